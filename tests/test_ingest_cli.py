"""The `ingest` command: in-process with CliRunner, and as a real subprocess against a running API."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from ingest.backends import KnownDocument
from ingest.cli import cli, collect_files, main, stale_documents
from rag.core.config import Settings, get_settings
from rag.store.catalog import DocumentCatalog
from rag.store.chroma_vectors import StoreLock
from tests import hostile, scans
from tests.ingest_helpers import census, expected_chunks
from tests.servers import Server, free_port, start_api


def make_corpus(root: Path) -> dict[str, Path]:
    (root / "sub").mkdir(parents=True)
    (root / ".hidden").mkdir()
    files = {
        "a": root / "a.txt",
        "b": root / "b.md",
        "pdf": root / "sub" / "paper.pdf",
        "hidden": root / ".hidden" / "secret.txt",
    }
    files["a"].write_text("Alpha file about rivers.\n\nA second paragraph on lakes.")
    files["b"].write_text("# Beta\n\nNotes on mountains and valleys.")
    files["pdf"].write_bytes(hostile.text_pdf(["A PDF page about forests."]))
    files["hidden"].write_text("never indexed")
    return files


# Pure parts.


def test_collect_files_walks_globs_and_skips_hidden(tmp_path: Path) -> None:
    files = make_corpus(tmp_path / "docs")
    root = tmp_path / "docs"
    assert [f.name for f in collect_files([root], None, False)] == ["a.txt", "b.md"]
    assert [f.name for f in collect_files([root], None, True)] == ["a.txt", "b.md", "sub/paper.pdf"]
    assert [f.name for f in collect_files([root], "*.pdf", True)] == ["sub/paper.pdf"]
    both = collect_files([files["a"], root], None, False)  # each file once
    assert [f.name for f in both] == ["a.txt", "b.md"]
    assert all(Path(f.source).is_absolute() for f in both)


def test_files_are_named_by_their_path_under_the_folder_given(tmp_path: Path) -> None:
    root = tmp_path / "doc"
    for package in ("apt", "curl", "dpkg"):
        (root / package).mkdir(parents=True)
        (root / package / "README.gz").write_bytes(b"")
    found = collect_files([root], None, True)
    assert [f.name for f in found] == ["apt/README.gz", "curl/README.gz", "dpkg/README.gz"]
    assert len({f.source for f in found}) == 3
    # A file given by itself is named by its file name; a watcher's changed file by its place under the root.
    assert [f.name for f in collect_files([root / "apt" / "README.gz"], None, False)] == ["README.gz"]
    changed = collect_files([root / "curl" / "README.gz", root / "dpkg"], None, True, roots=[root])
    assert [f.name for f in changed] == ["curl/README.gz", "dpkg/README.gz"]


def test_stale_documents_only_under_the_given_paths(tmp_path: Path) -> None:
    root = tmp_path / "docs"
    files = make_corpus(root)
    current = collect_files([root], None, True)
    known = [
        KnownDocument("1", str(files["a"].resolve()), "indexed"),
        KnownDocument("2", str((root / "gone.txt").resolve()), "indexed"),
        KnownDocument("3", str((root / "sub" / "gone.pdf").resolve()), "failed"),
        KnownDocument("4", str((tmp_path / "elsewhere.txt").resolve()), "indexed"),
        KnownDocument("5", "uploaded.txt", "indexed"),
    ]
    assert [d.id for d in stale_documents(known, [root], current, recursive=True)] == ["2", "3"]
    top = collect_files([root], None, False)
    assert [d.id for d in stale_documents(known, [root], top, recursive=False)] == ["2"]


# In-process, opening the store directly (no API is up).


@pytest.fixture
def local_env(ingest_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The CLI's environment: the real embedder, and an API port where nothing listens."""
    monkeypatch.setenv("RAG_EMBED_URL", ingest_env["RAG_EMBED_URL"])
    monkeypatch.setenv("RAG_API_PORT", str(free_port()))
    return ingest_env


def invoke(*args: str) -> object:
    return CliRunner().invoke(cli, list(args), catch_exceptions=False)


