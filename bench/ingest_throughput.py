"""End-to-end ingest throughput against the raw embedder, side by side; and the CLI's peak memory.

    .venv/bin/python bench/ingest_throughput.py [--paragraphs 600] [--pdfs 10] [--docx 10]
        [--modes local,api] [--rss-mb 25,50] [--rounds 1]

Throughput: a corpus of SQuAD contexts written as text files plus generated PDFs and DOCX files is
ingested by the `ingest` CLI as a subprocess (into a fresh data dir, against the real embedding server
started here), directly into the embedded store ("local") and through a running API ("api"). The
chunk texts it stored are then encoded in this process by the raw embedder, three ways:
SentenceTransformer.encode in one call at batch 32 and at the server's forward batch (all texts
sorted by length at once, torch on every core), and the embedding server's own SentenceEmbedder
(the same forward passes and workers as the server, without HTTP); each with the model's passage prompt
where it has one, as the server adds it (multilingual-e5-small: RAG_EMBED_MODEL=multilingual-e5-small and
RAG_MODELS_DIR naming the models dir that holds its rebuilt folder). The ratio of the ingest rate to
each is what the pipeline costs on top of that embedder; the target is against the fastest of them.

Memory: the CLI ingests PDFs of mostly image bytes (a text layer of a few chunks per file) totalling
each size of --rss-mb; the peak RSS (VmHWM) of the CLI process and of its parser workers is sampled
from /proc. It should not grow with the corpus size.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _datasets as datasets  # noqa: E402
from bench._provenance import header  # noqa: E402
from bench._servers import server_env  # noqa: E402
from tests import hostile  # noqa: E402
from tests.servers import Server, start_api, start_embedding_server  # noqa: E402

BATCH = 32


def squad_contexts(n: int) -> list[str]:
    contexts = [p["context"] for a in datasets.read("squad")["data"] for p in a["paragraphs"]]
    return contexts[:n]


def latin1(text: str) -> str:
    return text.encode("latin-1", errors="replace").decode("latin-1")


def write_corpus(folder: Path, paragraphs: int, pdfs: int, docx: int) -> int:
    """SQuAD contexts as .txt (all if `paragraphs` is 0), then PDFs (4 pages) and DOCX files (headings
    and paragraphs) made of contexts; returns the number of bytes written."""
    every = squad_contexts(10**6)
    paragraphs = paragraphs or len(every)
    contexts = every[:paragraphs] + every[: 4 * pdfs + 4 * docx]
    (folder / "squad").mkdir(parents=True)
    for i, text in enumerate(contexts[:paragraphs]):
        (folder / "squad" / f"{i:05d}.txt").write_text(text)
    rest = contexts[paragraphs:]
    for i in range(pdfs):
        pages = [_lines(latin1(rest[4 * i + p])) for p in range(4)]
        (folder / f"report-{i:03d}.pdf").write_bytes(hostile.text_pdf(pages))
    rest = rest[4 * pdfs :]
    for i in range(docx):
        blocks: list[tuple[str, object]] = []
        for p in range(4):
            blocks += [("heading1", f"Section {p + 1}"), ("p", rest[4 * i + p])]
        (folder / f"memo-{i:03d}.docx").write_bytes(hostile.docx_document(blocks))
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


def _lines(text: str, width: int = 90) -> list[str]:
    words, lines, line = text.split(), [], ""
    for word in words:
        if len(line) + len(word) + 1 > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + [line] if line else lines


def image_pdf(text_pages: list[str], image_bytes: int, seed: int) -> bytes:
    """A PDF whose pages carry a line of text each, plus one big (incompressible) grey image."""
    writer = hostile.PdfWriter()
    side = int(image_bytes**0.5)
    pixels = random.Random(seed).randbytes(side * side)
    image = writer.add_object(
        hostile._stream(  # noqa: SLF001 - the test PDF writer's stream helper
            f"/Type /XObject /Subtype /Image /Width {side} /Height {side} /ColorSpace /DeviceGray /BitsPerComponent 8".encode(),
            pixels,
        ),
        stream=True,
    )
    resources = b"/Font << /F1 3 0 R >> /XObject << /Im1 " + str(image).encode() + b" 0 R >>"
    for text in text_pages:
        content = hostile._text_content(_lines(latin1(text))) + b"\nq 200 0 0 200 100 100 cm /Im1 Do Q"  # noqa: SLF001
        writer.add_page(content, resources=resources)
    return writer.build()


def write_pdf_corpus(folder: Path, megabytes: int) -> int:
    folder.mkdir(parents=True)
    contexts = squad_contexts(2000)
    per_file = 1 << 20
    files = megabytes * (1 << 20) // per_file
    for i in range(files):
        pages = [contexts[(2 * i + p) % len(contexts)] for p in range(2)]
        (folder / f"scan-{i:04d}.pdf").write_bytes(image_pdf(pages, per_file - 8192, seed=i))
    return sum(p.stat().st_size for p in folder.iterdir())


class PeakRss:
    """Samples VmHWM of a process and its children from /proc until it exits."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak_kib: dict[int, int] = {}
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while Path(f"/proc/{self.pid}").exists():
            for pid in [self.pid, *self._children(self.pid)]:
                hwm = self._hwm(pid)
                if hwm:
                    self.peak_kib[pid] = max(self.peak_kib.get(pid, 0), hwm)
            time.sleep(0.02)

    @staticmethod
    def _children(pid: int) -> list[int]:
        # Each thread has its own list: the parser workers are started from worker threads.
        children = []
        for task in Path(f"/proc/{pid}/task").glob("*"):
            try:
                children += [int(c) for c in (task / "children").read_text().split()]
            except OSError:
                pass
        return children

    @staticmethod
    def _hwm(pid: int) -> int:
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
        except OSError:
            pass
        return 0

    def result(self) -> tuple[float, float]:
        """(MiB of the CLI, MiB of its largest child)."""
        self._thread.join()
        cli = self.peak_kib.get(self.pid, 0) / 1024
        workers = max((v for k, v in self.peak_kib.items() if k != self.pid), default=0) / 1024
        return cli, workers


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a running process and of its children it has waited for."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(f) for f in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@dataclass
class IngestRun:
    summary: dict
    wall: float
    rss: PeakRss
    cpu: dict[str, float]  # CPU seconds per process while the CLI ran: embedder, cli, api


