"""kill -9 at random points of `rag store backup` and of `rag store restore` (10 each by default): after
each kill, and after the re-run that follows it, the state must be consistent.

A backup is consistent when the destination holds a whole backup (the previous one, or after the re-run
the new one): its manifest lists every file with the right checksum, its counts are the store's, and the
store itself still checks out. A restore is consistent when, after the killed run and a re-run of the same
command, `rag store check` passes on the restored data dir and its counts are the backup's.

Each kill comes at a random moment (seeded) between the end of the command's start-up (the interpreter and
click, measured with `rag store --help`) and its measured length, so the kills fall in the copy, the
checksums, the renames, the Chroma rebuild.

    PYTHONPATH=. nice -n 10 .venv/bin/python bench/backup_kills.py [--chunks 3000] [--kills 10] [--seed 7]

Results: bench/results/backup_kills.json.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._provenance import header, write_json  # noqa: E402 (after the path set-up above)
from bench.backup import build, forget_chroma  # noqa: E402 (after the path set-up above)
from rag.core.config import Settings  # noqa: E402 (after the path set-up above)
from rag.core.errors import BackupInvalid  # noqa: E402 (after the path set-up above)
from rag.store.backup import RESTORE_MARK, read_manifest  # noqa: E402 (after the path set-up above)
from rag.store.repair import check_store  # noqa: E402 (after the path set-up above)

RESULTS = ROOT / "bench" / "results"
RAG = [sys.executable, "-m", "rag.cli"]


def env_for(data_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    return {**env, "RAG_DATA_DIR": str(data_dir), "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1"}


def run(args: list[str], data_dir: Path) -> float:
    """Run `rag ARGS` to the end; its length in seconds."""
    started = time.perf_counter()
    subprocess.run([*RAG, *args], env=env_for(data_dir), check=True, capture_output=True, cwd=ROOT)
    return time.perf_counter() - started


def killed(args: list[str], data_dir: Path, after_s: float) -> bool:
    """Start `rag ARGS`, SIGKILL it after `after_s`; whether it was still running then."""
    child = subprocess.Popen(
        [*RAG, *args], env=env_for(data_dir), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT
    )
    try:
        child.wait(after_s)
        return False
    except subprocess.TimeoutExpired:
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        return True


def counts(manifest: dict[str, Any]) -> dict[str, tuple[int, int]]:
    return {name: (c["documents"], c["chunks"]) for name, c in manifest["collections"].items()}


def backup_problems(dest: Path, data_dir: Path, want: dict[str, tuple[int, int]]) -> list[str]:
    problems = []
    try:
        got = counts(read_manifest(dest, Settings().embed_model))
        if got != want:
            problems.append(f"backup counts {got} != store {want}")
    except BackupInvalid as exc:
        problems.append(f"backup: {exc.message}")
    report = check_store(data_dir, data_dir / "chroma")
    forget_chroma()
    if not report.consistent:
        problems.append(f"store: {report.to_dict()}")
    return problems


def restore_problems(data_dir: Path, want: dict[str, tuple[int, int]]) -> list[str]:
    report = check_store(data_dir, data_dir / "chroma")
    forget_chroma()
    got = {c.name: (c.documents, c.record_chunks) for c in report.collections}
    problems = [] if report.consistent else [f"check: {report.to_dict()}"]
    if got != want:
        problems.append(f"restored counts {got} != backup {want}")
    return problems


def series(
    name: str, kills: int, start_s: float, length_s: float, rng: random.Random, attempt: Any
) -> list[dict[str, Any]]:
    rows = []
    for i in range(kills):
        after = round(rng.uniform(start_s, length_s), 2)
        row = attempt(after)
        rows.append({"kill": i + 1, "after_s": after, **row})
        state = "; ".join(row["after_kill"] + row["after_rerun"]) or "consistent"
        print(f"{name} kill {i + 1:>2} at {after:5.2f} s (running: {row['was_running']}): {state}", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=3000)
    parser.add_argument("--kills", type=int, default=10)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    print(header(), flush=True)
    with tempfile.TemporaryDirectory(prefix="rag-backup-kills-") as tmp:
        work = Path(tmp)
        data = work / "data"
        build(Settings(data_dir=data), args.chunks)
        dest = work / "backup"
        backup_s = run(["store", "backup", str(dest)], data)
        want = counts(read_manifest(dest, Settings().embed_model))

        def backup_attempt(after: float) -> dict[str, Any]:
            running = killed(["store", "backup", str(dest)], data, after)
            after_kill = backup_problems(dest, data, want)
            run(["store", "backup", str(dest)], data)
            return {"was_running": running, "after_kill": after_kill, "after_rerun": backup_problems(dest, data, want)}

        target = work / "restored"
        shutil.rmtree(target, ignore_errors=True)
        restore_s = run(["store", "restore", str(dest)], target)

        def restore_attempt(after: float) -> dict[str, Any]:
            shutil.rmtree(target, ignore_errors=True)
            running = killed(["store", "restore", str(dest)], target, after)
            if (target / RESTORE_MARK).exists() or not (target / "lexical.sqlite").exists():
                run(["store", "restore", str(dest)], target)  # the same restore again: it goes on
            return {"was_running": running, "after_kill": [], "after_rerun": restore_problems(target, want)}

        print(f"{args.chunks:,} chunks: a whole backup takes {backup_s:.1f} s, a restore {restore_s:.1f} s", flush=True)
        # The command's own start-up (the interpreter, click, the settings) is left out of the draw: the
        # kills fall while it works on the store.
        start_s = run(["store", "--help"], target)
        print(f"start-up alone {start_s:.2f} s", flush=True)
        backups = series("backup", args.kills, start_s, backup_s, rng, backup_attempt)
        restores = series("restore", args.kills, start_s, restore_s, rng, restore_attempt)
    rows = backups + restores
    inconsistent = sum(bool(r["after_kill"] or r["after_rerun"]) for r in rows)
    load = [round(x, 2) for x in os.getloadavg()]
    print(f"{len(rows)} kills, {inconsistent} inconsistent states; load average {load}", flush=True)
    write_json(
        RESULTS / "backup_kills.json",
        {
            "chunks": args.chunks,
            "seed": args.seed,
            "backup_s": round(backup_s, 2),
            "restore_s": round(restore_s, 2),
            "start_up_s": round(start_s, 2),
            "backups": backups,
            "restores": restores,
            "inconsistent": inconsistent,
            "load_average": load,
        },
    )
    print(json.dumps({"inconsistent": inconsistent}))


if __name__ == "__main__":
    main()
