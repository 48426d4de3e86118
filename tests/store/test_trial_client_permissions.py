"""Trial A: ``open`` of a directory this process may not write or enter raises ``PermissionDeniedError`` (a
``TinystoreError``) naming the directory and the OS's reason, in each way of opening, never a bare
``PermissionError``.

Tests run as root, for whom the OS enforces no file permissions: then the opening runs in a child process
as user ``nobody`` (with ``setpriv``), as a user would meet it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import tinystore

NOBODY = 65534

OPENER = """
import asyncio, json, sys, tinystore
async def main():
    out = []
    for kw in ({}, {"private": True}, {"embedded": True}):
        try:
            store = await asyncio.wait_for(tinystore.open(sys.argv[1], **kw), 30)
        except BaseException as exc:
            out.append([type(exc).__name__, isinstance(exc, tinystore.TinystoreError), str(exc)])
        else:
            await store.close()
            out.append(["opened", False, ""])
    print(json.dumps(out))
asyncio.run(main())
"""


def open_all_ways(directory: Path) -> list[list[object]]:
    """``open(directory)``, ``private=True`` and ``embedded=True``, as a user the OS holds to permissions."""
    cmd = [sys.executable, "-c", OPENER, str(directory)]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root, and no setpriv to run as another user")
        cmd = [setpriv, f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", *cmd]
    env = {**os.environ, "HOME": "/tmp"}
    src = str(Path(tinystore.__file__).resolve().parents[1])
    env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env, cwd="/")
    assert done.returncode == 0, done.stderr[-3000:]
    result: list[list[object]] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.fixture
def shared_tmp() -> Iterator[Path]:
    """A folder that user nobody can enter (pytest's tmp_path is the owner's only)."""
    d = Path(tempfile.mkdtemp(prefix="tinystore-trial-perm-"))
    os.chmod(d, 0o755)
    try:
        yield d
    finally:
        for p in [d, *d.rglob("*")]:
            if p.is_dir() and not p.is_symlink():
                os.chmod(p, 0o755)
        shutil.rmtree(d, ignore_errors=True)


def check_denied(results: list[list[object]], directory: Path, reason: str) -> None:
    assert len(results) == 3
    for (name, is_ours, message), way in zip(results, ("sidecar", "private", "embedded"), strict=True):
        assert name == "PermissionDeniedError", f"{way}: {name}: {message}"
        assert is_ours, way
        assert str(directory) in str(message), f"{way}: {message}"
        assert reason in str(message), f"{way}: {message}"


async def test_open_of_a_directory_that_cannot_be_written_is_permission_denied(shared_tmp: Path) -> None:
    store = shared_tmp / "store"
    store.mkdir()
    os.chmod(store, 0o555)  # others may enter and read, nobody may write
    check_denied(open_all_ways(store), store, "Permission denied")
    assert sorted(p.name for p in store.iterdir()) == []  # and nothing was made there


async def test_open_of_a_directory_that_cannot_be_entered_is_permission_denied(shared_tmp: Path) -> None:
    parent = shared_tmp / "closed"
    store = parent / "store"
    store.mkdir(parents=True)
    os.chmod(parent, 0o700)  # the owner's only: nobody may enter it
    check_denied(open_all_ways(store), store, "Permission denied")