def run_ingest(corpus: Path, env: dict[str, str], watch: dict[str, int], *extra: str) -> IngestRun:
    """The `ingest` CLI as a subprocess, with the CPU time it and the `watch`ed processes spent meanwhile."""
    command = [sys.executable, "-m", "ingest.cli", str(corpus), "--recursive", "--json", *extra]
    before = {name: cpu_seconds(pid) for name, pid in watch.items()}
    cli_before = children_cpu()
    start = time.perf_counter()
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    rss = PeakRss(process.pid)
    out, err = process.communicate()
    wall = time.perf_counter() - start
    cpu = {name: cpu_seconds(pid) - before[name] for name, pid in watch.items()} | {"cli": children_cpu() - cli_before}
    if process.returncode != 0:
        raise SystemExit(f"ingest failed ({process.returncode}):\n{err[-3000:]}")
    return IngestRun(json.loads(out), wall, rss, cpu)


def chunk_texts(corpus: Path) -> list[str]:
    """The chunk texts the pipeline stores for `corpus`: its own loaders and chunker, in this process."""
    from ingest.cli import collect_files
    from ingest.pipeline import LoaderPreparer, document_id
    from rag.core.config import Settings

    prepare = LoaderPreparer(Settings(data_dir=corpus.parent / "chunking"))
    texts = []
    for file in collect_files([corpus], None, True):
        data = file.path.read_bytes()
        texts += [r.text for r in prepare(data, file, document_id(data)).records]
    return texts


