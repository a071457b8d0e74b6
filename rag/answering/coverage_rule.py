"""Whether the documents cover a question: the "not in the documents" decision over the retrieved chunks.

Two rules, chosen by RAG_REFUSAL_RULE:

- `floor` (the first one): the best chunk's relevance (rag.answering.retrieval.relevance: the raw cosine
  and the IDF-weighted term coverage blended by the query's dense weight) against RAG_MIN_RELEVANCE;
- `model`: a logistic regression over several signals of the top-k hits, with one coefficient set per
  embedder (`COEFFICIENTS`), fitted by bench/refusal.py on a training split of SQuAD dev and the CMRC
  trial set (articles split by a hash of their title; the figures it reports come from the other half).

The signals (`signals`), all on scales that mean the same across queries:

- `cosine`: the best raw cosine of a hit (the dense top score, the embedder's own scale);
- `cosine_gap`: that best cosine minus the lowest cosine among the k hits (how far the best chunk stands
  out: a question about another article finds k chunks about equally near);
- `coverage`: the best IDF-weighted share of the query's search terms that one hit holds;
- `top_coverage`: the share the fused first hit holds (the chunk the generator reads first);
- `absent`: the IDF-weighted share of the query's search terms that no chunk of the index holds at all
  (a question about another subject names things the documents never mention). Its fitted weight is
  small and negative for both embedders (the coverage already falls with such a term); leaving it out
  still costs E5 2 points of refusals in cross-validation on TRAIN (bench/README.md);
- `agreement`: the share of the dense top 5 that is also in the BM25 top 5, among the k hits (rank
  overlap: two retrievers that agree on the chunks point at one subject);
- `cjk` and its products with `cosine` and `coverage`: the share of CJK characters in the query, so that a
  Chinese query that an English embedder reads as [UNK]s is weighed by its own coefficients.

A question that names something no chunk of the searched documents holds a word of ("Which port does
MongoDB use?" over Debian's documents: rag/answering/named_terms.py) must pass the model's higher
`named_threshold` (RAG_REFUSE_UNKNOWN_NAMES): such a question found near chunks all the same (other ports,
other databases) and its probability came out 0.13-0.76 on bench/real_docs, while a covered question
naming a word its documents spell otherwise (a typo, "Californian" for California) mostly keeps a high
one. The fixed answer then says what no document mentions.

The model gives the probability that the documents answer the question; under the embedder's
`threshold` the answer is the fixed "not in the documents" reply. An embedder without a coefficient set
is judged by the floor, and so are hits without any cosine (BM25 alone): the model was fitted on hybrid
hits, whose dense top is its strongest signal.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Protocol

from rag.answering.retrieval import relevance, relevance_floor
from rag.core.config import Settings
from rag.store.chunk_record import cjk_fraction

FEATURES = (
    "cosine",
    "cosine_gap",
    "coverage",
    "top_coverage",
    "absent",
    "agreement",
    "cjk",
    "cjk_cosine",
    "cjk_coverage",
)
AGREEMENT_DEPTH = 5

# Per embedder: `intercept`, one weight per FEATURES name, the `threshold` on the probability and the
# `named_threshold` for a question with an unknown name.
# Written by `bench.refusal --fit` (bench/results/refusal-<embedder>.txt holds the run).
COEFFICIENTS: dict[str, dict[str, float]] = {
    # bench/results/refusal-e5.txt: fitted on 2,866 TRAIN questions (SQuAD dev, CMRC trial, 8 single-article collections)
    "multilingual-e5-small": {
        "intercept": -52.5781,
        "cosine": 56.8674,
        "cosine_gap": 22.5616,
        "coverage": 3.8385,
        "top_coverage": 4.9209,
        "absent": -1.44,
        "agreement": 2.5692,
        "cjk": 1.4486,
        "cjk_cosine": 1.9897,
        "cjk_coverage": 6.0446,
        "threshold": 0.118,
        "named_threshold": 0.888,  # bench.refusal --fit-named (bench/results/refusal-named-e5.txt)
    },
    # bench/results/refusal-minilm.txt: the same TRAIN questions, MiniLM's chunks and vectors (named_threshold:
    # refusal-named-minilm.txt)
    "all-MiniLM-L6-v2": {
        "intercept": -10.1919,
        "cosine": 11.8788,
        "cosine_gap": 0.5073,
        "coverage": 3.3643,
        "top_coverage": 5.6627,
        "absent": -2.1561,
        "agreement": 3.343,
        "cjk": 6.6966,
        "cjk_cosine": -8.287,
        "cjk_coverage": 23.6634,
        "threshold": 0.183,
        "named_threshold": 0.872,
    },
}


class Hit(Protocol):
    """What the rule reads of a retrieved chunk (rag.answering.retrieval.RetrievedChunk is one)."""

    @property
    def cosine(self) -> float | None: ...
    @property
    def coverage(self) -> float: ...
    @property
    def dense_rank(self) -> int | None: ...
    @property
    def lexical_rank(self) -> int | None: ...
    @property
    def absent(self) -> float: ...
    @property
    def unknown_names(self) -> tuple[str, ...]: ...


def signals(query: str, hits: Sequence[Hit]) -> dict[str, float]:
    """The rule's inputs for `query` and its hits in the fused order (see the module docstring)."""
    cosines = sorted((max(h.cosine, 0.0) for h in hits if h.cosine is not None), reverse=True)
    best = cosines[0] if cosines else 0.0
    coverage = max((h.coverage for h in hits), default=0.0)
    both = sum(
        1
        for h in hits
        if h.dense_rank is not None
        and h.lexical_rank is not None
        and h.dense_rank <= AGREEMENT_DEPTH
        and h.lexical_rank <= AGREEMENT_DEPTH
    )
    c = cjk_fraction(query)
    return {
        "cosine": best,
        "cosine_gap": best - cosines[-1] if cosines else 0.0,
        "coverage": coverage,
        "top_coverage": hits[0].coverage if hits else 0.0,
        "absent": hits[0].absent if hits else 0.0,
        "agreement": both / AGREEMENT_DEPTH,
        "cjk": c,
        "cjk_cosine": c * best,
        "cjk_coverage": c * coverage,
    }


