"""``tinystore demo``: one process on an embedded store, and N web processes plus a worker on the sidecar."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

import tinystore
from tinystore.server import paths

from ..sse.harness import client, open_sse
from .demo_proc import run_demo


async def post_and_hear_the_reply(http: httpx.AsyncClient, post_to: str, listen_to: str) -> None:
    """Post through ``post_to``; a tab on ``listen_to`` gets the user's message, the tokens, and the reply."""
    chat = (await http.post(f"{post_to}/api/chats", json={"title": "demo"})).json()
    async with open_sse(http, f"{listen_to}/api/chats/{chat['id']}/events") as tab:
        r = await http.post(f"{post_to}/api/chats/{chat['id']}/messages", json={"text": "hello from a test"})
        assert r.status_code == 201, r.text
        asked = r.json()["id"]
        kinds = []
        while True:
            ev = await tab.next(timeout=15)
            kinds.append(ev.type)
            if ev.type == "message" and json.loads(ev.data)["id"] != asked:
                reply_id = json.loads(ev.data)["id"]
                break
        assert kinds[0] == "message" and "token" in kinds and "done" in kinds
    rows = (await http.get(f"{listen_to}/api/chats/{chat['id']}/messages")).json()
    assert [m["id"] for m in rows] == [asked, reply_id]


async def test_demo_runs_the_chat_on_an_embedded_store_and_stops_cleanly(tmp_path: Path) -> None:
    async with run_demo(tmp_path / "data", "--token-delay", "0.002") as demo, client() as http:
        (url,) = demo.urls
        assert "embedded" in demo.output[0]
        await post_and_hear_the_reply(http, url, url)
        # SIGTERM with a tab open: the stream is ended for the browser to reconnect, and the process exits 0
        async with open_sse(http, f"{url}/api/chats/1/events") as tab:
            assert await demo.stop() == 0
            assert await tab.ended(timeout=5)
    assert (tmp_path / "data" / "sql" / "chat.db").exists()


async def test_two_web_processes_and_a_worker_share_one_store(tmp_path: Path) -> None:
    err = tmp_path / "stderr.txt"
    async with (
        run_demo(tmp_path / "data", "--web-processes", "2", "--token-delay", "0.002", urls=2, stderr=err) as demo,
        client() as http,
    ):
        one, two = demo.urls
        pids = {(await http.get(f"{u}/healthz")).json()["pid"] for u in (one, two)}
        assert len(pids) == 2
        await post_and_hear_the_reply(http, one, two)  # posted through one, heard on the other
        await post_and_hear_the_reply(http, two, one)
        assert await demo.stop() == 0
        # the sidecar the demo started stops with it (trial AA: it stayed some 30 s, until idle)
        assert paths.read_address((tmp_path / "data").resolve()) is None
    # said once, not by each web process (trial CI)
    assert err.read_text().count("stopping: a reply being written") == 1, err.read_text()


async def test_a_server_that_served_before_the_demo_keeps_serving_after_it(tmp_path: Path) -> None:
    directory = tmp_path / "data"
    store = await tinystore.open(directory)  # a sidecar, serving before the demo starts
    async with run_demo(directory, "--web-processes", "1", "--token-delay", "0.002", urls=1) as demo:
        try:
            assert await demo.stop() == 0
            pid = (paths.read_address(directory.resolve()) or {}).get("pid")
            assert pid is not None and (await store.status())["pid"] == pid  # the same server, still serving
        finally:
            await store.close()  # before run_demo stops the sidecar: else the SDK would start it again


def test_the_chat_is_found_outside_a_checkout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An installed package carries the chat (``tinystore/_chat``): ``tinystore demo`` needs no source tree."""
    import tinystore
    from tinystore.cli.demo import find_example

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TINYSTORE_CHAT_EXAMPLE", raising=False)
    folder = find_example()
    assert (folder / "app.py").is_file() and (folder / "static" / "index.html").is_file()
    assert (folder / "migrations" / "001_chats.sql").is_file()
    packaged = Path(tinystore.__file__).parent / "_chat"
    assert (packaged / "app.py").is_file(), "the package's _chat (what a wheel installs) is missing"


def test_a_taken_port_is_one_clear_error_without_a_traceback(tmp_path: Path) -> None:
    import socket
    import subprocess
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "tinystore", "demo", str(tmp_path / "data"), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done.stderr
    assert f"port {port} on 127.0.0.1 is not free" in done.stderr
    assert "--port" in done.stderr
    assert "Traceback" not in done.stderr and "never retrieved" not in done.stderr, done.stderr
    # told before anything started (trial AA: the web server's own error line came first, and a new, empty store
    # directory was left behind)
    assert "Errno" not in done.stderr.split("\n")[0] and "ERROR" not in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()


def test_a_model_url_that_is_no_http_address_is_refused_at_start(tmp_path: Path) -> None:
    # from trial AN: "notaurl" was taken, and every reply then failed and was tried again five times
    import subprocess
    import sys

    for url in ["notaurl", "localhost:11434/v1", "ftp://example.com/v1", "http://"]:
        done = subprocess.run(
            [sys.executable, "-m", "tinystore", "demo", str(tmp_path / "data"), "--model-url", url],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 1, done.stderr
        assert f"--model-url {url!r}: expected an http:// or https:// address" in done.stderr, done.stderr
    assert not (tmp_path / "data").exists()


def test_a_wildcard_host_is_shown_with_the_address_a_phone_opens() -> None:
    from types import SimpleNamespace

    from tinystore.cli import demo

    class Sock:
        def getsockname(self) -> tuple[str, int]:
            return ("0.0.0.0", 8600)

    server = SimpleNamespace(servers=[SimpleNamespace(sockets=[Sock()])])
    lan = demo._network_address()
    shown = demo._address(server, "0.0.0.0")
    assert shown.startswith("http://127.0.0.1:8600")
    assert (f"(on this network: http://{lan}:8600)" in shown) if lan else shown == "http://127.0.0.1:8600"
    assert demo._address(server, "127.0.0.1") == "http://127.0.0.1:8600"


async def test_a_stale_address_file_does_not_keep_the_demos_sidecar(tmp_path: Path) -> None:
    """An embedded store that served left ``server/address`` behind when it closed: a later --web-processes demo
    took it for a server serving before it, and left its own sidecar running."""
    directory = tmp_path / "data"
    store = await tinystore.open(directory, embedded=True)
    await store.close()
    assert paths.read_address(directory.resolve()) is None  # an embedded store's address goes when it closes
    paths.write_address(directory.resolve(), {"pid": 2**22 + 1, "mode": "embedded"})  # as a killed one leaves
    async with run_demo(directory, "--web-processes", "1", "--token-delay", "0.002", urls=1) as demo:
        assert await demo.stop() == 0
        assert paths.read_address(directory.resolve()) is None
