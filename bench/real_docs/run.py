"""The benchmark of the documents people keep: Debian's man pages (English and Chinese), its docs (.gz,
HTML), Node's HTML tables, HTML and DOCX tables, PDFs, scans; follow-ups and questions no document covers.

One command, through the real stack: it starts `rag up` in a fresh data dir (ports of its own), indexes
bench/real_docs/docs/ with `ingest --recursive --server`, asks every question of questions.json through
`POST /v1/chat` (a follow-up after its first turn, in one conversation: the first turn's real answer is
the history), scores the answers (bench/real_docs/scoring.py) and prints one row per kind of document or
question. The results, with their provenance, go to `--out`.json and .txt.

    .venv/bin/python -m bench.real_docs.run                                   # the default generator
    .venv/bin/python -m bench.real_docs.run --generator smollm2-135m-instruct # the instruct option
    .venv/bin/python -m bench.real_docs.run --limit 12                        # a quick look: 12 questions, all kinds
    .venv/bin/python -m bench.real_docs.run --kinds man-zh,uncovered --out /tmp/zh

The model settings of the environment are passed on (bench/_servers.py), so `RAG_LLM_MODEL_PATH` or
`RAG_LLM_PROMPT_STYLE` measure what they name; the data dir, ports and collection are the run's own.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from bench._provenance import header, provenance, write_report
from bench._servers import server_env
from bench.real_docs.scoring import DOCS, KINDS, Question, Verdict, failed, judge, read_questions, summary, table

ROOT = Path(__file__).resolve().parents[2]
COLLECTION = "real-docs"
REQUEST_TIMEOUT_S = 600.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stack:
    """`rag up` in `data_dir` on ports of its own, stopped as Ctrl-C stops it."""

    def __init__(self, data_dir: Path, generator: str) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = server_env(
            data_dir,
            RAG_API_PORT=str(self.port),
            RAG_LLM_URL=f"http://127.0.0.1:{free_port()}",
            RAG_EMBED_URL=f"http://127.0.0.1:{free_port()}",
            RAG_GENERATOR=generator,
            PYTHONPATH=str(ROOT),
        )
        self.log = data_dir / "rag-up.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float) -> dict[str, Any]:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "rag.cli", "up"], env=self.env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"rag up ended ({self.process.returncode}); its log:\n{self.tail()}")
            try:
                health = httpx.get(f"{self.url}/health", timeout=5)
                if health.status_code == 200:
                    return dict(health.json())
            except httpx.HTTPError:
                pass
            time.sleep(2)
        raise RuntimeError(f"the stack was not healthy in {timeout_s:.0f} s; rag up's log:\n{self.tail()}")

    def tail(self, lines: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:]) if self.log.exists() else ""

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def ingest(stack: Stack) -> dict[str, Any]:
    """Index docs/ through the running API, as a user does; the CLI's JSON summary."""
    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", str(DOCS), "--recursive", "--collection", COLLECTION]
        + ["--server", stack.url, "--json"],
        env=stack.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    try:
        report = dict(json.loads(done.stdout))
    except json.JSONDecodeError:
        raise RuntimeError(f"ingest failed ({done.returncode}):\n{done.stderr[-3000:]}") from None
    report["exit_status"] = done.returncode
    return report


def ask(client: httpx.Client, messages: list[dict[str, str]]) -> dict[str, Any]:
    reply = client.post("/v1/chat", json={"messages": messages, "collection": COLLECTION, "stream": False})
    reply.raise_for_status()
    return dict(reply.json())


def answer(client: httpx.Client, q: Question) -> Verdict:
    """Ask `q` (its earlier turns first, each answered for real) and judge the last answer."""
    messages: list[dict[str, str]] = []
    started = time.perf_counter()
    try:
        for turn in q.history:
            messages.append({"role": "user", "content": turn})
            messages.append({"role": "assistant", "content": ask(client, messages)["answer"]})
        started = time.perf_counter()
        reply = ask(client, [*messages, {"role": "user", "content": q.question}])
    except httpx.HTTPStatusError as exc:  # the API's own error body says why (a 503's reason)
        reason = f"{exc.response.status_code} {exc.response.text[:500]}"
        return failed(q, f"HTTPStatusError: {reason}", time.perf_counter() - started)
    except httpx.HTTPError as exc:
        return failed(q, f"{type(exc).__name__}: {exc}", time.perf_counter() - started)
    return judge(q, reply, time.perf_counter() - started, history=messages)


def pick(questions: Sequence[Question], kinds: set[str] | None, limit: int | None) -> list[Question]:
    """The questions of `kinds`, the first of each kind in turn (so a run cut short by `limit` or the time
    budget has seen every kind), at most `limit` of them."""
    chosen = [q for q in questions if kinds is None or q.kind in kinds]
    by_kind: dict[str, list[Question]] = defaultdict(list)
    for q in chosen:
        by_kind[q.kind].append(q)
    interleaved = [q for i in range(len(chosen)) for kind in KINDS for q in by_kind[kind][i : i + 1]]
    return interleaved[:limit]