@pytest.mark.integration
def test_ingest_folder_then_rerun_then_sync(local_env: dict[str, str], tmp_path: Path, isolated_env: Path) -> None:
    root = tmp_path / "docs"
    files = make_corpus(root)
    result = invoke(str(root), "--recursive")
    assert result.exit_code == 0, result.output
    assert "files: 3 indexed, 0 unchanged, 0 failed" in result.stdout
    assert f"via local (data dir {isolated_env})" in result.stdout  # which store, in every mode
    settings = Settings(data_dir=isolated_env)
    expected = expected_chunks([files["a"], files["b"], files["pdf"]], settings)
    seen = census(isolated_env, "default")
    assert seen.consistent() and seen.indexed() == expected

    again = invoke(str(root), "-r", "--json")
    summary = json.loads(again.stdout)
    assert summary["files"] == {"indexed": 0, "unchanged": 3, "failed": 0, "deleted": 0}
    assert summary["chunks"] == 0 and summary["mode"] == "local"

    files["a"].write_text("Alpha, rewritten: deserts and dunes.")
    files["b"].unlink()
    dry = invoke(str(root), "-r", "--sync", "--dry-run")
    assert "would index" in dry.stderr and "would delete" in dry.stderr and "nothing changed" in dry.stdout
    assert census(isolated_env, "default").indexed() == expected

    synced = json.loads(invoke(str(root), "-r", "--sync", "--json").stdout)
    assert synced["files"] == {"indexed": 1, "unchanged": 1, "failed": 0, "deleted": 1}
    seen = census(isolated_env, "default")
    assert seen.consistent()
    assert seen.indexed() == expected_chunks([files["a"], files["pdf"]], settings)


@pytest.mark.integration
def test_documents_indexed_under_their_file_names_take_their_folder_paths_on_the_next_run(
    local_env: dict[str, str], tmp_path: Path, isolated_env: Path
) -> None:
    root = tmp_path / "doc"
    for package in ("apt", "curl"):
        (root / package).mkdir(parents=True)
        (root / package / "README").write_text(f"The {package} package reads its settings from /etc/{package}.\n")
    # A store of before: each file named by its file name alone (here: each file given by itself).
    assert invoke(str(root / "apt" / "README"), str(root / "curl" / "README")).exit_code == 0
    assert sorted(names(isolated_env)) == ["README", "README"]
    rerun = invoke(str(root), "-r", "--json")
    assert json.loads(rerun.stdout)["files"]["unchanged"] == 2
    assert sorted(names(isolated_env)) == ["apt/README", "curl/README"]


def names(data_dir: Path) -> list[str]:
    catalog = DocumentCatalog(data_dir / "catalog.sqlite")
    try:
        return [r.name for r in catalog.list("default", 0, 100)]
    finally:
        catalog.close()


@pytest.mark.integration
def test_a_failing_file_is_reported_and_the_exit_status_is_1(
    local_env: dict[str, str], tmp_path: Path, isolated_env: Path
) -> None:
    good = tmp_path / "good.txt"
    good.write_text("Some perfectly fine text about owls.")
    bad = tmp_path / "tool.pdf"
    bad.write_bytes(hostile.elf_executable())
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    result = CliRunner().invoke(cli, [str(good), str(bad), str(empty), "--collection", "notes"])
    assert result.exit_code == 1
    assert f"failed        {bad.resolve()}: unsupported file type: ELF executable" in result.stderr
    assert "the file is empty" in result.stderr
    assert "files: 1 indexed, 0 unchanged, 2 failed" in result.stdout and "into 'notes'" in result.stdout
    assert census(isolated_env, "notes").consistent()


@pytest.mark.integration
def test_a_scan_shows_each_page_as_ocr_reads_it(local_env: dict[str, str], tmp_path: Path, isolated_env: Path) -> None:
    pages = [
        scans.scanned(scans.render_page([f"Page {n} of the survey covers the {town} district."]), seed=n)
        for n, town in enumerate(("Arden", "Belmont", "Corvale"), start=1)
    ]
    scan = tmp_path / "survey-scan.pdf"
    scan.write_bytes(scans.image_pdf(pages))
    result = invoke(str(scan))
    assert result.exit_code == 0, result.output
    lines = result.stderr.splitlines()
    read = [line for line in lines if "OCR page" in line]
    assert read == [f"reading       {scan.resolve()}: OCR page {n} of 3" for n in (1, 2, 3)]
    assert lines.index(read[-1]) < next(i for i, line in enumerate(lines) if line.startswith("indexed")), (
        "the pages are shown as they are read, before the file's own line"
    )


