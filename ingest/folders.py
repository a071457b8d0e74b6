"""The files under the folders given to `ingest`: which are found (by --glob, --recursive) and the names
they are shown by, and which documents of the catalog lie under them but no longer have a file (what
--sync and --watch delete)."""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Sequence
from pathlib import Path

from .backends import KnownDocument
from .pipeline import SourceFile


def collect_files(
    paths: Sequence[Path], pattern: str | None, recursive: bool, roots: Sequence[Path] | None = None
) -> list[SourceFile]:
    """The files named or found in folders (by --glob, --recursive), each once, in a stable order.

    Each is named by its path relative to the folder it was found under (`roots`, by default the
    folders among `paths`): four `README.gz` of four packages are `apt/README.gz`, `curl/README.gz`...
    A file given by itself is named by its file name."""
    found: dict[Path, str] = {}
    folders = [root for root in (paths if roots is None else roots) if root.is_dir()]
    for path in paths:
        if path.is_dir():
            for file in _walk(path, recursive):
                if pattern is None or file.match(pattern):
                    found.setdefault(file.resolve(), display_name(file, folders))
        else:
            found.setdefault(path.resolve(), display_name(path, folders) if roots is not None else path.name)
    # Names in NFC, as the API keeps them: the same name typed on macOS (NFD) and Linux is one source.
    return [SourceFile(p, _nfc(str(p)), _nfc(name)) for p, name in found.items()]


def display_name(file: Path, folders: Sequence[Path]) -> str:
    """`file`'s path relative to the first of `folders` that holds it ("apt/README.gz"), else its name."""
    for folder in folders:
        for inner, outer in ((file, folder), (file.resolve(), folder.resolve())):
            if inner.is_relative_to(outer) and inner != outer:
                return inner.relative_to(outer).as_posix()
    return file.name


def _nfc(text: str) -> str:
    return unicodedata.normalize("NFC", text)


def _walk(folder: Path, recursive: bool) -> list[Path]:
    files = []
    for root, dirs, names in os.walk(folder):  # symlinked folders are not followed: no cycles
        dirs[:] = sorted(d for d in dirs if not d.startswith(".")) if recursive else []
        files += [Path(root) / n for n in sorted(names) if not n.startswith(".") and (Path(root) / n).is_file()]
    return files


def stale_documents(
    known: list[KnownDocument], roots: Sequence[Path], files: list[SourceFile], recursive: bool
) -> list[KnownDocument]:
    """Documents whose source lies under the given paths but is not among the files found now."""
    current = {f.source for f in files}
    folders = [p.resolve() for p in roots if p.is_dir()]
    singles = {str(p.resolve()) for p in roots if not p.is_dir()}

    def under(source: str) -> bool:
        path = Path(source)
        if not path.is_absolute():
            return False  # an upload's name, not a file of ours
        if source in singles:
            return True
        return any(path.is_relative_to(f) if recursive else path.parent == f for f in folders)

    return [d for d in known if d.state in ("indexed", "failed") and d.source not in current and under(d.source)]
