"""The report of a run: report.md, results.json and the plots."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from rag.core.provenance import summary
from rag.eval._metrics import DEPTH, RIGHT_F1


def write_report(result: dict[str, Any], directory: Path) -> Path:
    """report.md, results.json and the plots (recall@k per method, latency histogram) in `directory`."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "results.json").write_text(json.dumps(result, ensure_ascii=False), encoding="utf-8")
    plot_recall(result, directory / "recall_at_k.png")
    plot_latency(result, directory / "latency.png")
    path = directory / "report.md"
    path.write_text(report_markdown(result), encoding="utf-8")
    return path


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_recall(result: dict[str, Any], path: Path) -> None:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    for mode, m in result["retrieval"]["methods"].items():
        ks = list(range(1, len(m["curve"]) + 1))
        ax.plot(ks, m["curve"], marker="o", label=f"{mode} (MRR {m['mrr']:.3f})")
    ax.set_xlabel("k (chunks retrieved)")
    ax.set_ylabel("recall@k (answer-bearing chunk)")
    ax.set_ylim(0, 1.02)
    ax.set_xticks(range(1, DEPTH + 1))
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    ax.set_title(f"{result['dataset']['name']}: {result['retrieval']['questions']} questions")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _log_bins(series: Iterable[Sequence[float]], n: int = 40) -> Any:
    import numpy as np

    values = [v for values in series for v in values if v > 0]
    low, high = (min(values), max(values)) if values else (0.1, 1.0)
    return np.geomspace(low, max(high, low * 1.01), n)


def plot_latency(result: dict[str, Any], path: Path) -> None:
    """Histograms on a log axis: the query embedding and the searches differ by orders of magnitude."""
    plt = _pyplot()
    answers = result.get("answers")
    panels = [
        (
            "retrieval latency",
            {
                ("embed query" if k == "embed" else f"{k} search"): v
                for k, v in result["retrieval"]["samples_ms"].items()
                if v
            },
        )
    ]
    if answers:
        panels.append(
            ("answer latency", {k: answers["samples_ms"][k] for k in ("ttft", "total") if answers["samples_ms"][k]})
        )
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4), dpi=110, squeeze=False)
    for ax, (title, series) in zip(axes[0], panels):
        bins = _log_bins(series.values())
        for label, values in series.items():
            ax.hist(values, bins=bins, alpha=0.5, label=label)
        ax.set_xscale("log")
        ax.set_xlabel("milliseconds (log scale)")
        ax.set_ylabel("questions")
        ax.set_title(title)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


def report_markdown(result: dict[str, Any]) -> str:
    d, c, ing, ret = result["dataset"], result["config"], result["ingest"], result["retrieval"]
    sample = f"a sample of {d['questions']} questions (seed {d['seed']})" if d["limit"] else "all questions"
    lines = [
        f"# Evaluation: {d['name']}",
        "",
        *([f"Provenance: {summary(result['provenance'])}.", ""] if result.get("provenance") else []),
        f"Run {result['started_at']}, {result['elapsed_s']} s. {sample} of {d['total_questions']}; "
        f"{d['contexts']} of {d['total_contexts']} paragraphs indexed into collection `{c['collection']}`.",
        f"Chunks of {c['chunk_tokens']} tokens (overlap {c['chunk_overlap']}), embedder `{c['embed_model']}`, "
        f"hybrid dense weight {c['hybrid_dense_weight']}, retrieval depth {c['retrieval_depth']}, "
        f"reranker {'on' if c['reranker'] else 'off'}.",
        "",
        f"Ingest: {ing['indexed']} indexed, {ing['unchanged']} unchanged, {ing['failed']} failed; "
        f"{ing['chunks_indexed']} chunks in {ing['seconds']} s ({ing['chunks_per_s'] or 'n/a'} chunks/s).",
        "",
        "## Retrieval",
        "",
        f"{ret['questions']} questions; {ret['without_gold_chunk']} more have no answer-bearing chunk "
        "(the answer was cut across chunks) and are left out.",
        "",
        "| method | recall@1 | recall@5 | recall@10 | MRR | search p50 ms | p95 ms |",
        "|---|---|---|---|---|---|---|",
    ]
    for mode, m in ret["methods"].items():
        lat = m["search_ms"]
        lines.append(
            f"| {mode} | {m['recall@1']:.3f} | {m['recall@5']:.3f} | {m['recall@10']:.3f} | "
            f"{m['mrr']:.3f} | {lat.get('p50', 'n/a')} | {lat.get('p95', 'n/a')} |"
        )
    emb = ret["embed_ms"]
    lines += [
        "",
        f"Query embedding: p50 {emb.get('p50')} ms, p95 {emb.get('p95')} ms (once per question, "
        "shared by the methods).",
        "",
        "![recall@k](recall_at_k.png)",
        "",
        "![latency](latency.png)",
        "",
    ]
    answers = result.get("answers")
    if answers:
        ttft, total = answers["ttft_ms"], answers["total_ms"]
        lines += [
            "## Answers",
            "",
            f"{answers['questions']} questions{' (the first of the sample)' if c.get('answer_limit') else ''}, top_k {c['top_k']}, max_tokens {c['max_tokens'] or 'the style default'}, "
            f"model `{c['llm_model']}`, prompt style `{answers.get('prompt_style')}` ({answers.get('prompt_style_reason')}).",
            "",
            "| exact match | F1 | citation precision | no valid citation | with an invalid citation |",
            "|---|---|---|---|---|",
            f"| {answers['exact_match']:.3f} | {answers['f1']:.3f} | {_pct(answers['citation_precision'])} "
            f"({answers['citations']} citations) | {answers['no_valid_citation']:.3f} | "
            f"{answers['with_invalid_citation']:.3f} |",
            "",
            "| attribution precision | attributed chunk holds the answer said | with a supported source | "
            "unsupported sentences | at the token limit |",
            "|---|---|---|---|---|",
            f"| {_pct(answers.get('attribution_precision'))} ({answers.get('attributed')} attributed) | "
            f"{_pct(answers.get('attributed_holds_answer'))} | {_pct(answers.get('supported_source'))} | "
            f"{_pct(answers.get('unsupported_sentences'))} | {_pct(answers.get('at_token_limit'))} |",
            "",
            f"Shown as supported: {answers.get('supported_answers')} answers, of which the right ones (F1 ≥ "
            f"{RIGHT_F1}): {_pct(answers.get('supported_precision'))}.",
            "",
            f"Empty answers: {_pct(answers.get('empty_first_attempt'))} at the first attempt, "
            f'{_pct(answers.get("no_answer"))} after the retry (answered "the model gave no answer").',
            "",
            f"Withheld as too unlikely (the likelihood floor): {_pct(answers.get('unsure'))}.",
            "",
            f"TTFT p50 {ttft.get('p50')} ms, p95 {ttft.get('p95')} ms; whole answer p50 {total.get('p50')} ms, "
            f"p95 {total.get('p95')} ms.",
            "",
        ]
    lines += ["## Gated scores", "", "```json", json.dumps(result["scores"], indent=2), "```", ""]
    return "\n".join(lines)