def test_usage_errors(tmp_path: Path) -> None:
    file = tmp_path / "a.txt"
    file.write_text("x")
    for args, message in [
        ([str(file), "--glob", "*.txt"], "no PATH is a folder"),
        ([str(file), "--recursive"], "no PATH is a folder"),
        ([str(file), "--server", "localhost:8000"], "needs an http(s) URL"),
        ([str(tmp_path / "missing.txt")], "does not exist"),
        ([], "Missing argument"),
    ]:
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 2, args
        assert message in result.output
    bad_collection = CliRunner().invoke(cli, [str(file), "--collection", "x"])
    assert bad_collection.exit_code != 0 and "collection name" in str(bad_collection.exception)


def test_help_has_examples() -> None:
    result = invoke("--help")
    assert result.exit_code == 0 and "Examples:" in result.output and "--sync" in result.output


def test_help_names_every_kind_of_file_read_images_too() -> None:
    shown = " ".join(invoke("--help").output.split())
    for kind in ("Text", "Markdown", "HTML", "PDF", "DOCX", "PNG", "JPEG", "TIFF", "WebP", "BMP", "OCR"):
        assert kind in shown, kind


def test_the_pages_upload_hint_names_images_in_every_locale() -> None:
    import json

    locales = Path(__file__).resolve().parent.parent / "rag" / "api" / "static" / "locales"
    for path in sorted(locales.glob("*.json")):
        hint = json.loads(path.read_text(encoding="utf-8"))["library.types"]
        assert "PNG" in hint and "JPEG" in hint and "OCR" in hint, path.name


def test_env_var_defaults(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "a.txt").write_text("x")
    monkeypatch.setenv("RAG_INGEST_SERVER", "not-a-url")
    result = CliRunner().invoke(cli, [str(tmp_path / "a.txt")])
    assert result.exit_code == 2 and "'not-a-url'" in result.output


def run_main(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["ingest", *args])
    try:
        main()
    except SystemExit as exc:
        return int(exc.code or 0), capsys.readouterr().err
    return 0, capsys.readouterr().err


