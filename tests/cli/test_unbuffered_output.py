"""From trial DL: under PYTHONUNBUFFERED (``python -u``; many container images set it) a command's output to a
pipe whose reader was slow lost all but its first 64 KiB, with status 0: CPython's text layer over an unbuffered
stdout does not write again after a write the kernel took in part."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from ..helpers import open_store
from .support import popen_cli, run_cli


@pytest.mark.parametrize("unbuffered", ["1", ""])
async def test_a_slow_reader_gets_all_of_a_large_output(tmp_path: Path, unbuffered: str) -> None:
    directory = tmp_path / "s"
    async with open_store("embedded", directory, serve=False) as store:
        job_id = await store.queue("big").add("x" * 1_000_000)
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    proc = popen_cli("jobs", str(directory), "show", job_id, "--json", stdout=subprocess.PIPE, env=env)
    try:
        await asyncio.sleep(1.5)  # a slow reader: the pipe (64 KiB) fills, the command's write is taken in part
        out, _ = await asyncio.to_thread(proc.communicate, timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0
    assert len(out) > 1_000_000
    assert json.loads(out)["value"] == "x" * 1_000_000


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("unbuffered", ["1", ""])
@pytest.mark.parametrize("command", ["--help", "status", "sql"])
async def test_output_that_cannot_be_written_is_told_in_one_line(tmp_path: Path, unbuffered: str, command: str) -> None:
    """From trial DS: stdout to a full disk (``> /dev/full``) gave a traceback, then Python's "Exception ignored"
    of its last flush, status 120."""
    directory = tmp_path / "s"
    async with open_store("embedded", directory, serve=False) as store:
        await store.database("main")
    args = {"--help": ["--help"], "status": ["status", str(directory)], "sql": ["sql", str(directory), "select 1"]}
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    with open("/dev/full", "w") as full:
        proc = popen_cli(*args[command], stdout=full, stderr=subprocess.PIPE, env=env)
        _, err = await asyncio.to_thread(proc.communicate, timeout=30)
    text = err.decode()
    assert proc.returncode == 1, text
    assert text == "tinystore: the output could not be written: No space left on device\n", text


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
@pytest.mark.parametrize("unbuffered", ["1", ""])
@pytest.mark.parametrize("stderr", ["pipe", "full"])
async def test_a_large_output_that_cannot_be_written_is_told_in_one_line(
    tmp_path: Path, unbuffered: str, stderr: str
) -> None:
    """From trial DU: a table larger than one buffer (the failed write left the buffer empty) still gave a
    traceback; and with stderr to a full disk too, every command exited 120."""
    directory = tmp_path / "s"
    async with open_store("embedded", directory, serve=False) as store:
        db = await store.database("main")
        await db.exec("create table big (a, b)")
        await db.exec(
            "insert into big with recursive n(x) as (select 1 union all select x + 1 from n where x < 3000) "
            "select x, 'some text to make the table wide enough' from n"
        )
    env = {**os.environ, "PYTHONUNBUFFERED": unbuffered}
    with open("/dev/full", "w") as full:
        proc = popen_cli(
            "sql",
            str(directory),
            "select * from big",
            stdout=full,
            stderr=subprocess.PIPE if stderr == "pipe" else full,
            env=env,
        )
        _, err = await asyncio.to_thread(proc.communicate, timeout=30)
    assert proc.returncode == 1, err
    if stderr == "pipe":
        assert err.decode() == "tinystore: the output could not be written: No space left on device\n", err


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
async def test_a_subscription_whose_output_cannot_be_written_ends_with_one_line(tmp_path: Path) -> None:
    """From trial DU: `channels subscribe > /dev/full` logged a traceback at each message and went on."""
    directory = tmp_path / "s"
    async with open_store("embedded", directory, serve=False):
        pass
    with open("/dev/full", "w") as full:
        proc = popen_cli("channels", str(directory), "subscribe", "ch", stdout=full, stderr=subprocess.PIPE)
        try:
            for _ in range(100):  # until the subscription hears it (its sidecar starts first)
                await asyncio.to_thread(run_cli, "channels", str(directory), "publish", "ch", '{"a": 1}')
                if proc.poll() is not None:
                    break
                await asyncio.sleep(0.2)
            _, err = await asyncio.to_thread(proc.communicate, timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            run_cli("stop", str(directory))
    assert proc.returncode == 1, err
    assert err.decode() == "tinystore: the output could not be written: No space left on device\n", err


@pytest.mark.parametrize("encoding", ["latin-1", "ascii", "C locale"])
@pytest.mark.parametrize("json_out", [True, False])
async def test_values_the_output_encoding_cannot_hold_are_escaped(
    tmp_path: Path, encoding: str, json_out: bool
) -> None:
    """From trials DV, DW: under PYTHONIOENCODING=latin-1 or a C locale a value outside the encoding was a
    UnicodeEncodeError traceback; escaped as Python's own, JSON was no longer JSON (``\\U0001f600``)."""
    directory = tmp_path / "s"
    value = "日本語 é ☃ 😀"
    async with open_store("embedded", directory, serve=False) as store:
        db = await store.database("app")
        await db.exec("create table t (name text)")
        await db.exec("insert into t values (?)", value)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LC_", "LANG", "PYTHONIOENCODING", "PYTHONUTF8"))}
    if encoding == "C locale":
        env.update(LC_ALL="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0")
    else:
        env["PYTHONIOENCODING"] = encoding
    proc = popen_cli(
        "sql",
        str(directory),
        "select name from t",
        "--db",
        "app",
        *(["--json"] if json_out else []),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    out, err = await asyncio.to_thread(proc.communicate, timeout=30)
    assert proc.returncode == 0 and b"Traceback" not in err, err
    if json_out:
        assert json.loads(out) == {"name": value}, out
    else:
        assert b"65e5" in out, out


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full")
async def test_a_server_whose_stderr_cannot_be_written_serves_and_stops_cleanly(tmp_path: Path) -> None:
    """From trial DV: `tinystore serve DIR 2>/dev/full` failed its start as it printed that it served, leaving its
    address and socket behind."""
    directory = tmp_path / "s"
    with open("/dev/full", "w") as full:
        proc = popen_cli("serve", str(directory), stdout=full, stderr=full)
        try:
            for _ in range(200):
                done = await asyncio.to_thread(run_cli, "status", str(directory))
                if done.returncode == 0 or proc.poll() is not None:
                    break
                await asyncio.sleep(0.1)
            assert proc.poll() is None, "the server exited"
            assert (await asyncio.to_thread(run_cli, "stop", str(directory))).returncode == 0
            assert await asyncio.to_thread(proc.wait, 30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert not (directory / "server" / "address").exists() and not (directory / "server" / "sock").exists()
