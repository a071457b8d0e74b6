"""The folders show the architecture: each part imports only the parts beneath it, and no module
imports itself back through others (the README's "Layout" paragraph names the same rules)."""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# What each part may import (besides itself). The CLIs (`rag.cli`, `ingest.cli`) sit on top of everything.
ALLOWED = {
    "rag.core": set(),
    "rag.clients": {"rag.core"},
    "rag.store": {"rag.core"},
    "rag.deploy": {"rag.core"},
    "rag.servers": {"rag.core"},
    "rag.answering": {"rag.core", "rag.clients", "rag.store"},
    "ingest": {"rag.core", "rag.clients", "rag.store"},
    "rag.api": {"rag.core", "rag.clients", "rag.store", "rag.answering", "ingest"},
    "rag.eval": {"rag.core", "rag.clients", "rag.store", "rag.deploy", "rag.answering", "ingest", "rag.api"},
}
TOP = {"rag.cli", "ingest.cli"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def project_modules() -> dict[str, Path]:
    return {module_name(p): p for top in ("rag", "ingest") for p in (ROOT / top).rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """Every project module `path` imports, at any depth of the file (function-level imports too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def part_of(module: str) -> str:
    if module in TOP:
        return module
    for part in sorted(ALLOWED, key=len, reverse=True):
        if module == part or module.startswith(part + "."):
            return part
    return module


def import_graph() -> dict[str, set[str]]:
    modules = project_modules()
    return {name: imports_of(name, path, set(modules)) for name, path in modules.items()}


def test_every_module_belongs_to_a_named_part():
    loose = [m for m in project_modules() if part_of(m) not in ALLOWED and m not in TOP and m not in ("rag", "ingest")]
    assert loose == []


def test_parts_import_only_the_parts_beneath_them():
    upward = []
    for module, targets in import_graph().items():
        part = part_of(module)
        if part in TOP or part not in ALLOWED:
            continue
        for target in targets:
            target_part = part_of(target)
            if target_part not in (part, "rag", "ingest") and target_part not in ALLOWED[part]:
                upward.append(f"{module} -> {target}")
    assert upward == []


def test_loaders_import_only_the_settings_errors_data_and_format_checks():
    allowed = ("rag.core", "ingest.models", "ingest.detect", "ingest.loaders")
    wider = [
        f"{module} -> {target}"
        for module, targets in import_graph().items()
        if module.startswith("ingest.loaders")
        for target in targets
        if not any(target == a or target.startswith(a + ".") for a in allowed)
    ]
    assert wider == []


def test_no_module_imports_itself_back():
    graph = import_graph()
    cycles: list[list[str]] = []
    state: dict[str, int] = {}

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                cycles.append(stack[stack.index(nxt) :] + [nxt])
            elif nxt not in state:
                visit(nxt, stack + [nxt])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [node])
    assert cycles == []


def test_no_module_imports_an_entry_point():
    # The entry points are run, never imported: what both share lives beneath them (rag.core.command_line).
    importers = sorted(
        f"{module} -> {target}" for module, targets in import_graph().items() for target in targets & TOP
    )
    assert importers == []


# A path into the developers' data folder beside the checkout: relative, built with Path(...) / "<name>" / ...,
# or its absolute form (the name is spelled with a class so this file does not match itself).
BESIDE = re.compile(r"""\.\./s[h]ared\b|["']s[h]ared["']\s*/|/s[h]ared/data\b""")


def repository_files() -> list[Path]:
    """The tracked files (every file under ROOT when this is no git checkout)."""
    listed = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode == 0:
        return [ROOT / name for name in listed.stdout.split("\0") if name]
    skip = {".git", ".venv", "__pycache__", "node_modules"}
    return [p for p in ROOT.rglob("*") if p.is_file() and not skip & set(p.relative_to(ROOT).parts)]


def test_no_file_reads_beside_the_checkout():
    # A user's clone has nothing beside it: tests read tests/data/, benchmarks take a path.
    found = []
    for path in repository_files():
        if path == Path(__file__).resolve() or not path.is_file():
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        found += [
            f"{path.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}: {m.group()}"
            for m in BESIDE.finditer(text)
        ]
    assert found == []


def test_the_readme_names_every_folder():
    readme = (ROOT / "README.md").read_text()
    folders = {
        p.parent.relative_to(ROOT).as_posix() for top in ("rag", "ingest") for p in ROOT.glob(f"{top}/**/__init__.py")
    }
    assert sorted(f for f in folders - {"rag"} if f"`{f}/`" not in readme) == []