def test_a_held_store_is_one_clear_line(
    tmp_path: Path, isolated_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAG_API_PORT", str(free_port()))
    (tmp_path / "a.txt").write_text("hello")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; from rag.store.chroma_vectors import StoreLock;"
            "lock = StoreLock(Path(sys.argv[1])); lock.acquire('the rag API'); print('held', flush=True); time.sleep(60)",
            str(isolated_env),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        code, err = run_main(monkeypatch, capsys, str(tmp_path / "a.txt"))
        assert code == 1
        assert err.count("\n") == 1 and err.startswith("error: the store at") and "held by the rag API" in err
        assert "ingest --server URL" in err
        monkeypatch.setenv("RAG_DEBUG", "1")
        get_settings.cache_clear()
        monkeypatch.setattr(sys, "argv", ["ingest", str(tmp_path / "a.txt")])
        with pytest.raises(Exception, match="held by the rag API"):
            main()
    finally:
        holder.kill()
        holder.wait()
    lock = StoreLock(isolated_env)
    lock.acquire("test")  # released by the holder's death
    lock.release()


@pytest.mark.integration
@pytest.mark.slow
def test_with_nothing_running_ingest_starts_its_own_embedder(
    tmp_path: Path, isolated_env: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("RAG_API_PORT", str(free_port()))
    monkeypatch.setenv("RAG_EMBED_URL", f"http://127.0.0.1:{free_port()}")
    files = make_corpus(tmp_path / "docs")
    code, err = run_main(monkeypatch, capsys, str(tmp_path / "docs"), "-r")
    assert code == 0, err
    assert "no embedding server answers at" in err and "starting one for this run" in err
    assert "embedding server ready in" in err
    seen = census(isolated_env, "default")
    assert seen.consistent() and set(seen.states.values()) == {"indexed"}
    expected = expected_chunks([files["a"], files["b"], files["pdf"]], Settings(data_dir=isolated_env))
    assert sum(expected.values()) == sum(seen.chroma.values())
    assert (isolated_env / "logs" / "ingest-embedder.log").exists()


@pytest.mark.integration
@pytest.mark.slow
def test_the_embedder_that_ingest_started_dies_when_ingest_is_killed(tmp_path: Path, isolated_env: Path) -> None:
    import signal
    import time

    from tests.test_launcher import _alive, _children

    make_corpus(tmp_path / "docs")
    env = {
        **os.environ,
        "RAG_API_PORT": str(free_port()),
        "RAG_EMBED_URL": f"http://127.0.0.1:{free_port()}",
        "RAG_DATA_DIR": str(isolated_env),
    }
    ingest = subprocess.Popen(
        [sys.executable, "-m", "ingest.cli", str(tmp_path / "docs"), "-r"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 120
        embedders: set[int] = set()
        while not embedders:
            assert ingest.poll() is None and time.monotonic() < deadline, "ingest started no embedding server"
            embedders = {
                pid for pid in _children(ingest.pid) if b"serve-embeddings" in Path(f"/proc/{pid}/cmdline").read_bytes()
            }
            time.sleep(0.1)
        os.kill(ingest.pid, signal.SIGKILL)
        ingest.wait()
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in embedders):
            assert time.monotonic() < deadline, "the embedding server outlived the ingest that started it"
            time.sleep(0.1)
    finally:
        if ingest.poll() is None:
            ingest.kill()
            ingest.wait()


# A real subprocess against a running API.


@pytest.fixture
def api(ingest_env: dict[str, str], tmp_path: Path) -> Iterator[Server]:
    server = start_api(tmp_path, ingest_env, ready_path="/v1/collections")
    yield server
    server.stop()


@pytest.mark.integration
def test_subprocess_sends_to_the_running_api(
    api: Server, ingest_env: dict[str, str], tmp_path: Path, isolated_env: Path
) -> None:
    root = tmp_path / "corpus"
    files = make_corpus(root)
    port = api.url.rsplit(":", 1)[1]
    env = {**ingest_env, "RAG_API_HOST": "127.0.0.1", "RAG_API_PORT": port}
    command = [sys.executable, "-m", "ingest.cli", str(root), "-r", "--json", "--collection", "papers"]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["mode"] == "api" and summary["files"]["indexed"] == 3
    assert "indexed" in done.stderr  # plain progress lines: stderr is not a terminal
    assert f"ingest: via the API at {api.url} (data dir {ingest_env['RAG_DATA_DIR']})" in done.stderr
    listing = httpx.get(f"{api.url}/v1/documents", params={"collection": "papers"}).json()
    assert sorted(d["source_key"] for d in listing["documents"]) == sorted(
        str(files[k].resolve()) for k in ("a", "b", "pdf")
    )
    assert sorted(d["source"] for d in listing["documents"]) == ["a.txt", "b.md", "sub/paper.pdf"]
    expected = expected_chunks([files["a"], files["b"], files["pdf"]], Settings(data_dir=isolated_env))
    assert {d["id"]: d["chunks"] for d in listing["documents"]} == expected

    # --server explicitly, with --sync after a file is removed; the API port env points nowhere.
    files["b"].unlink()
    env["RAG_API_PORT"] = str(free_port())
    synced = subprocess.run(
        [*command, "--sync", "--server", api.url], env=env, capture_output=True, text=True, timeout=300
    )
    assert synced.returncode == 0, synced.stderr
    assert json.loads(synced.stdout)["files"] == {"indexed": 0, "unchanged": 2, "failed": 0, "deleted": 1}
    assert httpx.get(f"{api.url}/v1/documents", params={"collection": "papers"}).json()["total"] == 2

    # Without --server and with the API elsewhere, the CLI refuses to open the store the API holds.
    refused = subprocess.run(
        [sys.executable, "-m", "ingest.cli", str(root)], env=env, capture_output=True, text=True, timeout=120
    )
    assert refused.returncode == 1 and "held by the rag API" in refused.stderr
    assert "Traceback" not in refused.stderr


@pytest.mark.integration
def test_an_api_on_another_data_dir_is_refused_unless_named(
    api: Server, ingest_env: dict[str, str], tmp_path: Path
) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "ok.txt").write_text("Good text about birds and their songs.")
    port = api.url.rsplit(":", 1)[1]
    other = tmp_path / "my-data"
    env = {**ingest_env, "RAG_API_HOST": "127.0.0.1", "RAG_API_PORT": port, "RAG_DATA_DIR": str(other)}
    command = [sys.executable, "-m", "ingest.cli", str(tmp_path / "in")]
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, refused.stderr
    assert f"the API at {api.url} keeps its data in {ingest_env['RAG_DATA_DIR']}" in refused.stderr
    assert str(other) in refused.stderr and f"--server {api.url}" in refused.stderr
    assert httpx.get(f"{api.url}/v1/documents").json()["total"] == 0
    sent = subprocess.run([*command, "--server", api.url], env=env, capture_output=True, text=True, timeout=300)
    assert sent.returncode == 0, sent.stderr
    assert f"ingest: via the API at {api.url} (--server)" in sent.stderr
    assert httpx.get(f"{api.url}/v1/documents").json()["total"] == 1


@pytest.mark.integration
def test_subprocess_reports_failures_through_the_api(api: Server, ingest_env: dict[str, str], tmp_path: Path) -> None:
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "ok.txt").write_text("Good text about birds and their songs.")
    (folder / "scan.pdf").write_bytes(hostile.image_only_pdf())
    env = {**ingest_env, "RAG_INGEST_SERVER": api.url}
    done = subprocess.run(
        [sys.executable, "-m", "ingest.cli", str(folder)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1
    assert "scan.pdf" in done.stderr and "no extractable text" in done.stderr
    assert "1 indexed, 0 unchanged, 1 failed" in done.stdout and "via api" in done.stdout
    assert os.environ.get("RAG_INGEST_SERVER") is None


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_on_a_terminal(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from ingest.cli import Report
    from ingest.pipeline import FileResult, SourceFile

    terminal = FakeTerminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    report = Report(as_json=False, total=2)
    with report.progress():
        for name, status in (("a.txt", "indexed"), ("b.pdf", "failed")):
            report.file_started(SourceFile(tmp_path / name, str(tmp_path / name), name))
            report.chunks_stored(3 if status == "indexed" else 0)
            report.file_done(
                FileResult(name, str(tmp_path / name), "id", status, "broken" if status == "failed" else None, 3)
            )
    shown = terminal.getvalue()
    assert "2/2" in shown and "chunks/s" in shown and "ETA" in shown
    assert f"failed        {tmp_path / 'b.pdf'}: broken" in shown
    assert "indexed       " not in shown  # on a terminal the bar replaces the per-file lines


@pytest.mark.integration
def test_the_cli_never_imports_torch(ingest_env: dict[str, str], tmp_path: Path) -> None:
    """Embeddings come from the embedding server: a local ingest of text, PDF and DOCX loads no model."""
    folder = tmp_path / "in"
    folder.mkdir()
    (folder / "a.txt").write_text("Text about rivers.")
    (folder / "b.pdf").write_bytes(hostile.text_pdf(["A PDF about lakes."]))
    (folder / "c.docx").write_bytes(hostile.docx_document([("p", "A memo about hills.")]))
    code = (
        "import sys\nfrom ingest.cli import main\nsys.argv = ['ingest', sys.argv[1]]\n"
        "try:\n    main()\nexcept SystemExit as exc:\n    assert not exc.code, exc.code\n"
        "heavy = sorted(m for m in ('torch', 'sentence_transformers', 'transformers') if m in sys.modules)\n"
        "print('heavy:', heavy)\n"
    )
    env = {**ingest_env, "RAG_API_PORT": str(free_port())}
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder)], env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert "files: 3 indexed" in done.stdout and "heavy: []" in done.stdout