def ingest_once(mode: str, corpus: Path, base_env: dict[str, str], work: Path, embedder: Server) -> IngestRun:
    """Ingest `corpus` into a fresh data dir, directly ("local") or through an API started for it ("api")."""
    data_dir = Path(tempfile.mkdtemp(dir=work, prefix=f"{mode}-"))
    env = {**base_env, "RAG_DATA_DIR": str(data_dir), "RAG_EMBED_BATCH": str(BATCH)}
    if mode == "local":
        env["RAG_API_PORT"] = "9"  # nothing listens there: the CLI opens the store itself
        return run_ingest(corpus, env, {"embedder": embedder.pid})
    api: Server = start_api(data_dir, env, ready_path="/v1/collections")
    try:
        return run_ingest(corpus, env, {"embedder": embedder.pid, "api": api.pid}, "--server", api.url)
    finally:
        api.stop()


@dataclass
class Reference:
    """One way of running the raw embedder in this process."""

    name: str
    encode: Callable[[list[str]], object]
    threads: int  # torch threads while it runs


def references(model_path: str) -> list[Reference]:
    import torch
    from sentence_transformers import SentenceTransformer

    from rag.core.config import Settings
    from rag.servers.embedding import SentenceEmbedder

    served = SentenceEmbedder.from_settings(Settings(), device="cpu")
    forward = served.batch_size
    cores = os.cpu_count() or 1
    model = SentenceTransformer(model_path, device="cpu")
    torch.set_num_threads(cores)
    model.encode(["warm up"] * BATCH, batch_size=BATCH)

    def plain(batch: int) -> Callable[[list[str]], object]:
        return lambda texts: model.encode(
            served.prompted(texts, "passage"), batch_size=batch, normalize_embeddings=True
        )

    return [
        Reference(f"ST.encode, batch {BATCH}", plain(BATCH), cores),
        Reference(f"ST.encode, batch {forward}", plain(forward), cores),
        Reference(
            f"SentenceEmbedder, {served.workers} x {forward}",
            lambda texts: served.encode(served.prompted(texts, "passage")),
            1,
        ),
    ]


