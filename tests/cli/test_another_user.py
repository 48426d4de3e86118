"""Trial EP: a user other than the store's owner, on a store directory others may enter (0755, as a folder the
operator made keeps its mode; ``server/`` inside it is the owner's alone), got a Python traceback from ``status``
and ``stop`` (a ``PermissionError`` connecting to the socket) instead of one ``error[code]`` line."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from ..helpers import ServerProcess
from .support import cli_argv

NOBODY = 65534


def as_nobody(*args: str) -> subprocess.CompletedProcess[str]:
    """``tinystore ARGS`` run as the user nobody."""
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cli_argv(*args)],
        capture_output=True,
        text=True,
        timeout=30,
        stdin=subprocess.DEVNULL,
        cwd="/",
    )


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
@pytest.mark.parametrize("command", [["status"], ["stop"], ["sql", "--db", "app", "select 1"]])
def test_another_user_is_told_in_one_line_that_it_may_not_reach_the_server(command: list[str]) -> None:
    top = Path(tempfile.mkdtemp(prefix="tinystore-other-user-"))  # (pytest's tmp_path is root's alone: 0700)
    try:
        top.chmod(0o755)
        directory = top / "store"
        directory.mkdir(mode=0o755)
        server = ServerProcess(directory).start()
        try:
            made = subprocess.run(
                cli_argv("sql", str(directory), "create table t (x)", "--write", "--create", "--db", "app"),
                capture_output=True,
                timeout=30,
            )
            assert made.returncode == 0, made.stderr
            done = as_nobody(command[0], str(directory), *command[1:])
            assert done.returncode == 1, (done.stdout, done.stderr)
            assert "Traceback" not in done.stderr, done.stderr
            assert done.stderr.startswith(f"error[permission_denied] store {directory}: this user may not "), (
                done.stderr
            )
            assert server.proc is not None and server.proc.poll() is None  # and the server goes on
        finally:
            server.stop()
    finally:
        shutil.rmtree(top, ignore_errors=True)


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None, reason="needs root and setpriv")
@pytest.mark.parametrize("command", [["status"], ["jobs", "list"], ["sql", "select 1"], ["stop"]])
def test_a_store_directory_this_user_may_not_enter_is_one_error_line(command: list[str]) -> None:
    # (trial EP: a store of mode 0700, as `open` makes it, gave click's usage error and exit 2 to another user)
    top = Path(tempfile.mkdtemp(prefix="tinystore-other-user-"))
    try:
        top.chmod(0o755)
        directory = top / "store"
        directory.mkdir(mode=0o700)
        (directory / "LOCK").touch()
        done = as_nobody(command[0], str(directory), *command[1:])
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert done.stderr == (
            f"error[permission_denied] store {directory}: this user may not enter the directory (it is for the user "
            "that owns the store: run the command as that user)\n"
        )
    finally:
        shutil.rmtree(top, ignore_errors=True)
