"""The question sets a benchmark reads: the repository's own (tests/data/), or the whole sets by path.

The numbers in bench/README.md were measured on the whole sets: SQuAD v1.1 dev (48 articles, 4.8 MB) and
the CMRC 2018 trial set. The repository keeps only the first 6 SQuAD dev articles (and the whole CMRC trial
set), so a benchmark runs on those unless `--squad PATH` (`--cmrc PATH`) names another file in SQuAD's JSON
format; it says at the start which files it reads.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"
DEFAULTS = {"squad": DATA / "squad-v1.1-dev-slice.json", "cmrc": DATA / "cmrc2018-trial.json"}
HELP = {
    "squad": "SQuAD v1.1 dev in SQuAD's JSON format [default: tests/data's first 6 articles; bench/README.md's "
    "numbers come from the whole dev set]",
    "cmrc": "the CMRC 2018 trial set in SQuAD's JSON format [default: tests/data's copy]",
}
_chosen = dict(DEFAULTS)


def add_options(parser: argparse.ArgumentParser, *names: str) -> None:
    """`--squad PATH` and/or `--cmrc PATH`; call `use(args)` after parsing."""
    for name in names:
        parser.add_argument(f"--{name}", type=Path, default=DEFAULTS[name], metavar="PATH", help=HELP[name])


def use(args: argparse.Namespace) -> None:
    """Take the paths the options name, refuse a missing file, and say which files are read."""
    for name in DEFAULTS:
        path = getattr(args, name, None)
        if path is None:
            continue
        if not path.is_file():
            sys.exit(f"--{name} {path}: no such file")
        _chosen[name] = path
        print(f"# {name}: {path}{' (from tests/data)' if path == DEFAULTS[name] else ''}", flush=True)


def path(name: str) -> Path:
    """The file of set `name` ("squad" or "cmrc") this run reads."""
    return _chosen[name]


def read(name: str) -> dict[str, Any]:
    """Set `name` as parsed JSON."""
    return json.loads(path(name).read_text(encoding="utf-8"))
