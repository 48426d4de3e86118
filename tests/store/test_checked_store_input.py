"""Input of the store's own calls, checked in the SDK and again in the server (for clients that are not the
SDK): migrations' names and texts, stop_server's grace, connect()'s address and token."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

import tinystore
from tests.helpers import open_store
from tinystore.protocol.messages import encode
from tinystore.protocol.sql import Migration, OpenDb
from tinystore.protocol.store import Stop
from tinystore.server import paths

from .raw import RawClient, error_of

BAD_NAMES = [
    ("", "migration '': a migration's name is 1 to 255 characters, with no control characters"),
    ("a\x00.sql", "migration 'a\\x00.sql': a migration's name is 1 to 255 characters, with no control characters"),
    ("a\n.sql", "migration 'a\\n.sql': a migration's name is 1 to 255 characters, with no control characters"),
    (
        "x" * 256,
        "migration '" + "x" * 37 + "'...: a migration's name is 1 to 255 characters, with no control "
        "characters (this one has 256)",
    ),
]


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_migration_names_and_texts_are_checked(tmp_path: Path, mode: str) -> None:
    async with open_store(mode, tmp_path / "s") as store:
        for name, why in BAD_NAMES:
            with pytest.raises(tinystore.InvalidError) as info:
                await store.database("app", migrations=[(name, "create table t (a)")])
            assert info.value.message == f"database app: {why}"
        with pytest.raises(tinystore.InvalidError) as info:
            await store.database("app", migrations=[("001.sql", "create table z (a) -- \ud800")])
        assert info.value.message == (
            "database app: migration '001.sql': its text is not valid Unicode (surrogates not allowed at character "
            "22): UTF-8 cannot store it"
        )
        with pytest.raises(tinystore.InvalidError, match=r"^database app: migration '001.sql' is given twice$"):
            await store.database("app", migrations=[("001.sql", "create table t (a)")] * 2)
        # nothing was recorded; a good name of 255 characters is fine
        db = await store.database("app", migrations=[("y" * 255, "create table t (a)")])
        assert await db.all("select name from _tinystore_migrations") == [{"name": "y" * 255}]


async def test_the_server_checks_migration_names_itself(tmp_path: Path) -> None:
    d = tmp_path / "s"
    async with open_store("private", d) as store:
        raw = await RawClient.open(("unix", paths.socket_path(d)))
        try:
            await raw.hello()
            f = await raw.call(1, "sql.open", encode(OpenDb(db="app", migrations=[Migration("a\x00", "select 1")])))
            err = error_of(f)
            assert err.code == "invalid" and err.message.startswith("database app: migration 'a\\x00': ")
        finally:
            await raw.close()
        db = await store.database("app")
        assert await db.all("select name from _tinystore_migrations") == []


async def test_the_server_checks_the_grace_of_a_stop_itself(tmp_path: Path) -> None:
    d = tmp_path / "s"
    async with open_store("private", d) as store:
        raw = await RawClient.open(("unix", paths.socket_path(d)))
        try:
            await raw.hello()
            for i, grace in enumerate([-1.0, math.nan, math.inf]):
                err = error_of(await raw.call(1 + i, "store.stop", encode(Stop(grace))))
                assert err.code == "invalid" and err.message.startswith("store.stop: grace: a duration must be finite")
        finally:
            await raw.close()
        assert (await store.status())["pid"] > 0  # it did not stop


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_stop_server_refuses_a_bad_grace_before_anything_stops(tmp_path: Path, mode: str) -> None:
    d = tmp_path / "s"
    async with open_store(mode, d) as store:
        for grace in (-1, math.nan, "x"):
            with pytest.raises(tinystore.InvalidError) as info:
                await store.stop_server(grace=grace)  # type: ignore[arg-type]
            assert info.value.message.startswith(f"store {d}: stop_server: grace: ")
        assert (await store.status())["pid"] > 0


@pytest.mark.parametrize(
    ("address", "shown", "why"),
    [
        ("tcp://user:pw@127.0.0.1:7600/path?x=1", "tcp://…@127.0.0.1:7600/path?x=1", "a user or password in the"),
        ("tcp://127.0.0.1:7600/path", "tcp://127.0.0.1:7600/path", "a path ('/path') has no meaning here"),
        ("tls://127.0.0.1:7600/?x=1", "tls://127.0.0.1:7600/?x=1", "a query ('x=1') has no meaning here"),
        ("tcp://127.0.0.1:7600#top", "tcp://127.0.0.1:7600#top", "a fragment ('#top') has no meaning here"),
    ],
)
async def test_connect_refuses_parts_of_an_address_it_would_ignore(address: str, shown: str, why: str) -> None:
    with pytest.raises(tinystore.InvalidError) as info:
        await tinystore.connect(address, token="t" * 16)
    message = info.value.message
    assert message.startswith(f"connect: address {shown!r}: use tcp://HOST:PORT or tls://HOST:PORT ({why}")
    assert "pw" not in message


async def test_a_token_that_is_not_unicode_is_refused_without_showing_it() -> None:
    with pytest.raises(tinystore.InvalidError) as info:
        await tinystore.connect("tcp://127.0.0.1:7600", token="secret\ud800")
    assert info.value.message.startswith("connect: token: not valid Unicode text (a lone surrogate at character 6)")
    assert "secret" not in info.value.message
    assert info.value.__cause__ is None and info.value.__suppress_context__


BAD_OPEN_OPTIONS = [
    ({"embedded": "false"}, "open: embedded 'false': expected True or False"),
    ({"private": 1}, "open: private 1: expected True or False"),
    ({"embedded": True, "serve": "false"}, "open: serve 'false': expected True or False"),
    ({"embedded": True, "clock": "2030-01-01"}, "open: clock '2030-01-01': expected a datetime"),
    ({"embedded": True, "clock": 1.5}, "open: clock 1.5: expected a datetime"),
    ({"private": True, "clock": "2030-01-01"}, "open: clock '2030-01-01': expected a datetime"),
    ({"embedded": True, "limits": {"tx_idle": 1}}, "open: limits {'tx_idle': 1}: expected a tinystore.Limits"),
    ({"private": True, "limits": {"tx_idle": 1}}, "open: limits {'tx_idle': 1}: expected a tinystore.Limits"),
    # trial AH: accepted, then every add failed about an `at` nobody gave
    (
        {"embedded": True, "clock": datetime(1960, 1, 1, tzinfo=UTC)},
        "open: clock 1960-01-01T00:00:00+00:00: a test clock starts between 1970 and the end of 9999",
    ),
]


async def test_open_refuses_a_path_with_a_nul_by_name(tmp_path: Path) -> None:
    # trial AH: a bare ValueError ("embedded null byte")
    with pytest.raises(tinystore.InvalidError, match="cannot hold a NUL"):
        await tinystore.open(f"{tmp_path}/a\0b", embedded=True)


# contract: STORE-02
@pytest.mark.parametrize("mode", [{}, {"private": True}, {"embedded": True}])
@pytest.mark.parametrize(
    ("given", "shown"),
    [
        ("tcp://127.0.0.1:7611", "tcp://127.0.0.1:7611"),
        ("tls://db.example:7611", "tls://db.example:7611"),
        ("TCP://127.0.0.1:7611/", "TCP://127.0.0.1:7611/"),
        ("tcp://user:pw@127.0.0.1:7611", "tcp://…@127.0.0.1:7611"),
        ("unix:///tmp/s", "unix:///tmp/s"),
    ],
)
async def test_open_refuses_an_address_before_making_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: dict[str, bool], given: str, shown: str
) -> None:
    # trial BU: open("tcp://127.0.0.1:7611") made a folder "tcp:/127.0.0.1:7611" and started a sidecar in it
    monkeypatch.chdir(tmp_path)
    try:
        store = await tinystore.open(given, **mode)
    except tinystore.InvalidError as exc:
        message = exc.message
    else:  # stop what it started
        await store.stop_server(grace=1)
        await store.close()
        pytest.fail(f"opened {store!r}")
    assert message == (
        f"open: directory {shown!r}: an address, not a directory; to reach a server at an address, use "
        "tinystore.connect(url, token=...)"
    )
    assert "pw" not in message
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("options", range(len(BAD_OPEN_OPTIONS)))
async def test_open_names_an_option_of_the_wrong_type(tmp_path: Path, options: int) -> None:
    # trial U: "false" meant True (an embedded store that served), and a str clock or a dict of limits gave a bare
    # ValueError/AttributeError naming no option; a float clock was taken silently
    given, why = BAD_OPEN_OPTIONS[options]
    with pytest.raises(tinystore.InvalidError) as info:
        await tinystore.open(tmp_path / "s", **given)
    assert info.value.message.startswith(why), info.value.message
    assert not (tmp_path / "s" / "server" / "address").exists()
    async with open_store("embedded", tmp_path / "s"):
        pass  # nothing kept the directory


# contract: STORE-02
async def test_open_names_a_bad_idle_as_its_other_options(tmp_path: Path) -> None:
    # trial BU: open(idle="forever") said "idle: cannot read ...", where every other option's error begins "open:"
    with pytest.raises(tinystore.InvalidError) as info:
        await tinystore.open(tmp_path / "s", idle="forever")
    assert info.value.message == (
        'open: idle: cannot read \'forever\' as a duration (use "250ms", "30s", "1m30s", "2h", "7d"); idle '
        '"0s" keeps a sidecar until it is stopped'
    )
    assert not (tmp_path / "s").exists()


async def test_reprs_name_what_a_log_line_needs(tmp_path: Path) -> None:
    # trial U: Database, SqlTx and StoreClock had the default repr; a Semaphore's left out its limit
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app")
        assert repr(db) == f"<tinystore.Database app of {store!r}>"
        seen: list[str] = []

        async def body(tx: tinystore.SqlTx) -> None:
            seen.append(repr(tx))

        await db.tx(body, read_only=True)
        assert re.fullmatch(r"<tinystore\.SqlTx read-only transaction \d+ of database app>", seen[0]), seen
        assert repr(store.semaphore("slots", 3)) == "<tinystore.Semaphore slots limit 3 ttl 10s>"
        assert repr(store.clock).endswith("real time>")
        async with store.lock("l").hold("k") as lease:
            assert repr(lease).startswith('<tinystore.Lease lock l: key "k" fence ')
    assert repr(store).endswith(" closed>")


def test_a_job_event_is_built_as_api_md_writes_it() -> None:
    # API.md: tinystore.JobEvent(kind, job_id, state, progress, attempts, error)
    event = tinystore.JobEvent("state", "j1", "dead", None, 3, "boom")
    assert (event.kind, event.job_id, event.state, event.attempts, event.error) == ("state", "j1", "dead", 3, "boom")
