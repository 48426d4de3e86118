"""Arguments of queue calls are checked in the SDK, before anything is sent: the same ``InvalidError`` naming the
queue and the argument in every mode (not a raw ``TypeError``, an error about the store's own database, or the
wire's text); and what a handler hands back to end a job is checked the same way."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tinystore import ClosedError, InvalidError

from ..helpers import open_store


@pytest.fixture(params=["embedded", "sidecar"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


STATES = "queued, running, succeeded, failed, dead, cancelled, stuck"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit": "5"}, "limit '5' is not an int from 1 to 1000"),
        ({"limit": None}, "limit None is not an int from 1 to 1000"),
        ({"limit": 1.5}, "limit 1.5 is not an int from 1 to 1000"),
        ({"limit": True}, "limit True is not an int from 1 to 1000"),
        ({"limit": 0}, "limit 0 is not an int from 1 to 1000"),
        ({"limit": 10**30}, f"limit {10**30} is not an int from 1 to 1000"),
        ({"state": "done"}, f"state 'done' is not one of {STATES} (or None)"),
        ({"state": 5}, f"state 5 is not one of {STATES} (or None)"),
        ({"tenant": 5}, "tenant 5 is not a str (or None)"),
        ({"user": b"u"}, "user b'u' is not a str (or None)"),
        ({"type": [1]}, "type [1] is not a str (or None)"),
        ({"tenant": "a\ud800"}, "tenant 'a\\ud800' is not valid Unicode text (it holds a lone surrogate)"),
        ({"type": "t" * 300}, f"type '{'t' * 40}'…: at most 256 characters"),
    ],
)
async def test_list_arguments_are_checked_naming_the_queue(
    store: tinystore.Store, kwargs: dict[str, Any], message: str
) -> None:
    q = store.queue("lq")
    await q.add({})
    with pytest.raises(InvalidError) as info:
        await q.list(**kwargs)
    assert info.value.message == f"queue lq: list: {message}"
    assert len((await q.list(limit=1, tenant="", state="queued")).jobs) == 1  # good arguments still work


async def test_a_job_id_that_is_not_valid_unicode_is_refused_by_every_call(store: tinystore.Store) -> None:
    q = store.queue("ids")
    jid = await q.add({})
    for name, call in (("get", q.get), ("cancel", q.cancel), ("retry", q.retry)):
        with pytest.raises(InvalidError) as info:
            await call("\ud800")
        assert info.value.message == (
            f"queue ids: {name}: job id '\\ud800' is not valid Unicode text (a job id is what add returned)"
        )
    with pytest.raises(InvalidError, match=r"^queue ids: watch: job id '\\ud800' is not valid Unicode"):
        async for _ in q.watch("\ud800"):
            pass
    job = await q.get(jid)
    assert job is not None and job.state == "queued"


@pytest.mark.parametrize("priority", [2**64, 2**63, -(2**63), -(2**64)])
async def test_a_priority_past_64_bits_is_refused_naming_the_queue(store: tinystore.Store, priority: int) -> None:
    q = store.queue("pq")
    with pytest.raises(InvalidError) as info:
        await q.add({}, priority=priority)
    assert info.value.message == (
        f"queue pq: add: priority {priority} does not fit in 64 bits (-{2**63 - 1} .. {2**63 - 1})"
    )
    with pytest.raises(InvalidError, match=r"^queue pq: add_many: priority .* does not fit in 64 bits"):
        await q.add_many([{}, {}], priority=priority)
    await q.add({}, priority=2**63 - 1)
    await q.add({}, priority=-(2**63 - 1))
    assert sorted(j.priority for j in (await q.list()).jobs) == [-(2**63 - 1), 2**63 - 1]


async def test_an_over_long_key_is_cut_to_40_characters_in_the_error(store: tinystore.Store) -> None:
    q = store.queue("kq")
    with pytest.raises(InvalidError) as info:
        await q.add({}, key="k" * 513)
    assert info.value.message == (
        f"queue kq: add: key '{'k' * 40}'…: an idempotency key is a str of 1 to 512 characters"
    )
    assert (await q.list()).jobs == []


@pytest.mark.parametrize("keys", ["ab", b"ab", {"a": 1, "b": 2}, 7])
async def test_add_many_refuses_keys_that_are_not_a_list(store: tinystore.Store, keys: Any) -> None:
    q = store.queue("mq")
    with pytest.raises(InvalidError) as info:
        await q.add_many([1, 2], keys=keys)
    assert info.value.message == (
        f"queue mq: add_many: keys takes a list of keys (str or None), one per value, not {type(keys).__name__}"
    )
    assert (await q.list()).jobs == []
    ids = await q.add_many([1, 2], keys=iter(["a", None]))  # any iterable of keys
    assert [j.key for j in (await q.list()).jobs] == [None, "a"] and len(ids) == 2


@pytest.mark.parametrize("concurrency", ["2", 1.5, True, 0, 1001, None])
async def test_a_bad_concurrency_is_refused_by_work_and_run_due(store: tinystore.Store, concurrency: Any) -> None:
    q = store.queue("cq")
    for call in ("work", "run_due"):
        with pytest.raises(InvalidError) as info:
            if call == "work":
                q.work(lambda v, run: None, concurrency=concurrency)
            else:
                await q.run_due(lambda v, run: None, concurrency=concurrency)
        assert info.value.message == f"queue cq: {call}: concurrency {concurrency!r} is not an int from 1 to 1000"


async def test_a_queue_type_that_cannot_be_carried_is_invalid_naming_the_queue(store: tinystore.Store) -> None:
    for bad, kind in ((42, "an int"), ("Ask", "a str")):
        # (trial IQ: the text said "type 'str' cannot be carried: Type ''str'' is not supported")
        with pytest.raises(
            InvalidError, match=rf"^queue q: type {re.escape(repr(bad))} is not a type but {kind}: give the type itself"
        ):
            store.queue("q", bad)
    for bad_type in ("str", 5):
        with pytest.raises(InvalidError, match=r"^channel c: type .* is not a type but (a str|an int): give the type"):
            store.channel("c", bad_type)


@pytest.mark.parametrize("backoff", ["10s", 10, timedelta(seconds=10), ("1s",)])
async def test_backoff_takes_first_and_cap_only(store: tinystore.Store, backoff: Any) -> None:
    with pytest.raises(InvalidError, match=r"^queue q: option backoff: .* is not \(first, cap\), two durations"):
        store.queue("q", backoff=backoff)
    assert (await store.queue("q", backoff=["1s", "1m"]).options())["backoff"] == (1.0, 60.0)


async def test_work_after_the_store_closed_raises_closed_error(store: tinystore.Store) -> None:
    q = store.queue("wq")
    await q.add({})
    await store.close()
    with pytest.raises(ClosedError, match=r"^queue wq: work: the store is closed"):
        q.work(lambda v, run: None)


async def test_at_may_be_the_last_microsecond_of_9999(store: tinystore.Store) -> None:
    q = store.queue("aq")
    last = datetime(9999, 12, 31, 23, 59, 59, 999999)
    jid = await q.add({}, at=last)
    job = await q.get(jid)
    assert job is not None and job.run_at == datetime(9999, 12, 31, 23, 59, 59, 999000, tzinfo=UTC)
    east = datetime(10000 - 1, 12, 31, 23, 59, tzinfo=timezone(timedelta(hours=-1)))  # past 9999 in UTC
    with pytest.raises(InvalidError, match="is not between 1970 and the end of 9999"):
        await q.add({}, at=east)
    jid = await q.add({}, at=datetime(2030, 5, 6, 7, 8, 9, 123999, tzinfo=timezone(timedelta(hours=2))))
    job = await q.get(jid)
    assert job is not None and job.run_at == datetime(2030, 5, 6, 5, 8, 9, 123000, tzinfo=UTC)
    with pytest.raises(InvalidError, match="is not between 1970 and the end of 9999"):
        await q.add({}, at=datetime(1969, 12, 31, 23, 59, 59, 999999))


async def test_what_a_handler_hands_back_is_checked(store: tinystore.Store) -> None:
    q = store.queue("hq", attempts=2)
    cases = {
        "fail-none": lambda run: run.fail(None),
        "fail-bare": lambda run: run.fail(),
        "fail-int": lambda run: run.fail(5),
        "fail-empty": lambda run: run.fail(""),
        "permanent-none": lambda run: _raise(tinystore.PermanentError(None)),
        "permanent-bare": lambda run: _raise(tinystore.PermanentError()),
        "permanent-int": lambda run: _raise(tinystore.PermanentError(5)),  # type: ignore[arg-type]
        "permanent-text": lambda run: _raise(tinystore.PermanentError("not a PDF")),
        "step-none": lambda run: run.step(None, lambda: 1),
        # trial AH: each was a bare TypeError or msgspec.ValidationError, and a result that did not fit was kept
        "step-fn-none": lambda run: run.step("s", None),
        "step-type-5": lambda run: run.step("s", lambda: 1, type=5),
        "step-misfit": lambda run: run.step("s", lambda: "abc", type=int),
        "retry-soon": lambda run: run.retry("soon"),
    }
    ids = {name: await q.add({"case": name}) for name in cases}

    async def handler(value: dict[str, str], run: tinystore.Run) -> Any:
        result = cases[value["case"]](run)
        if hasattr(result, "__await__"):
            result = await result
        return result

    assert await q.run_due(handler) == len(cases)
    got = {}
    for name, jid in ids.items():
        job = await q.get(jid)
        assert job is not None
        got[name] = (job.state, (job.error or "").replace(jid, "<id>"))
    assert (await q.get(ids["step-misfit"])).steps == {}  # nothing kept: the next attempt runs the step again
    assert got == {
        # a reason that is not a str is the handler's error: a failed attempt, retried
        # (trial Z: run.fail(None) and run.fail() were retried, while PermanentError(None) ended the job)
        "fail-none": ("dead", "run.fail (the handler gave no reason)"),
        "fail-bare": ("dead", "run.fail (the handler gave no reason)"),
        "fail-int": (
            "failed",
            "InvalidError: queue hq: job <id>: fail: reason 5 is not a str (say why the job cannot succeed)",
        ),
        "fail-empty": ("dead", "run.fail (the handler gave no reason)"),
        "permanent-none": ("dead", "PermanentError (the handler gave no reason)"),
        "permanent-bare": ("dead", "PermanentError (the handler gave no reason)"),
        "permanent-int": (
            "failed",
            "InvalidError: PermanentError: reason 5 is not a str (say why the job cannot succeed)",
        ),
        "permanent-text": ("dead", "not a PDF"),
        "step-none": (
            "failed",
            "InvalidError: queue hq: job <id>: step name None: a str of 1 to 256 characters, "
            "without quotes or backslashes",
        ),
        "step-fn-none": (
            "failed",
            "InvalidError: queue hq: job <id>: step 's': fn must be a function called with no arguments, not None",
        ),
        "step-type-5": (
            "failed",
            "InvalidError: queue hq: job <id>: step 's': type 5 is not a type a result can be read as "
            "(Type '5' is not supported)",
        ),
        "step-misfit": (
            "failed",
            "InvalidError: queue hq: job <id>: step 's': its result (not kept) 'abc' does not fit int: "
            "Expected `int`, got `str`",
        ),
        "retry-soon": (
            "failed",
            "InvalidError: queue hq: job <id>: retry: after: cannot read 'soon' as a duration "
            '(use "250ms", "30s", "1m30s", "2h", "7d")',
        ),
    }


def _raise(exc: BaseException) -> Any:
    raise exc


async def test_a_workers_stop_names_the_queue_of_a_bad_grace(store: tinystore.Store) -> None:
    # trial AH: "grace: cannot read '10x' ..." named no queue nor worker
    worker = store.queue("gq").work(lambda value, run: None)
    with pytest.raises(InvalidError, match="queue gq: worker stop: grace: cannot read '10x'"):
        await worker.stop(grace="10x")
    await worker.stop()


async def test_an_int_past_a_floats_range_as_at_or_delay_is_invalid_shown_by_its_size(store: tinystore.Store) -> None:
    # trial GK: at=10**400 raised Python's OverflowError (math.isfinite), and delay=-10**400 was shown in 401 digits
    q = store.queue("bq")
    for kwargs, words in (
        ({"at": 10**400}, "at an int of 1329 bits (epoch seconds) is not between 1970 and the end of 9999"),
        ({"at": -(10**400)}, "at a negative int of 1329 bits (epoch seconds) is not between"),
        ({"delay": -(10**400)}, "delay a negative int of 1329 bits is negative"),
        ({"delay": 10**400}, "delay: a duration is at most 100 years"),
    ):
        with pytest.raises(InvalidError, match=re.escape(f"queue bq: add: {words}")):
            await q.add({}, **kwargs)
    assert await q.add({}, at=5) is not None
