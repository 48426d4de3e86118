"""STORE-02: open(dir) finds the directory's server or starts one; many at once end up on one."""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

import tinystore
from tinystore.server import paths

from ..helpers import ServerProcess, stop_sidecar

CLIENT = """
import asyncio, sys, tinystore
async def main():
    store = await tinystore.open(sys.argv[1], idle="1s")
    db = await store.database("app")
    await db.exec("create table if not exists t (who)")
    await db.exec("insert into t values (?)", sys.argv[2])
    print((await store.status())["pid"], flush=True)
    sys.stdin.read()   # stay connected until the test lets go
    await store.close()
asyncio.run(main())
"""


def serving(directory: Path) -> set[int]:
    """Pids of the live `tinystore serve` processes for ``directory`` (zombies excluded)."""
    want = str(directory.resolve())
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        args = [a.decode(errors="replace") for a in argv]
        if "tinystore" in args and "serve" in args and want in args:
            out.add(int(entry))
    return out


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def reap(procs: list[subprocess.Popen[bytes]], directory: Path) -> None:
    """Kill the client processes still running, and every server of ``directory``."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()
    for pid in serving(directory):
        os.kill(pid, 9)


async def wait_for(cond: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


# contract: STORE-02
async def test_many_processes_open_at_once_end_on_one_server(tmp_path: Path) -> None:
    d = tmp_path / "store"
    d.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", CLIENT, str(d), str(i)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for i in range(8)
    ]
    server_pid = None
    try:
        lines = await asyncio.gather(*(asyncio.to_thread(p.stdout.readline) for p in procs))  # type: ignore[union-attr]
        pids = set()
        for p, line in zip(procs, lines, strict=True):
            assert line.strip(), f"a client failed: {p.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
            pids.add(int(line))
        assert len(pids) == 1, pids
        server_pid = pids.pop()
        info = paths.read_address(d)
        assert info is not None and info["pid"] == server_pid and info["mode"] == "sidecar"
        # the sidecars that lost the race have gone: exactly one server process for the directory
        await wait_for(lambda: serving(d) == {server_pid}, 10, f"one server only (have {serving(d)})")
        # one was started: the others waited for it (trial CG: each started one every 2 s until it could connect;
        # 24 processes started 175, which slowed the winner until every call failed)
        log = (paths.server_dir(d) / "sidecar.log").read_text()
        assert "error[in_use]" not in log, log
        # its start line has its time, as the log's other lines (trial CG: it had none)
        assert re.search(
            r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+ INFO tinystore\.server: tinystore serving ", log, re.M
        ), log
        # nobody but the server opened the SQLite files: every client's row is there, once
        store = await tinystore.open(d, idle="1s")
        try:
            assert (await store.status())["pid"] == server_pid
            db = await store.database("app")
            rows = await db.all("select who from t order by who")
            assert [r["who"] for r in rows] == [str(i) for i in range(8)]
        finally:
            await store.close()
        # everyone lets go: the sidecar exits after its idle time (1 s after the last client left)
        t = time.monotonic()
        for p in procs:
            p.stdin.close()  # type: ignore[union-attr]
        for p in procs:
            assert await asyncio.to_thread(p.wait, 20) == 0, p.stderr.read().decode()[-2000:]  # type: ignore[union-attr]
        await wait_for(lambda: not alive(server_pid), 10, "the idle sidecar to exit")
        assert time.monotonic() - t >= 0.9  # it waited for its idle time, it did not exit with the clients
        assert paths.read_address(d) is None
        assert not paths.socket_path(d).exists()
        # open() after that starts a new one
        store = await tinystore.open(d, idle="1s")
        try:
            new_pid = (await store.status())["pid"]
            assert new_pid != server_pid and alive(new_pid)
            db = await store.database("app")
            assert await db.scalar("select count(*) from t") == 8
        finally:
            await store.close()
            await stop_sidecar(d)
    finally:
        reap(procs, d)


# contract: STORE-02
async def test_a_running_server_is_found_not_replaced(tmp_path: Path) -> None:
    d = tmp_path / "store"
    first = await tinystore.open(d, idle="1s")
    try:
        pid = (await first.status())["pid"]
        second = await tinystore.open(d, idle="1s")
        try:
            assert (await second.status())["pid"] == pid
            st = await second.status()
            assert len(st["connections"]) == 2
        finally:
            await second.close()
    finally:
        await first.close()
        await stop_sidecar(d)


# contract: STORE-02
def test_a_long_paths_server_is_found_through_a_bind_mount(tmp_path: Path) -> None:
    """From trial AY: an address file told by its directory's path was dropped when the same folder was reached
    through a bind mount (another path), and open() of the mount's path looked for a socket nobody served, then
    failed after 20 s. The address names its directory by device and inode."""
    import shutil
    import textwrap

    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root, for a bind mount in a mount namespace of its own")
    real = tmp_path / ("n" * 60) / ("e" * 40) / "store"
    alias = tmp_path / ("m" * 60) / ("f" * 40) / "store"
    alias.mkdir(parents=True)
    server = ServerProcess(real).start()
    try:
        client = textwrap.dedent(
            f"""
            import asyncio, tinystore
            async def main():
                store = await asyncio.wait_for(tinystore.open({str(alias)!r}), 30)
                try:
                    print((await store.status())["pid"], flush=True)
                finally:
                    await store.close()
            asyncio.run(main())
            """
        )
        done = subprocess.run(
            ["unshare", "-m", "sh", "-c", 'mount --bind "$0" "$1" && exec "$2" -c "$3"', str(real), str(alias),
             sys.executable, client],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        if "mount" in done.stderr and done.returncode != 0 and not done.stdout:
            pytest.skip(f"no bind mount here: {done.stderr.strip()[:200]}")
        assert done.returncode == 0, done.stderr[-2000:]
        assert server.proc is not None and done.stdout.strip() == str(server.proc.pid)
    finally:
        server.stop()


# contract: STORE-02
async def test_a_server_killed_while_it_stopped_leaves_no_wait_behind(tmp_path: Path) -> None:
    """From trial AW: a server killed during its stop's grace left `stopping_until` in its address, and every
    later open() waited for it, then failed "is stopping and has not let the directory go", for good."""
    import json

    d = tmp_path / "store"
    server = ServerProcess(d).start()
    assert server.proc is not None
    address = paths.address_file(d)
    info = json.loads(address.read_text())
    server.proc.send_signal(signal.SIGKILL)
    server.proc.wait()
    info["stopping_until"] = time.time() + 3600  # what it had written as its stop began
    address.write_text(json.dumps(info))
    started = time.monotonic()
    store = await asyncio.wait_for(tinystore.open(d, idle="2s"), 30)
    try:
        assert time.monotonic() - started < 10
        assert (await store.status())["pid"] != info["pid"]
    finally:
        await store.close()
        await stop_sidecar(d)
        server.stop()


# contract: STORE-01
# contract: STORE-02
@pytest.mark.parametrize("long", [False, True])
@pytest.mark.parametrize("address", ["now", "older"])
async def test_a_copy_of_a_running_store_is_a_store_of_its_own(tmp_path: Path, long: bool, address: str) -> None:
    """From trial AW: a copy made while the server ran (cp -r, a template store) carries the original's address
    file, and open(copy) followed it to the original's socket: its writes went into the original. From trial AZ
    ("older"): an address written by a server of an older version names no directory; its pid must hold the
    copy's LOCK for it to count."""
    import json
    import shutil

    base = tmp_path / ("n" * 60) / ("e" * 40) if long else tmp_path
    orig, copy = base / "orig", base / "copy"
    store = await tinystore.open(orig, idle="2s")
    try:
        db = await store.database("app", migrations=[("001.sql", "create table t (v);")])
        await db.exec("insert into t values ('orig')")
        if address == "older":
            info = json.loads(paths.address_file(orig).read_text())
            del info["directory"], info["dir_id"]
            paths.address_file(orig).write_text(json.dumps(info))
            assert paths.read_address(orig) == info  # (still the original's own)
        shutil.copytree(orig, copy, ignore=shutil.ignore_patterns("sock"))
        other = await tinystore.open(copy, idle="2s")
        try:
            assert (await other.status())["directory"] == str(copy.resolve())
            await (await other.database("app")).exec("insert into t values ('copy')")
        finally:
            await other.close()
        assert [r["v"] for r in await db.all("select v from t")] == ["orig"]
    finally:
        await store.close()
        await stop_sidecar(orig)
        await stop_sidecar(copy)


