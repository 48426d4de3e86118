"""From trial AJ: a database file this process may not write (its permissions) gave ``InvalidError`` blaming the
call ("this call reads; a statement that writes goes through exec"), for an exec. The file system refused, the SQL
is not at fault: ``UnavailableError`` saying so. Run as a user without root's override of permissions (root runs
the check as ``nobody``)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

SCRIPT = r"""
import asyncio, os, sys, tinystore
async def main(directory):
    async with await tinystore.open(directory, embedded=True, serve=False) as store:
        db = await store.database("app", migrations=[("1.sql", "create table t (x integer);")])
        await db.exec("insert into t (x) values (1)")
    os.chmod(os.path.join(directory, "sql", "app.db"), 0o444)
    async with await tinystore.open(directory, embedded=True, serve=False) as store:
        db = await store.database("app")
        print("read", await db.scalar("select count(*) from t"))
        for call in ("exec", "tx"):
            try:
                if call == "exec":
                    await db.exec("insert into t (x) values (2)")
                else:
                    await db.tx(lambda tx: tx.exec("insert into t (x) values (3)"))
                print(call, "ok")
            except tinystore.TinystoreError as exc:
                print(call, type(exc).__name__, exc.message)
asyncio.run(main(sys.argv[1]))
"""


# contract: SQL-06
def test_a_database_file_without_write_permission_is_the_file_systems_refusal() -> None:
    base = Path(tempfile.mkdtemp(prefix="ts-ro-"))
    try:
        directory = base / "store"
        cmd = [sys.executable, "-c", SCRIPT, str(directory)]
        if os.getuid() == 0:
            setpriv = shutil.which("setpriv")
            if setpriv is None:
                pytest.skip("running as root, and no setpriv to run the check as another user")
            os.chmod(base, 0o777)
            cmd = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", *cmd]
            probe = subprocess.run([*cmd[:4], sys.executable, "-c", "import tinystore"], capture_output=True)
            if probe.returncode != 0:
                pytest.skip(f"nobody cannot run this Python: {probe.stderr.decode()[-200:]}")
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=base)
        lines = out.stdout.splitlines()
        assert out.returncode == 0, out.stderr[-2000:]
        assert lines[0] == "read 1"
        for line in lines[1:]:
            assert line.split()[1] == "UnavailableError", line
            assert "cannot be written (a read-only file system, or its permissions)" in line, line
            assert "goes through exec" not in line, line
    finally:
        shutil.rmtree(base, ignore_errors=True)