def covered_probability(features: Mapping[str, float], coefficients: Mapping[str, float]) -> float:
    """The model's probability that the documents answer the question."""
    z = coefficients["intercept"] + sum(coefficients[name] * features[name] for name in FEATURES)
    return 1.0 / (1.0 + math.exp(-z)) if z > -700 else 0.0


def coefficients_for(settings: Settings) -> Mapping[str, float] | None:
    """The embedder's coefficient set when the model rule is on and the embedder has one."""
    if settings.refusal_rule != "model":
        return None
    return COEFFICIENTS.get(settings.embed_model)


def unknown_names(hits: Sequence[Hit], settings: Settings) -> tuple[str, ...]:
    """The names of the question that no searched chunk holds, when the rule reads them."""
    return hits[0].unknown_names if hits and settings.refuse_unknown_names else ()


def covered(query: str, hits: Sequence[Hit], settings: Settings) -> bool:
    """Whether the hits answer `query` by the configured rule (False: "not in the documents"). A floor set
    to 0 turns refusal off under either rule, as it always has."""
    if not hits:
        return False
    if relevance_floor(query, settings) == 0:  # RAG_MIN_RELEVANCE=0 (or its CJK twin, for such a query): off
        return True
    coefficients = coefficients_for(settings)
    if coefficients is None or all(h.cosine is None for h in hits):  # no dense signal: what the model reads most
        return relevance(query, hits, settings) >= relevance_floor(query, settings)
    threshold = coefficients["named_threshold"] if unknown_names(hits, settings) else coefficients["threshold"]
    return covered_probability(signals(query, hits), coefficients) >= threshold