# contract: STORE-02
# contract: STORE-05
@pytest.mark.parametrize("runtimes", ["same", "other"])
async def test_open_waits_for_a_stopping_server_past_its_own_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, runtimes: str
) -> None:
    """From trial AS: a sidecar stopping with a grace longer than open()'s 20 s (a read under way) made open()
    fail "owned by another process; connect to it with tinystore.open() instead of owning it". The server says in
    its address that it stops, and until when: open() waits for it (here with a deadline of 2 s, a grace of 8).
    From trial AW ("other"): a long path's stopping server under another runtime folder than the one of the
    sidecar started after it; open() kept looking at the stopping server's socket, and failed."""
    from tinystore.client.store import ensure_server

    d = tmp_path / "store"
    # runtime folders of a short path of their own (under tmp_path, with pytest-xdist's longer one, a socket's path
    # there was too long for an address too)
    short = Path(tempfile.mkdtemp(prefix="ts-"))
    if runtimes == "other":
        d = tmp_path / ("n" * 60) / ("e" * 40) / "store"
        for name in ("xa", "xb"):
            (short / name).mkdir(mode=0o700)
        monkeypatch.setenv("XDG_RUNTIME_DIR", str(short / "xa"))  # the first sidecar's
    slow = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 3000000000) select count(*) from c"
    a = await tinystore.open(d, idle="30s")
    try:
        db = await a.database("app")
        reading = asyncio.ensure_future(db.scalar(slow))  # a call under way: the stop waits for it
        await asyncio.sleep(0.5)
        stop = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "tinystore",
            "stop",
            str(d),
            "--grace",
            "8s",
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        from tinystore.client.store import _can_connect

        async with asyncio.timeout(10):
            # stopping, and its listener closed (it says it stops a moment before it takes no connection)
            while not (paths.read_address(d) or {}).get("stopping_until") or _can_connect(paths.served_socket(d)):
                await asyncio.sleep(0.02)
        if runtimes == "other":
            monkeypatch.setenv("XDG_RUNTIME_DIR", str(short / "xb"))  # this process's, and its new sidecar's
        sock = paths.served_socket(d)
        extra = ["--sidecar", "--idle", "2s"]
        opening = asyncio.ensure_future(ensure_server(d, sock, extra, timeout=2.0))
        await asyncio.sleep(3.0)  # past open()'s deadline: it waits on
        assert not opening.done()
        reading.cancel()  # the read ends: the old server lets the directory go, and a new sidecar starts
        got = await asyncio.wait_for(opening, 20)
        assert got == paths.socket_path(d)  # the new sidecar's socket, where it listens
        await stop.wait()
    finally:
        await a.close()
        await stop_sidecar(d)
        shutil.rmtree(short, ignore_errors=True)


