"""Precision of "supported": of the answers shown as supported, the share that are right (F1 >= 0.5).

    .venv/bin/python bench/supported_precision.py --out result.json

Runs `rag eval --answers`' own harness (ingest, retrieval, packing, attribution) on the CMRC trial's
200-question sample and on the SQuAD slice's questions that `bench/results/eval-squad-answers-e5/` answered,
with the real embedding server (multilingual-e5-small), and replays as the generator the answers that
the bundled Gemma 3 270M gave in the recorded runs (`bench/results/eval-*-answers-e5/results.json`):
the same answers go through the attribution of whichever code is on PYTHONPATH, so two checkouts compare
on identical text. A replayed answer meets today's prompt, which may hold another chunk than the one it
was generated from; the precision is of the attribution, not of the model.

`--dump FILE` also keeps what the attribution was given per question (the question, the answer, the
prompt's chunks) with the answer's F1, so that `bench/supported_replay.py` can judge another
attribution on the same inputs in milliseconds, without the embedder.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._provenance import header, write_json  # noqa: E402
from bench._servers import server_env  # noqa: E402
from tests.chat_helpers import ReplayLlamaServer  # noqa: E402
from tests.servers import start_embedding_server  # noqa: E402

RESULTS = ROOT / "bench" / "results"
SETS = {
    "cmrc": (ROOT / "tests/data/cmrc2018-trial.json", RESULTS / "eval-cmrc-answers-e5/results.json", 200),
    "squad": (ROOT / "tests/data/squad-v1.1-dev-slice.json", RESULTS / "eval-squad-answers-e5/results.json", None),
}
QUESTION = re.compile(r".*Question:\s*(.+?)\s*\nAnswer:\s*$", re.S)  # the prompt's last question


class RecordedAnswers(ReplayLlamaServer):
    """llama-server replaying, for each question of a completion prompt, the answer recorded for it."""

    def __init__(self, by_question: dict[str, str]) -> None:
        super().__init__("")
        self.by_question = by_question

    def handle(self, request: Any) -> Any:
        if request.url.path == "/v1/completions":
            match = QUESTION.search(json.loads(request.content)["prompt"])
            self.reply = self.by_question.get(match.group(1).strip(), "") if match else ""
        return super().handle(request)


class AttributionInputs:
    """What `citations_event` was given per answer (question -> answer text and prompt chunks)."""

    def __init__(self) -> None:
        self.seen: dict[str, dict[str, Any]] = {}

    def install(self) -> None:
        from rag.answering import answer_stream

        original = answer_stream.citations_event

        def recording(text: str, chunks: Any, hits: Any, **kwargs: Any) -> Any:
            question = kwargs.get("question", "")
            self.seen[question.strip()] = {"question": question, "text": text, "chunks": dict(chunks)}
            return original(text, chunks, hits, **kwargs)

        answer_stream.citations_event = recording  # type: ignore[assignment]


async def measure(name: str, embed_url: str, work: Path, inputs: AttributionInputs) -> dict[str, Any]:
    from rag.api.services import build_services
    from rag.clients.llm import LlamaServerClient
    from rag.core.config import Settings
    from rag.eval.harness import EvalOptions, EvalSet, Evaluation, read_squad

    data, recorded_path, limit = SETS[name]
    recorded = {q["qid"]: q["answer"] for q in json.loads(recorded_path.read_text())["answers"]["per_question"]}
    full = read_squad(data, limit=limit, seed=0)
    questions = [q for q in full.questions if q.qid in recorded]
    evalset = EvalSet(full.name, full.sha256, full.contexts, questions, full.total_questions, full.total_contexts)
    replay = RecordedAnswers({q.question.strip(): recorded[q.qid] for q in questions})
    settings = Settings(
        data_dir=work / name,
        embed_url=embed_url,
        embed_model="multilingual-e5-small",
        llm_prompt_style="completion",
    )
    services = build_services(settings, owner="bench/supported_precision.py")
    services.llm = LlamaServerClient("http://replay", model=settings.llm_model, transport=replay.transport())
    try:
        result = await Evaluation(services, settings, EvalOptions(modes=("hybrid",), answers=True)).run(evalset)
    finally:
        await services.aclose()
    answers = result["answers"]
    keys = ("questions", "exact_match", "f1", "supported_answers", "supported_precision", "attribution_precision")
    by_qid = {q.qid: inputs.seen.get(q.question.strip()) for q in questions}
    return {
        "questions_replayed": len(questions),
        **{k: answers[k] for k in keys},
        "per_question": [
            {**{k: q[k] for k in ("qid", "answer", "f1", "supported")}, "inputs": by_qid.get(q["qid"])}
            for q in answers["per_question"]
        ],
        "provenance": result["provenance"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--sets", default="squad,cmrc")
    parser.add_argument("--dump", type=Path, help="also write the attribution's inputs per question here")
    args = parser.parse_args()
    print(header(), flush=True)
    work = Path(tempfile.mkdtemp(prefix="supported-precision-"))
    embedder = start_embedding_server(work, server_env(work / "embedder", RAG_EMBED_MODEL="multilingual-e5-small"))
    out: dict[str, Any] = {"load_average_at_start": [round(x, 2) for x in os.getloadavg()]}
    inputs = AttributionInputs()
    inputs.install()
    try:
        for name in args.sets.split(","):
            out[name] = asyncio.run(measure(name, embedder.url, work, inputs))
            shown = {k: out[name][k] for k in ("questions", "supported_answers", "supported_precision", "f1")}
            print(name, shown, flush=True)
    finally:
        embedder.stop()
    if args.dump:
        write_json(args.dump, out)
    for name in args.sets.split(","):
        for q in out[name]["per_question"]:
            q.pop("inputs")
    write_json(args.out, out)


if __name__ == "__main__":
    main()
