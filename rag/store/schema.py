"""Versions of the store's SQLite files: each carries `PRAGMA user_version`, and opening one migrates it
forward step by step, each step in its own transaction, after copying the file beside itself
(`<name>.v<N>.bak`, SQLite's backup API). A file newer than this code is refused with both versions.

Version 0 is a file written before the files were versioned; step 1 brings it to the schema of that
time (every table and column, created where missing), so it needs nothing else.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable
from pathlib import Path

from rag.core.errors import StoreTooNew

log = logging.getLogger(__name__)

Step = tuple[str, Callable[[sqlite3.Connection], None]]  # (what it does, the step)

# The newest version of each file: the number of steps its module passes to `migrate`.
LATEST = {"catalog.sqlite": 1, "lexical.sqlite": 1, "keys.sqlite": 1}


def run_script(db: sqlite3.Connection, script: str) -> None:
    """Run `;`-separated statements inside the caller's transaction (`executescript` would commit first)."""
    for statement in script.split(";"):
        if statement.strip():
            db.execute(statement)


def user_version(path: Path) -> int:
    db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        return int(db.execute("PRAGMA user_version").fetchone()[0])
    finally:
        db.close()


def migrate(db: sqlite3.Connection, path: Path, steps: list[Step]) -> None:
    """Bring the file open as `db` (autocommit) to version len(steps), or refuse one newer than that."""
    latest = len(steps)
    have = int(db.execute("PRAGMA user_version").fetchone()[0])
    if have > latest:
        raise StoreTooNew(
            f"{path} has schema version {have}, newer than this version of rag-stack reads ({latest}): "
            "upgrade rag-stack, or restore a backup taken by this version"
        )
    if have == latest:
        return
    if db.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()[0]:
        copy = path.with_name(f"{path.name}.v{have}.bak")
        target = sqlite3.connect(str(copy))
        try:
            db.backup(target)
        finally:
            target.close()
        log.info("%s: copied to %s before migrating", path, copy.name)
    for version in range(have, latest):
        what, step = steps[version]
        db.execute("BEGIN IMMEDIATE")
        try:
            if int(db.execute("PRAGMA user_version").fetchone()[0]) > version:  # another process did it
                db.execute("ROLLBACK")
                continue
            step(db)
            db.execute(f"PRAGMA user_version = {version + 1}")
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")
        log.info("%s: schema %d -> %d: %s", path, version, version + 1, what)