def direct_encode(
    refs: list[Reference], texts: list[str], rows: list[tuple[str, int, float, float]]
) -> dict[str, tuple[float, float]]:
    """Per reference: (chunks/s, CPU seconds per chunk) in this process."""
    import torch

    measured = {}
    for ref in refs:
        torch.set_num_threads(ref.threads)
        cpu = time.process_time()
        start = time.perf_counter()
        ref.encode(texts)
        seconds = time.perf_counter() - start
        rows.append((ref.name, len(texts), seconds, seconds))
        measured[ref.name] = (len(texts) / seconds, (time.process_time() - cpu) / len(texts))
    return measured


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--paragraphs", type=int, default=0, help="SQuAD contexts to use; 0: all of them")
    parser.add_argument("--pdfs", type=int, default=10)
    parser.add_argument("--docx", type=int, default=10)
    parser.add_argument("--modes", default="local,api")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--rss-mb", default="25,50,100", help="PDF corpus sizes for the memory measurement; '' to skip")
    datasets.add_options(parser, "squad")
    args = parser.parse_args()
    datasets.use(args)
    print(header(), flush=True)

    from rag.core.config import Settings

    refs = references(str(Settings().embed_model_dir))
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        corpus = work / "corpus"
        size = write_corpus(corpus, args.paragraphs, args.pdfs, args.docx)
        env = server_env(work / "embedder")
        server = start_embedding_server(work, env)
        env["RAG_EMBED_URL"] = server.url
        rows: list[tuple[str, int, float, float]] = []
        ratios: dict[str, dict[str, list[float]]] = {}
        cpu_rows: list[tuple[str, dict[str, float], dict[str, float]]] = []
        try:
            texts = chunk_texts(corpus)
            before = direct_encode(refs, texts, rows)
            for _ in range(args.rounds):
                for mode in args.modes.split(","):
                    run = ingest_once(mode, corpus, env, work, server)
                    chunks, seconds = run.summary["chunks"], run.summary["seconds"]
                    rows.append((f"ingest CLI, {mode}", chunks, seconds, run.wall))
                    after = direct_encode(refs, texts, rows)
                    # Against the encodes just before and after: the machine's load drifts.
                    mean = {ref.name: (before[ref.name][0] + after[ref.name][0]) / 2 for ref in refs}
                    for name, rate in mean.items():
                        ratios.setdefault(mode, {}).setdefault(name, []).append(chunks / seconds / rate)
                    ratios[mode].setdefault("fastest", []).append(chunks / seconds / max(mean.values()))
                    # CPU seconds per chunk, direct vs all our processes: what the ratio would be on
                    # otherwise idle cores, whatever else runs on this machine now.
                    per_chunk = sum(run.cpu.values()) / chunks
                    cpu_ratio = {ref.name: (before[ref.name][1] + after[ref.name][1]) / 2 / per_chunk for ref in refs}
                    cpu_rows.append((mode, {k: v / chunks for k, v in run.cpu.items()}, cpu_ratio))
                    before = after
            rss_rows = []
            for megabytes in [int(m) for m in args.rss_mb.split(",") if m]:
                pdfs = work / f"pdfs-{megabytes}"
                total = write_pdf_corpus(pdfs, megabytes)
                for mode in args.modes.split(","):
                    run = ingest_once(mode, pdfs, env, work, server)
                    cli_mib, worker_mib = run.rss.result()
                    rss_rows.append(
                        (
                            mode,
                            total,
                            run.summary["files"]["indexed"],
                            run.summary["chunks"],
                            run.wall,
                            cli_mib,
                            worker_mib,
                        )
                    )
        finally:
            server.stop()

    print(
        f"corpus: {args.paragraphs or 'all'} SQuAD paragraphs as .txt, {args.pdfs} PDFs, {args.docx} DOCX; {size / 1e6:.1f} MB; "
        f"batch {BATCH}; {os.cpu_count()} CPUs"
    )
    print(f"{'path':<20} {'chunks':>7} {'seconds':>8} {'chunks/s':>9} {'wall s':>7} {'chunks/s (wall)':>16}")
    for name, chunks, seconds, wall in rows:
        print(f"{name:<20} {chunks:>7} {seconds:>8.1f} {chunks / seconds:>9.2f} {wall:>7.1f} {chunks / wall:>16.2f}")
    print("ingest / direct ratio (each against the direct encodes around it):")
    for mode, by_ref in ratios.items():
        shown = "; ".join(f"{name} {', '.join(f'{v:.3f}' for v in values)}" for name, values in by_ref.items())
        print(f"  {mode}: {shown}")
    for mode, per_chunk, by_ref in cpu_rows:
        parts = ", ".join(f"{k} {v * 1000:.1f} ms" for k, v in per_chunk.items())
        shown = "; ".join(f"{name} {v:.3f}" for name, v in by_ref.items())
        print(f"CPU per chunk, {mode}: {parts}; direct CPU / ingest CPU: {shown}")
    if rss_rows:
        print(
            f"{'mode':<6} {'PDF corpus MB':>13} {'files':>6} {'chunks':>7} {'wall s':>7} {'CLI peak RSS MiB':>17} {'parser worker MiB':>18}"
        )
        for mode, total, files, chunks, wall, cli_mib, worker_mib in rss_rows:
            print(
                f"{mode:<6} {total / (1 << 20):>13.1f} {files:>6} {chunks:>7} {wall:>7.1f} {cli_mib:>17.1f} {worker_mib:>18.1f}"
            )


if __name__ == "__main__":
    main()
