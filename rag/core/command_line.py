"""What every command of ours does alike: settings that fail as one line, and one error path.

Expected failures (invalid settings, a click usage error, any `RagError`) end as one line on stderr and
a non-zero exit; `RAG_DEBUG=1` shows the traceback of a `RagError` instead. The `rag` and `ingest`
entry points and the command modules beneath them (`rag eval`) share this, so none imports another.
"""

from __future__ import annotations

import sys

import click

from rag.core.config import Settings, get_settings, settings_error_line
from rag.core.errors import RagError


def load_settings() -> Settings:
    """The settings, or a one-line click error naming the invalid one."""
    from pydantic import ValidationError

    try:
        return get_settings()
    except ValidationError as exc:
        raise click.ClickException(settings_error_line(exc)) from None


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
    except (RagError, BaseExceptionGroup) as exc:
        # A task group (anyio, asyncio.TaskGroup) wraps what its tasks raised: the RagError inside is the reason.
        reason = exc if isinstance(exc, RagError) else _rag_error_in(exc)
        if reason is None or _debug():
            raise
        click.echo(f"error: {reason.message}", err=True)
        sys.exit(1)
    if isinstance(code, int) and code:
        sys.exit(code)


def _debug() -> bool:
    """RAG_DEBUG, as the settings read it (settings that do not load show no traceback)."""
    from pydantic import ValidationError

    try:
        return get_settings().debug
    except ValidationError:
        return False


def _rag_error_in(group: BaseExceptionGroup) -> RagError | None:
    for exc in group.exceptions:
        found = (
            exc if isinstance(exc, RagError) else _rag_error_in(exc) if isinstance(exc, BaseExceptionGroup) else None
        )
        if found is not None:
            return found
    return None
