"""The question set: a SQuAD-format file read into questions and the paragraphs that hold their answers."""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag.core.errors import InvalidRequest


@dataclass(frozen=True)
class EvalQuestion:
    qid: str
    question: str
    answers: tuple[str, ...]
    context: int  # index of its paragraph in EvalSet.contexts


@dataclass
class EvalSet:
    name: str
    sha256: str
    contexts: dict[int, str]  # paragraph number in the file -> text (only those of the chosen questions)
    questions: list[EvalQuestion]
    total_questions: int
    total_contexts: int


def read_squad(path: Path, *, limit: int | None = None, seed: int = 0) -> EvalSet:
    """The questions of a SQuAD-format file.

    With `limit`: whole articles in a seeded order until they hold `limit` questions and at least
    limit/2 paragraphs, then a seeded sample of `limit` of their questions; only those articles'
    paragraphs are indexed. The other paragraphs of an article share its topic, so they are the hard
    distractors of a real collection, and a quick run does not saturate at recall 1.
    """
    raw = path.read_bytes()
    try:
        articles = [_article(a) for a in json.loads(raw)["data"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"{path} is not SQuAD JSON (data[].paragraphs[].qas[]): {exc}") from None
    contexts: dict[int, str] = {}
    questions: list[EvalQuestion] = []
    by_article: list[tuple[dict[int, str], list[EvalQuestion]]] = []
    for paragraphs in articles:
        mine: dict[int, str] = {}
        asked: list[EvalQuestion] = []
        for text, qas in paragraphs:
            number = len(contexts)
            contexts[number] = mine[number] = text
            asked += [
                EvalQuestion(qid or f"q{len(questions) + len(asked)}", q, answers, number) for qid, q, answers in qas
            ]
        questions += asked
        by_article.append((mine, asked))
    total_q, total_c = len(questions), len(contexts)
    if limit is not None and limit < len(questions):
        contexts, questions = _sample(by_article, limit, seed)
    if not questions:
        raise InvalidRequest(f"{path} holds no question with an answer text")
    return EvalSet(path.stem, hashlib.sha256(raw).hexdigest(), contexts, questions, total_q, total_c)


def _article(article: dict[str, Any]) -> list[tuple[str, list[tuple[str, str, tuple[str, ...]]]]]:
    """An article's paragraphs as (context, [(id, question, answer texts)]), questions without answers left out."""
    paragraphs = []
    for paragraph in article["paragraphs"]:
        qas = []
        for qa in paragraph.get("qas", []):
            answers = tuple(dict.fromkeys(a["text"].strip() for a in qa.get("answers", []) if a["text"].strip()))
            if answers and qa["question"].strip():
                qas.append((str(qa.get("id", "")), qa["question"], answers))
        paragraphs.append((paragraph["context"], qas))
    return paragraphs


def _sample(
    by_article: list[tuple[dict[int, str], list[EvalQuestion]]], limit: int, seed: int
) -> tuple[dict[int, str], list[EvalQuestion]]:
    rng = random.Random(seed)
    order = list(range(len(by_article)))
    rng.shuffle(order)
    contexts: dict[int, str] = {}
    pool: list[EvalQuestion] = []
    for i in order:
        if len(pool) >= limit and len(contexts) >= limit / 2:
            break
        contexts.update(by_article[i][0])
        pool += by_article[i][1]
    return contexts, rng.sample(pool, min(limit, len(pool)))
