"""Who a request is: the admin (RAG_API_KEY, or anyone when no key is set) or a scoped key (`rag keys`).

A scoped key opens only its collections, and a read-only one only to read (search, chat, list, pages):
an upload or a delete is 403. A collection outside a key's scope is 404, worded the same whether it
exists or not, and every list it sees (collections, the names in an unknown collection's 404) holds its
own collections alone, so a key never learns another collection's name. `/metrics` is the admin's.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from rag.core.config import Settings
from rag.core.errors import Forbidden, NotFound, RagError, StoreDamaged, Unauthorized
from rag.store.catalog import check_collection
from rag.store.keys import ApiKey, KeyStore

log = logging.getLogger("rag.api")

STATE_KEY = "access"  # where the request's Access is kept in its ASGI scope's state (`request.state.access`)


@dataclass(frozen=True)
class Access:
    """What one request may open."""

    key: ApiKey | None = None  # None: the admin

    @property
    def admin(self) -> bool:
        return self.key is None

    @property
    def read_only(self) -> bool:
        return self.key is not None and self.key.read_only

    def allows(self, name: str) -> bool:
        return self.key is None or self.key.collections is None or name in self.key.collections

    def default(self, settings: Settings) -> str:
        """The collection of a request that names none: RAG_COLLECTION, or the key's first one when
        RAG_COLLECTION is not among its collections."""
        if self.allows(settings.collection) or self.key is None or not self.key.collections:
            return settings.collection
        return self.key.collections[0]

    def collection(self, name: str | None, settings: Settings) -> str:
        """The collection a read names (or the default), if this key opens it; NotFound otherwise."""
        if not name:
            return self.default(settings)
        check_collection(name)
        if not self.allows(name):
            raise self.unknown(name)
        return name

    def writable(self, name: str | None, settings: Settings) -> str:
        """As `collection`, for an upload or a delete: a read-only key is Forbidden."""
        chosen = self.collection(name, settings)
        if self.read_only:
            raise Forbidden("this API key is read-only: it may search and chat, not upload or delete")
        return chosen

    def check_exists(self, name: str, settings: Settings, known: Iterable[str]) -> None:
        """NotFound for a listing of a collection that is neither among `known` nor this key's default
        (empty before its first document): a mistyped name is a 404, not an empty list."""
        names = sorted(known)
        if name == self.default(settings) or name in names:
            return
        if self.key is not None:
            raise self.unknown(name)
        raise NotFound(
            f"no collection {name[:100]!r}; the collections are: {', '.join(names[:5]) or 'none yet'}",
            collection=name[:100],
            collections=names[:5],
            total=len(names),
        )

    def require_admin(self, what: str) -> None:
        if not self.admin:
            raise Forbidden(f"{what} needs RAG_API_KEY; a scoped key does not open it")

    def visible(self, names: Iterable[str]) -> list[str]:
        return [n for n in names if self.allows(n)]

    def unknown(self, name: str) -> NotFound:
        """The 404 of a collection this key does not open, or that does not exist, worded alike."""
        mine = list(self.key.collections or ()) if self.key is not None else []
        shown = ", ".join(mine[:5]) or "none"
        return NotFound(
            f"no collection {name[:100]!r}; this key's collections are: {shown}",
            collection=name[:100],
            collections=mine[:5],
        )

    def hidden(self, exc: RagError) -> RagError:
        """`exc` as this key may see it: the store's 404 of an unknown collection lists every collection,
        which only the admin may read."""
        if self.key is None or self.key.collections is None:
            return exc
        if not isinstance(exc, NotFound) or "collections" not in exc.detail:
            return exc
        return self.unknown(str(exc.detail.get("collection", "")))


ADMIN = Access()


def authorize(header: str, settings: Settings, keys: KeyStore) -> Access:
    """The Access of an `Authorization` header; Unauthorized unless it carries RAG_API_KEY or a live
    scoped key (any header passes when RAG_API_KEY is unset: the API is open)."""
    if settings.api_key is None:
        return ADMIN
    scheme, _, token = header.partition(" ")
    token = token.strip()
    refused = Unauthorized("missing or wrong API key: send 'Authorization: Bearer <key>'")
    if scheme.lower() != "bearer":
        raise refused
    presented = token.encode("utf-8", "surrogateescape")
    if secrets.compare_digest(presented, settings.api_key.get_secret_value().encode()):
        return ADMIN
    try:
        key = keys.find(token)
    except StoreDamaged as exc:
        log.error("scoped API keys cannot be checked: %s", exc.message)
        raise refused from None
    if key is None:
        raise refused
    return Access(key)
