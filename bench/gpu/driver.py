"""GPU benchmark phases after the build: 16 GB emulation, llama-bench sweep, llama-server runs.

    python3 bench/gpu/driver.py PHASE... --bin DIR --models DIR --out DIR [--deadline EPOCH] [--dry-run]

PHASE: probe, emulate, bench, server. Results go to OUT/results-h200.json after every step (a phase cut
short by the deadline leaves what it measured); logs to OUT/logs/. `--dry-run` runs everything against a
CPU build and toy models, without holding GPU memory, to check the driver itself.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from rag.deploy.gpus import GPU, get_gpu  # noqa: E402
from rag.deploy.model_shapes import published_extra_bytes, qwen35_model  # noqa: E402
from rag.deploy.planner import MIB, Flags, plan, read_gguf  # noqa: E402
from rag.deploy.profiles import PROFILES  # noqa: E402

V100_MIB = 16_160
PROMPT_TOKENS = 3_584  # with 512 generated: the whole 4,096-token context
ANSWER_TOKENS = 512
SHIPPED = PROFILES["v100-16g"]
SHIPPED_QUANT = (SHIPPED.model or "x-q4_k_s").rsplit("-", 1)[1].upper()  # qwen3.6-27b-q4_k_s -> Q4_K_S
FIELD_FLAGS = [
    "-ngl",
    "999",
    "-c",
    "4096",
    "-b",
    "512",
    "-ub",
    "1024",
    "-ctk",
    "q8_0",
    "-ctv",
    "q8_0",
    "-fa",
    "on",
    "-np",
    "1",
]
DEFAULT_FLAGS = ["-ngl", "999", "-c", "4096", "-np", "1"]
BUFFER_LINE = re.compile(r"(\S+)\s+(model|KV|RS|compute) buffer size =\s+([\d.]+) MiB")


class Run:
    """Shared state: paths, the deadline, the results file."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.bin = Path(args.bin)
        self.models = Path(args.models)
        self.out = Path(args.out)
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.deadline = args.deadline or time.time() + 3600
        self.dry = args.dry_run
        self.path = self.out / "results-h200.json"
        self.results: dict[str, Any] = json.loads(self.path.read_text()) if self.path.exists() else {}

    def done(self, section: str, key: str) -> bool:
        """Measured by an earlier call (this benchmark resumes where a cut-short call stopped)."""
        entry = self.results.get(section, {}).get(key)
        return entry is not None and not (isinstance(entry, dict) and "skipped" in entry)

    def left(self) -> float:
        return self.deadline - time.time()

    def save(self, section: str, key: str, value: Any) -> None:
        self.results.setdefault(section, {})[key] = value
        self.path.write_text(json.dumps(self.results, indent=2))
        print(f"[{section}] {key}: {json.dumps(value)[:400]}", flush=True)

    def model(self, quant: str) -> Path:
        return self.models / f"qwen3.6-27b-shape-{quant}.gguf"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def vocab_size(model: Path) -> int:
    return read_gguf(model).vocab_size


# --- llama-server --------------------------------------------------------------------------------


