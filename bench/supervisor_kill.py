"""`rag up` under kill -9: orphans left after killing it at random moments, and the time a killed
llama-server takes to come back while the stack runs.

Each round starts the real stack (llama-server, embedding server, API) in a fresh data directory,
kills `rag up` with SIGKILL at a random moment of start-up or while running, and counts the processes
it had started that are still alive 5 s later. Then one last `rag up` must come up on the same ports;
in it, llama-server is killed with SIGKILL and the time until rag up reports it ready again is printed.

    PYTHONPATH=. .venv/bin/python bench/supervisor_kill.py [--rounds 10] [--seed 14]
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._provenance import header  # noqa: E402
from bench._servers import server_env  # noqa: E402
from tests.servers import free_port  # noqa: E402
from tests.test_supervisor import alive, descendants  # noqa: E402


def rag_up(data_dir: Path, ports: dict[str, int]) -> subprocess.Popen[str]:
    env = server_env(
        data_dir,
        RAG_LLM_URL=f"http://127.0.0.1:{ports['llm']}",
        RAG_EMBED_URL=f"http://127.0.0.1:{ports['embed']}",
        RAG_API_PORT=str(ports["api"]),
    )
    return subprocess.Popen(
        [sys.executable, "-m", "rag.cli", "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def wait_line(proc: subprocess.Popen[str], text: str, timeout: float) -> float | None:
    started = time.monotonic()
    while time.monotonic() - started < timeout:
        line = proc.stdout.readline()
        if not line:
            return None
        if text in line:
            return time.monotonic() - started
    return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seed", type=int, default=14)
    args = parser.parse_args()
    print(header(), flush=True)
    rng = random.Random(args.seed)
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}")
    with tempfile.TemporaryDirectory() as tmp:
        data_dir = Path(tmp)
        ports = {"llm": free_port(), "embed": free_port(), "api": free_port()}
        total_orphans = 0
        for round_ in range(args.rounds):
            proc = rag_up(data_dir, ports)
            running = rng.random() < 0.3
            if running:
                wait_line(proc, "open ", 300)
                time.sleep(rng.uniform(0, 3))
                moment = "running"
            else:
                delay = rng.uniform(0.3, 25)
                time.sleep(delay)
                moment = f"{delay:5.1f} s into start-up"
            family = descendants(proc.pid)
            proc.kill()
            proc.wait()
            time.sleep(5)
            orphans = [p for p in family if alive(p)]
            total_orphans += len(orphans)
            print(f"round {round_ + 1:2}: kill -9 {moment:<24} {len(family)} processes started, {len(orphans)} left")
            for pid in orphans:  # do not let one failed round spoil the next
                os.kill(pid, signal.SIGKILL)
        proc = rag_up(data_dir, ports)
        ready = wait_line(proc, "open ", 300)
        print(
            f"orphans in all: {total_orphans}; the next rag up was ready in {ready:.1f} s"
            if ready
            else "the next rag up failed"
        )
        llama = next(p for p in descendants(proc.pid) if "llama-server" in Path(f"/proc/{p}/cmdline").read_text())
        os.kill(llama, signal.SIGKILL)
        back = wait_line(proc, "llama-server ready again", 120)
        print(f"llama-server killed with SIGKILL: back in {back:.1f} s" if back else "llama-server did not come back")
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}")


if __name__ == "__main__":
    main()
