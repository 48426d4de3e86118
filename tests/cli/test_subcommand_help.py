"""``tinystore channels publish --help``, the directory left out (trial JG, session of 2026-12-07, eighth): click
read ``publish`` as the directory and showed the group's help."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from tinystore.cli import main


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (["channels", "publish", "--help"], "Usage: tinystore channels DIRECTORY publish [OPTIONS]"),
        (["channels", "subscribe", "--help"], "Usage: tinystore channels DIRECTORY subscribe [OPTIONS]"),
        (["jobs", "list", "--help"], "Usage: tinystore jobs DIRECTORY list [OPTIONS]"),
        (["jobs", "configure", "--help"], "Usage: tinystore jobs DIRECTORY configure [OPTIONS] QUEUE"),
        (["lock", "hold", "--help"], "Usage: tinystore lock DIRECTORY hold [OPTIONS]"),
        (["jobs", "somedir", "list", "--help"], "Usage: tinystore jobs DIRECTORY list [OPTIONS]"),
        (["jobs", "--json", "list", "--help"], "Usage: tinystore jobs DIRECTORY list [OPTIONS]"),
    ],
)
def test_a_commands_help_without_the_directory(args: list[str], usage: str) -> None:
    result = CliRunner().invoke(main, args, prog_name="tinystore")
    assert result.exit_code == 0, result.output
    assert result.output.startswith(usage), result.output


def test_a_folder_named_as_a_command_is_still_a_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "list").mkdir()
    result = CliRunner().invoke(main, ["jobs", "list", "--help"], prog_name="tinystore")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("Usage: tinystore jobs [OPTIONS] DIRECTORY COMMAND"), result.output
