"""The system of record's encodings: each chunk's vector kept compactly beside its text, and per
collection the embedding model that made the vectors.

The chunks table of `lexical.sqlite` is the record (`rag/store/chunk_record.py` writes it): text, metadata
(JSON) and the vector as float16 (2 bytes a dimension: 768 bytes at 384-d, 2 KiB at 1024-d). From it
Chroma and the BM25 index can be rebuilt without the embedder. float16 rather than int8 with a scale:
at unit length its error (< 5e-4 a component) keeps the cosine of a vector with its copy above 0.99999,
so a rebuilt index ranks like the original except for near-ties; int8 would halve the size again.

The embedder of a collection is named by its model name, dimension, whether it normalizes, and a
probe: the first text it embedded for the collection, with that vector. Embedding the probe's text
again tells whether the embedder is still the same model: another model (or other weights under the
same name) gives another vector; the same model on another device one within rounding (cosine > 0.999).
"""

from __future__ import annotations

import hashlib
import json
import math
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from rag.core.errors import EmbedderMismatch
from rag.store.schema import run_script

SAME_MODEL_COSINE = 0.999

SCHEMA = """
CREATE TABLE IF NOT EXISTS embedders (
    collection TEXT PRIMARY KEY,
    model      TEXT NOT NULL,
    dimensions INTEGER NOT NULL,
    normalized INTEGER NOT NULL,
    probe_text TEXT NOT NULL,
    probe      BLOB NOT NULL,
    created_at REAL NOT NULL
);
"""
CHUNK_COLUMNS = {"metadata": "TEXT", "vector": "BLOB"}


def encode_vector(vector: Any) -> bytes:
    return np.asarray(vector, dtype=np.float16).tobytes()


Vectors = npt.NDArray[np.float32]  # (n, d): one row per text


def rounded(vectors: Vectors | Sequence[Sequence[float]]) -> Vectors:
    """Vectors as the record keeps them, as an (n, d) float32 array. Chroma gets these same values, so
    an index rebuilt from the record ranks exactly like the one written at ingestion."""
    return np.asarray(vectors, dtype=np.float16).astype(np.float32)


def decode_vector(blob: bytes) -> list[float]:
    values: list[float] = np.frombuffer(blob, dtype=np.float16).astype(np.float32).tolist()
    return values


def encode_metadata(metadata: dict[str, Any] | None) -> str | None:
    return None if metadata is None else json.dumps(metadata, ensure_ascii=False, sort_keys=True)


def decode_metadata(text: str | None) -> dict[str, Any]:
    return json.loads(text) if text else {}


def add_columns(db: sqlite3.Connection) -> None:
    """Bring an older record up to this schema (its chunks then have no vector until re-embedded)."""
    run_script(db, SCHEMA)
    have = {row[1] for row in db.execute("PRAGMA table_info(chunks)")}
    for name, kind in CHUNK_COLUMNS.items():
        if name not in have:
            db.execute(f"ALTER TABLE chunks ADD COLUMN {name} {kind}")


@dataclass(frozen=True)
class EmbedderIdentity:
    """What made a collection's vectors."""

    model: str
    dimensions: int
    normalized: bool
    probe_text: str
    probe: tuple[float, ...]

    @classmethod
    def of(cls, model: str, probe_text: str, probe: Sequence[float] | Vectors) -> EmbedderIdentity:
        norm = math.sqrt(sum(x * x for x in probe))
        return cls(model, len(probe), abs(norm - 1.0) < 1e-3, probe_text, tuple(float(x) for x in probe))

    @property
    def fingerprint(self) -> str:
        """A short name for the probe (rounded, so that one model on two devices usually agrees)."""
        return hashlib.sha256(np.round(np.asarray(self.probe), 2).astype(np.float16).tobytes()).hexdigest()[:12]

    def describe(self) -> str:
        norm = "normalized" if self.normalized else "not normalized"
        return f"{self.model} ({self.dimensions}-d, {norm}, fingerprint {self.fingerprint})"

    def same_as(self, other: EmbedderIdentity) -> bool:
        if self.dimensions != other.dimensions or self.normalized != other.normalized:
            return False
        a, b = np.asarray(self.probe), np.asarray(other.probe)
        cosine = float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b) or 1.0))
        return cosine >= SAME_MODEL_COSINE

    def refusal(self, now: EmbedderIdentity, collection: str) -> EmbedderMismatch:
        """The 409 of a collection embedded by this model, asked through `now`'s."""
        return EmbedderMismatch(
            f"collection {collection!r} was embedded with {self.describe()}; the embedding server now "
            f"gives {now.describe()}. Serve the original model, or re-embed the collection with "
            f"`rag store reindex --collection {collection}`",
            recorded=self.describe(),
            current=now.describe(),
        )


async def check_embedder_of(
    collection: str, recorded: EmbedderIdentity | None, model: str, embed: Callable[[str], Awaitable[Sequence[float]]]
) -> None:
    """The 409 when `embed` (the serving model's passage embedding) no longer gives the collection's probe."""
    if recorded is None:
        return
    now = EmbedderIdentity.of(model, recorded.probe_text, await embed(recorded.probe_text))
    if not now.same_as(recorded):
        raise recorded.refusal(now, collection)


def read_embedder(db: sqlite3.Connection, collection: str) -> EmbedderIdentity | None:
    row = db.execute(
        "SELECT model, dimensions, normalized, probe_text, probe FROM embedders WHERE collection = ?", (collection,)
    ).fetchone()
    if row is None:
        return None
    model, dimensions, normalized, probe_text, probe = row
    return EmbedderIdentity(model, int(dimensions), bool(normalized), probe_text, tuple(decode_vector(probe)))


def write_embedder(db: sqlite3.Connection, collection: str, identity: EmbedderIdentity, now: float) -> None:
    db.execute(
        "INSERT OR REPLACE INTO embedders (collection, model, dimensions, normalized, probe_text, probe, created_at) "
        "VALUES (?, ?, ?, ?, ?, ?, ?)",
        (
            collection,
            identity.model,
            identity.dimensions,
            int(identity.normalized),
            identity.probe_text,
            encode_vector(identity.probe),
            now,
        ),
    )
