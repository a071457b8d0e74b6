"""Logs kept per run: `$RAG_DATA_DIR/logs/<date-time>/`, a `latest` link to the newest, the last KEEP runs."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

KEEP = 10
_STAMP = "%Y%m%d-%H%M%S"


def new_run_dir(logs: Path, keep: int = KEEP) -> Path:
    """A fresh folder for this run's logs (created), `latest` pointing at it; older runs beyond `keep` go."""
    logs.mkdir(parents=True, exist_ok=True)
    run = logs / _stamp()
    while run.exists():  # two starts within one millisecond
        time.sleep(0.001)
        run = logs / _stamp()
    run.mkdir()
    for old in run_dirs(logs)[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    latest = logs / "latest"
    if latest.is_symlink() or latest.exists():
        latest.unlink()
    latest.symlink_to(run.name)
    return run


def _stamp() -> str:
    now = time.time()
    return f"{time.strftime(_STAMP, time.localtime(now))}.{int(now * 1000) % 1000:03d}"  # sorts as it happens


def run_dirs(logs: Path) -> list[Path]:
    """The run folders under `logs`, oldest first."""
    return sorted(p for p in logs.iterdir() if p.is_dir() and not p.is_symlink() and p.name[:8].isdigit())
