"""Precision of "supported", two attributions side by side on the same recorded inputs, in one run.

    .venv/bin/python bench/supported_precision.py --out FILE --dump INPUTS   # once: the inputs
    .venv/bin/python bench/supported_replay.py INPUTS --before /work/main --out result.json

`INPUTS` holds, per question of the SQuAD slice and the CMRC sample, what `citations_event` was given
(the question, the replayed answer, the prompt's chunks) and the answer's F1 against the gold answers.
This script runs the attribution of the checkout at `--before` and that of the code on PYTHONPATH over
them (milliseconds per answer, no embedder, no generator): for each, the answers shown as supported, the
precision (the share of those that are right, F1 >= 0.5), and which right and wrong answers lost or gained
the mark. The questions are split in two halves by a hash of their id: `tuning` (what a rule may be
fitted to) and `held_out` (reported apart, so a rule fitted to one half is judged on the other).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import zlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._provenance import header, write_json  # noqa: E402

RIGHT_F1 = 0.5
Attribute = Callable[[str, Mapping[str, str], str], Any]


def attribution_of(checkout: Path | None) -> Attribute:
    """`attribute` of rag/answering/citations.py in `checkout` (None: the code on PYTHONPATH); its
    imports come from the code on PYTHONPATH."""
    if checkout is None:
        from rag.answering.citations import attribute

        return attribute
    path = checkout / "rag" / "answering" / "citations.py"
    spec = importlib.util.spec_from_file_location(f"citations_at_{abs(hash(str(checkout)))}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module.attribute  # type: ignore[no-any-return]


def half(qid: str) -> str:
    return "tuning" if zlib.crc32(qid.encode()) % 2 == 0 else "held_out"


def shown_supported(attribute: Attribute, inputs: Mapping[str, Any]) -> bool:
    """What the page shows: an attributed chunk for some sentence of the answer."""
    return any(s.supported for s in attribute(inputs["text"], inputs["chunks"], inputs["question"]).sentences)


def scores(marks: list[tuple[bool, bool]]) -> dict[str, Any]:
    """(shown supported, right) per answer -> the counts and the precision."""
    supported = [right for shown, right in marks if shown]
    return {
        "answers": len(marks),
        "right": sum(right for _, right in marks),
        "supported": len(supported),
        "supported_right": sum(supported),
        "supported_wrong": len(supported) - sum(supported),
        "precision": round(sum(supported) / len(supported), 3) if supported else None,
    }


def compare(questions: list[dict[str, Any]], before: Attribute, after: Attribute) -> dict[str, Any]:
    rows = []
    for q in questions:
        if q["inputs"] is None:
            continue
        right = q["f1"] >= RIGHT_F1
        rows.append((q, right, shown_supported(before, q["inputs"]), shown_supported(after, q["inputs"])))
    out: dict[str, Any] = {}
    for part in ("all", "tuning", "held_out"):
        chosen = [r for r in rows if part == "all" or half(r[0]["qid"]) == part]
        out[part] = {
            "before": scores([(b, right) for _, right, b, _ in chosen]),
            "after": scores([(a, right) for _, right, _, a in chosen]),
            "right_losing_the_mark": sum(right and b and not a for _, right, b, a in chosen),
            "wrong_losing_the_mark": sum(not right and b and not a for _, right, b, a in chosen),
            "right_gaining_the_mark": sum(right and a and not b for _, right, b, a in chosen),
            "wrong_gaining_the_mark": sum(not right and a and not b for _, right, b, a in chosen),
        }
    out["changed"] = [
        {"qid": q["qid"], "half": half(q["qid"]), "answer": q["answer"], "f1": q["f1"], "before": b, "after": a}
        for q, _, b, a in rows
        if a != b
    ]
    out["still_wrong_and_supported"] = [
        {"qid": q["qid"], "half": half(q["qid"]), "question": q["inputs"]["question"], "answer": q["answer"]}
        for q, right, _, a in rows
        if a and not right
    ]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("inputs", type=Path, help="written by bench/supported_precision.py --dump")
    parser.add_argument("--before", type=Path, required=True, help="a checkout whose attribution is 'before'")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    print(header(), flush=True)
    recorded = json.loads(args.inputs.read_text(encoding="utf-8"))
    before, after = attribution_of(args.before), attribution_of(None)
    out: dict[str, Any] = {
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "inputs": {"file": str(args.inputs), "provenance": recorded.get("provenance")},
        "before": str(args.before),
        "after": "the code on PYTHONPATH (this file's provenance)",
    }
    for name in ("squad", "cmrc"):
        if name not in recorded:
            continue
        out[name] = compare(recorded[name]["per_question"], before, after)
        for part in ("all", "tuning", "held_out"):
            r = out[name][part]
            print(
                f"{name:5} {part:8} answers {r['before']['answers']:3}  supported {r['before']['supported']:3} -> "
                f"{r['after']['supported']:3}  precision {r['before']['precision']} -> {r['after']['precision']}  "
                f"wrong supported {r['before']['supported_wrong']:3} -> {r['after']['supported_wrong']:3}  "
                f"right losing the mark {r['right_losing_the_mark']}  wrong losing it {r['wrong_losing_the_mark']}  "
                f"gaining: right {r['right_gaining_the_mark']} wrong {r['wrong_gaining_the_mark']}",
                flush=True,
            )
    if args.out:
        write_json(args.out, out)


if __name__ == "__main__":
    main()
