"""Settings fail fast with a one-line reason."""

from pathlib import Path

import pytest
from pydantic import ValidationError

from rag.core.config import Settings, settings_error_line


def test_defaults_are_the_embedded_stack():
    settings = Settings()
    assert settings.context_budget == 4096
    assert settings.answer_reserve == 512
    assert settings.chroma_mode == "embedded"
    assert settings.llm_port == 8081 and settings.embed_port == 8082


@pytest.mark.parametrize(
    "env, message",
    [
        ({"RAG_LLM_URL": "localhost:8081"}, "RAG_LLM_URL"),
        ({"RAG_EMBED_URL": "ftp://x"}, "RAG_EMBED_URL"),
        ({"RAG_CONTEXT_BUDGET": "1000", "RAG_ANSWER_RESERVE": "1000"}, "answer_reserve"),
        ({"RAG_API_PORT": "70000"}, "RAG_API_PORT"),
        ({"RAG_COLLECTION": "x"}, "RAG_COLLECTION"),
        ({"RAG_CHROMA_MODE": "server"}, "RAG_CHROMA_URL"),
        ({"RAG_CHUNK_TOKENS": "100", "RAG_CHUNK_OVERLAP": "100"}, "chunk_overlap"),
    ],
)
def test_nonsense_is_rejected_with_a_reason(monkeypatch, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValidationError) as err:
        Settings()
    line = settings_error_line(err.value)
    assert "\n" not in line and message in line


def test_env_file_is_read(tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("RAG_TOP_K=3\n")
    monkeypatch.chdir(tmp_path)
    assert Settings().top_k == 3


def test_cli_reports_bad_settings_in_one_line(monkeypatch):
    from click.testing import CliRunner

    from rag.cli import cli

    monkeypatch.setenv("RAG_LLM_URL", "nope")
    result = CliRunner().invoke(cli, ["models", "prepare"])
    assert result.exit_code != 0
    assert "invalid settings: RAG_LLM_URL" in result.output


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("http://127.0.0.1:8081,localhost:8083", "is not an http(s) URL"),
        ("http://127.0.0.1:8081, http://127.0.0.1:8081/", "names one server twice"),
    ],
)
def test_a_pool_of_urls_is_checked_url_by_url(monkeypatch, value, message):
    monkeypatch.setenv("RAG_LLM_URL", value)
    with pytest.raises(ValidationError) as caught:
        Settings()
    assert "RAG_LLM_URL" in settings_error_line(caught.value) and message in settings_error_line(caught.value)


def test_a_pool_keeps_its_order_and_one_url_stays_one():
    pool = Settings(llm_url="http://a:1, http://b:2/", embed_url="http://e:3,http://f:4")
    assert pool.llm_urls == ["http://a:1", "http://b:2"] and pool.embed_urls == ["http://e:3", "http://f:4"]
    assert Settings().llm_urls == ["http://127.0.0.1:8081"]


def test_the_default_embedder_is_the_multilingual_one(monkeypatch):
    from rag.core.config import CALIBRATED, MULTILINGUAL_E5

    monkeypatch.delenv("RAG_EMBED_MODEL")  # the suite's own choice (tests/conftest.py)
    settings = Settings()
    assert settings.embed_model == MULTILINGUAL_E5
    assert settings.hybrid_dense_weight_cjk == CALIBRATED[MULTILINGUAL_E5]["hybrid_dense_weight_cjk"] > 0


def test_the_weights_and_floors_follow_the_embedder_unless_set(isolated_env, monkeypatch):
    from rag.core.config import CALIBRATED, MULTILINGUAL_E5

    assert Settings().hybrid_dense_weight_cjk == CALIBRATED["all-MiniLM-L6-v2"]["hybrid_dense_weight_cjk"]
    monkeypatch.setenv("RAG_EMBED_MODEL", MULTILINGUAL_E5)
    e5 = Settings()
    assert {name: getattr(e5, name) for name in CALIBRATED[MULTILINGUAL_E5]} == CALIBRATED[MULTILINGUAL_E5]
    monkeypatch.setenv("RAG_MIN_RELEVANCE", "0.5")
    assert Settings().min_relevance == 0.5  # a setting given explicitly wins
    assert (
        Settings(embed_model="another-model").hybrid_dense_weight
        == CALIBRATED["all-MiniLM-L6-v2"]["hybrid_dense_weight"]
    )


def test_models_live_once_per_machine_in_the_cache_whatever_the_data_dir(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAG_CACHE_DIR", str(tmp_path / "cache"))
    one, two = Settings(data_dir=tmp_path / "one"), Settings(data_dir=tmp_path / "two")
    assert one.cache_dir == tmp_path / "cache"
    assert one.models_path == two.models_path == tmp_path / "cache" / "models"
    (tmp_path / "one" / "models").mkdir(parents=True)  # a data dir's own folder from before is not read
    assert Settings(data_dir=tmp_path / "one").models_path == tmp_path / "cache" / "models"
    assert Settings(models_dir=tmp_path / "mine").models_path == tmp_path / "mine"


def test_ragstack_variables_win_over_rag_ones_that_other_programs_share(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("RAG_TOP_K", "3")  # Open WebUI's own RAG_TOP_K, in a shared environment
    assert Settings().top_k == 3
    monkeypatch.setenv("RAGSTACK_TOP_K", "7")
    assert Settings().top_k == 7