# contract: STORE-02
async def test_a_long_paths_server_is_found_from_another_runtime_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From trial AS: a sidecar started under XDG_RUNTIME_DIR put a long path's socket there; a process without it
    (cron, a service, su) looked under the temporary folder, started sidecars that could not own the store for
    20 s, then failed "owned by another process; connect to it with tinystore.open()". The address file says
    where the server listens: a client goes there."""
    d = tmp_path / ("n" * 60) / ("e" * 40) / "store"
    short = Path(tempfile.mkdtemp(prefix="ts-"))  # (see test_open_waits_for_a_stopping_server_past_its_own_deadline)
    runtime = short / "xdg"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    store = await tinystore.open(d, idle="2s")
    try:
        pid = (await store.status())["pid"]
        assert str(paths.socket_path(d)).startswith(str(runtime))
        monkeypatch.delenv("XDG_RUNTIME_DIR")
        assert not str(paths.socket_path(d)).startswith(str(runtime))
        async with asyncio.timeout(10):
            other = await tinystore.open(d, idle="2s")
        try:
            assert (await other.status())["pid"] == pid
        finally:
            await other.close()
        env = {k: v for k, v in os.environ.items() if k != "XDG_RUNTIME_DIR"}
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "tinystore", "status", str(d), "--json"],
            capture_output=True,
            text=True,
            timeout=30,
            env=env,
        )
        assert done.returncode == 0, done.stderr
        assert f'"pid": {pid}' in done.stdout
    finally:
        await store.close()
        await stop_sidecar(d)
        shutil.rmtree(short, ignore_errors=True)


# contract: STORE-02
async def test_socket_path_too_long_falls_back_to_a_short_path(tmp_path: Path) -> None:
    d = tmp_path / ("n" * 60) / ("e" * 40) / "store"
    long_path = d.resolve() / "server" / "sock"
    assert len(os.fsencode(long_path)) > 100
    store = await tinystore.open(d, idle="1s")
    try:
        info = paths.read_address(d)
        assert info is not None
        sock = Path(info["socket"])
        assert sock == paths.socket_path(d)
        assert sock != long_path and not long_path.exists()
        assert len(os.fsencode(sock)) <= 100
        assert sock.exists()
        assert (sock.parent.stat().st_mode & 0o777) == 0o700
        db = await store.database("app")
        await db.exec("create table t (a)")
        await db.exec("insert into t values (1)")
        assert await db.scalar("select count(*) from t") == 1
        # another client finds it too
        other = await tinystore.open(d, idle="1s")
        try:
            assert (await other.status())["pid"] == info["pid"]
        finally:
            await other.close()
    finally:
        await store.close()
        await stop_sidecar(d)
    assert not sock.exists()


# contract: STORE-02
async def test_open_gives_up_soon_on_a_sidecar_that_takes_connections_and_does_not_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From trial AK: open() on a stopped (SIGSTOP) sidecar waited out five whole handshakes (over a minute); it
    now gives up after one, naming it, and never starts a second server on the directory."""
    from tinystore.client import store, transport

    directory = tmp_path / "store"
    first = await tinystore.open(directory)
    pid = (await first.status())["pid"]
    monkeypatch.setattr(transport, "HANDSHAKE_WAIT", 0.5)  # (15 s)
    monkeypatch.setattr(
        store, "QUICK_FAILURE", 0.3, raising=False
    )  # (2 s: a failure sooner is a race with an exiting sidecar)
    os.kill(pid, signal.SIGSTOP)
    try:
        started = time.monotonic()
        with pytest.raises(tinystore.UnavailableError, match=r"did not answer the handshake within 0\.5s: its server"):
            await tinystore.open(directory)
        assert time.monotonic() - started < 2.5  # one handshake's wait (0.5 s here), not five
        assert serving(directory) == {pid}
    finally:
        os.kill(pid, signal.SIGCONT)
        await first.close()
        await stop_sidecar(directory)


