"""The supervisor behind `rag up` (`rag.deploy.launcher`): no orphans however it dies, stop signals
honoured at any moment of start-up, a dead part restarted with backoff, repeated crashes stop the stack.

The parts here are small real servers (Python's http.server answering /health) so that each case runs
in seconds; the whole stack under `rag up` is covered by tests/test_launcher.py.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.servers import free_port

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[1]

PART = r"""
import http.server, os, subprocess, sys, threading, time
port, delay, crash_after, grandchild = int(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3]), sys.argv[4] == "1"
if grandchild:
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
time.sleep(delay)
class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200); self.end_headers(); self.wfile.write(b"ok")
    def log_message(self, *args):
        pass
server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
server.allow_reuse_address = True
threading.Thread(target=server.serve_forever, daemon=True).start()
print(f"part serving on {port}", flush=True)
if crash_after > 0:
    time.sleep(crash_after)
    print("boom: the part hit a fatal error", flush=True)
    os._exit(3)
while True:
    time.sleep(60)
"""

DRIVER = r"""
import json, sys
from pathlib import Path
from rag.deploy.launcher import LaunchError, Part, RestartPolicy, Stack, Stopped, stop_on_signals
stop_on_signals()
cfg = json.loads(sys.argv[1])
parts = [Part(p["name"], p["command"], p["health"], p["port"], "127.0.0.1", "-", Path(p["log"]), ready_timeout_s=p["ready"])
         for p in cfg["parts"]]
stack = Stack(parts, echo=lambda line: print(line, flush=True), pid_file=Path(cfg["pid_file"]),
              policy=RestartPolicy(**cfg["policy"]))
try:
    stack.start()
    print("started", flush=True)
    stack.watch(poll_s=0.1)
except Stopped as exc:
    print("stopped", exc, flush=True)
except LaunchError as exc:
    print("error:", exc.message, flush=True)
    sys.exit(1)
