"""Vectors sent to pgvector in its binary form: one `vector[]` parameter for the vectors of a write.

Written as text (`[0.1,0.2,...]`), a 384-d vector costs Python ~0.2 ms to format and PostgreSQL as much to
parse, most of a bulk load's time; in binary it is a copy of its float32s. The array is PostgreSQL's
binary array format (dimensions, element type, then each element's length and bytes) around
pgvector's binary vector (`vector_recv`: int16 dimensions, int16 unused, big-endian float32s), built by
numpy for the whole batch at once.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np
from psycopg.adapt import Dumper
from psycopg.pq import Format
from psycopg.types import TypeInfo


class VectorArray:
    """The vectors of one write (rows of a float matrix), for a `?::vector[]` parameter."""

    def __init__(self, vectors: Any) -> None:
        self.vectors = np.ascontiguousarray(vectors, dtype=">f4")


def register(conn: Any) -> bool:
    """Teach a psycopg connection to send `VectorArray`s in binary; False where the database has no
    `vector` type yet (its extension is created after the first connection)."""
    info = TypeInfo.fetch(conn, "vector")
    if info is None:
        return False
    element = info.oid

    class VectorArrayDumper(Dumper):
        format = Format.BINARY
        oid = info.array_oid

        def dump(self, obj: VectorArray) -> bytes:
            rows, width = obj.vectors.shape
            out = np.zeros((rows, 8 + 4 * width), dtype=np.uint8)
            out[:, :4] = np.frombuffer(struct.pack(">i", 4 + 4 * width), np.uint8)  # the element's length
            out[:, 4:6] = np.frombuffer(struct.pack(">H", width), np.uint8)  # then int16 unused, left 0
            out[:, 8:] = obj.vectors.view(np.uint8).reshape(rows, 4 * width)
            return struct.pack(">iiiii", 1, 0, element, rows, 1) + out.tobytes()

    conn.adapters.register_dumper(VectorArray, VectorArrayDumper)
    return True
