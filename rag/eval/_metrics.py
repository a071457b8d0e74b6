"""The metrics: SQuAD's exact match and F1 (per character for CJK), rank metrics, latency summaries and
the pooled answer metrics."""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any

from rag.core.cjk import CJK_CHARS, has_cjk

KS = (1, 5, 10)
DEPTH = 10  # results looked at per question: recall@10 and MRR@10

_CJK_OR_OTHER = re.compile(f"[{CJK_CHARS}]|[^{CJK_CHARS}]+")  # one CJK character, or a run of others
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_CITATION = re.compile(r"[\[【［]\s*S\d+(?:\s*[,，;；]\s*S\d+)*\s*[\]】］]", re.IGNORECASE)
_CJK_PUNCT = set("，。！？；：、“”‘’（）《》【】〈〉「」『』…—～·")


def _is_punct(ch: str) -> bool:
    return ch in string.punctuation or ch in _CJK_PUNCT or unicodedata.category(ch).startswith("P")


def normalize_answer(text: str) -> str:
    """SQuAD's normalization: lower-case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if not _is_punct(ch))
    return " ".join(_ARTICLES.sub(" ", text).split())


def answer_tokens(text: str) -> list[str]:
    """Words of the normalized text; CJK characters count one by one."""
    tokens: list[str] = []
    for word in normalize_answer(text).split():
        if has_cjk(word):
            tokens.extend(_CJK_OR_OTHER.findall(word))
        else:
            tokens.append(word)
    return tokens


def strip_citations(text: str) -> str:
    return " ".join(_CITATION.sub(" ", text).split())


def exact_match(prediction: str, golds: Iterable[str]) -> float:
    pred = " ".join(answer_tokens(prediction))
    return float(any(pred == " ".join(answer_tokens(g)) for g in golds))


def token_f1(prediction: str, golds: Iterable[str]) -> float:
    """The best token F1 of `prediction` against any gold answer."""
    from collections import Counter

    pred = answer_tokens(prediction)
    best = 0.0
    for gold in golds:
        ref = answer_tokens(gold)
        common = sum((Counter(pred) & Counter(ref)).values())
        if common:
            precision, recall = common / len(pred), common / len(ref)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best


def folded(text: str) -> str:
    return " ".join(text.casefold().split())


def bears_answer(chunk_text: str, chunk_doc: str, question_doc: str, answers: Iterable[str]) -> bool:
    """Whether a chunk of `chunk_doc` is answer-bearing for a question of `question_doc`."""
    if chunk_doc != question_doc:
        return False
    text = folded(chunk_text)
    return any(folded(answer) in text for answer in answers)


def rank_metrics(ranks: Sequence[int | None], depth: int = DEPTH) -> dict[str, Any]:
    """recall@1/5/10, MRR and the recall@k curve for k = 1..depth, from each question's first-hit rank."""
    n = max(len(ranks), 1)
    curve = [sum(r is not None and r <= k for r in ranks) / n for k in range(1, depth + 1)]
    out: dict[str, Any] = {f"recall@{k}": curve[k - 1] for k in KS if k <= depth}
    out["mrr"] = sum(1 / r for r in ranks if r is not None and r <= depth) / n
    out["curve"] = curve
    return out


def latency_summary(values_ms: Sequence[float]) -> dict[str, float]:
    """p50/p95/p99, mean and max in milliseconds (empty: {})."""
    if not values_ms:
        return {}
    import numpy as np

    arr = np.asarray(values_ms, dtype=float)
    return {
        "n": int(arr.size),
        "p50": round(float(np.percentile(arr, 50)), 2),
        "p95": round(float(np.percentile(arr, 95)), 2),
        "p99": round(float(np.percentile(arr, 99)), 2),
        "mean": round(float(arr.mean()), 2),
        "max": round(float(arr.max()), 2),
    }


def _share(flags: Sequence[bool]) -> float | None:
    return sum(flags) / len(flags) if flags else None


ANSWER_CHARS_KEPT = 200  # of each answer, in the per-question scores
RIGHT_F1 = 0.5  # an answer this close to a gold one (token F1) counts as right in `supported_precision`


def supported_precision(records: Sequence[dict[str, Any]]) -> float | None:
    """Of the answers shown as supported (a chunk attributed to a sentence of theirs), the share that
    are right: what a reader trusting "Supported by" gets."""
    return _share([r["f1"] >= RIGHT_F1 for r in records if r["attributed_ok"]])


def answer_metrics(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = max(len(records), 1)
    supported = [s for r in records for s in r["supported"]]
    return {
        "questions": len(records),
        "exact_match": sum(r["em"] for r in records) / n,
        "f1": sum(r["f1"] for r in records) / n,
        "citation_precision": (sum(supported) / len(supported)) if supported else None,
        "citations": len(supported),
        "no_valid_citation": sum(not r["cited"] for r in records) / n,
        "with_invalid_citation": sum(r["invalid"] > 0 for r in records) / n,
        "no_sources_answers": sum(bool(r.get("no_sources")) for r in records),
        "attribution_precision": _share([a for r in records for a in r["attributed_ok"]]),
        "attributed": sum(len(r["attributed_ok"]) for r in records),
        "attributed_holds_answer": _share([a for r in records for a in r["attributed_said"]]),
        "supported_source": sum(any(r["supported"]) or any(r["attributed_ok"]) for r in records) / n,
        "supported_answers": sum(bool(r["attributed_ok"]) for r in records),
        "supported_precision": supported_precision(records),
        "unsupported_sentences": (
            sum(r["unsupported"] for r in records) / total_sentences
            if (total_sentences := sum(r["sentences"] for r in records))
            else None
        ),
        "at_token_limit": sum(bool(r.get("at_token_limit")) for r in records) / n,
        "empty_first_attempt": sum(bool(r.get("retried")) and r.get("retry_reason") == "blank" for r in records) / n,
        "retried_echo": sum(r.get("retry_reason") == "echo" for r in records) / n,
        "retried_off_span": sum(r.get("retry_reason") == "off_span" for r in records) / n,
        "no_answer": sum(bool(r.get("no_answer")) for r in records) / n,
        "unsure": sum(bool(r.get("unsure")) for r in records) / n,  # lines withheld under the likelihood floor
        "failed": sum("error" in r for r in records),
        "ttft_ms": latency_summary([r["ttft_ms"] for r in records if r.get("ttft_ms") is not None]),
        "total_ms": latency_summary([r["total_ms"] for r in records]),
        "examples": [{k: r[k] for k in ("qid", "answer", "em", "f1")} for r in records[:5]],
        # Per question, so that runs over the same sample can be compared on any subset of it.
        "per_question": [
            {
                "qid": r["qid"],
                "em": r["em"],
                "f1": round(r["f1"], 4),
                "at_token_limit": bool(r.get("at_token_limit")),
                "supported": bool(r["attributed_ok"]),
                "answer": r["answer"][:ANSWER_CHARS_KEPT],
                "retry_reason": r.get("retry_reason"),
                "likelihood": r.get("likelihood"),
                "total_ms": round(r["total_ms"], 1),
            }
            for r in records
        ],
        "samples_ms": {
            "ttft": [r["ttft_ms"] for r in records if r.get("ttft_ms") is not None],
            "total": [round(r["total_ms"], 1) for r in records],
        },
    }
