"""Backup and restore of a store of N chunks: the time of `rag store backup` (the record and catalog at
one moment, checksummed), its size on disk, and the time of `rag store restore` into a wiped data dir
(the copy, Chroma rebuilt from the stored vectors, the BM25 index rebuilt from the record, the check).

    nice .venv/bin/python -m bench.backup                      # 10k chunks
    nice .venv/bin/python -m bench.backup --sizes 10000 100000

The store is built the way bench/scale.py builds its derived chunks: documents of 10 chunks written
through the pipeline's write path (`DocumentStores.write_chunks`) and the catalog's claim/mark_indexed,
without the embedder; here the texts are 120 random words of a 5,000-word vocabulary (about SQuAD's
paragraph length) and the vectors random 384-d unit vectors (MiniLM's size). No step re-embeds.
Results: bench/results/backup.json.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._provenance import header, write_json  # noqa: E402 (after the path set-up above)
from bench.scale import COLLECTION, Parts, _catalog_indexed, _records  # noqa: E402 (after the path set-up above)
from rag.core.config import Settings  # noqa: E402 (after the path set-up above)

RESULTS = ROOT / "bench" / "results"


def disk_mb(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 1e6, 1)


def forget_chroma() -> None:
    from chromadb.api.shared_system_client import SharedSystemClient

    SharedSystemClient.clear_system_cache()


def build(settings: Settings, size: int) -> float:
    rng = np.random.default_rng(size)
    vocabulary = [f"w{i}" for i in range(5000)]
    parts = Parts(settings)
    started = time.perf_counter()
    try:
        for start in range(0, size, settings.embed_batch):
            n = min(settings.embed_batch, size - start)
            texts = [" ".join(rng.choice(vocabulary, 120)) for _ in range(n)]
            vectors = rng.normal(size=(n, 384)).astype(np.float32)
            vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
            records = _records(start, texts, [150] * n)
            parts.pipeline.stores.write_chunks(COLLECTION, records, vectors.tolist())
            _catalog_indexed(parts, records)
    finally:
        import asyncio

        asyncio.run(parts.aclose())
        forget_chroma()
    return time.perf_counter() - started


def measure(size: int, workdir: Path) -> dict[str, Any]:
    from rag.store.backup import (
        backup_store,
        finish_restore,
        read_manifest,
        restore_files,
    )
    from rag.store.repair import check_store, repair_store

    settings = Settings(data_dir=workdir / f"data-{size}")
    shutil.rmtree(settings.data_dir, ignore_errors=True)
    built = build(settings, size)
    store_mb = disk_mb(settings.data_dir)
    dest = workdir / f"backup-{size}"
    t0 = time.perf_counter()
    backup_store(settings.data_dir, dest)
    backup_s = time.perf_counter() - t0

    shutil.rmtree(settings.data_dir)
    t0 = time.perf_counter()
    manifest = read_manifest(dest, settings.embed_model)
    restore_files(dest, settings.data_dir, manifest)
    copied = time.perf_counter() - t0
    repair_store(settings.data_dir, settings.chroma_path)
    forget_chroma()
    rebuilt = time.perf_counter() - t0
    report = check_store(settings.data_dir, settings.chroma_path)  # opening the record rebuilds BM25
    finish_restore(settings.data_dir)
    restore_s = time.perf_counter() - t0
    assert report.consistent, report.to_dict()
    out = {
        "chunks": size,
        "build_s": round(built, 1),
        "store_mb": store_mb,
        "backup_s": round(backup_s, 2),
        "backup_mb": disk_mb(dest),
        "restore_s": round(restore_s, 1),
        "restore_copy_verify_s": round(copied, 2),
        "restore_chroma_s": round(rebuilt - copied, 1),
        "restore_bm25_and_check_s": round(restore_s - rebuilt, 1),
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
    shutil.rmtree(settings.data_dir)
    shutil.rmtree(dest)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10000])
    parser.add_argument("--workdir", type=Path, default=None)
    args = parser.parse_args()
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="rag-backup-bench-"))
    print(header(), flush=True)
    rows = []
    for size in args.sizes:
        row = measure(size, workdir)
        rows.append(row)
        print(
            f"{size:>7,} chunks: store {row['store_mb']} MB; backup {row['backup_s']} s, {row['backup_mb']} MB; "
            f"restore {row['restore_s']} s (copy+verify {row['restore_copy_verify_s']} s, Chroma {row['restore_chroma_s']} s, "
            f"BM25+check {row['restore_bm25_and_check_s']} s); load {row['load_average']}",
            flush=True,
        )
    write_json(RESULTS / "backup.json", {"sizes": rows})


if __name__ == "__main__":
    main()
