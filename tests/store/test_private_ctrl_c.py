"""From trial AS: a terminal's Ctrl-C (SIGINT to the foreground process group) reached a private server too, and
stopped it at the moment the program began its clean-up: the clean-up's write failed, "stopped (stop_server,
tinystore stop or SIGTERM)". The private server has a process group of its own now; it stops with the store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

PROGRAM = r"""
import asyncio, sys, tinystore
async def main():
    s = await tinystore.open(sys.argv[1], private=True)
    db = await s.database("app")
    await db.exec("create table if not exists t (id integer primary key, note text)")
    print("READY", flush=True)
    try:
        await asyncio.sleep(60)
    finally:  # Ctrl-C: asyncio.run cancels main(); save what it was doing, then close
        await asyncio.sleep(0.5)
        await db.exec("insert into t (note) values ('interrupted')")
        print("saved", await db.scalar("select count(*) from t"), flush=True)
        await s.close()
try:
    asyncio.run(main())
except KeyboardInterrupt:
    pass
"""


# contract: STORE-05
def test_ctrl_c_leaves_a_private_store_to_its_program_until_it_closes_it(tmp_path: Path) -> None:
    program = subprocess.Popen(
        [sys.executable, "-c", PROGRAM, str(tmp_path / "store")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # (its own foreground group, as a terminal gives it)
    )
    try:
        assert program.stdout is not None and program.stdout.readline().strip() == "READY"
        os.killpg(program.pid, signal.SIGINT)  # what a terminal does on Ctrl-C
        out, err = program.communicate(timeout=40)
        assert "saved 1" in out, (out, err[-2000:])
    finally:
        if program.poll() is None:
            os.killpg(program.pid, signal.SIGKILL)
            program.wait()
