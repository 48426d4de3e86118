"""From trial DQ: the processes of ``tinystore demo --web-processes N``. One killed stopped the whole demo (the
other web process too: every page stayed "reconnecting"); it is started again in its place, on its port. And a
demo killed with SIGKILL left its web processes and worker serving, its ports taken."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import httpx

from ..cli.support import running
from ..sse.harness import client
from .demo_proc import run_demo
from .test_demo import post_and_hear_the_reply


async def _ended(pid: int, within: float = 15.0) -> bool:
    """Whether process ``pid`` ended (a zombie counts: its parent may be gone too) within ``within`` seconds."""
    deadline = time.monotonic() + within
    while running(pid):
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.05)
    return True


async def _pid(http: httpx.AsyncClient, url: str, within: float = 30.0) -> int:
    deadline = time.monotonic() + within
    while True:
        try:
            pid: int = (await http.get(f"{url}/healthz", timeout=2)).json()["pid"]
            return pid
        except httpx.HTTPError:
            assert time.monotonic() < deadline, f"{url} did not answer within {within}s"
            await asyncio.sleep(0.1)


async def test_a_killed_web_process_is_started_again_and_the_other_goes_on(tmp_path: Path) -> None:
    err = tmp_path / "stderr.txt"
    async with (
        run_demo(tmp_path / "data", "--web-processes", "2", "--token-delay", "0.002", urls=2, stderr=err) as demo,
        client() as http,
    ):
        one, two = demo.urls
        first = await _pid(http, one)
        os.kill(first, signal.SIGKILL)
        assert await _ended(first)
        assert (await http.get(f"{two}/healthz")).status_code == 200  # the other went on serving
        again = await _pid(http, one)  # started again, on its port
        assert again != first
        await post_and_hear_the_reply(http, one, two)
        await post_and_hear_the_reply(http, two, one)
        assert demo.proc.returncode is None
        assert await demo.stop() == 0
    assert "exited (status -9); starting it again" in err.read_text(), err.read_text()


async def test_a_demo_killed_takes_its_processes_with_it(tmp_path: Path) -> None:
    async with (
        run_demo(tmp_path / "data", "--web-processes", "2", "--token-delay", "0.002", urls=2) as demo,
        client() as http,
    ):
        pids = [await _pid(http, url) for url in demo.urls]
        demo.proc.kill()
        for pid in pids:
            assert await _ended(pid), f"web process {pid} went on after its demo was killed"


async def test_a_web_process_on_a_wildcard_host_is_started_again_on_its_port(tmp_path: Path) -> None:
    """From trial DR: with --host 0.0.0.0 the address printed ends with "(on this network: ...)", and reading its
    port failed: the demo crashed at its start."""
    async with (
        run_demo(tmp_path / "data", "--host", "0.0.0.0", "--web-processes", "1", "--token-delay", "0.002") as demo,
        client() as http,
    ):
        (url,) = demo.urls
        first = await _pid(http, url)
        os.kill(first, signal.SIGKILL)
        assert await _ended(first)
        assert await _pid(http, url) != first


async def test_processes_that_keep_exiting_stop_the_demo_with_status_1(tmp_path: Path) -> None:
    """Past 5 starts again within a minute the demo stops, its processes and sidecar with it; its status says it
    was not asked to (trial DR: 0, as for a Ctrl-C)."""
    err = tmp_path / "stderr.txt"
    async with (
        run_demo(tmp_path / "data", "--web-processes", "1", "--token-delay", "0.002", stderr=err) as demo,
        client() as http,
    ):
        (url,) = demo.urls
        for _ in range(6):
            pid = await _pid(http, url)
            os.kill(pid, signal.SIGKILL)
            assert await _ended(pid)
        async with asyncio.timeout(30):
            assert await demo.proc.wait() == 1
    assert "exited 6 times within 60s: stopping the others" in err.read_text(), err.read_text()


async def test_a_web_process_that_stops_answering_is_killed_and_started_again(tmp_path: Path) -> None:
    """A web process stopped (SIGSTOP) or hung was not noticed: its pages stayed "reconnecting". One that does not
    answer /healthz for --hang-after seconds (30 by default) is killed and started again on its port."""
    err = tmp_path / "stderr.txt"
    async with (
        run_demo(
            tmp_path / "data",
            "--web-processes",
            "2",
            "--hang-after",
            "1.5",
            "--token-delay",
            "0.002",
            urls=2,
            stderr=err,
        ) as demo,
        client() as http,
    ):
        one, two = demo.urls
        first, other = await _pid(http, one), await _pid(http, two)
        os.kill(first, signal.SIGSTOP)
        assert await _ended(first, within=30)
        again = await _pid(http, one)
        assert again != first
        assert await _pid(http, two) == other  # (the one that answers is left alone)
        await post_and_hear_the_reply(http, one, two)
        assert demo.proc.returncode is None
        assert await demo.stop() == 0
    text = err.read_text()
    assert "web process 1 (" in text and "did not answer for" in text and "starting it again" in text, text
    assert "web process 2 (" not in text, text


async def test_a_worker_that_stops_beating_is_killed_and_started_again(tmp_path: Path) -> None:
    """The worker process stopped (SIGSTOP) or hung was not noticed: replies never came. It writes a line every
    third of --hang-after (at most 5 s); one that writes none for --hang-after seconds is killed and started
    again, and replies come again."""
    err = tmp_path / "stderr.txt"
    async with (
        run_demo(
            tmp_path / "data", "--web-processes", "1", "--hang-after", "1.5", "--token-delay", "0.002", stderr=err
        ) as demo,
        client() as http,
    ):
        (url,) = demo.urls
        await post_and_hear_the_reply(http, url, url)
        worker = _worker_pid(demo.proc.pid)
        os.kill(worker, signal.SIGSTOP)
        assert await _ended(worker, within=30)
        await post_and_hear_the_reply(http, url, url)  # (from the worker started again)
        assert _worker_pid(demo.proc.pid) != worker
        assert demo.proc.returncode is None
        assert await demo.stop() == 0
    text = err.read_text()
    assert "the worker did not answer for" in text and "the worker exited" in text, text


def _worker_pid(demo: int) -> int:
    """The pid of the worker process of the demo ``demo`` (a child whose command line has ``--role worker``)."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rpartition(")")[2].split()[1])
        if ppid == demo and b"--role" in argv and argv[argv.index(b"--role") + 1] == b"worker":
            return int(entry.name)
    raise AssertionError(f"no worker process of demo {demo}")
