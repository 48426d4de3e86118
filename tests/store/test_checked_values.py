"""Values a user gives are checked where they are given, with a clear InvalidError: Limits, durations, open's
directory; and messages read right ("an int")."""

from __future__ import annotations

import enum
import math
import os
import re
import subprocess
import sys
from collections.abc import Awaitable, Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

import tinystore
from tests.helpers import open_store
from tinystore.durations import seconds

COUNTS = [f.name for f in msgspec.structs.fields(tinystore.Limits) if f.type is int]
DURATIONS = [f.name for f in msgspec.structs.fields(tinystore.Limits) if f.type is float]


def test_every_field_of_limits_is_a_count_or_a_duration() -> None:
    assert sorted(COUNTS + DURATIONS) == sorted(tinystore.Limits.__struct_fields__)
    assert "channel_log" in COUNTS and "tx_idle" in DURATIONS


@pytest.mark.parametrize("name", COUNTS)
@pytest.mark.parametrize("bad", [0, -5, 1.5, "5", True, None])
def test_a_count_out_of_range_is_refused(name: str, bad: Any) -> None:
    with pytest.raises(tinystore.InvalidError, match=f"Limits: {name} = {bad!r}: it must be an int") as err:
        tinystore.Limits(**{name: bad})
    least = "1,048,576" if name in ("sql_memory_bytes", "client_output_bytes") else "1"  # (see limits._INT_MIN)
    assert f"{least} " in err.value.message or f"from {least}" in err.value.message


@pytest.mark.parametrize("name", DURATIONS)
@pytest.mark.parametrize("bad", [-1, -0.5, math.inf, -math.inf, math.nan, True, 11 * 365 * 86400])
def test_a_duration_out_of_range_is_refused(name: str, bad: Any) -> None:
    with pytest.raises(tinystore.InvalidError, match=f"Limits: {name} = .*: it must be a number of seconds") as err:
        tinystore.Limits(**{name: bad})
    assert repr(bad) in err.value.message and "at most 315360000" in err.value.message


@pytest.mark.parametrize("name", DURATIONS)
def test_a_duration_may_be_text_or_a_timedelta_as_everywhere(name: str) -> None:
    # (trial CR: API.md's durations are a timedelta, a number of seconds or text; Limits took numbers only)
    assert getattr(tinystore.Limits(**{name: "1m30s"}), name) == 90.0
    assert getattr(tinystore.Limits(**{name: timedelta(milliseconds=2500)}), name) == 2.5
    assert tinystore.Limits.from_json(tinystore.Limits(**{name: "2s"}).to_json()) == tinystore.Limits(**{name: 2})
    with pytest.raises(tinystore.InvalidError, match=f"Limits: {name}: cannot read '5 parsecs' as a duration"):
        tinystore.Limits(**{name: "5 parsecs"})


@pytest.mark.parametrize("name", DURATIONS)
def test_zero_is_a_duration_only_where_it_means_something(name: str) -> None:
    if name in ("inline_read", "job_keep"):
        assert getattr(tinystore.Limits(**{name: 0}), name) == 0
    else:
        with pytest.raises(tinystore.InvalidError, match=f"Limits: {name} = 0: .*above 0"):
            tinystore.Limits(**{name: 0})


def test_the_user_reported_limits_and_the_upper_bounds() -> None:
    with pytest.raises(tinystore.InvalidError, match=r"Limits: channel_log = -5: it must be an int, 1 or more"):
        tinystore.Limits(channel_log=-5)
    with pytest.raises(tinystore.InvalidError, match=r"Limits: channel_prefetch = 0: it must be an int, 1 or more"):
        tinystore.Limits(channel_prefetch=0)
    with pytest.raises(tinystore.InvalidError, match=r"frame_body_bytes = 4294967296: it must be an int from 1 to"):
        tinystore.Limits(frame_body_bytes=1 << 32)
    with pytest.raises(tinystore.InvalidError, match=r"readers = 5000: it must be an int from 1 to 1024"):
        tinystore.Limits(readers=5000)
    with pytest.raises(tinystore.InvalidError, match=r"lock_ttl_min \(10\) is above lock_ttl_max \(5\)"):
        tinystore.Limits(lock_ttl_min=10, lock_ttl_max=5)
    # what the tests and users give: ints for seconds, small values
    limits = tinystore.Limits(lock_ttl_min=0.1, lock_ttl_max=5, tx_idle=1, inline_read=0, channel_log=1)
    assert limits.tx_idle == 1 and limits.channel_log == 1
    assert tinystore.Limits.from_json(limits.to_json()) == limits


