"""scripts/build-llama-server.sh counts a binary as built once it has served a short completion: one that
dies (SIGILL on an AMX CPU, say) is passed over for the next form of the build, and a cache hit
re-runs the check only when the binary, the CPU or the kernel changed. Stand-in binaries, no compile."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "build-llama-server.sh"

# A llama-server that answers --version and then, run for real, serves /completion (or kills itself).
STAND_IN = r"""#!{python}
import http.server, json, os, signal, sys
if "--version" in sys.argv:
    print("version: 1 (stand-in)"); sys.exit(0)
with open(os.environ["STAND_IN_RUNS"], "a") as runs:
    runs.write(sys.argv[0] + "\n")
if {dies}:
    print("llama threadpool init", flush=True)
    os.kill(os.getpid(), signal.SIGILL)
port = int(sys.argv[sys.argv.index("--port") + 1])
class Completion(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        answer = json.dumps({{"content": " ok" * body["n_predict"]}}).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(answer))); self.end_headers()
        self.wfile.write(answer)
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", port), Completion).serve_forever()
"""


def stand_in(path: Path, *, dies: bool) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(STAND_IN.format(python=sys.executable, dies=dies))
    path.chmod(0o755)
    return path


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF")
    return dict(
        os.environ,
        RAG_CACHE_DIR=str(tmp_path / "cache"),
        LLAMA_CHECK_MODEL=str(model),
        LLAMA_CPU_FORM="native portable",
        STAND_IN_RUNS=str(tmp_path / "runs"),
        PIP_INDEX_URL="http://127.0.0.1:9/simple",  # a form that would need a compile fails at the fetch
    )


def build(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", str(SCRIPT), *args], env=env, capture_output=True, text=True, timeout=120)


def form_dirs(env: dict[str, str]) -> dict[str, Path]:
    lines = build(env, "--forms").stdout.splitlines()
    return {form: Path(folder) for form, folder in (line.split(" ", 1) for line in lines)}


def runs(env: dict[str, str]) -> list[str]:
    path = Path(env["STAND_IN_RUNS"])
    return path.read_text().splitlines() if path.exists() else []


def test_the_check_names_the_signal_of_a_binary_that_dies_by_sigill(tmp_path: Path, env: dict[str, str]):
    done = build(env, "--check", str(stand_in(tmp_path / "llama-server", dies=True)))
    assert done.returncode == 1
    assert "was killed by SIGILL (illegal instruction) on a test-run of model.gguf" in done.stderr
    assert "llama threadpool init" in done.stderr


def test_the_check_passes_a_binary_that_serves_four_tokens(tmp_path: Path, env: dict[str, str]):
    done = build(env, "--check", str(stand_in(tmp_path / "llama-server", dies=False)))
    assert done.returncode == 0, done.stderr
    assert "serves" in done.stdout


def test_a_cached_build_that_dies_is_passed_over_for_the_next_form_that_runs(env: dict[str, str]):
    dirs = form_dirs(env)
    stand_in(dirs["native"] / "bin" / "llama-server", dies=True)
    portable = stand_in(dirs["portable"] / "bin" / "llama-server", dies=False)
    done = build(env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == str(portable)
    assert "was killed by SIGILL (illegal instruction)" in done.stderr
    assert "the native build does not run here" in done.stderr


def test_a_cache_hit_re_runs_the_check_only_when_the_binary_changed(env: dict[str, str]):
    binary = stand_in(form_dirs(env)["native"] / "bin" / "llama-server", dies=False)
    assert build(env).stdout.splitlines()[-1] == str(binary)
    assert build(env).stdout.splitlines()[-1] == str(binary)
    assert len(runs(env)) == 1, "the second cache hit remembered the first one's test-run"
    binary.write_text(binary.read_text() + "# another build\n")
    assert build(env).returncode == 0
    assert len(runs(env)) == 2


def test_a_failed_test_run_is_remembered_too(env: dict[str, str]):
    dirs = form_dirs(env)
    stand_in(dirs["native"] / "bin" / "llama-server", dies=True)
    stand_in(dirs["portable"] / "bin" / "llama-server", dies=False)
    build(env)
    again = build(env)
    assert again.returncode == 0
    assert "failed its test-run here before" in again.stderr and "SIGILL" in again.stderr
    assert len(runs(env)) == 2, "each binary ran once"


def test_an_amx_cpu_tries_the_fixed_amx_kernels_first_and_native_keeps_its_cache_folder(env: dict[str, str]):
    env.pop("LLAMA_CPU_FORM")
    dirs = form_dirs(env)
    amx = "amx_tile" in Path("/proc/cpuinfo").read_text()
    assert list(dirs) == (["amxfix", "noamx", "portable"] if amx else ["native", "portable"])
    sha = next(line for line in (REPO / "models.lock").read_text().splitlines() if line.startswith("sha256 = "))
    native = next(iter(dirs.values())).name.removesuffix("-amxfix")
    assert native.startswith(sha.split('"')[1][:16] + "-cpu-") and len(native.rsplit("-", 1)[1]) == 12


def test_a_second_build_waits_for_the_one_running_and_takes_what_it_built(env: dict[str, str]):
    cache = Path(env["RAG_CACHE_DIR"])
    cache.mkdir(parents=True)
    with (cache / "build.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        second = subprocess.Popen(
            ["bash", str(SCRIPT)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        time.sleep(2)
        binary = stand_in(form_dirs(env)["native"] / "bin" / "llama-server", dies=False)  # the first build's result
    out, err = second.communicate(timeout=60)
    assert second.returncode == 0, err
    assert "another build of llama-server is running here; waiting for it" in err
    assert out.splitlines()[-1] == str(binary)
