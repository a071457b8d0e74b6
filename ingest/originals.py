"""The original bytes of documents that have pages (PDFs, images), kept to show a cited page, and the
pages rendered from them.

    originals = Originals(settings.data_dir)
    originals.save(collection, doc_id, data)          # while indexing, before the document is searchable
    originals.delete(collection, doc_id)              # with its chunks: the original and its pages go

Layout: `data_dir/originals/<collection>/<doc_id>/original` and `.../pages/<name>.png` beside it, so
deleting a document is one directory. Uploads are removed once indexed: this copy is the only one.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from pathlib import Path

from .models import DocKind

# The kinds that have pages to show: PDFs, and images once they are read.
PAGED_KINDS = frozenset(k for k in DocKind if k.value in ("pdf", "image"))
_DOC_ID = re.compile(r"[0-9a-f]{8,128}")
_NAME = re.compile(r"[-\w.]{1,120}")
_COLLECTION = re.compile(r"[-\w.]{1,512}")


class Originals:
    """Original files and rendered pages under `data_dir/originals`."""

    def __init__(self, data_dir: Path) -> None:
        self.root = data_dir / "originals"

    def directory(self, collection: str, doc_id: str) -> Path:
        if not _DOC_ID.fullmatch(doc_id) or not _COLLECTION.fullmatch(collection) or collection.startswith("."):
            raise ValueError(f"not a document id or collection: {doc_id!r}, {collection!r}")
        # A long collection name would pass a file system's 255-byte limit on names: its hash stands in.
        folder = collection if len(collection) <= 100 else "h-" + hashlib.sha256(collection.encode()).hexdigest()
        return self.root / folder / doc_id

    def save(self, collection: str, doc_id: str, data: bytes) -> None:
        _write_atomic(self.directory(collection, doc_id) / "original", data)

    def path(self, collection: str, doc_id: str) -> Path | None:
        """The original's file, or None when none is kept (another kind, or indexed before they were)."""
        path = self.directory(collection, doc_id) / "original"
        return path if path.is_file() else None

    def page_path(self, collection: str, doc_id: str, name: str) -> Path:
        """Where a rendered page named `name` (letters, digits, '-', '_', '.') is cached."""
        if not _NAME.fullmatch(name):
            raise ValueError(f"not a page name: {name!r}")
        return self.directory(collection, doc_id) / "pages" / f"{name}.png"

    def save_page(self, path: Path, png: bytes) -> None:
        _write_atomic(path, png)

    def delete(self, collection: str, doc_id: str) -> None:
        """Removes what is kept of the document, if anything (an id that is no content hash has nothing)."""
        try:
            directory = self.directory(collection, doc_id)
        except ValueError:
            return
        shutil.rmtree(directory, ignore_errors=True)


def _write_atomic(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
