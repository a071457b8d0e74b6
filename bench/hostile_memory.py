"""API memory and time to refusal for each oversized input: the bounds hold before the work starts.

For each case a fresh API process (`rag serve-api`, its backends away: nothing here may reach them)
takes the input over real HTTP while a sampler reads the API's RSS every few milliseconds. Printed per
case: the HTTP status, the time from the first byte sent to the refusal, and the API's RSS before and
at its peak during the case. Targets: peak - start < 150 MB, refusal <= 1 s.

    PYTHONPATH=. .venv/bin/python bench/hostile_memory.py [--json bench/results/hostile_memory.json]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._provenance import header, write_json  # noqa: E402
from tests import hostile  # noqa: E402
from tests.servers import free_port  # noqa: E402

MB = 1 << 20


def rss(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) << 10
    return 0


class Sampler:
    """The highest RSS of a process while the `with` block runs."""

    def __init__(self, pid: int) -> None:
        self.pid, self.peak, self._stop = pid, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, rss(self.pid))
            time.sleep(0.003)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)  # memory freed right after the answer still counts
        self._stop.set()
        self._thread.join()


class Api:
    def __init__(self, data_dir: Path) -> None:
        dead = f"http://127.0.0.1:{free_port()}"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("RAG_")}
        env.update(
            RAG_DATA_DIR=str(data_dir),
            RAG_LLM_URL=dead,
            RAG_EMBED_URL=dead,
            RAG_API_PORT=str(self.port),
            RAG_MAX_UPLOAD_BYTES=str(64 * MB),
            HF_HUB_OFFLINE="1",
        )
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "rag.cli", "serve-api"],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                httpx.get(f"{self.url}/health", timeout=5)
                break
            except httpx.TransportError:
                time.sleep(0.2)
        # Warm the paths the cases use, so their first-use imports are not counted against them.
        httpx.post(f"{self.url}/v1/chat", json={"messages": [{"role": "user", "content": "x" * 20_000}]}, timeout=30)
        httpx.post(
            f"{self.url}/v1/documents",
            files=[("files", ("w.pdf", hostile.shared_stream_pdf(3_000), "application/pdf"))],
            timeout=120,
        )
        httpx.post(
            f"{self.url}/v1/documents",
            files=[("files", ("w.docx", hostile.zip_directory_flood(20_000), "application/zip"))],
            timeout=120,
        )

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def upload(url: str, name: str, data: bytes) -> tuple[int, float, str]:
    started = time.perf_counter()
    response = httpx.post(
        f"{url}/v1/documents", files=[("files", (name, data, "application/octet-stream"))], timeout=300
    )
    return response.status_code, time.perf_counter() - started, response.text[:160]


def raw_post(url: str, path: str, headers: dict[str, str], chunks) -> tuple[int, float, str]:
    started = time.perf_counter()
    status, sent, answer = hostile.send_until_answered(url, path, headers, chunks)
    elapsed = time.perf_counter() - started
    return (
        status,
        elapsed,
        f"answered after {sent / MB:.1f} MB sent; " + answer.partition(b"\r\n\r\n")[2][:120].decode(errors="replace"),
    )


def case_zip_floods(url: str) -> tuple[int, float, str]:
    flood = hostile.zip_directory_flood(900_017, shared_header=True)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: upload(url, f"flood{i}.docx", flood), range(4)))
    return results[0][0], max(r[1] for r in results), results[0][2]


def case_zip_flood(url: str) -> tuple[int, float, str]:
    return upload(url, "flood.docx", hostile.zip_directory_flood(900_017, shared_header=True))


def case_question_40mb(url: str) -> tuple[int, float, str]:
    total = 40 * MB
    head = b'{"messages": [{"role": "user", "content": "'
    body = head + b"q" * (total - len(head) - 4) + b'"}]}'
    chunks = (body[i : i + MB] for i in range(0, len(body), MB))
    return raw_post(url, "/v1/chat", {"content-type": "application/json", "content-length": str(len(body))}, chunks)


def case_question_40mb_chunked(url: str) -> tuple[int, float, str]:
    def chunks():
        for piece in [b'{"messages": [{"role": "user", "content": "'] + [b"q" * MB] * 40 + [b'"}]}']:
            yield b"%x\r\n%s\r\n" % (len(piece), piece)
        yield b"0\r\n\r\n"

    return raw_post(url, "/v1/chat", {"content-type": "application/json", "transfer-encoding": "chunked"}, chunks())


def case_million_messages(url: str) -> tuple[int, float, str]:
    one = b'{"role": "user", "content": "hi"}, '
    body = b'{"messages": [' + one * 999_999 + b'{"role": "user", "content": "hi"}]}'
    chunks = (body[i : i + MB] for i in range(0, len(body), MB))
    return raw_post(url, "/v1/chat", {"content-type": "application/json", "content-length": str(len(body))}, chunks)


def case_pdf_6000_pages(url: str) -> tuple[int, float, str]:
    return upload(url, "pages.pdf", hostile.shared_stream_pdf(6_000))


def case_random_words_48mb(url: str) -> tuple[int, float, str]:
    import random

    rng = random.Random(7)
    words = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 9))) for _ in range(5000)]
    text = " ".join(rng.choice(words) for _ in range(8_500_000))[: 48 * MB]
    return upload(url, "words.txt", text.encode())


def case_style_without_braces(url: str) -> tuple[int, float, str]:
    page = "<html><head><style>" + "a" * 200_000 + "</style></head><body><p>x</p></body></html>"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        answer = pool.submit(upload, url, "freeze.html", page.encode())
        slowest = 0.0
        while not answer.done():
            started = time.perf_counter()
            httpx.get(f"{url}/health", timeout=30)
            slowest = max(slowest, time.perf_counter() - started)
        status, seconds, detail = answer.result()
    return status, seconds, f"slowest /health meanwhile {slowest:.3f} s; {detail}"


def case_zip64_behind_small_record(url: str) -> tuple[int, float, str]:
    flood = hostile.zip_directory_flood(900_017, shared_header=True, zip64_behind_small_record=True)
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: upload(url, f"hidden{i}.docx", flood), range(4)))
    return results[0][0], max(r[1] for r in results), results[0][2]


CASES: dict[str, Callable[[str], tuple[int, float, str]]] = {
    "a 48 MB text of random words": case_random_words_48mb,
    "HTML whose <style> is 200,000 'a' (while /health is polled)": case_style_without_braces,
    "4 concurrent ZIP64 floods behind a 2-entry classic record": case_zip64_behind_small_record,
    "one ZIP-directory flood (900,017 entries, 46.8 MB)": case_zip_flood,
    "4 concurrent ZIP-directory floods (900,017 entries, 46.8 MB each)": case_zip_floods,
    "a 40 MB question (Content-Length)": case_question_40mb,
    "a 40 MB question (chunked, no length)": case_question_40mb_chunked,
    "1e6 messages (34 MB body)": case_million_messages,
    "a 6,000-page PDF sharing one content stream": case_pdf_6000_pages,
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="write the results here too")
    parser.add_argument("--only", help="run only the cases whose name holds this text")
    args = parser.parse_args()
    print(header(), flush=True)
    rows = []
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}")
    for name, case in CASES.items():
        if args.only and args.only not in name:
            continue
        with tempfile.TemporaryDirectory() as tmp:
            api = Api(Path(tmp))
            try:
                start = rss(api.proc.pid)
                with Sampler(api.proc.pid) as sampler:
                    status, seconds, detail = case(api.url)
                rows.append(
                    {
                        "case": name,
                        "status": status,
                        "refusal_s": round(seconds, 3),
                        "rss_start_mb": round(start / MB, 1),
                        "rss_peak_mb": round(sampler.peak / MB, 1),
                        "delta_mb": round((sampler.peak - start) / MB, 1),
                        "detail": detail,
                    }
                )
            finally:
                api.close()
        row = rows[-1]
        print(
            f"{name:<66} HTTP {row['status']}  refused in {row['refusal_s']:6.3f} s  RSS {row['rss_start_mb']:6.1f} -> "
            f"{row['rss_peak_mb']:6.1f} MB (+{row['delta_mb']:.1f})"
        )
        print(f"    {detail}")
    print(f"load average: {Path('/proc/loadavg').read_text().split()[:3]}")
    if args.json:
        write_json(args.json, rows)


if __name__ == "__main__":
    main()
