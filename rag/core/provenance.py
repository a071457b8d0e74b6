"""Where a measured number comes from: the code's commit (or version), the date, the machine and its load.

`rag eval` results and every benchmark under bench/ carry `provenance()`, so a number quoted in a README
can be traced to the code and the conditions that produced it. The commit is git's when the package sits
in a git checkout; an installed package reports its version instead. Nothing here raises or waits long:
a missing or slow git gives "unknown".
"""

from __future__ import annotations

import datetime
import os
import platform
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTION = "rag-stack"
GIT_TIMEOUT_S = 10


def _git(*args: str) -> str | None:
    """git's output in ROOT, or None when git is missing, fails or takes longer than GIT_TIMEOUT_S."""
    try:
        done = subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=GIT_TIMEOUT_S, check=True
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def in_checkout() -> bool:
    """Whether ROOT is a git work tree's top (not merely a folder inside another repository, like a venv)."""
    top = _git("rev-parse", "--show-toplevel")
    return top is not None and Path(top).resolve() == ROOT


def package_version() -> str:
    """The installed rag-stack's version ("unknown" when it runs from a folder that was never installed)."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


def code_identity() -> dict[str, Any]:
    """The commit and whether tracked files differ from it; outside a checkout, the installed version."""
    if in_checkout():
        status = _git("status", "--porcelain", "--untracked-files=no")
        return {
            "commit": _git("rev-parse", "HEAD") or "unknown",
            "uncommitted_changes": None if status is None else status != "",
        }
    return {"commit": None, "version": package_version(), "uncommitted_changes": None}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:  # not available on this platform
        return None


def provenance() -> dict[str, Any]:
    """The code (commit or version), the UTC date, the machine and its load average now."""
    return {
        **code_identity(),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "cpu": _cpu_model(), "system": platform.platform()},
        "load_average": _load_average(),
    }


def summary(p: dict[str, Any]) -> str:
    """`p` in one line: "commit 0123456789ab (with uncommitted changes), <date>, 2 cores <cpu>, load average …"."""
    code = f"commit {p['commit'][:12]}" if p.get("commit") else f"version {p.get('version', 'unknown')}"
    dirty = " (with uncommitted changes)" if p.get("uncommitted_changes") else ""
    load = " ".join(f"{x:.2f}" for x in p["load_average"]) if p.get("load_average") else "unknown"
    machine = p["machine"]
    return f"{code}{dirty}, {p['date']}, {machine['cores']} cores {machine['cpu']}, load average {load}"
