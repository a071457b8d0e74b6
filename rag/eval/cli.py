"""`rag eval DATASET`: retrieval and answer quality on a SQuAD-format question set, with a regression gate.

It runs in this process against the configured backends: it opens the store itself (the embedded
Chroma is locked to one process, so a running API must be stopped first, or the evaluation pointed at
another RAG_DATA_DIR; with RAG_CHROMA_MODE=server both can run), embeds through the embedding server
and, with --answers, generates through llama-server. The API has no endpoint that searches with one
method only, which a per-method comparison needs; in-process, the run uses the same Retriever,
pipeline and answering core that the API serves.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import click

from rag.core.command_line import load_settings
from rag.core.config import Settings
from rag.core.errors import StoreLocked
from rag.core.provenance import summary
from rag.eval._metrics import RIGHT_F1
from rag.eval.harness import (
    MODES,
    EvalOptions,
    EvalSet,
    Evaluation,
    compare,
    read_baseline,
    read_squad,
    sample_differs,
    unmeasured,
    write_report,
)

EXIT_REGRESSION = 3

EPILOG = """\b
Examples:
  rag eval data/squad-v1.1-dev.json --limit 200
  rag eval squad.json --limit 200 --json > baseline.json
  RAG_CHUNK_TOKENS=120 rag eval squad.json --limit 200 --baseline baseline.json --max-drop 0.02
  rag eval cmrc2018-trial.json --answers --limit 50 --report eval-report/
  RAG_GENERATOR=smollm2-135m-instruct rag eval squad.json --limit 200 --answers --answer-limit 50