def report_text(result: dict[str, Any]) -> str:
    lines = [header(), f"# command: {result['command']}", f"# generator: {result['generator']}"]
    lines.append(f"# load average at start {result['load_start']}, at end {result['load_end']}")
    lines.append(f"# {result['started']} .. {result['ended']} ({result['wall_s']} s)")
    ing = result["ingest"]
    lines.append(f"# ingest: files {ing.get('files')}, {ing.get('chunks')} chunks in {ing.get('seconds')} s")
    lines += [
        f"#   failed: {r.get('source')}: {r.get('error') or r.get('reason')}"
        for r in ing.get("results", [])
        if r.get("status") == "failed"
    ]
    if result["not_asked"]:
        lines.append(f"# {result['asked']} questions asked; not asked (time budget): {len(result['not_asked'])}")
    lines += ["", table(result["summary"])]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--generator", default="gemma-270m", choices=("gemma-270m", "smollm2-135m-instruct"))
    parser.add_argument("--limit", type=int, help="ask this many questions only, taken from every kind in turn")
    parser.add_argument("--kinds", help=f"comma-separated kinds to ask ({', '.join(KINDS)})")
    parser.add_argument("--out", type=Path, help="results prefix (default bench/results/real_docs-GENERATOR)")
    parser.add_argument(
        "--time-budget", type=float, help="seconds of asking; the questions left then are reported as not asked"
    )
    parser.add_argument("--data-dir", type=Path, help="a new data dir for the stack (default: a temporary one)")
    parser.add_argument("--keep", action="store_true", help="keep the temporary data dir")
    parser.add_argument("--start-timeout", type=float, default=1800.0)
    args = parser.parse_args(argv)
    kinds = set(args.kinds.split(",")) if args.kinds else None
    if kinds and kinds - set(KINDS):
        parser.error(f"unknown kinds: {', '.join(sorted(kinds - set(KINDS)))}")
    out = args.out or ROOT / "bench" / "results" / f"real_docs-{args.generator}"
    questions = pick(read_questions(), kinds, args.limit)
    if args.data_dir and args.data_dir.exists() and any(args.data_dir.iterdir()):
        parser.error(f"{args.data_dir} is not empty: the benchmark needs a fresh data dir")
    data_dir = args.data_dir or Path(tempfile.mkdtemp(prefix="real-docs-"))
    command = shlex.join([Path(sys.executable).name, "-m", "bench.real_docs.run", *(argv or sys.argv[1:])])
    started, load_start, t0 = datetime.now(UTC), os.getloadavg(), time.monotonic()
    at_start = provenance()  # the file's own provenance is taken when it is written, at the end
    print(header(), f"\n# {len(questions)} questions, data dir {data_dir}", flush=True)
    stack = Stack(data_dir, args.generator)
    verdicts: list[Verdict] = []
    not_asked: list[str] = []
    health: dict[str, Any] = {}
    ingested: dict[str, Any] = {}
    try:
        health = stack.start(args.start_timeout)
        print(f"# stack up at {stack.url}: {json.dumps(health.get('llm', health))[:200]}", flush=True)
        ingested = ingest(stack)
        print(f"# ingest: files {ingested.get('files')}, {ingested.get('chunks')} chunks", flush=True)
        with httpx.Client(base_url=stack.url, timeout=REQUEST_TIMEOUT_S) as client:
            asking = time.monotonic()
            for n, q in enumerate(questions, 1):
                if args.time_budget is not None and time.monotonic() - asking > args.time_budget:
                    not_asked = [q.id for q in questions[n - 1 :]]
                    print(f"# time budget spent: {len(not_asked)} questions not asked", flush=True)
                    break
                v = answer(client, q)
                verdicts.append(v)
                print(
                    f"{n:3d}/{len(questions)} {v.id:15s} {v.status:13s} {v.seconds:6.1f}s  {v.answer[:90]!r}",
                    flush=True,
                )
    finally:
        stack.stop()
        if not args.keep and not args.data_dir:
            subprocess.run(["rm", "-rf", str(data_dir)], check=False)
    result = {
        "command": command,
        "generator": args.generator,
        "provenance_at_start": at_start,
        "health": health,
        "started": started.isoformat(timespec="seconds"),
        "ended": datetime.now(UTC).isoformat(timespec="seconds"),
        "wall_s": round(time.monotonic() - t0, 1),
        "load_start": [round(x, 2) for x in load_start],
        "load_end": [round(x, 2) for x in os.getloadavg()],
        "ingest": ingested,
        "asked": len(verdicts),
        "not_asked": not_asked,
        "summary": summary(verdicts),
        "questions": [v.as_json() for v in verdicts],
    }
    write_report(out, result, report_text(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
