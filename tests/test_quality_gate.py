"""The retrieval quality gate: `rag eval` on fixed SQuAD and CMRC slices against committed baselines.

Each slice is ingested and searched with the real embedding server, Chroma and the lexical index; a
metric more than MAX_DROP below its baseline (tests/baselines/, see the README there) fails the test.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from click.testing import CliRunner

from rag.core.config import get_settings
from rag.eval.cli import eval_command
from tests.conftest import SUITE_EMBEDDER
from tests.data import CMRC, SQUAD
from tests.servers import Server

BASELINES = Path(__file__).resolve().parent / "baselines"
MAX_DROP = 0.01  # any question of 60 lost (0.017) fails: the runs are deterministic
SLICES = [(SQUAD, "squad-retrieval.json"), (CMRC, "cmrc-retrieval.json")]


@pytest.mark.integration
@pytest.mark.parametrize(("dataset", "baseline"), SLICES, ids=["squad", "cmrc"])
def test_retrieval_does_not_fall_below_its_baseline(
    dataset: Path, baseline: str, embedding_server: Server, tmp_path: Path
) -> None:
    path = BASELINES / baseline
    limit = json.loads(path.read_text())["dataset"]["limit"]
    env: dict[str, str | None] = {k: None for k in os.environ if k.startswith("RAG_")}
    env.update(RAG_DATA_DIR=str(tmp_path / "data"), RAG_EMBED_URL=embedding_server.url, RAG_EMBED_MODEL=SUITE_EMBEDDER)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(
            eval_command,
            [
                str(dataset),
                "--limit",
                str(limit),
                "--json",
                "--baseline",
                str(path),
                "--max-drop",
                str(MAX_DROP),
            ],
            env=env,
        )
    finally:
        get_settings.cache_clear()
    assert "not the same questions" not in result.stderr, result.stderr
    assert result.exit_code == 0, result.stderr + repr(result.exception)
    assert "gate passed: none of 12 metrics" in result.stderr, result.stderr


def test_the_baselines_hold_what_the_gate_compares() -> None:
    for _, baseline in SLICES:
        data = json.loads((BASELINES / baseline).read_text())
        assert data["config"]["modes"] == ["dense", "lexical", "hybrid"] and data["answers"] is None
        assert len(data["scores"]) == 12 and data["dataset"]["seed"] == 0
