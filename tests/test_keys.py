"""Scoped API keys in the data dir: made, found, listed and revoked; stored only as hashes; `rag keys`."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from click.testing import CliRunner

from rag.cli import cli
from rag.core.errors import InvalidRequest, NotFound, StoreDamaged, StoreTooNew
from rag.store.keys import FILE, TOKEN, KeyStore


@pytest.fixture
def keys(tmp_path: Path) -> KeyStore:
    store = KeyStore(tmp_path / FILE)
    yield store
    store.close()


def test_a_key_is_found_by_its_token_and_stored_only_as_a_hash(keys: KeyStore) -> None:
    key, token = keys.create(["alpha", "beta"], read_only=True)
    assert TOKEN.fullmatch(token) and token.startswith(f"rag_{key.id}_")
    found = keys.find(token)
    assert found is not None and found.id == key.id
    assert found.collections == ("alpha", "beta") and found.read_only
    secret = token.split("_", 2)[2]
    stored = (keys.path.read_bytes() + Path(f"{keys.path}-wal").read_bytes()).decode("latin-1")
    assert secret not in stored and key.id in stored


def test_wrong_unknown_and_junk_tokens_find_nothing(keys: KeyStore) -> None:
    key, token = keys.create(None, read_only=False)
    secret = token.split("_", 2)[2]
    other = "A" if secret[0] != "A" else "B"
    for presented in (
        f"rag_{key.id}_{other}{secret[1:]}",  # the right id, a wrong secret
        f"rag_{'0' * 8 if key.id != '0' * 8 else '1' * 8}_{secret}",  # an unknown id
        token + "x",
        token[:-1],
        "",
        "rag_",
        "x" * 10_000,
        "rag_zzzzzzzz_" + "A" * 43,
        "\udcff\x00" + token,
    ):
        assert keys.find(presented) is None, presented
    assert keys.find(token) is not None


def test_a_revoked_key_is_found_no_more(keys: KeyStore) -> None:
    key, token = keys.create(["alpha"], read_only=False)
    kept, kept_token = keys.create(["beta"], read_only=False)
    keys.revoke(key.id)
    assert keys.find(token) is None
    assert keys.find(kept_token) is not None
    assert [k.id for k in keys.list()] == [kept.id]
    with pytest.raises(NotFound, match="rag keys list"):
        keys.revoke(key.id)


def test_last_used_is_written_at_most_once_a_minute(keys: KeyStore) -> None:
    key, token = keys.create(["alpha"], read_only=False)
    assert keys.list()[0].last_used is None
    found = keys.find(token)
    assert found is not None and keys.due_for_touch(found, 1000.0)
    keys.touch(key.id, 1000.0)
    found = keys.find(token)
    assert found is not None and found.last_used == 1000.0
    assert not keys.due_for_touch(found, 1030.0) and keys.due_for_touch(found, 1060.0)


def test_a_key_for_no_collection_is_refused(keys: KeyStore) -> None:
    with pytest.raises(InvalidRequest, match="at least one collection"):
        keys.create([], read_only=True)


def test_no_key_file_means_no_keys_and_none_is_created(keys: KeyStore) -> None:
    assert keys.list() == [] and keys.find("rag_00000000_" + "A" * 43) is None
    assert not keys.path.exists()


def test_a_junk_key_file_is_refused_with_the_fix(keys: KeyStore) -> None:
    keys.path.write_bytes(b"this is no database" * 100)
    with pytest.raises(StoreDamaged, match="not a key file.*move it away"):
        keys.find("rag_00000000_" + "A" * 43)
    assert keys.path.read_bytes() == b"this is no database" * 100, "nothing is lost"


def test_a_key_file_from_a_newer_version_is_refused(keys: KeyStore) -> None:
    keys.create(["alpha"], read_only=True)
    keys.close()
    db = sqlite3.connect(keys.path)
    db.execute("PRAGMA user_version = 9")
    db.close()
    with pytest.raises(StoreTooNew, match="schema version 9"):
        KeyStore(keys.path).list()


def test_the_cli_makes_lists_and_revokes_keys(monkeypatch: pytest.MonkeyPatch, isolated_env: Path) -> None:
    monkeypatch.setenv("RAG_API_KEY", "admin-key")
    runner = CliRunner()
    made = runner.invoke(cli, ["keys", "create", "--collections", "alpha, beta", "--read-only"])
    assert made.exit_code == 0, made.output
    token = made.stdout.strip()
    assert TOKEN.fullmatch(token), made.stdout
    assert "alpha, beta, read-only" in made.stderr and "shown this once" in made.stderr

    listed = runner.invoke(cli, ["keys", "list", "--json"])
    assert listed.exit_code == 0, listed.output
    [row] = json.loads(listed.stdout)
    assert row["collections"] == ["alpha", "beta"] and row["read_only"] and row["last_used"] == "never"
    assert token.split("_", 2)[2] not in listed.output
    table = runner.invoke(cli, ["keys", "list"]).stdout
    assert row["id"] in table and "alpha, beta" in table and "never" in table

    assert runner.invoke(cli, ["keys", "revoke", row["id"]]).exit_code == 0
    assert "no scoped keys" in runner.invoke(cli, ["keys", "list"]).stdout
    assert KeyStore(isolated_env / FILE).find(token) is None


def test_the_cli_refuses_a_key_while_the_api_is_open(isolated_env: Path) -> None:
    result = CliRunner().invoke(cli, ["keys", "create", "--collections", "alpha"])
    assert result.exit_code == 1
    assert "RAG_API_KEY is not set" in result.output
    assert not (isolated_env / FILE).exists()


def test_the_cli_refuses_a_bad_collection_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RAG_API_KEY", "admin-key")
    result = CliRunner().invoke(cli, ["keys", "create", "--collections", "a"])
    assert result.exit_code != 0
    assert "collection name 'a'" in str(result.exception) + result.output


@pytest.mark.parametrize("scope", [[], ["--collections", "alpha", "--all-collections"]])
def test_the_cli_makes_no_key_without_a_scope_said_once(isolated_env: Path, monkeypatch, scope: list[str]) -> None:
    monkeypatch.setenv("RAG_API_KEY", "admin-key")
    result = CliRunner().invoke(cli, ["keys", "create", *scope])
    assert result.exit_code == 2 and "--all-collections" in result.output
    assert not (isolated_env / FILE).exists()