def test_limits_read_from_json_are_checked() -> None:
    with pytest.raises(tinystore.InvalidError, match="Limits: channel_log = -5"):
        tinystore.Limits.from_json('{"channel_log": -5}')
    with pytest.raises(tinystore.InvalidError, match=r"Limits: .*channel_log"):
        tinystore.Limits.from_json('{"channel_log": "x"}')
    with pytest.raises(tinystore.InvalidError, match="Limits: JSON is malformed"):
        tinystore.Limits.from_json("nope")
    # a duration as text, as Limits(...) takes it (trial HV: `--limits '{"tx_idle": "2s"}'` was refused)
    assert tinystore.Limits.from_json('{"tx_idle": "2s", "job_keep": "1d"}') == tinystore.Limits(
        tx_idle=2, job_keep=86400
    )
    with pytest.raises(tinystore.InvalidError, match="Limits: tx_idle: cannot read '2 parsecs' as a duration"):
        tinystore.Limits.from_json('{"tx_idle": "2 parsecs"}')
    with pytest.raises(tinystore.InvalidError, match=r"client_output_bytes = '256MiB': it must be an int .*not text"):
        tinystore.Limits.from_json('{"client_output_bytes": "256MiB"}')


def test_a_server_given_bad_limits_says_so() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tinystore", "serve", os.devnull + "-never-made", "--limits", '{"channel_prefetch": 0}'],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1] == (
        "error[invalid] Limits: channel_prefetch = 0: it must be an int, 1 or more"
    )


@pytest.mark.parametrize("text", ["-1s", "-1m30s", "-250ms", " -2h", "-1", "-1.5"])
def test_a_negative_duration_in_text_says_not_negative(text: str) -> None:
    with pytest.raises(tinystore.InvalidError, match=f"ttl: a duration must be finite and not negative, got '{text}'"):
        seconds(text, "ttl")


def test_durations_that_do_not_read_still_say_so() -> None:
    for text in ("-x", "--1s", "1x", "s1"):
        with pytest.raises(tinystore.InvalidError, match=f"ttl: cannot read '{text}' as a duration"):
            seconds(text, "ttl")
    assert seconds("-0s") == 0 and seconds("1m30s") == 90


def test_an_int_past_a_floats_range_is_an_invalid_error_naming_what() -> None:
    # from trial GI: 10**400 as a ttl went out as Python's OverflowError ("int too large to convert to float")
    with pytest.raises(tinystore.InvalidError, match=r"^ttl: a duration is at most 100 years \(36500d\), got an int"):
        seconds(10**400, "ttl")
    with pytest.raises(tinystore.InvalidError, match=r"^ttl: a duration must be finite and not negative"):
        seconds(-(10**400), "ttl")
    with pytest.raises(tinystore.InvalidError, match="at most 100 years"):
        seconds(10**100_000, "ttl")  # (past the digits an int may be shown with)


async def test_locks_and_connect_refuse_an_int_past_a_floats_range(tmp_path: Path) -> None:
    async with await tinystore.open(tmp_path / "s", embedded=True) as store:
        for make in (lambda: store.lock("a", ttl=10**400), lambda: store.lock("a", max_hold=10**400)):
            with pytest.raises(tinystore.InvalidError, match="at most 100 years"):
                make()
        with pytest.raises(tinystore.InvalidError, match="wait: a duration is at most 100 years"):
            async with store.lock("a").hold("k", wait=10**400):
                pass
    with pytest.raises(tinystore.InvalidError, match="at most 100 years"):
        await tinystore.connect("tcp://127.0.0.1:1", token="x" * 16, reconnect_timeout=10**400)


