"""`rag up` puts the embedder on the GPU only when the planner leaves it room beside llama-server."""

from __future__ import annotations

from pathlib import Path

import pytest

from rag.core.config import Settings
from rag.deploy.launcher import plan_parts
from rag.deploy.model_shapes import qwen35_model
from rag.deploy.modellock import ensure_bundled_generator
from rag.deploy.placement import embedder_placement, readable_gguf


def test_the_shipped_v100_profile_keeps_the_embedder_on_the_cpu() -> None:
    placed = embedder_placement(Settings(llm_profile="v100-16g"), qwen35_model(ftype="Q4_K_S"))
    assert placed.device == "cpu"
    assert "Tesla V100" in placed.reason and "embedder needs" in placed.reason


def test_a_small_generator_on_the_v100_leaves_room_for_the_embedder() -> None:
    gemma = readable_gguf(ensure_bundled_generator(Settings()))
    assert gemma is not None
    assert embedder_placement(Settings(llm_profile="v100-16g"), gemma).device == "cuda"


def test_an_unreadable_generator_is_not_trusted_to_leave_room(tmp_path: Path) -> None:
    truncated = tmp_path / "truncated.gguf"
    truncated.write_bytes(b"GGUF\x03\x00\x00\x00")
    for path in (tmp_path / "absent.gguf", truncated):
        assert readable_gguf(path) is None
        assert embedder_placement(Settings(llm_profile="v100-16g"), path).device == "cpu"


def test_the_cpu_profile_leaves_the_choice_to_the_embedding_server() -> None:
    assert embedder_placement(Settings(), None).device is None


def test_an_explicit_device_wins() -> None:
    placed = embedder_placement(Settings(llm_profile="v100-16g", embed_device="cuda:1"), None)
    assert placed == embedder_placement(Settings(embed_device="cuda:1"), None)
    assert placed.device == "cuda:1"


def test_rag_up_starts_the_embedder_with_the_planned_device(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_LLM_PROFILE", "v100-16g")
    monkeypatch.setenv("RAG_LLM_SERVER_BIN", "/bin/true")
    monkeypatch.setenv("RAG_LLM_MODEL_PATH", str(tmp_path / "Qwen3.6-27B-Q4_K_S.gguf"))
    embedder = next(part for part in plan_parts(Settings()) if part.name == "embedder")
    assert embedder.env == {"RAG_EMBED_DEVICE": "cpu"}
