"""Trial CX: an IPv6 listen address as the server prints it, and as a client gives it without brackets."""

from __future__ import annotations

from pathlib import Path

import pytest

import tinystore

from ..helpers import ServerProcess, has_ipv6_loopback, write_tokens


@pytest.mark.skipif(not has_ipv6_loopback(), reason="no IPv6 loopback here")
async def test_an_ipv6_address_is_told_in_brackets_and_connects_as_told(tmp_path: Path) -> None:
    tokens, admin, _ = write_tokens(tmp_path)
    server = ServerProcess(tmp_path / "s", "--listen", "tcp://[::1]:0", "--tokens", str(tokens)).start()
    try:
        address = server.tcp
        assert address.startswith("tcp://[::1]:"), address  # (it said tcp://::1:PORT, which connect refused)
        store = await tinystore.connect(address, token=admin)
        try:
            assert (await store.status())["pid"] == server.proc.pid  # type: ignore[union-attr]
        finally:
            await store.close()
        port = address.rpartition(":")[2]
        with pytest.raises(tinystore.InvalidError, match=rf"an IPv6 address goes in brackets: tcp://\[::1\]:{port}\)"):
            await tinystore.connect(f"tcp://::1:{port}", token=admin)
    finally:
        server.stop()
