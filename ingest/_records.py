"""What a run takes and gives: the files, the chunk records the stores take, the results; the protocols
of the embedder, the progress listener and the preparer that a pipeline is built with."""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from rag.core.errors import RagError
from rag.store.record import Vectors

# deleted: a DELETE of the document came while it was being indexed; nothing of it is kept.
Status = Literal["indexed", "unchanged", "failed", "deleted"]


@dataclass(frozen=True)
class SourceFile:
    """A file to ingest: where its bytes are, what identifies it across versions, what to show."""

    path: Path
    source: str  # a new file with the same source replaces the old one's chunks
    name: str  # display name: the chunks' `source` metadata and the loaders' hint for text kinds


@dataclass
class FileResult:
    filename: str
    source: str
    document_id: str | None
    status: Status
    reason: str | None = None
    chunks: int = 0
    error: RagError | None = field(default=None, repr=False, compare=False)
    warnings: tuple[str, ...] = ()  # indexed, with something left out or in doubt (an OCR page, low scores)

    def to_api(self) -> dict[str, Any]:
        return {
            "filename": self.filename,
            "document_id": self.document_id,
            "status": self.status,
            "reason": self.reason,
            "chunks": self.chunks,
            "warnings": list(self.warnings),
        }


@dataclass(frozen=True)
class ChunkRecord:
    """A chunk as the stores take it: id, text and contract metadata."""

    id: str
    text: str
    metadata: dict[str, str | int]

    @property
    def tokens(self) -> int:
        """The chunker's token count, or an estimate."""
        return int(self.metadata.get("tokens") or len(self.text) // 4)


@dataclass
class Prepared:
    """A loaded and chunked document."""

    records: list[ChunkRecord]
    pages: int | None = None
    warnings: tuple[str, ...] = ()
    keep_original: bool = False  # a document with pages to show: its bytes are kept (`ingest.originals`)


class Embedder(Protocol):
    async def embed(self, texts: list[str]) -> Vectors: ...  # one row per text, in order


class Progress(Protocol):
    def file_started(self, file: SourceFile) -> None: ...
    def page_read(self, file: SourceFile, n: int, total: int | None) -> None: ...  # OCR starts page n of total
    def chunks_stored(self, n: int) -> None: ...
    def file_done(self, result: FileResult) -> None: ...


class NoProgress:
    def file_started(self, file: SourceFile) -> None:
        pass

    def page_read(self, file: SourceFile, n: int, total: int | None) -> None:
        pass

    def chunks_stored(self, n: int) -> None:
        pass

    def file_done(self, result: FileResult) -> None:
        pass


Preparer = Callable[[bytes, SourceFile, str], Prepared]


def document_id(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