async def test_a_negative_ttl_in_text_reads_as_negative(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        with pytest.raises(tinystore.InvalidError, match="not negative, got '-1s'"):
            store.lock("jobs", ttl="-1s")


@pytest.mark.parametrize("empty", ["", "   "])
async def test_open_refuses_an_empty_directory(empty: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for kw in ({}, {"embedded": True}, {"private": True}):
        with pytest.raises(tinystore.InvalidError, match=r"open: directory '\s*': give the store's directory"):
            await tinystore.open(empty, **kw)
    assert list(tmp_path.iterdir()) == []  # nothing made in the current directory
    with pytest.raises(tinystore.InvalidError, match=f"connect: address {empty!r}: use tcp://HOST:PORT"):
        await tinystore.connect(empty)


# contract: JOB-06
async def test_tx_with_names_the_type_with_the_right_article(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        db = await store.database("app")

        async def use(tx: tinystore.SqlTx, thing: object) -> None:
            tx.with_(thing)

        for thing, text in ((5, "an int"), ({}, "a dict"), (object(), "an object"), (db, "a Database")):
            with pytest.raises(tinystore.InvalidError, match=f"tx.with_: {text} cannot take part in a transaction"):
                await db.tx(lambda tx, thing=thing: use(tx, thing))
        # trial BU: tx.with_("events") said only that a str cannot take part; it takes the Queue or Channel object
        for thing, text in (("events", "a str"), ("x" * 65, "a str"), (5, "an int")):
            with pytest.raises(tinystore.InvalidError) as info:
                await db.tx(lambda tx, thing=thing: use(tx, thing))
            name = repr(thing) if thing == "events" else "name"
            assert info.value.message == (
                f"tx.with_: {text} cannot take part in a transaction: give it the Queue or Channel object "
                f"(store.queue({name}) or store.channel({name}))"
            )
        with pytest.raises(tinystore.InvalidError, match="parameter 1: an object is not a SQL value"):
            await db.exec("select ?", object())


# contract: STORE-01
async def test_open_reads_a_leading_tilde_as_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # from trial AN: "~/x" made a folder named "~" in the current directory
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(cwd)
    store = await tinystore.open("~/data", embedded=True, serve=False)
    try:
        assert store.directory == home / "data"
    finally:
        await store.close()
    assert (home / "data" / "LOCK").is_file() and list(cwd.iterdir()) == []


@pytest.mark.parametrize("big", [10**400, -(10**400), 10**5000, -(10**5000)], ids=["e400", "-e400", "e5000", "-e5000"])
async def test_a_huge_int_anywhere_is_an_invalid_error_that_shows_its_size(store: tinystore.Store, big: int) -> None:
    # trial GL: past 4,300 digits Python refuses to write an int, and these raised its ValueError (a caller that
    # catches TinystoreError missed them); below that, the messages held all of its digits
    db = await store.database("app", migrations=[("001.sql", "create table t (a)")])
    size = f"{'a negative' if big < 0 else 'an'} int of {big.bit_length()} bits"

    async def hold(lock: tinystore.Lock | tinystore.Semaphore, key: object) -> None:
        async with lock.hold(key, wait="1s"):  # type: ignore[arg-type]
            pass

    cases: list[tuple[Callable[[], Awaitable[object]], str]] = [
        (lambda: db.all("select ?", big), f"database app: parameter 1: {size} does not fit in 64 bits"),
        (lambda: db.exec("insert into t values (?)", big), f"parameter 1: {size} does not fit in 64 bits"),
        (lambda: hold(store.semaphore("s", limit=big), "k"), f"semaphore s: limit {size} must be an int from 1"),
        (lambda: hold(store.lock("l"), big), f"lock l: key {size}: a key is 1 to 256 characters"),
        (lambda: store.channel("c").under(big).publish(1), f"channel c: branch part {size}: a branch part is 1"),
        (lambda: store.queue("q1", database=db, attempts=big).add({}), f"option attempts: {size} is not between"),
        (lambda: store.queue("q2", database=db, max_running=big).add({}), f"option max_running: {size} is not"),
        (lambda: store.queue("q3").add({"n": big}), f"the value does not encode as JSON: {size} does not fit"),
        (lambda: store.queue("q4").add({}, priority=big), f"priority {size} does not fit in 64 bits"),
    ]
    for call, message in cases:
        with pytest.raises(tinystore.InvalidError, match=re.escape(message)) as caught:
            await call()
        assert len(str(caught.value)) < 200
    assert await db.scalar("select count(*) from t") == 0
    assert await db.scalar("select 1") == 1  # (the connection stays)


async def test_int_subclasses_are_taken_as_plain_ints_in_every_mode(store: tinystore.Store) -> None:
    # trial GP: an IntEnum semaphore limit was refused embedded ("limit <Level.SEVEN: 7> must be an int from 1"),
    # an int subclass as attempts or max_running raised TypeError embedded, as priority or list limit failed over a
    # sidecar
    class Sub(int):
        def __repr__(self) -> str:
            return "R" * 100_000  # (never shown whole)

    class Level(enum.IntEnum):
        SEVEN = 7

    for v in (Sub(7), Level.SEVEN):
        name = type(v).__name__.lower()
        async with store.semaphore(f"s-{name}", limit=v).try_hold("k") as permit:
            assert permit is not None
        q = store.queue(f"q-{name}", attempts=v, max_running=v, max_running_per_tenant=v)
        jid = await q.add({}, priority=v)
        assert [j.id for j in (await q.list(limit=v)).jobs] == [jid]
        job = await q.get(jid)
        assert job is not None and job.priority == 7 and type(job.priority) is int


def test_a_duration_shows_a_huge_int_by_its_size() -> None:
    # trial GP: 10**300 as a ttl was shown with its 301 digits; an int subclass's own repr, whole
    class Loud(int):
        def __repr__(self) -> str:
            return "R" * 100_000

    for value, told in [
        (10**300, "got an int of 997 bits"),
        (-(10**300), "got a negative int of 997 bits"),
        (Loud(10**20), "got RRRR"),  # (its repr, cut)
        (Loud(-1), "got RRRR"),
    ]:
        with pytest.raises(tinystore.InvalidError, match=told) as caught:
            seconds(value, "ttl")
        assert len(str(caught.value)) < 120


async def test_a_huge_int_where_a_name_limit_or_pair_goes_is_an_invalid_error(tmp_path: Path) -> None:
    # trial GR: Python's ValueError (an int past 4,300 digits written as text) or OverflowError came out instead
    big = -(10**5000)
    for make in (lambda: tinystore.Limits(readers=big), lambda: tinystore.Limits(lock_ttl=big)):
        with pytest.raises(tinystore.InvalidError, match="a negative int of 16610 bits"):
            make()
    async with open_store("embedded", tmp_path / "s") as store:
        with pytest.raises(tinystore.InvalidError, match="database name a negative int of 16610 bits"):
            await store.database(big)  # type: ignore[arg-type]
        with pytest.raises(tinystore.InvalidError, match=r"is not a \(name, SQL text\) pair"):
            await store.database("app", migrations=[(big, "x")])  # type: ignore[list-item]
    with pytest.raises(tinystore.InvalidError, match="reconnect_timeout a negative int of 16610 bits"):
        await tinystore.connect("tcp://127.0.0.1:1", token="x" * 16, reconnect_timeout=big)


async def test_an_int_subclass_as_concurrency_is_a_plain_int(store: tinystore.Store) -> None:
    # trial GR: run_due(concurrency=Sub(2)) did not encode over a connection
    class Sub(int):
        pass

    q = store.queue("subbed")
    await q.add({})

    async def noop(value: Any, run: tinystore.Run) -> None:
        pass

    assert await q.run_due(noop, concurrency=Sub(2)) == 1
    worker = q.work(noop, concurrency=Sub(2))
    await worker.stop()
