"""Running ``tinystore`` commands in child processes, and telling whether a process still runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any


def cli_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "tinystore", *args]


def run_cli(*args: str, timeout: float = 20, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``tinystore ARGS`` in a child process; ``env``: variables added to this process's."""
    return subprocess.run(
        cli_argv(*args),
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
        env=None if env is None else {**os.environ, **env},
    )


def popen_cli(*args: str, **kw: Any) -> subprocess.Popen[bytes]:
    return subprocess.Popen(cli_argv(*args), stdin=subprocess.DEVNULL, **kw)


def running(pid: int) -> bool:
    """Whether ``pid`` runs: it exists and is not a zombie (a killed orphan stays one until init reaps it)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rpartition(")")[2].split()[0] not in ("Z", "X")