# contract: STORE-01
# contract: STORE-02
async def test_an_embedded_open_beside_a_sidecar_says_it_is_the_sidecar_and_how_to_stop_it(tmp_path: Path) -> None:
    """From trial BL: after a command that starts the directory's sidecar (`tinystore lock DIR …`), the program's
    own ``open(DIR, embedded=True)`` failed "owned by another process (pid N)", not saying that N is a sidecar that
    exits once idle, nor that `tinystore stop DIR` stops it now."""
    d = tmp_path / "store"
    a = await tinystore.open(d, idle="45s")
    try:
        with pytest.raises(tinystore.InUseError) as got:
            await tinystore.open(d, embedded=True)
        message = got.value.message
        assert "owned by its sidecar server" in message, message
        assert "exits by itself after 45s without connections" in message, message
        assert f"tinystore stop {d}" in message, message
    finally:
        await a.close()
        await stop_sidecar(d)
    # a sidecar told to stay (idle "0s") is not said to exit by itself (trial BP)
    b = await tinystore.open(tmp_path / "stays", idle="0s")
    try:
        with pytest.raises(tinystore.InUseError) as got:
            await tinystore.open(tmp_path / "stays", embedded=True)
        assert "which stays until it is stopped" in got.value.message, got.value.message
    finally:
        await b.close()
        await stop_sidecar(tmp_path / "stays")


RECONNECTING = """
import asyncio, sys, time, tinystore
async def main():
    store = await tinystore.open(sys.argv[1], idle="30s")
    db = await store.database("app")
    print((await store.status())["pid"], flush=True)
    sys.stdin.readline()   # the test killed the sidecar
    started = time.monotonic()
    await db.scalar("select 1")
    print((await store.status())["pid"], round(time.monotonic() - started, 2), flush=True)
    sys.stdin.read()
    await store.close()
asyncio.run(main())
"""


