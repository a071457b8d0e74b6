"""`rag keys`: make, list and revoke scoped API keys (rag/store/keys.py) in the data dir.

The API reads the key file on every request that carries a scoped key, so a key made or revoked here
takes effect at once, with or without a running API (in compose: `docker compose exec api rag keys ...`,
the data dir being the volume).
"""

from __future__ import annotations

import json
import time

import click

from rag.core.command_line import load_settings
from rag.store.backend import open_keys
from rag.store.catalog import check_collection
from rag.store.keys import ApiKey, KeyStore

EPILOG = """\b
Examples:
  rag keys create --collections handbook --read-only   ask and search in one collection
  rag keys create --collections team-a,team-b           read and write two collections
  rag keys create --all-collections --read-only         read every collection
  rag keys list
  rag keys revoke 3f9c2a1b
"""


def _store() -> KeyStore:
    return open_keys(load_settings())


def _when(at: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%SZ", time.gmtime(at)) if at is not None else "never"


def _row(key: ApiKey) -> dict[str, object]:
    return {
        "id": key.id,
        "collections": list(key.collections) if key.collections is not None else None,
        "read_only": key.read_only,
        "created": _when(key.created_at),
        "last_used": _when(key.last_used),
    }


@click.group("keys", epilog=EPILOG)
def keys_command() -> None:
    """Scoped API keys: each opens only its collections, and only to read with --read-only.
    RAG_API_KEY stays the admin's key (every collection, /metrics)."""


@keys_command.command("create")
@click.option("--collections", default=None, help="Comma-separated collections the key opens.")
@click.option("--all-collections", is_flag=True, help="The key opens every collection, today's and later ones.")
@click.option("--read-only", is_flag=True, help="Search and chat only: no upload, no delete.")
def create(collections: str | None, all_collections: bool, read_only: bool) -> None:
    """Make a key and print it once: only its hash is kept. Name its collections, or say --all-collections."""
    if (collections is None) == (not all_collections):
        raise click.UsageError(
            "name the key's collections (--collections a,b) or give it every one (--all-collections)"
        )
    settings = load_settings()
    if settings.api_key is None:
        raise click.ClickException(
            "RAG_API_KEY is not set, so the API is open to every request and a scoped key would limit nothing: "
            "set RAG_API_KEY (the admin's key) first"
        )
    names = None
    if collections is not None:
        names = [check_collection(n.strip()) for n in collections.split(",") if n.strip()]
        if not names:
            raise click.UsageError("--collections names no collection")
    key, token = open_keys(settings).create(names, read_only=read_only)
    scope = ", ".join(key.collections) if key.collections is not None else "every collection"
    click.echo(f"key {key.id}: {scope}, {'read-only' if key.read_only else 'read and write'}", err=True)
    click.echo("the key is shown this once (only its hash is stored):", err=True)
    click.echo(token)


@keys_command.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the keys as JSON.")
def list_keys(as_json: bool) -> None:
    """The keys: id, collections, read-only, created, last used (never the secret)."""
    rows = [_row(k) for k in _store().list()]
    if as_json:
        click.echo(json.dumps(rows, indent=2))
        return
    if not rows:
        click.echo("no scoped keys (rag keys create makes one)")
        return
    click.echo(f"{'id':<9} {'read-only':<9} {'created':<21} {'last used':<21} collections")
    for r in rows:
        shown = ", ".join(r["collections"]) if isinstance(r["collections"], list) else "*"
        read_only = "yes" if r["read_only"] else "no"
        click.echo(f"{r['id']!s:<9} {read_only:<9} {r['created']!s:<21} {r['last_used']!s:<21} {shown}")


@keys_command.command("revoke")
@click.argument("key_id")
def revoke(key_id: str) -> None:
    """Delete a key: the next request that carries it is refused (401)."""
    _store().revoke(key_id)
    click.echo(f"revoked key {key_id}")