\b
Exit status: 0 ok, 1 an error (a backend down, the store held by a running API), 3 a metric fell more
than --max-drop below the baseline.
"""


class RichProgress:
    """A progress bar per stage on a terminal; elsewhere (a log file) a line at every tenth of a stage."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        console = Console(stderr=True)
        self.plain = not console.is_terminal
        self.bar = Progress(
            TextColumn("{task.description:<9}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            console=console,
            disable=self.plain,
        )
        self._task: Any = None
        self._line = ("", 0, 0)  # stage, total, done (plain mode)

    def __enter__(self) -> RichProgress:
        self.bar.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.bar.stop()

    def stage(self, name: str, total: int) -> None:
        if self._task is not None:
            self.bar.update(self._task, completed=self.bar.tasks[-1].total)
        self._task = self.bar.add_task(name, total=total)
        self._line = (name, total, 0)
        if self.plain:
            click.echo(f"{name}: 0/{total}", err=True)

    def advance(self, n: int = 1) -> None:
        self.bar.advance(self._task, n)
        name, total, done = self._line
        self._line = (name, total, done + n)
        if self.plain and (done + n) * 10 // max(total, 1) > done * 10 // max(total, 1):
            click.echo(f"{name}: {done + n}/{total}", err=True)


def _open_parts(settings: Settings) -> Any:
    from rag.api.services import build_services

    try:
        return build_services(settings, owner="rag eval")
    except StoreLocked as exc:
        raise StoreLocked(
            f"rag eval opens the store itself, and {exc.message.split(';')[0]}. Stop the API, or evaluate in "
            "a store of its own (RAG_DATA_DIR=/tmp/rag-eval rag eval ...), or run Chroma as a server "
            "(RAG_CHROMA_MODE=server) so that both can use it"
        ) from None


async def _evaluate(evalset: EvalSet, settings: Settings, options: EvalOptions) -> dict[str, Any]:
    """The run, with the embedding model prepared on this machine first (its tokenizer cuts the chunks)
    and an embedding server of its own started when none answers at RAG_EMBED_URL, as `ingest` does."""
    from ingest.embedder import embedder_for
    from rag.deploy.e5_rebuild import prepare_embedder

    prepare_embedder(settings, _say)
    async with embedder_for(settings, _say, "rag eval") as served:
        parts = _open_parts(served)
        try:
            with RichProgress() as progress:
                return await Evaluation(parts, served, options, progress).run(evalset)
        finally:
            await parts.aclose()


def _say(line: str) -> None:
    click.echo(line, err=True)


def render_table(result: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    ret = result["retrieval"]
    table = Table(
        title=f"{result['dataset']['name']}: {ret['questions']} questions, collection {result['config']['collection']}"
    )
    for column in ("method", "recall@1", "recall@5", "recall@10", "MRR", "search p50 ms", "p95 ms"):
        table.add_column(column, justify="left" if column == "method" else "right")
    for mode, m in ret["methods"].items():
        lat = m["search_ms"]
        table.add_row(
            mode,
            *(f"{m[k]:.3f}" for k in ("recall@1", "recall@5", "recall@10", "mrr")),
            str(lat.get("p50")),
            str(lat.get("p95")),
        )
    console.print(table)
    console.print(f"provenance: {summary(result['provenance'])}")
    ing, emb = result["ingest"], ret["embed_ms"]
    console.print(
        f"ingest: {ing['indexed']} indexed, {ing['unchanged']} unchanged, {ing['failed']} failed, "
        f"{ing['chunks_indexed']} chunks in {ing['seconds']} s; query embed p50 {emb.get('p50')} ms, "
        f"p95 {emb.get('p95')} ms; {ret['without_gold_chunk']} questions without an answer-bearing chunk"
    )
    answers = result.get("answers")
    if answers:
        cp = answers["citation_precision"]
        console.print(
            f"answers: EM {answers['exact_match']:.3f}  F1 {answers['f1']:.3f}  citation precision "
            f"{'n/a' if cp is None else f'{cp:.3f}'} ({answers['citations']} citations)  no valid citation "
            f"{answers['no_valid_citation']:.3f}  TTFT p50 {answers['ttft_ms'].get('p50')} ms p95 "
            f"{answers['ttft_ms'].get('p95')} ms"
        )
        ap = answers["attribution_precision"]
        console.print(
            f"attribution precision {'n/a' if ap is None else f'{ap:.3f}'} ({answers['attributed']} attributed)  "
            f"with a supported source {answers['supported_source']:.3f}  at the token limit "
            f"{answers['at_token_limit']:.3f}  whole answer p50 {answers['total_ms'].get('p50')} ms  "
            f"style {answers['prompt_style']}"
        )
        console.print(
            f"empty answers: {answers['empty_first_attempt']:.3f} at the first attempt, "
            f"{answers['no_answer']:.3f} after the retry; withheld as too unlikely {answers['unsure']:.3f}"
        )
        sp = answers["supported_precision"]
        console.print(
            f"shown as supported: {answers['supported_answers']} answers, right (F1 >= {RIGHT_F1}) "
            f"{'n/a' if sp is None else f'{sp:.3f}'} of them"
        )


def _gate(result: dict[str, Any], baseline_path: Path, max_drop: float) -> bool:
    """Print the comparison with the baseline on stderr; whether the run passes."""
    baseline = read_baseline(baseline_path)
    why = sample_differs(result, baseline)
    if why:
        click.echo(f"warning: not the same questions as the baseline ({why}): the comparison is loose", err=True)
    missing = unmeasured(result["scores"], baseline["scores"])
    if missing:
        click.echo(f"warning: not measured in this run, not compared: {', '.join(missing)}", err=True)
    if len(missing) == len(baseline["scores"]):
        raise click.ClickException("no metric of the baseline was measured in this run: nothing to compare")
    regressions = compare(result["scores"], baseline["scores"], max_drop)
    for regression in regressions:
        click.echo(f"REGRESSION {regression.line()}", err=True)
    compared = len(baseline["scores"]) - len(missing)
    if regressions:
        click.echo(
            f"{len(regressions)} of {compared} metrics fell more than {max_drop} below {baseline_path}", err=True
        )
        return False
    click.echo(f"gate passed: none of {compared} metrics fell more than {max_drop} below {baseline_path}", err=True)
    return True


@click.command("eval", epilog=EPILOG)
@click.argument("dataset", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option(
    "--collection",
    default=None,
    help="Index into (or reuse) this collection and keep it. Default: a fresh one, removed at the end.",
)
@click.option("--keep", is_flag=True, help="Keep the fresh collection (its name is in the output).")
@click.option("--modes", default=",".join(MODES), show_default=True, help="Retrieval methods to measure.")
@click.option("--answers", is_flag=True, help="Also generate answers (llama-server) and score them.")
@click.option(
    "--max-tokens",
    type=click.IntRange(1, 4096),
    default=None,
    help="Answer length limit with --answers  [default: the prompt style's, as in the API]",
)
@click.option(
    "--limit",
    type=click.IntRange(1),
    default=None,
    help="A seeded sample of N questions; only their paragraphs are indexed.",
)
@click.option(
    "--answer-limit",
    type=click.IntRange(1),
    default=None,
    help="With --answers, answer only the first N questions of the sample (a slow model on the same questions).",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the results as JSON (the --baseline format).")
@click.option(
    "--report",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write report.md, results.json and plots into this directory.",
)
@click.option(
    "--baseline",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="A previous --json output: exit 3 when a metric falls more than --max-drop below it.",
)
@click.option("--max-drop", type=click.FloatRange(0, 1), default=0.02, show_default=True)
def eval_command(
    dataset: Path,
    collection: str | None,
    keep: bool,
    modes: str,
    answers: bool,
    max_tokens: int | None,
    limit: int | None,
    answer_limit: int | None,
    seed: int,
    as_json: bool,
    report: Path | None,
    baseline: Path | None,
    max_drop: float,
) -> None:
    """Measure retrieval (recall@1/5/10, MRR per method) and, with --answers, answer quality on DATASET.

    DATASET is SQuAD JSON: data[].paragraphs[].{context, qas[].{question, answers[].text}}. Each
    paragraph is indexed as a document through the normal ingestion pipeline.
    """
    settings = load_settings()
    chosen = tuple(m.strip() for m in modes.split(",") if m.strip())
    if not chosen or any(m not in MODES for m in chosen):
        raise click.BadParameter(f"choose among {', '.join(MODES)}", param_hint="--modes")
    if collection:
        from rag.store.catalog import check_collection

        check_collection(collection)
    evalset = read_squad(dataset, limit=limit, seed=seed)
    options = EvalOptions(
        collection=collection,
        keep=keep,
        modes=chosen,
        answers=answers,
        max_tokens=max_tokens,
        limit=limit,
        seed=seed,
        answer_limit=answer_limit,
    )
    result = asyncio.run(_evaluate(evalset, settings, options))
    if as_json:
        click.echo(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        render_table(result)
    if report:
        path = write_report(result, report)
        click.echo(f"report: {path}", err=True)
    if baseline and not _gate(result, baseline, max_drop):
        sys.exit(EXIT_REGRESSION)
