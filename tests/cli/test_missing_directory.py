"""Every command but ``serve`` and ``demo`` refuses a DIR that does not exist, with one clear error naming it
and saying how to make a store there, exit status 1, and nothing created (a typo makes no store)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tinystore.cli import main

from ..helpers import stop_sidecar
from .support import run_cli

COMMANDS = {
    "publish": ["channels", "{d}", "publish", "c/7", '{"id": 1}'],
    "subscribe": ["channels", "{d}", "subscribe", "c/7", "--for", "1s"],
    "lock hold": ["lock", "{d}", "hold", "cron", "nightly", "--wait", "0", "--", "true"],
    "status": ["status", "{d}"],
    "sql": ["sql", "{d}", "select 1"],
    "sql --write": ["sql", "{d}", "create table t (x)", "--write"],
    "jobs list": ["jobs", "{d}", "list"],
    "stop": ["stop", "{d}"],
}


@pytest.mark.parametrize("command", list(COMMANDS))
async def test_a_directory_that_does_not_exist_is_refused(tmp_path: Path, command: str) -> None:
    directory = tmp_path / "typo" / "store"
    try:
        done = run_cli(*[a.replace("{d}", str(directory)) for a in COMMANDS[command]])
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert done.stderr == (
            f"error[invalid] store {directory}: no such directory (to make a store there: "
            f"`tinystore serve {directory}`)\n"
        ), done.stderr
        assert done.stdout == ""
        assert not (tmp_path / "typo").exists()
    finally:
        await stop_sidecar(directory)  # the subscribe and the hold of an unfixed CLI start one


def test_help_still_works_on_a_directory_that_does_not_exist(tmp_path: Path) -> None:
    for args in (["channels", "publish"], ["channels", "subscribe"], ["lock", "hold"], ["jobs", "list"]):
        result = CliRunner().invoke(main, [args[0], str(tmp_path / "nope"), args[1], "--help"])
        assert result.exit_code == 0 and "Usage:" in result.output, result.output
    assert not (tmp_path / "nope").exists()


def test_a_directory_every_user_may_write_is_not_offered_to_serve(tmp_path: Path) -> None:
    """Trial HT: `status` on a folder of mode 777 said to make a store there with `tinystore serve`, which refuses it
    (another user could plant its files)."""
    directory = tmp_path / "shared"
    directory.mkdir()
    directory.chmod(0o777)
    done = run_cli("status", str(directory))
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert "tinystore serve" not in done.stderr.split("(", 1)[1].split(";", 1)[0], done.stderr
    assert "every user may write it (mode 777)" in done.stderr and "mkdir -m 700" in done.stderr, done.stderr
