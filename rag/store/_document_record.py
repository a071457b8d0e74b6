"""A row of the document catalog as the code and the API see it, and a collection's counts."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

State = Literal["pending", "indexed", "failed", "deleting"]


@dataclass(frozen=True)
class DocumentCounts:
    """A collection's documents (indexed contents, however many names each has) and its failures."""

    documents: int = 0
    failed: int = 0


def _iso(ts: float | None) -> str | None:
    return None if ts is None else datetime.fromtimestamp(ts, UTC).isoformat(timespec="seconds")


@dataclass
class DocumentRecord:
    collection: str
    doc_id: str
    source: str  # what identifies a file across versions: a path for the CLI, the upload's name
    name: str  # the display name (also the chunks' `source` metadata)
    size: int
    pages: int | None
    chunks: int
    state: State
    error: str | None
    owner: str | None
    created_at: float
    indexed_at: float | None

    def to_api(self, names: list[tuple[str, str]] | None = None) -> dict[str, Any]:
        """The API's view: `source` is the display name (as in the chunks' metadata), `source_key` what
        identifies the file across versions (the CLI's path, an upload's name or server id); `names`
        every name of the content, its own first."""
        names = names or [(self.source, self.name)]
        return {
            "id": self.doc_id,
            "source": self.name,
            "source_key": self.source,
            "collection": self.collection,
            "size": self.size,
            "chunks": self.chunks,
            "pages": self.pages,
            "state": self.state,
            "error": self.error,
            "created_at": _iso(self.created_at),
            "indexed_at": _iso(self.indexed_at),
            "names": [{"source": name, "source_key": source} for source, name in names],
        }
