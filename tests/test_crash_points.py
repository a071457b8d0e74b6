"""kill -9 at random (seeded) points of an ingest, through the CLI and through the API: after each
restart every document agrees in the catalog, the record, Chroma and the BM25 index, and after the
re-run every file is indexed exactly once. `bench/crash_points.py` runs the same at 500 files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.crash_points import PATHS, run_series

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FILES = 60
KILLS = 3
SEED = 13


@pytest.mark.parametrize("path", PATHS)
def test_kill_at_random_points_then_rerun(path: str, ingest_env: dict[str, str], tmp_path: Path) -> None:
    result = run_series(path, FILES, KILLS, SEED, ingest_env, tmp_path)
    for kill in result.kills:
        assert not kill.problems, kill
    assert sum(k.at is not None for k in result.kills) >= KILLS - 1, result.kills  # the kills hit the ingest
    assert not result.final, result.final
    assert result.final_documents == FILES
