"""Where a benchmark's numbers come from: the commit, the date, the machine and its load.

Every results file a benchmark writes carries `provenance()` (JSON files under the key "provenance";
printed reports, which are kept with `tee`, start with `header()`), so a number quoted in a README can be
traced to the code and the conditions that produced it.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import subprocess
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return done.stdout.strip()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def provenance() -> dict[str, Any]:
    """The commit (with uncommitted changes flagged), the UTC date, the machine and its load average now."""
    return {
        "commit": _git("rev-parse", "HEAD"),
        "uncommitted_changes": _git("status", "--porcelain", "--untracked-files=no") != "",
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cores": os.cpu_count(), "cpu": _cpu_model(), "system": platform.platform()},
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }


def header() -> str:
    """One line for the top of a printed report."""
    p = provenance()
    dirty = " (with uncommitted changes)" if p["uncommitted_changes"] else ""
    load = " ".join(f"{x:.2f}" for x in p["load_average"])
    return (f"# commit {p['commit'][:12]}{dirty}, {p['date']}, {p['machine']['cores']} cores "
            f"{p['machine']['cpu']}, load average {load}")


def with_provenance(results: Any) -> dict[str, Any]:
    """`results` with the provenance added: a dict gains the key, anything else goes under "results"."""
    if isinstance(results, dict):
        return {"provenance": provenance(), **results}
    return {"provenance": provenance(), "results": results}


def write_json(path: Path, results: Any, **dump: Any) -> None:
    """Write `results` as JSON with the provenance, creating the folder."""
    path.parent.mkdir(parents=True, exist_ok=True)
    dump.setdefault("indent", 2)
    path.write_text(json.dumps(with_provenance(results), **dump) + "\n", encoding="utf-8")
