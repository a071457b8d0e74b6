"""Every part's PostgreSQL schema in one upgrade (`rag db upgrade`): what a replica's parts would each create
on first use, done once before the replicas start (compose's one-shot `migrate` service).

The steps are the parts' own (`STEPS` of each module, moved forward in `schema_versions` by `migrate`), so
an upgrade here and a replica's first open leave the same tables at the same versions. The parts live in
several layers (the store, ingest's job queue, the answering's shared sources): `rag db upgrade` names them.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from rag.core.errors import StoreUnavailable
from rag.store.postgres import Connection, PgStep, migrate, owners_table

Part = tuple[str, list[PgStep]]  # a name `schema_versions` holds, and its module's steps


def upgrade(url: str, parts: list[Part]) -> dict[str, int]:
    """Bring every part to its latest version; each part's version after."""
    for part, steps in parts:
        # Each part on a connection named for it, as its module opens one: a replica starting meanwhile
        # takes its turn on the same advisory lock.
        db = Connection(url, part)
        try:
            migrate(db, part, steps)
        finally:
            db.close()
    db = Connection(url, "jobs")
    try:
        owners_table(db)  # the replicas' owner leases (each creates it on start too)
        rows = db.execute("SELECT part, version FROM schema_versions").fetchall()
    finally:
        db.close()
    wanted = {part for part, _ in parts}
    return {str(part): int(version) for part, version in rows if part in wanted}


def upgrade_when_up(
    url: str, parts: list[Part], *, wait_s: float = 0.0, say: Callable[[str], None] = print
) -> dict[str, int]:
    """`upgrade`, retried every second for up to `wait_s` while the server is unreachable (still starting)."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            return upgrade(url, parts)
        except StoreUnavailable as exc:
            if time.monotonic() >= deadline:
                raise
            say(f"waiting for the database: {exc.message}")
            time.sleep(1.0)
