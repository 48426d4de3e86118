"""Trial A, the SDK's side of connecting: bad addresses and TLS settings are ``InvalidError`` at once, and a
plain-text client at a TLS port is told that the server may want ``tls://``."""

from __future__ import annotations

import asyncio
import os
import ssl
from pathlib import Path

import pytest

import tinystore
from tinystore.errors import InvalidError, UnavailableError

from ..helpers import ServerProcess, write_tokens
from .test_store03_auth import make_cert


@pytest.mark.parametrize(
    ("address", "named"),
    [
        ("tcp://127.0.0.1:99999", "port '99999'"),
        ("tcp://127.0.0.1:-1", "port '-1'"),
        ("tcp://127.0.0.1:abc", "port 'abc'"),
        ("tcp://127.0.0.1:0", "port '0'"),
        ("tcp://127.0.0.1", "no port"),
        ("tcp://:7600", "no host"),
        ("http://127.0.0.1:7600", "unknown scheme 'http://'"),
        ("unix://127.0.0.1:7600", "unknown scheme 'unix://'"),
        ("127.0.0.1:7600", "no scheme"),
        ("tcp://[::1", "IPv6"),
        (7600, "expected a str"),
        (None, "expected a str"),
    ],
)
async def test_a_bad_address_is_invalid_and_names_what_is_wrong(address: object, named: str) -> None:
    with pytest.raises(InvalidError) as info:
        await tinystore.connect(address, token="x" * 20)  # type: ignore[arg-type]
    assert named in info.value.message
    assert "use tcp://HOST:PORT or tls://HOST:PORT" in info.value.message


async def test_an_ssl_context_with_a_tcp_address_is_refused_before_anything_is_sent() -> None:
    # nothing listens there: the refusal must come before any connection is tried (not UnavailableError)
    ctx = ssl.create_default_context()
    with pytest.raises(InvalidError) as info:
        await tinystore.connect("tcp://127.0.0.1:1", token="x" * 20, ssl_context=ctx)
    message = info.value.message
    assert "tls://" in message and "tcp://" in message and "clear" in message
    with pytest.raises(InvalidError):  # a scheme in capitals is the same scheme (URLs ignore its case)
        await tinystore.connect("TCP://127.0.0.1:1", token="x" * 20, ssl_context=ctx)


async def test_bad_options_of_connect_are_invalid() -> None:
    with pytest.raises(InvalidError):
        await tinystore.connect("tcp://127.0.0.1:1", token=123)  # type: ignore[arg-type]
    with pytest.raises(InvalidError):
        await tinystore.connect("tcp://127.0.0.1:1", reconnect_timeout=-1)
    with pytest.raises(InvalidError):
        await tinystore.connect("tls://127.0.0.1:1", ssl_context="yes")  # type: ignore[arg-type]


async def test_a_plain_client_at_a_tls_port_is_told_to_use_tls(tmp_path: Path) -> None:
    cert, key = make_cert(tmp_path)
    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(
        tmp_path / "store",
        *("--listen", "tls://127.0.0.1:0", "--tokens", str(tokens), "--tls-cert", str(cert), "--tls-key", str(key)),
    ).start()
    try:
        address = server.tcp.replace("tls://", "tcp://")
        loop = asyncio.get_running_loop()
        began = loop.time()
        with pytest.raises(UnavailableError) as info:
            # (at once, not after reconnect_timeout: the listener is found to speak TLS, where a forwarder whose
            # backend is not up, which closes the connection alike, is waited for: trial HU)
            await tinystore.connect(address, token=admin, reconnect_timeout=30)
        assert loop.time() - began < 5, loop.time() - began
        message = info.value.message
        assert "None" not in message
        assert "closed the connection during the handshake" in message
        assert "use tls://" in message
        assert address in message
    finally:
        server.stop()


async def test_open_refuses_options_of_another_way_of_reaching_the_store(tmp_path: Path) -> None:
    """``serve`` is for an embedded store, ``reconnect_timeout`` for one reached over a socket: given to the other
    kind, each is refused rather than silently ignored."""
    with pytest.raises(InvalidError, match="open: serve is for embedded=True stores"):
        await tinystore.open(tmp_path / "s", private=True, serve=False)
    with pytest.raises(InvalidError, match="open: serve is for embedded=True stores"):
        await tinystore.open(tmp_path / "s", serve=True)
    with pytest.raises(InvalidError, match="open: reconnect_timeout is for a store reached over a socket"):
        await tinystore.open(tmp_path / "s", embedded=True, reconnect_timeout=5)
    with pytest.raises(InvalidError, match="open: reconnect_timeout -1: expected a duration above 0"):
        await tinystore.open(tmp_path / "s", private=True, reconnect_timeout=-1)
    with pytest.raises(InvalidError, match="open: reconnect_timeout '0s': expected a duration above 0"):
        await tinystore.open(tmp_path / "s", private=True, reconnect_timeout="0s")
    # trial EK: too long was "expected a duration above 0"
    with pytest.raises(InvalidError, match=r"open: reconnect_timeout: a duration is at most 100 years \(36500d\)"):
        await tinystore.open(tmp_path / "s", private=True, reconnect_timeout="100000000d")


async def test_open_takes_reconnect_timeout_as_connect_does(tmp_path: Path) -> None:
    # trial U: API.md's durations are a timedelta, a number of seconds or text; reconnect_timeout took numbers only
    store = await tinystore.open(tmp_path / "s", private=True, reconnect_timeout="2500ms")
    try:
        assert store.transport.reconnect_timeout == 2.5  # type: ignore[attr-defined]
        assert await store.status()
    finally:
        await store.close()
    embedded = await tinystore.open(tmp_path / "s", embedded=True, serve=False)  # still the way to say it
    await embedded.close()


@pytest.mark.parametrize("what", ["missing", "directory", "not a certificate", "fifo"])
async def test_ssl_cert_file_naming_no_certificate_file_is_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str
) -> None:
    # OpenSSL skips an SSL_CERT_FILE it cannot read, without a word: the server's certificate then fails to
    # verify, or the system's CAs stand in for the file the user meant (trial CK). Refused before any connection.
    path = tmp_path / "ca.pem"
    if what == "directory":
        path.mkdir()
    elif what == "not a certificate":
        path.write_text("hello\n")
    elif what == "fifo":  # (OpenSSL read it: connect() waited for ever on a FIFO nobody writes; trial CO)
        os.mkfifo(path)
    own = ssl.create_default_context()  # (made before: it reads the variable too)
    monkeypatch.setenv("SSL_CERT_FILE", str(path))
    with pytest.raises(InvalidError) as info:
        await asyncio.wait_for(tinystore.connect("tls://127.0.0.1:1", token="x" * 20), 10)
    message = info.value.message
    assert "SSL_CERT_FILE" in message and str(path) in message
    if what == "not a certificate":
        assert "holds no PEM certificate" in message, message
    # an ssl_context of the caller's own is the caller's: the variable is not looked at
    with pytest.raises(UnavailableError):
        await tinystore.connect("tls://127.0.0.1:1", token="x" * 20, ssl_context=own, reconnect_timeout=0.2)
