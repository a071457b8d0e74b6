"""The regression gate: a run's flat scores against a baseline's, with the drop each may take."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rag.core.errors import InvalidRequest
from rag.eval._metrics import KS

LOWER_IS_BETTER = frozenset({"answers.no_valid_citation"})


@dataclass
class Regression:
    metric: str
    baseline: float
    current: float

    @property
    def drop(self) -> float:
        """How much worse than the baseline (positive: worse), whichever way the metric points."""
        delta = self.baseline - self.current
        return -delta if self.metric in LOWER_IS_BETTER else delta

    def line(self) -> str:
        return f"{self.metric}: {self.baseline:.4f} -> {self.current:.4f} (worse by {self.drop:.4f})"


def compare(current: dict[str, float], baseline: dict[str, float], max_drop: float) -> list[Regression]:
    """The metrics measured in both runs that got worse than the baseline by more than `max_drop` (absolute)."""
    checks = [Regression(m, float(b), float(current[m])) for m, b in sorted(baseline.items()) if m in current]
    return [c for c in checks if c.drop > max_drop + 1e-9]


def unmeasured(current: dict[str, float], baseline: dict[str, float]) -> list[str]:
    """Metrics of the baseline that this run did not measure (other --modes, no --answers)."""
    return sorted(set(baseline) - set(current))


def read_baseline(path: Path) -> dict[str, Any]:
    try:
        baseline: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        baseline["scores"]  # noqa: B018 - shape check
    except (ValueError, KeyError, TypeError) as exc:
        raise InvalidRequest(f"{path} is not the --json output of rag eval: {exc}") from None
    return baseline


def sample_differs(result: dict[str, Any], baseline: dict[str, Any]) -> str | None:
    """Why the two runs did not ask the same questions, if they did not."""
    a, b = result.get("dataset", {}), baseline.get("dataset", {})
    for key in ("sha256", "limit", "seed"):
        if a.get(key) != b.get(key):
            return f"the baseline ran with {key}={b.get(key)!r}, this run with {a.get(key)!r}"
    return None


def flat_scores(result: dict[str, Any]) -> dict[str, float]:
    """The gated metrics of a result, one flat name each."""
    scores: dict[str, float] = {}
    for mode, m in result["retrieval"]["methods"].items():
        for key in (*(f"recall@{k}" for k in KS), "mrr"):
            scores[f"retrieval.{mode}.{key}"] = round(m[key], 4)
    answers = result.get("answers")
    if answers:
        for key in (
            "exact_match",
            "f1",
            "citation_precision",
            "no_valid_citation",
            "attribution_precision",
            "supported_source",
        ):
            if answers.get(key) is not None:
                scores[f"answers.{key}"] = round(answers[key], 4)
    return scores