class Server:
    def __init__(self, run: Run, model: Path, flags: list[str], name: str) -> None:
        self.port = free_port()
        self.log_path = run.logs / f"server-{name}.log"
        threads = ["-t", "1"] if run.dry else []
        command = [
            str(run.bin / "llama-server"),
            "-m",
            str(model),
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            *flags,
            *threads,
            "-lv",
            "4",
        ]
        with self.log_path.open("wb") as log:
            log.write((" ".join(command) + "\n").encode())
            log.flush()
            self.proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        self.url = f"http://127.0.0.1:{self.port}"

    def wait_ready(self, timeout: float) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.proc.poll() is not None:
                return False
            try:
                if httpx.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return True
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def buffers(self) -> dict[str, float]:
        sums: dict[str, float] = {}
        for device, kind, mib in BUFFER_LINE.findall(self.log()):
            key = f"{device} {kind}"
            sums[key] = sums.get(key, 0.0) + float(mib)
        return sums

    def failure(self) -> str:
        lines = [line for line in self.log().splitlines() if " E " in line or "error" in line.lower()]
        return " | ".join(lines[-4:])[-600:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


def stream_completion(
    url: str, prompt: list[int], n_predict: int, *, cache_prompt: bool, extra: dict[str, Any] | None = None
) -> tuple[float, float, int, dict[str, Any]]:
    """Stream one greedy `/completion` of token ids: (time to first token s, total s, chunks, the server's timings)."""
    body = {
        "prompt": prompt,
        "n_predict": n_predict,
        "ignore_eos": True,
        "stream": True,
        "cache_prompt": cache_prompt,
        "temperature": 0.0,
        **(extra or {}),
    }
    started = time.perf_counter()
    first = None
    timings: dict[str, Any] = {}
    n_chunks = 0
    with httpx.stream("POST", f"{url}/completion", json=body, timeout=300) as response:
        response.raise_for_status()
        for line in response.iter_lines():
            if not line.startswith("data: "):
                continue
            chunk = json.loads(line[6:])
            if chunk.get("content") and first is None:
                first = time.perf_counter() - started
            n_chunks += 1
            if chunk.get("stop"):
                timings = chunk.get("timings", {})
    total = time.perf_counter() - started
    return (first or total), total, n_chunks, timings


def complete(server: Server, n_prompt: int, n_predict: int, n_vocab: int, seed: int) -> dict[str, Any]:
    """Stream one completion of `n_prompt` random token ids; time to first token and the server's timings."""
    rng = random.Random(seed)
    prompt = [rng.randrange(300, n_vocab) for _ in range(n_prompt)]
    first, total, n_chunks, timings = stream_completion(server.url, prompt, n_predict, cache_prompt=False)
    return {
        "ttft_s": round(first, 3),
        "total_s": round(total, 3),
        "chunks": n_chunks,
        "prompt_n": timings.get("prompt_n"),
        "prompt_tok_s": round(timings.get("prompt_per_second", 0.0), 1),
        "predicted_n": timings.get("predicted_n"),
        "decode_tok_s": round(timings.get("predicted_per_second", 0.0), 2),
    }


def model_step_parser(doc: str | None) -> argparse.ArgumentParser:
    """The arguments of a step that serves one model file (pool.py, batching.py)."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bin", required=True)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--out", required=True)
    parser.add_argument("--deadline", type=float, default=None)
    parser.add_argument("--dry-run", action="store_true")
    return parser


def model_step_run(args: argparse.Namespace) -> Run:
    return Run(
        argparse.Namespace(
            bin=args.bin, models=str(args.model.parent), out=args.out, deadline=args.deadline, dry_run=args.dry_run
        )
    )


# --- phases --------------------------------------------------------------------------------------


def probe(run: Run) -> None:
    """The machine: GPU, driver, measured copy bandwidth."""
    info: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "host_cpus": os.cpu_count()}
    try:
        smi = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
        info["nvidia_smi"] = smi.stdout.strip()
    except (OSError, subprocess.TimeoutExpired) as exc:
        info["nvidia_smi"] = f"unavailable: {exc}"
    if not run.dry:
        import torch

        n = 2 << 30
        src = torch.empty(n, dtype=torch.uint8, device="cuda").random_(0, 255)
        dst = torch.empty_like(src)
        for _ in range(3):
            dst.copy_(src)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(10):
            start.record()
            dst.copy_(src)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 1000)
        times.sort()
        info["copy_bandwidth_tb_s"] = round(2 * n / times[len(times) // 2] / 1e12, 2)
        info["torch"] = torch.__version__
        del src, dst
        torch.cuda.empty_cache()
    run.save("machine", "probe", info)


def holder(leave_mib: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__).with_name("hold.py")), str(leave_mib)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    line = proc.stdout.readline() if proc.stdout else ""
    if not line:
        raise RuntimeError("the memory holder did not start")
    return proc


def holder_free(proc: subprocess.Popen[str] | None) -> float | None:
    if proc is None or proc.stdin is None or proc.stdout is None:
        return None
    proc.stdin.write("free\n")
    proc.stdin.flush()
    return json.loads(proc.stdout.readline())["free_mib"]


def holder_stop(proc: subprocess.Popen[str] | None) -> None:
    if proc is not None and proc.poll() is None and proc.stdin is not None:
        proc.stdin.write("quit\n")
        proc.stdin.flush()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def emulated_gpu() -> GPU:
    """The H200 seen through a 16,160 MiB window: Hopper kernels (no fp16 dequant pool), V100's memory."""
    h200 = get_gpu("h200")
    return replace(h200, name="h200-as-v100", memory_mib=V100_MIB)


EMULATIONS = [
    # name, quant, flags (the shipped profile comes from rag/deploy/profiles.py)
    (f"shipped-{SHIPPED_QUANT}-q8_0", SHIPPED_QUANT, SHIPPED.flags()),
    ("IQ4_XS-q8_0", "IQ4_XS", SHIPPED.flags()),
    ("field-recipe-Q4_K_M", "Q4_K_M", FIELD_FLAGS + ["-fit", "off"]),
    ("Q4_K_M-f16", "Q4_K_M", DEFAULT_FLAGS + ["-fa", "on", "-b", "512", "-ub", "512", "-fit", "off"]),
    ("Q4_K_S-f16", "Q4_K_S", DEFAULT_FLAGS + ["-fa", "on", "-b", "512", "-ub", "512", "-fit", "off"]),
]


def emulate(run: Run) -> None:
    """Which profiles load and serve a full 4,096-token context in 16,160 MiB, against the planner's verdicts."""
    gpu = emulated_gpu()
    for name, quant, flags in EMULATIONS:
        if run.done("emulation", name):
            continue
        if run.left() < 75:
            run.save("emulation", name, {"skipped": "deadline"})
            continue
        model = run.model(quant)
        spec = read_gguf(model)
        planned = plan(spec, gpu, Flags.from_server_args(flags))
        extra = 0 if run.dry else published_extra_bytes(qwen35_model(ftype=quant), quant)
        published = plan(spec, gpu, Flags.from_server_args(flags), extra_weight_bytes=extra)
        entry: dict[str, Any] = {
            "quant": quant,
            "file_bytes": model.stat().st_size,
            "flags": flags,
            "planner": {
                "verdict": planned.verdict,
                "reported_mib": round(planned.memory.reported_gpu / MIB, 1),
                "total_mib": round(planned.memory.total_gpu / MIB, 1),
                "free_mib": round(planned.free / MIB, 1),
                "components_mib": {k: round(v / MIB, 1) for k, v in planned.memory.__dict__.items()},
                "verdict_at_published_size": published.verdict,
            },
        }
        hold = None if run.dry else holder(V100_MIB)
        entry["free_before_mib"] = holder_free(hold)
        server = Server(run, model, flags, f"emulate-{name}")
        try:
            loaded = server.wait_ready(min(120, run.left() - 30))
            entry["loaded"] = loaded
            entry["buffers_mib"] = server.buffers()
            if loaded:
                entry["free_after_load_mib"] = holder_free(hold)
                n_vocab = vocab_size(model)
                prompt = 256 if run.dry else PROMPT_TOKENS
                try:
                    entry["served"] = complete(server, prompt, 32 if run.dry else ANSWER_TOKENS, n_vocab, seed=1)
                    entry["served_ok"] = entry["served"]["prompt_n"] == prompt
                except (httpx.HTTPError, ValueError) as exc:
                    entry["served_ok"] = False
                    entry["serve_error"] = str(exc)[:300]
                entry["free_after_serving_mib"] = holder_free(hold)
                alive = server.proc.poll() is None
                entry["alive_after_serving"] = alive
                if not alive:
                    entry["error"] = server.failure()
            else:
                entry["error"] = server.failure()
        finally:
            server.stop()
            holder_stop(hold)
        run.save("emulation", name, entry)


def llama_bench(run: Run, name: str, model: Path, args: list[str], timeout: float) -> list[dict[str, Any]]:
    command = [str(run.bin / "llama-bench"), "-m", str(model), "-o", "json", *args]
    if run.dry:
        command += ["-t", "1"]
    log = run.logs / f"bench-{name}.log"
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        log.write_text(f"timeout after {timeout} s\n{exc.stderr or ''}")
        return []
    log.write_text(" ".join(command) + "\n" + done.stderr[-20000:])
    try:
        rows = json.loads(done.stdout)
    except json.JSONDecodeError:
        return []
    keep = (
        "n_prompt",
        "n_gen",
        "n_depth",
        "n_batch",
        "n_ubatch",
        "type_k",
        "type_v",
        "flash_attn",
        "avg_ts",
        "stddev_ts",
    )
    return [{k: r.get(k) for k in keep} for r in rows]


def bench(run: Run) -> None:
    """llama-bench: prompt (pp512) and decode (tg128, also at a 3,584-token depth) over the flags that matter."""
    model = run.model("Q4_K_M")
    reps = ["-r", "1"] if run.dry else ["-r", "3"]
    small = ["-p", "64", "-n", "8"] if run.dry else ["-p", "512", "-n", "128"]
    depth = "256" if run.dry else str(PROMPT_TOKENS)
    grid = [
        ("defaults", []),
        ("fa-off-f16", ["-fa", "off"]),
        ("fa-on-f16", ["-fa", "on", "-ub", "256,512,1024"]),
        ("fa-on-q8_0", ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-ub", "256,512,1024"]),
        ("fa-on-q8_0-b512", ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-b", "512", "-ub", "512"]),
        ("depth-f16", ["-fa", "on", "-p", "0", "-n", "128" if not run.dry else "8", "-d", depth]),
        (
            "depth-q8_0",
            ["-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-p", "0", "-n", "128" if not run.dry else "8", "-d", depth],
        ),
    ]
    for name, args in grid:
        if run.done("llama_bench", name):
            continue
        if run.left() < 60:
            run.save("llama_bench", name, {"skipped": "deadline"})
            continue
        extra = [] if "-p" in args else small
        rows = llama_bench(run, name, model, [*extra, *reps, *args], timeout=min(180, run.left() - 20))
        run.save("llama_bench", name, rows)
    shipped = run.model(SHIPPED_QUANT)
    if run.left() > 60 and shipped.exists() and not run.done("llama_bench", f"shipped-{SHIPPED_QUANT}"):
        rows = llama_bench(
            run,
            "shipped",
            shipped,
            [*small, *reps, "-fa", "on", "-ctk", "q8_0", "-ctv", "q8_0", "-b", "512", "-ub", "512"],
            timeout=min(120, run.left() - 20),
        )
        run.save("llama_bench", f"shipped-{SHIPPED_QUANT}", rows)


def best_flags(run: Run) -> list[str] | None:
    """The llama-bench configuration with the shortest 4K RAG answer (3,584-token prompt + 512 decoded)."""
    rows = [r for rows in run.results.get("llama_bench", {}).values() if isinstance(rows, list) for r in rows]
    pp = {
        (r["n_ubatch"], r["n_batch"], r["type_k"], r["flash_attn"]): r["avg_ts"]
        for r in rows
        if r["n_prompt"] and not r["n_gen"]
    }
    tg = {
        (r["n_ubatch"], r["n_batch"], r["type_k"], r["flash_attn"]): r["avg_ts"]
        for r in rows
        if r["n_gen"] and not r["n_prompt"] and not r["n_depth"]
    }
    best = None
    for key in pp.keys() & tg.keys():
        seconds = PROMPT_TOKENS / pp[key] + ANSWER_TOKENS / tg[key]
        if best is None or seconds < best[0]:
            best = (seconds, key)
    if best is None:
        return None
    ub, b, type_k, fa = best[1]
    flags = [
        "-ngl",
        "999",
        "-c",
        "4096",
        "-np",
        "1",
        "-b",
        str(b),
        "-ub",
        str(ub),
        "-ctk",
        type_k,
        "-ctv",
        type_k,
        "-fa",
        "on" if fa in (True, 1, "on") else "off",
    ]
    run.save("sweep", "best", {"flags": flags, "predicted_answer_s": round(best[0], 2)})
    return flags


def server_runs(run: Run) -> None:
    """llama-server: TTFT and decode of a 4K RAG-sized request under each flag set (the whole card)."""
    model = run.model("Q4_K_M")
    configs = [("defaults", model, DEFAULT_FLAGS), ("field-recipe", model, FIELD_FLAGS)]
    best = best_flags(run)
    if best:
        configs.append(("sweep-best", model, best))
    configs.append(("shipped-on-Q4_K_M", model, SHIPPED.flags()))
    configs.append(("shipped", run.model(SHIPPED_QUANT), SHIPPED.flags()))
    for name, path, flags in configs:
        if run.done("llama_server", name):
            continue
        if run.left() < 60:
            run.save("llama_server", name, {"skipped": "deadline"})
            continue
        server = Server(run, path, flags, f"speed-{name}")
        entry: dict[str, Any] = {"model": path.name, "flags": flags}
        try:
            if not server.wait_ready(min(120, run.left() - 30)):
                entry["error"] = server.failure()
            else:
                n_vocab = vocab_size(path)
                complete(server, 16, 8, n_vocab, seed=0)  # warm-up
                prompt = 256 if run.dry else PROMPT_TOKENS
                answers = 64 if run.dry else 256
                reps = 1 if run.dry else 3
                entry["runs"] = [complete(server, prompt, answers, n_vocab, seed=i + 1) for i in range(reps)]
                entry["buffers_mib"] = server.buffers()
        except (httpx.HTTPError, ValueError) as exc:
            entry["error"] = str(exc)[:300]
        finally:
            server.stop()
        run.save("llama_server", name, entry)


PHASES = {"probe": probe, "emulate": emulate, "bench": bench, "server": server_runs}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("phases", nargs="+", choices=sorted(PHASES))
    parser.add_argument("--bin", required=True)
    parser.add_argument("--models", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--deadline", type=float, default=None, help="Unix time after which no new step starts")
    parser.add_argument("--dry-run", action="store_true")
    args = parser.parse_args()
    run = Run(args)
    for phase in args.phases:
        started = time.monotonic()
        PHASES[phase](run)
        run.save("phase_seconds", phase, round(time.monotonic() - started, 1))


if __name__ == "__main__":
    main()