"""


class Supervisor:
    """The driver above as a process, with its parts' specs."""

    def __init__(self, tmp: Path, parts: list[dict], policy: dict | None = None) -> None:
        (tmp / "part.py").write_text(PART)
        (tmp / "driver.py").write_text(DRIVER)
        self.tmp = tmp
        self.parts = parts
        cfg = {"parts": parts, "pid_file": str(tmp / "run" / "up.json"), "policy": policy or {}}
        env = dict(os.environ, PYTHONPATH=str(REPO))
        self.proc = subprocess.Popen(
            [sys.executable, str(tmp / "driver.py"), json.dumps(cfg)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.lines: list[str] = []

    def read_until(self, text: str, timeout: float = 30) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            self.lines.append(line)
            if text in line:
                return line
        raise AssertionError(f"no {text!r} in:\n{''.join(self.lines)}")

    def finish(self, timeout: float = 30) -> str:
        out, _ = self.proc.communicate(timeout=timeout)
        return "".join(self.lines) + out


def part(
    tmp: Path, name: str, *, delay: float = 0.0, crash_after: float = 0.0, grandchild: bool = False, ready: float = 30.0
) -> dict:
    port = free_port()
    return {
        "name": name,
        "port": port,
        "health": f"http://127.0.0.1:{port}/health",
        "ready": ready,
        "log": str(tmp / "logs" / f"{name}.log"),
        "command": [
            sys.executable,
            str(tmp / "part.py"),
            str(port),
            str(delay),
            str(crash_after),
            "1" if grandchild else "0",
        ],
    }


def descendants(pid: int) -> set[int]:
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        parent = frontier.pop()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) not in found:
                try:
                    ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
                except OSError:
                    continue
                if ppid == parent:
                    found.add(int(entry.name))
                    frontier.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: set[int], timeout: float = 5.0) -> set[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(alive(p) for p in pids):
        time.sleep(0.05)
    return {p for p in pids if alive(p)}


def healthy(spec: dict) -> bool:
    try:
        return httpx.get(spec["health"], timeout=2).status_code == 200
    except httpx.TransportError:
        return False


def test_kill_9_of_the_supervisor_at_random_moments_leaves_no_orphans(tmp_path: Path):
    rng = random.Random(14)
    for moment in [rng.uniform(0.2, 3.0) for _ in range(4)] + [None]:
        specs = [part(tmp_path, "first"), part(tmp_path, "second", delay=1.0), part(tmp_path, "third", delay=1.0)]
        sup = Supervisor(tmp_path, specs)
        if moment is None:
            sup.read_until("started")  # and once while running
        else:
            time.sleep(moment)
        children = descendants(sup.proc.pid)
        sup.proc.kill()
        sup.proc.wait()
        assert not wait_gone(children), f"orphans after kill -9 at {moment} s"
        assert not wait_gone(descendants(1) & children)
    # The next start works: the ports are free again.
    specs = [part(tmp_path, "again")]
    sup = Supervisor(tmp_path, specs)
    sup.read_until("started")
    sup.proc.send_signal(signal.SIGTERM)
    assert "stopped SIGTERM" in sup.finish()


def test_the_next_start_stops_what_a_killed_supervisor_left_in_its_process_groups(tmp_path: Path):
    specs = [part(tmp_path, "parent", grandchild=True)]
    sup = Supervisor(tmp_path, specs)
    sup.read_until("started")
    family = descendants(sup.proc.pid)
    assert len(family) == 2  # the part and the child it started itself
    sup.proc.kill()
    sup.proc.wait()
    time.sleep(0.5)
    left = {p for p in family if alive(p)}
    assert left, "the part's own child survives a kill -9 of the supervisor (only the part gets the death signal)"
    sup = Supervisor(tmp_path, [part(tmp_path, "next")])
    sup.read_until("started")
    assert not wait_gone(left), "the next start stopped the leftover group"
    assert any("left by a previous rag up" in line for line in sup.lines)
    sup.proc.send_signal(signal.SIGINT)
    sup.finish()


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_during_start_up_stops_everything_within_seconds(tmp_path: Path, signum: int):
    specs = [part(tmp_path, "ready"), part(tmp_path, "slow", delay=120.0, ready=300.0)]
    sup = Supervisor(tmp_path, specs)
    sup.read_until("ready ")
    time.sleep(0.5)
    children = descendants(sup.proc.pid)
    assert len(children) == 2
    sent = time.monotonic()
    sup.proc.send_signal(signum)
    output = sup.finish(timeout=20)
    assert time.monotonic() - sent < 15
    assert f"stopped {signal.Signals(signum).name}" in output
    assert not wait_gone(children)


@pytest.mark.parametrize(
    ("signum", "said"), [(signal.SIGKILL, "SIGKILL"), (signal.SIGSEGV, "SIGSEGV (segmentation fault)")]
)
def test_a_part_that_dies_is_restarted_with_backoff_and_its_signal_named(tmp_path: Path, signum: int, said: str):
    specs = [part(tmp_path, "backend"), part(tmp_path, "api")]
    sup = Supervisor(tmp_path, specs, policy={"first_delay_s": 0.5})
    sup.read_until("started")
    first = [p for p in descendants(sup.proc.pid) if str(specs[0]["port"]) in Path(f"/proc/{p}/cmdline").read_text()]
    os.kill(first[0], signum)
    assert "restarting in 0.5 s" in sup.read_until(f"backend was killed by {said}")
    sup.read_until("backend ready again")
    assert healthy(specs[0]) and healthy(specs[1])
    os.kill(sup.proc.pid, signal.SIGTERM)
    sup.finish()


def test_repeated_crashes_stop_the_stack_with_the_last_log_lines(tmp_path: Path):
    specs = [part(tmp_path, "steady"), part(tmp_path, "flaky", crash_after=0.5)]
    sup = Supervisor(tmp_path, specs, policy={"first_delay_s": 0.1, "max_restarts": 2})
    sup.read_until("started")
    children = descendants(sup.proc.pid)
    output = sup.finish(timeout=60)
    assert sup.proc.returncode == 1
    assert "flaky crashed 3 times in a row" in output and "boom: the part hit a fatal error" in output
    assert "restart 1 of 2" in output and "restart 2 of 2" in output
    assert not wait_gone(children)
    assert not healthy(specs[0]), "the steady part was stopped too"


DIES_BY_SIGILL = "import os, signal; print('llama threadpool init', flush=True); os.kill(os.getpid(), signal.SIGILL)"


def test_a_part_killed_during_start_up_is_named_with_its_signal_and_the_remedy(tmp_path: Path):
    spec = part(tmp_path, "llama-server")
    spec["command"] = [sys.executable, "-c", DIES_BY_SIGILL]
    sup = Supervisor(tmp_path, [spec])
    output = sup.finish()
    assert sup.proc.returncode == 1
    error = next(line for line in output.splitlines() if line.startswith("error:"))
    assert "llama-server was killed by SIGILL (illegal instruction) during start-up — " in error
    assert "bash scripts/build-llama-server.sh" in error and "LLAMA_ARG_REPACK=0" in error
    assert "llama threadpool init" in output
