"""The README's promises: the two commands exist, CI runs the test one, every setting is documented."""

from pathlib import Path

from rag.core.config import Settings

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def test_every_setting_is_in_the_readme():
    missing = [f"RAG_{name.upper()}" for name in Settings.model_fields if f"RAG_{name.upper()}" not in README]
    assert not missing, f"settings missing from the README's table: {missing}"


def test_the_two_commands_are_make_targets_and_ci_runs_the_test_one():
    makefile = (ROOT / "Makefile").read_text()
    assert "make up" in README and "make test" in README
    assert "\nup:" in makefile and "\ntest:" in makefile
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == "make test"


def test_the_readme_opens_with_a_five_line_quick_start_that_says_what_a_cached_build_saves():
    opening = README.split("## Prerequisites")[0]
    assert "## Quick start" in opening
    block = opening.split("```sh\n", 1)[1].split("```", 1)[0]
    lines = [line for line in block.splitlines() if line.strip()]
    assert len(lines) == 5 and lines[0].startswith("git clone") and any(line.startswith("make up") for line in lines)
    assert "cached llama-server build" in block
    assert "a cached build skips the compile, about 15 minutes saved" in README
