"""The chunks waiting to be embedded, and how a batch is cut from them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

from ingest._records import ChunkRecord

Doc = TypeVar("Doc")

FLUSH = object()  # the consumer's idle tick: embed a partial batch instead of waiting for more


class Pool(Generic[Doc]):
    """Chunks waiting to be embedded, each with the number of batches taken before it arrived."""

    def __init__(self) -> None:
        self._items: list[tuple[int, Doc, ChunkRecord]] = []
        self._taken = 0

    def __len__(self) -> int:
        return len(self._items)

    def add(self, doc: Doc, records: Iterable[ChunkRecord]) -> None:
        self._items.extend((self._taken, doc, record) for record in records)

    def take(self, size: int, patience: int) -> list[tuple[Doc, ChunkRecord]]:
        """The `size` shortest chunks, or the `size` nearest in length to one that waited `patience` batches."""
        self._items.sort(key=lambda item: item[2].tokens)
        oldest = min(range(len(self._items)), key=lambda i: self._items[i][0])
        start = 0
        if self._taken - self._items[oldest][0] >= patience:
            start = max(0, min(oldest - size // 2, len(self._items) - size))
        batch = self._items[start : start + size]
        del self._items[start : start + size]
        self._taken += 1
        return [(doc, record) for _, doc, record in batch]
