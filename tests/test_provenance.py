"""The provenance record: the commit in a git checkout, the installed version elsewhere, never a crash or a hang."""

from __future__ import annotations

import re
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from rag.core import provenance as prov


@pytest.mark.skipif(not prov.in_checkout(), reason="this copy of the code is not a git checkout")
def test_a_checkout_gives_its_commit() -> None:
    p = prov.provenance()
    assert re.fullmatch(r"[0-9a-f]{40}", p["commit"]) and isinstance(p["uncommitted_changes"], bool)
    assert p["machine"]["cores"] >= 1 and len(p["load_average"]) == 3
    assert prov.summary(p).startswith(f"commit {p['commit'][:12]}")


def test_outside_a_checkout_the_installed_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(prov, "ROOT", tmp_path)
    p = prov.provenance()
    assert p["commit"] is None and p["version"] == metadata.version("rag-stack")
    assert prov.summary(p).startswith(f"version {p['version']}, ")


def test_a_folder_inside_another_repository_is_not_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed package under a venv that sits in some repository must not report that repository's commit."""
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    inner = tmp_path / "venv" / "site-packages"
    inner.mkdir(parents=True)
    monkeypatch.setattr(prov, "ROOT", inner)
    assert prov.provenance()["commit"] is None


@pytest.mark.parametrize("failure", [FileNotFoundError("git"), subprocess.TimeoutExpired("git", prov.GIT_TIMEOUT_S)])
def test_no_git_or_a_hanging_git_gives_the_version(failure: Exception, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(*args: Any, **kwargs: Any) -> None:
        assert kwargs["timeout"] == prov.GIT_TIMEOUT_S
        raise failure

    monkeypatch.setattr(prov.subprocess, "run", run)
    p = prov.provenance()
    assert p["commit"] is None and p["version"]


def test_an_unknown_package_and_no_load_average(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_load() -> tuple[float, float, float]:
        raise OSError("no load average here")

    monkeypatch.setattr(prov, "ROOT", tmp_path)
    monkeypatch.setattr(prov, "DISTRIBUTION", "not-installed-anywhere")
    monkeypatch.setattr(prov.os, "getloadavg", no_load)
    p = prov.provenance()
    assert p["version"] == "unknown" and p["load_average"] is None
    assert prov.summary(p).endswith("load average unknown")