# contract: STORE-02
async def test_processes_that_lost_their_sidecar_start_one_between_them(tmp_path: Path) -> None:
    """After a kill -9 of the sidecar, every process started a new one every 2 s until it could connect: with
    24 processes on 2 cores, 175 interpreters starting at once kept the winner from serving for 30 s, and every
    call failed. One is started; the others wait for it."""
    d = tmp_path / "store"
    d.mkdir()
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", RECONNECTING, str(d)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        for _ in range(8)
    ]
    try:
        lines = await asyncio.gather(*(asyncio.to_thread(p.stdout.readline) for p in procs))  # type: ignore[union-attr]
        first = {int(line) for line in lines}
        assert len(first) == 1, lines
        log = paths.server_dir(d) / "sidecar.log"
        before = log.read_text()
        os.kill(first.pop(), signal.SIGKILL)
        for p in procs:
            p.stdin.write(b"go\n")  # type: ignore[union-attr]
            p.stdin.flush()  # type: ignore[union-attr]
        lines = await asyncio.gather(*(asyncio.to_thread(p.stdout.readline) for p in procs))  # type: ignore[union-attr]
        for p, line in zip(procs, lines, strict=True):
            assert line.strip(), f"a client failed: {p.stderr.read().decode()[-2000:]}"  # type: ignore[union-attr]
        assert len({line.split()[0] for line in lines}) == 1, lines
        started = log.read_text()[len(before) :]
        assert "error[in_use]" not in started, started
    finally:
        reap(procs, d)


EMBEDDED_OWNER = """
import asyncio, sys, tinystore
async def main():
    store = await tinystore.open(sys.argv[1], embedded=True, serve=False)
    print("owned", flush=True)
    sys.stdin.read()
    await store.close()
asyncio.run(main())
"""


# contract: STORE-02
async def test_open_beside_an_embedded_owner_that_serves_nothing_says_so_at_once(tmp_path: Path) -> None:
    """With sidecars started only when nobody owns the directory, open() waited its 20 s beside an embedded store
    opened with serve=False, then said the owner "does not serve it yet" (trial CK); the sidecar it used to start
    said at once why nothing could connect."""
    d = tmp_path / "store"
    owner = subprocess.Popen(
        [sys.executable, "-c", EMBEDDED_OWNER, str(d)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert owner.stdout is not None and owner.stdout.readline().strip() == b"owned"
        past = time.time() - 60  # (taken a minute ago: past the time a starting store is given)
        os.utime(d / "LOCK", (past, past))
        started = time.monotonic()
        with pytest.raises(tinystore.InUseError, match=r"which does not serve its socket \(an embedded store opened"):
            await tinystore.open(d)
        assert time.monotonic() - started < 5
    finally:
        owner.kill()
        owner.wait()


# contract: STORE-02
async def test_a_client_stuck_holding_the_spawning_lock_does_not_hold_up_the_others(tmp_path: Path) -> None:
    """A client frozen while it held the lock of DIR/server/spawning (SIGSTOP, a debugger) made every open()
    wait its 20 s, then fail (trial CK). The others start a sidecar themselves after a few seconds."""
    import fcntl

    d = tmp_path / "store"
    store = await tinystore.open(d, idle="1s")
    await store.close()
    await stop_sidecar(d)
    with (paths.server_dir(d) / "spawning").open("a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)  # (this process's: not the one of the open below)
        started = time.monotonic()
        store = await asyncio.wait_for(tinystore.open(d, idle="1s"), 20)
        try:
            assert time.monotonic() - started < 15
            assert (await store.status())["mode"] == "sidecar"
        finally:
            await store.close()
            await stop_sidecar(d)


# contract: STORE-02
async def test_a_sidecar_slow_to_start_is_waited_for_not_started_twice(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a busy machine an interpreter takes seconds to start: the client started another sidecar every 2 s
    while its first still started, and the extra one logged "sidecar not needed" (trial CK)."""
    from tinystore.client import store as client_store

    real = client_store._server_cmd
    started: list[int] = []

    def slow(directory: Path, *extra: str) -> list[str]:
        started.append(1)
        return ["sh", "-c", 'sleep 3; exec "$@"', "sh", *real(directory, *extra)]

    monkeypatch.setattr(client_store, "_server_cmd", slow)
    d = tmp_path / "store"
    store = await tinystore.open(d, idle="1s")
    try:
        assert (await store.status())["mode"] == "sidecar"
        assert len(started) == 1, started
    finally:
        await store.close()
        await stop_sidecar(d)
