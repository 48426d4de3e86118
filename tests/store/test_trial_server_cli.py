"""Trial A, items 3, 4, 5, 6, 7, 8: ``tinystore serve``, ``stop`` and ``status`` as an operator meets them.

A server that does not answer is named as such; a directory that holds no store is never made into one by a
command but ``serve``; bad ``serve`` input is one ``error[invalid]`` line (exit 1, no traceback); SIGHUP stops
a server as gracefully as SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tinystore
from tinystore.server import paths

from ..cli.support import run_cli
from ..helpers import ServerProcess, stop_sidecar, write_tokens
from .test_store03_auth import make_cert

# every command but serve and demo, on a directory that holds no store
COMMANDS = {
    "status": ["status", "{d}"],
    "status --json": ["status", "{d}", "--json"],
    "stop": ["stop", "{d}"],
    "sql": ["sql", "{d}", "select 1"],
    "sql --write": ["sql", "{d}", "create table t (x)", "--write"],
    "publish": ["channels", "{d}", "publish", "c/7", '{"id": 1}'],
    "subscribe": ["channels", "{d}", "subscribe", "c/7", "--for", "1s"],
    "lock hold": ["lock", "{d}", "hold", "cron", "nightly", "--wait", "0", "--", "true"],
    "jobs list": ["jobs", "{d}", "list"],
}


def one_error_line(done: subprocess.CompletedProcess[str], code: str = "invalid") -> str:
    """The one ``error[code] …`` line a refused command printed (exit status 1, no traceback)."""
    assert done.returncode == 1, (done.returncode, done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error[{code}] "), done.stderr
    return lines[0]


@pytest.mark.parametrize("command", list(COMMANDS))
async def test_a_directory_that_holds_no_store_is_not_made_one(tmp_path: Path, command: str) -> None:
    directory = tmp_path / "home"
    directory.mkdir()
    (directory / "notes.txt").write_text("mine\n")
    try:
        done = await asyncio.to_thread(run_cli, *[a.replace("{d}", str(directory)) for a in COMMANDS[command]])
        line = one_error_line(done)
        assert line == (
            f"error[invalid] store {directory}: this directory holds no store (no LOCK file in it; "
            f"to make a store there: `tinystore serve {directory}`)"
        ), line
        assert sorted(p.name for p in directory.iterdir()) == ["notes.txt"]
    finally:
        await stop_sidecar(directory)  # subscribe and hold of an unfixed CLI start one


async def test_status_of_a_stopped_store_still_works(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True, serve=False)
    await store.close()
    done = await asyncio.to_thread(run_cli, "status", str(directory), "--json")
    assert done.returncode == 0, done.stderr
    assert '"mode": "embedded"' in done.stdout


def test_stop_and_status_name_a_server_that_does_not_answer(tmp_path: Path) -> None:
    server = ServerProcess(tmp_path / "store").start()
    assert server.proc is not None
    pid = server.proc.pid
    try:
        os.kill(pid, signal.SIGSTOP)  # a hung server: it holds the directory and the socket, and answers nothing
        with subprocess.Popen(
            [sys.executable, "-m", "tinystore", "stop", str(server.directory)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ) as stopping:  # fmt: skip
            status = run_cli("status", str(server.directory))
            out, err = stopping.communicate(timeout=20)
        for done in (status, subprocess.CompletedProcess(stopping.args, stopping.returncode, out, err)):
            line = one_error_line(done, "unavailable")
            assert f"the server of {server.directory} (pid {pid}) does not answer" in line, line
            assert "no server is running" not in line and "connect to it" not in line, line
            if done.args is stopping.args and "sent it SIGTERM" not in err:
                assert "nothing was stopped" in line, line  # (trial IA)
    finally:
        os.kill(pid, signal.SIGCONT)
        if "sent it SIGTERM" in (err if "err" in locals() else ""):
            # (on a loaded machine the stopped server's backlog filled and `stop` took it for one that takes no
            # connection, which it stops with SIGTERM: resumed, it stops by itself; a second SIGTERM as it exits,
            # its handlers gone, would kill it, -15)
            server.proc.wait(20)
        server.stop()
    assert server.proc.returncode == 0


@pytest.fixture
def free_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield int(s.getsockname()[1])


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield int(s.getsockname()[1])


def serve(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("serve", str(directory), *args, timeout=30)


BAD_TOKENS = {
    "missing": (None, "no such file"),
    "not UTF-8": (b"admin \xff\xfe" + b"x" * 20 + b"\n", "not UTF-8"),
    "empty": (b"", "no token in it"),
    "comments only": (b"# admin tokens go here\n\n   \n", "no token in it"),
    "duplicated": (b"admin " + b"a" * 24 + b"\n# x\ndata " + b"a" * 24 + b"\n", "line 3: the token of line 1 again"),
    "short": (b"admin abc\n", "line 1: a token needs at least 16 characters"),
    # (trial CX: a token too long for the handshake was taken, and then every client using it got UnavailableError)
    "long": (
        b"data " + b"a" * 24 + b"\nadmin " + b"b" * 4097 + b"\n",
        "line 2: a token of 4097 bytes; a token holds at most 4096",
    ),
    "three words": (b"admin " + b"a" * 24 + b" extra\n", "line 1: expected '<admin|data> <token>', found 3 words"),
    "token first": (b"a" * 24 + b" admin\n", "line 1: expected '<admin|data> <token>'; its first word is neither"),
    "only a comment after admin": (b"admin #" + b"a" * 24 + b"\n", "found 1 word (a word that starts with '#'"),
}


@pytest.mark.parametrize("case", list(BAD_TOKENS))
def test_serve_refuses_a_tokens_file_it_cannot_use(tmp_path: Path, case: str) -> None:
    content, expected = BAD_TOKENS[case]
    tokens = tmp_path / "tokens"
    if content is not None:
        tokens.write_bytes(content)
    directory = tmp_path / "store"
    line = one_error_line(serve(directory, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)))
    assert line.startswith(f"error[invalid] tokens file {tokens}: ") and expected in line, line
    assert not directory.exists()  # refused before the directory is owned


def test_a_comment_may_follow_a_token_on_its_line(tmp_path: Path) -> None:
    # trial T (F1): docs/serving.md says '#' starts a comment, but one after a token refused the whole file
    from tinystore.server.listener import load_tokens

    tokens = tmp_path / "tokens"
    tokens.write_text(
        "# who may connect\n"
        "admin aaaaaaaaaaaaaaaaaaaaaaaa   # the operator\n"
        "data  bbbbbbbbbbbbbbbbbbbb#not-a-comment #web, 2026-11\n"
        "   # indented comment\n"
    )
    assert load_tokens(tokens) == {
        "aaaaaaaaaaaaaaaaaaaaaaaa": "admin",
        "bbbbbbbbbbbbbbbbbbbb#not-a-comment": "data",
    }


def test_a_tokens_file_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    # from trial AX: an editor's BOM made the first line "neither admin nor data"
    from tinystore.server.listener import load_tokens

    tokens = tmp_path / "tokens"
    tokens.write_text("\ufeffadmin aaaaaaaaaaaaaaaaaaaaaaaa\n", encoding="utf-8")
    assert load_tokens(tokens) == {"aaaaaaaaaaaaaaaaaaaaaaaa": "admin"}


def test_the_tokens_help_states_the_minimum_length() -> None:
    done = run_cli("serve", "--help")
    assert "at least 16 characters" in done.stdout and "one line only" in done.stdout, done.stdout
    assert "at most 4096 bytes" in " ".join(done.stdout.split()), done.stdout


async def test_connect_refuses_a_token_longer_than_any_server_takes_before_trying() -> None:
    # trial CX: a 100,000-character token went out in a HELLO over the handshake's limit, and the answer was
    # UnavailableError after the reconnect timeout rather than a word on the token
    import tinystore
    from tinystore.errors import InvalidError

    with pytest.raises(InvalidError, match=r"connect: token: 100000 bytes; a token holds at most 4096 bytes"):
        await tinystore.connect("tcp://127.0.0.1:9", token="t" * 100_000)


@pytest.mark.parametrize(
    "address, expected",
    [
        ("tcp://127.0.0.1:99999", "port '99999' is not a number from 0 to 65535"),
        ("tcp://127.0.0.1:-5", "port '-5' is not a number from 0 to 65535"),
        ("tcp://127.0.0.1:abc", "port 'abc' is not a number from 0 to 65535"),
        # (trial CY: an IPv6 address without brackets was told its port was no number; trial DB: its suggestion
        # was [:] for tcp://::1, and other addresses with two ':' were taken for IPv6 ones)
        ("tcp://::1:0", "an IPv6 address goes in brackets: tcp://[::1]:0"),
        ("tcp://::1", "an IPv6 address goes in brackets: tcp://[::1]:PORT"),
        ("tcp://fe80::1", "an IPv6 address goes in brackets: tcp://[fe80::1]:PORT"),
        ("tcp://127.0.0.1:0:0", "'127.0.0.1:0:0' is not HOST:PORT (more than one ':')"),
        ("tcp://[::1]x:0", "after the bracketed host comes only ':PORT'"),
        ("tcp://127.0.0.1:0/path?q=1", "a path ('/path') has no meaning here"),
        ("tls://[::1:7000", "Invalid IPv6 URL"),
        ("tcp://256.1.1.1:7000", "the host '256.1.1.1' does not resolve"),
        ("tcp://no-such-host.invalid:7000", "the host 'no-such-host.invalid' does not resolve"),
    ],
)
def test_serve_refuses_a_bad_address(tmp_path: Path, address: str, expected: str) -> None:
    tokens, _, _ = write_tokens(tmp_path)
    directory = tmp_path / "store"
    line = one_error_line(serve(directory, "--listen", address, "--tokens", str(tokens)))
    assert expected in line and address in line, line
    assert not directory.exists()


def test_serve_refuses_a_port_in_use(tmp_path: Path, taken_port: int) -> None:
    tokens, _, _ = write_tokens(tmp_path)
    address = f"tcp://127.0.0.1:{taken_port}"
    (tmp_path / "store").mkdir()
    line = one_error_line(serve(tmp_path / "store", "--listen", address, "--tokens", str(tokens)))
    assert line == f"error[invalid] listen address {address}: the port is already in use", line
    # checked before the directory is taken: no store made in it (it used to hold EPOCH, LOCK, server/, sql/)
    assert list((tmp_path / "store").iterdir()) == []


def test_serve_refuses_tls_files_with_a_tcp_address(tmp_path: Path, free_port: int) -> None:
    tokens, _, _ = write_tokens(tmp_path)
    cert, key = make_cert(tmp_path)
    address = f"tcp://127.0.0.1:{free_port}"
    tls = ["--tls-cert", str(cert), "--tls-key", str(key)]
    line = one_error_line(serve(tmp_path / "store", "--listen", address, "--tokens", str(tokens), *tls))
    assert f"--tls-cert and --tls-key given but the address {address} is tcp://" in line, line
    assert "use TLS" in line and "tls://HOST:PORT" in line, line
    assert not (tmp_path / "store").exists()
    # a certificate alone, and TLS files with no address at all, are refused the same way
    line = one_error_line(serve(tmp_path / "store", "--listen", address, "--tokens", str(tokens), *tls[:2]))
    assert "--tls-cert given but the address" in line, line
    line = one_error_line(serve(tmp_path / "store", *tls))
    assert "given but there is no --listen address" in line, line


def test_serve_refuses_tokens_with_no_address_to_guard(tmp_path: Path) -> None:
    tokens, _, _ = write_tokens(tmp_path)
    line = one_error_line(serve(tmp_path / "store", "--tokens", str(tokens)))
    assert f"--tokens {tokens} given but there is no --listen address" in line, line
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("case", ["no files", "no key", "missing cert", "swapped", "not PEM"])
def test_serve_refuses_tls_files_it_cannot_use(tmp_path: Path, case: str) -> None:
    tokens, _, _ = write_tokens(tmp_path)
    cert, key = make_cert(tmp_path)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    files = {
        "no files": ([], "tls:// needs --tls-cert and --tls-key"),
        "no key": (["--tls-cert", str(cert)], "tls:// needs --tls-cert and --tls-key"),
        "missing cert": (["--tls-cert", str(tmp_path / "nope.pem"), "--tls-key", str(key)], "cannot be read"),
        "swapped": (["--tls-cert", str(key), "--tls-key", str(cert)], "not a PEM certificate and its private key"),
        "not PEM": (["--tls-cert", str(junk), "--tls-key", str(key)], "not a PEM certificate and its private key"),
    }
    args, expected = files[case]
    done = serve(tmp_path / "store", "--listen", "tls://127.0.0.1:0", "--tokens", str(tokens), *args)
    line = one_error_line(done)
    assert expected in line, line
    if case == "missing cert":
        assert str(tmp_path / "nope.pem") in line, line
    # trial DH: files that were no PEM at all were asked whether they were swapped
    assert ("are they swapped?" in line) == (case == "swapped"), line
    assert not (tmp_path / "store").exists()


@pytest.mark.parametrize("kind", ["another pair", "another type"])
def test_serve_names_a_key_that_is_not_the_certificates(tmp_path: Path, kind: str) -> None:
    # (a TLS key of another type than its certificate was told as "not a PEM certificate and its private key")
    tokens, _, _ = write_tokens(tmp_path)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    cert, _ = make_cert(tmp_path / "a")
    _, key = make_cert(tmp_path / "b")
    if kind == "another type":
        if shutil.which("openssl") is None:
            pytest.skip("no openssl command to make an RSA key")
        key = tmp_path / "rsa.pem"
        subprocess.run(["openssl", "genrsa", "-out", str(key), "2048"], check=True, capture_output=True, timeout=60)
    done = serve(
        tmp_path / "store",
        "--listen",
        "tls://127.0.0.1:0",
        "--tokens",
        str(tokens),
        "--tls-cert",
        str(cert),
        "--tls-key",
        str(key),
    )
    line = one_error_line(done)
    assert f"--tls-key {key}: not the private key of the certificate in --tls-cert {cert}" in line, line
    assert not (tmp_path / "store").exists()


def test_serve_names_an_encrypted_key_without_asking_for_its_passphrase(tmp_path: Path) -> None:
    """From trial DU: OpenSSL asked for the passphrase on the terminal (a serve with one waited there for ever);
    without one, it was told as "not a PEM certificate and its private key"."""
    if shutil.which("openssl") is None:
        pytest.skip("no openssl command to encrypt a key")
    tokens, _, _ = write_tokens(tmp_path)
    cert, key = make_cert(tmp_path)
    encrypted = tmp_path / "encrypted.pem"
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-aes256", "-passout", "pass:secret", "-out", str(encrypted)],
        check=True,
        capture_output=True,
        timeout=60,
    )
    done = serve(
        tmp_path / "store",
        *("--listen", "tls://127.0.0.1:0", "--tokens", str(tokens), "--tls-cert", str(cert)),
        *("--tls-key", str(encrypted)),
    )
    line = one_error_line(done)
    assert f"--tls-key {encrypted}: the private key is encrypted" in line, line
    assert "pass phrase" not in done.stdout + done.stderr
    assert not (tmp_path / "store").exists()


def test_serve_refuses_a_directory_it_cannot_write(tmp_path: Path) -> None:
    parent = tmp_path / "locked"
    parent.mkdir()
    directory = parent / "store"
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: every directory is writable")
        parent.chmod(0o755)
        tmp_path.chmod(0o755)
        argv = [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m", "tinystore"]
        done = subprocess.run(
            [*argv, "serve", str(directory)], capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
        )
    else:
        parent.chmod(0o555)
        try:
            done = serve(directory)
        finally:
            parent.chmod(0o755)
    line = one_error_line(done, "permission_denied")  # as an embedded open() says it
    assert line.startswith(f"error[permission_denied] store {directory}: permission denied on "), line
    assert not directory.exists()


# contract: STORE-05
async def test_sighup_stops_the_server_gracefully(tmp_path: Path) -> None:
    tokens, admin, _ = write_tokens(tmp_path)
    hup = signal.getsignal(signal.SIGHUP)
    with contextlib.ExitStack() as stack:
        if hup is signal.SIG_IGN:  # under nohup: the server would (rightly) keep ignoring it
            signal.signal(signal.SIGHUP, signal.SIG_DFL)
            stack.callback(signal.signal, signal.SIGHUP, hup)
        server = ServerProcess(tmp_path / "store", "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    assert server.proc is not None
    sock = paths.socket_path(server.directory)
    try:
        store = await tinystore.connect(server.tcp, token=admin)
        try:
            db = await store.database("app", migrations=[("001_t.sql", "create table t (a)")])
            await db.exec("insert into t values ('kept')")
        finally:
            await store.close()
        server.proc.send_signal(signal.SIGHUP)
        assert await asyncio.to_thread(server.proc.wait, 10) == 0  # a graceful exit, not death by SIGHUP
        assert not paths.address_file(server.directory).exists()
        assert not sock.exists()
        assert not (server.directory / "sql" / "app.db-wal").exists()  # checkpointed and closed
    finally:
        server.stop()
    store = await tinystore.open(server.directory, embedded=True, serve=False)  # the lock was let go
    try:
        assert await (await store.database("app")).scalar("select a from t") == "kept"
    finally:
        await store.close()


def test_the_serve_banner_is_one_line_however_long_the_path(tmp_path: Path) -> None:
    """Read by people and by scripts (its log line): a long directory name used to wrap it mid-address."""
    import subprocess
    import sys

    directory = tmp_path / ("a-rather-long-directory-name-" * 3)
    proc = subprocess.Popen(
        [sys.executable, "-m", "tinystore", "serve", str(directory)],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert line.startswith(f"tinystore serving {directory} on unix:"), line
        assert line.rstrip("\n").endswith("sock"), line  # the whole address on this line (a short path, here)
    finally:
        proc.terminate()
        proc.wait(20)


# contract: STORE-05
async def test_commands_during_a_graceful_stop_say_the_server_is_stopping(tmp_path: Path) -> None:
    """From trial AX: while a server stopped within its grace, `status`, `sql` and the others said the directory
    was "owned by another process; connect to it with tinystore.open()", and a second `stop` said no server ran."""
    d = tmp_path / "store"
    server = ServerProcess(d).start()
    try:
        store = await tinystore.open(d)
        try:
            db = await store.database("app")
            slow = "with recursive c(x) as (select 1 union all select x + 1 from c where x < 3000000000) "
            slow += "select count(*) from c"
            reading = asyncio.ensure_future(db.scalar(slow))  # under way: the stop waits for it
            await asyncio.sleep(0.5)
            stopping = asyncio.ensure_future(asyncio.to_thread(run_cli, "stop", str(d), "--grace", "30s", timeout=60))
            for _ in range(200):
                if (paths.read_address(d) or {}).get("stopping_until"):
                    break
                await asyncio.sleep(0.02)
            status = await asyncio.to_thread(run_cli, "status", str(d))
            assert status.returncode == 1 and "is stopping" in status.stderr, status.stderr
            assert "instead of owning it" not in status.stderr
            again = asyncio.ensure_future(asyncio.to_thread(run_cli, "stop", str(d), timeout=60))
            await asyncio.sleep(3.0)  # (its process starts, and finds the server stopping: 1 s was short under load)
            reading.cancel()  # the read ends: the server stops
            done = await again
            assert done.returncode == 0 and "is stopping already" in done.stderr, (done.stdout, done.stderr)
            assert "stopped the server" in done.stdout
            assert (await stopping).returncode == 0
        finally:
            await store.close()
    finally:
        server.stop()


@pytest.mark.parametrize(
    "address, expected",
    [
        ("tcp://a..b:7600", "the host 'a..b' has an empty label"),
        ("tcp://" + "a" * 64 + ".example:7600", "has a label over 63 characters"),
        ("tcp://h\x00:7600", "it holds whitespace or a control character"),
        (" tcp://localhost:7600", "it holds whitespace or a control character"),
        ("tcp://local\nhost:7600", "it holds whitespace or a control character"),
        ("tcp://h:" + "1" * 100_000, "100008 characters: an address is at most 300"),
    ],
)
async def test_connect_refuses_a_host_that_cannot_work_with_an_invalid_error(address: str, expected: str) -> None:
    # trial DD: a raw UnicodeError (IDNA) or ValueError (a NUL), a traceback from the command line, a 200 kB message,
    # and tabs or newlines dropped silently
    import tinystore
    from tinystore.errors import InvalidError

    with pytest.raises(InvalidError) as caught:
        await tinystore.connect(address, token="t" * 16, reconnect_timeout=1)
    assert expected in caught.value.message and len(caught.value.message) < 400, caught.value.message


def test_an_ipv6_zone_id_written_as_a_uri_writes_it_is_read() -> None:
    from tinystore.addresses import parse_address

    assert parse_address("tcp://[fe80::1%25lo]:7600", "x") == ("tcp", "fe80::1%lo", 7600)  # RFC 6874
