"""Bad input to the jobs engine: a clear error naming the queue (and the job), nothing half-written."""

from __future__ import annotations

import dataclasses
import re
from datetime import timedelta
from pathlib import Path
from typing import Any

import msgspec
import pytest

import tinystore
from tinystore import InvalidError, LimitError, PermissionDeniedError
from tinystore.protocol.jobs import RESERVED_CHANNELS, Add, Find, Get, NewJob, Page, check_client_publish
from tinystore.protocol.jobs import List as ListRequest

from ..helpers import open_store


@dataclasses.dataclass
class Ask:
    chat_id: int


@pytest.fixture(params=["embedded", "sidecar"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


async def test_values_that_do_not_encode_or_are_too_big(store: tinystore.Store) -> None:
    q = store.queue("asks", Ask)
    with pytest.raises(InvalidError, match=r"queue asks: add: the value does not encode as Ask"):
        await q.add({"chat_id": "seven"})  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match="queue asks"):
        await q.add(object())  # type: ignore[arg-type]
    # a type with arguments is named whole (it was "dict", which the value was)
    counts = store.queue("counts", dict[int, str])
    with pytest.raises(InvalidError, match=r"^queue counts: add: the value does not encode as dict\[int, str\]: "):
        await counts.add({"a": "x"})  # type: ignore[dict-item]
    plain = store.queue("plain")
    with pytest.raises(LimitError, match="queue plain") as info:
        await plain.add({"blob": "x" * (1024 * 1024)})
    assert info.value.limit == 1024 * 1024
    with pytest.raises(InvalidError, match=r"add_many: values\[1\]"):
        await q.add_many([Ask(1), {"chat_id": None}, Ask(3)])  # type: ignore[list-item]
    assert (await q.list()).jobs == [] and (await plain.list()).jobs == []


async def test_bad_keys_delays_and_fields(store: tinystore.Store) -> None:
    q = store.queue("asks", Ask)
    for key in ("", "k" * 513):
        with pytest.raises(InvalidError, match="key"):
            await q.add(Ask(1), key=key)
    for delay in (-1, timedelta(seconds=-5), "-1s"):
        with pytest.raises(InvalidError, match=r"delay|duration"):
            await q.add(Ask(1), delay=delay)
    with pytest.raises(InvalidError, match="delay or at"):
        await q.add(Ask(1), delay="1s", at=0.0)
    with pytest.raises(InvalidError, match="priority"):
        await q.add(Ask(1), priority="high")  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match="tenant"):
        await q.add(Ask(1), tenant="t" * 300)
    with pytest.raises(InvalidError, match="3 keys for 2 values"):
        await q.add_many([Ask(1), Ask(2)], keys=["a", "b", "c"])
    # trial EF: "add_many: values[1]: key 5", when the bad one is keys[1]
    with pytest.raises(InvalidError, match=r"queue asks: add_many: keys\[1\]: key 5: an idempotency key is a str"):
        await q.add_many([Ask(1), Ask(2)], keys=["a", 5])  # type: ignore[list-item]
    assert (await q.list()).jobs == []


async def test_an_add_many_past_the_frame_limit_is_named_add_many(store: tinystore.Store) -> None:
    """Trial EF: "queue big: jobs.add: the request is ... bytes encoded" (the wire's method, not the caller's)."""
    q = store.queue("big")
    with pytest.raises(LimitError, match=r"queue big: add_many: 17 jobs are \d+ bytes encoded, over the frame limit"):
        await q.add_many(["x" * 1_000_000] * 17)
    assert (await q.list()).jobs == []
    # and inside a transaction (trial EH)
    db = await store.database("app")
    in_app = store.queue("bigtx", database=db)

    async def fn(tx: Any) -> Any:
        return await tx.with_(in_app).add_many(["x" * 1_000_000] * 17)

    with pytest.raises(LimitError, match=r"queue bigtx: add_many: 17 jobs are \d+ bytes encoded, over the frame"):
        await db.tx(fn)
    assert (await in_app.list()).jobs == []


async def test_bad_names_and_options(store: tinystore.Store) -> None:
    with pytest.raises(InvalidError, match="queue name"):
        store.queue("Bad Name")
    with pytest.raises(InvalidError, match="attempts"):
        await store.queue("q1", attempts=0).add({})
    with pytest.raises(InvalidError, match="lease"):
        await store.queue("q2", lease="100ms").add({})
    with pytest.raises(InvalidError, match="backoff"):
        await store.queue("q3", backoff=("1m", "1s")).add({})
    with pytest.raises(InvalidError, match="duration"):
        store.queue("q4", timeout="soon")
    with pytest.raises(InvalidError, match="concurrency"):
        store.queue("q5").work(lambda v, run: None, concurrency=0)
    await store.queue("q6", attempts=2).add({})
    with pytest.raises(InvalidError, match=r"queue q6: option attempts is 3 here but the store keeps 2"):
        await store.queue("q6", attempts=3).add({})
    assert len((await store.queue("q6").list()).jobs) == 1
    # from trial AM: durations as written ("518400s" before), no limit as None (the store's 0 before)
    with pytest.raises(InvalidError, match=r"option keep is 6d here but the store keeps 7d"):
        await store.queue("q6", keep="6d").add({})
    with pytest.raises(InvalidError, match=r"option max_running is 2 here but the store keeps None \(no limit\)"):
        await store.queue("q6", max_running=2).add({})


async def test_a_raw_add_with_a_value_that_is_not_json_is_refused_by_the_server(store: tinystore.Store) -> None:
    await store.queue("raw").add({"ok": 1})
    with pytest.raises(InvalidError, match="not JSON"):
        await store._call("jobs.add", Add(queue="raw", jobs=[NewJob(value="{nope")]), list[str], write=True)
    with pytest.raises(InvalidError, match="negative"):
        await store._call("jobs.add", Add(queue="raw", jobs=[NewJob(value="1", delay_ms=-5)]), list[str], write=True)
    assert len((await store.queue("raw").list()).jobs) == 1


async def test_a_result_that_is_not_json_fails_the_attempt_with_a_clear_error(store: tinystore.Store) -> None:
    q = store.queue("results", attempts=1)
    jid = await q.add({})
    big = await q.add({"big": True})

    async def handler(value: Any, run: tinystore.Run) -> Any:
        if value.get("big"):
            return "x" * (1024 * 1024 + 1)
        return object()

    assert await q.run_due(handler) == 2
    job = await q.get(jid)
    assert job is not None and job.state == "dead" and job.result is None
    assert job.error is not None
    assert job.error.startswith(f"InvalidError: queue results: job {jid}: the result does not encode as JSON")
    job = await q.get(big)
    assert job is not None and job.state == "dead" and "over the 1048576 bytes" in (job.error or "")
    assert (job.error or "").startswith(f"LimitError: queue results: job {big}: the result is")  # (trial EF)


async def test_progress_and_steps_that_are_not_json_or_too_big(store: tinystore.Store) -> None:
    q = store.queue("progress", attempts=1)
    jid = await q.add({})
    errors: list[str] = []

    async def handler(value: Any, run: tinystore.Run) -> str:
        with pytest.raises(LimitError, match=f"job {run.job_id}"):
            run.set_progress({"x": "y" * 5000})
        with pytest.raises(InvalidError):
            run.set_progress(object())
        with pytest.raises(InvalidError, match="step"):
            await run.step("s", lambda: object())
        with pytest.raises(InvalidError, match="step name"):
            await run.step('a"b', lambda: 1)
        errors.append("checked")
        return "ok"

    assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert errors == ["checked"] and job is not None and job.state == "succeeded" and job.steps == {}


async def test_a_step_inside_a_transaction_of_the_queues_database_is_refused(store: tinystore.Store) -> None:
    db = await store.database("app", migrations=[("001.sql", "create table t (id integer primary key);")])
    q = store.queue("in-tx", database=db)
    jid = await q.add({})
    seen: list[str] = []

    async def handler(value: Any, run: tinystore.Run) -> str:
        async def inside(tx: tinystore.SqlTx) -> None:
            await tx.exec("insert into t (id) values (1)")
            with pytest.raises(InvalidError, match="would wait for itself"):
                await run.step("s", lambda: 1)
            seen.append("refused")

        await db.tx(inside)
        return str(await run.step("s", lambda: 2))  # outside the transaction it works

    assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert (
        seen == ["refused"] and job is not None and (job.state, job.result, job.steps) == ("succeeded", "2", {"s": 2})
    )


NOT_JSON = [
    (float("nan"), r"nan is not a JSON number"),
    (float("inf"), r"inf is not a JSON number"),
    ({"scores": [1.0, float("-inf")]}, r"-inf is not a JSON number \(at \$\.scores\[1\]\)"),
    (2**64, r"the integer 18446744073709551616 does not fit in 64 bits"),
    ([-(2**63) - 1], r"the integer -9223372036854775809 does not fit in 64 bits \(at \$\[0\]\)"),
    ({1: "a"}, r"the key 1 is not a str"),
]
NOT_JSON_IDS = ["nan", "inf", "nested-inf", "2**64", "below-int64", "int-key"]


@pytest.mark.parametrize(
    ("value", "why"), NOT_JSON, ids=["nan", "inf", "nested-inf", "2**64", "below-int64", "int-key"]
)
async def test_a_value_json_cannot_hold_is_refused(store: tinystore.Store, value: Any, why: str) -> None:
    q = store.queue("odd-values")
    with pytest.raises(InvalidError, match=rf"queue odd-values: add: the value does not encode as JSON: {why}"):
        await q.add(value)
    with pytest.raises(
        InvalidError, match=rf"queue odd-values: add_many: values\[1\]: the value does not encode as JSON: {why}"
    ):
        await q.add_many([1, value])
    assert (await q.list()).jobs == []


class _Keyed(msgspec.Struct):
    counts: dict[int, int]
    extra: dict[str, Any]


async def test_a_typed_queue_refuses_int_keys_its_type_would_read_back_as_text(store: tinystore.Store) -> None:
    # trial IP: a queue of type dict took {1: 2} and gave back {"1": 2}: changed, where a queue without a type refuses
    bare = store.queue("bare-dict", dict)
    with pytest.raises(
        InvalidError, match=r"queue bare-dict: add: the value does not encode as JSON: the key 1 comes back as '1'"
    ):
        await bare.add({1: 2})
    with pytest.raises(InvalidError, match=r"queue bare-dict: add_many: values\[1\]: .* the key 1 comes back as '1'"):
        await bare.add_many([{"a": 1}, {1: 2}])
    assert (await bare.list()).jobs == []
    keyed = store.queue("keyed", _Keyed)
    with pytest.raises(InvalidError, match=r"queue keyed: add: .*: the key 3 comes back as '3' \(at \$\.extra\.x\)"):
        await keyed.add(_Keyed({1: 2}, {"x": {3: 4}}))
    jid = await keyed.add(_Keyed({1: 2}, {"x": {"3": 4}}))  # where the type names the keys' type, they come back
    job = await keyed.get(jid)
    assert job is not None and job.value == _Keyed({1: 2}, {"x": {"3": 4}})
    assert (await keyed.list()).jobs[0].id == jid


async def test_integers_at_the_edges_of_64_bits_come_back_as_they_went_in(store: tinystore.Store) -> None:
    q = store.queue("wide-ints", attempts=1)
    edges = {"top": 2**64 - 1, "bottom": -(2**63), "list": [2**63, -1]}
    jid = await q.add(edges)

    async def handler(value: Any, run: tinystore.Run) -> Any:
        assert value == edges
        run.set_progress({"done": 2**64 - 1})
        assert await run.step("s", lambda: [2**64 - 1]) == [2**64 - 1]
        return {"n": 2**64 - 1}

    assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert job is not None
    assert job.state == "succeeded", job.error
    assert (job.value, job.result, job.progress, job.steps) == (
        edges,
        {"n": 2**64 - 1},
        {"done": 2**64 - 1},
        {"s": [2**64 - 1]},
    )


class Counts(msgspec.Struct):
    by_page: dict[int, int]


async def test_a_typed_queue_keeps_the_int_keys_its_type_reads_back(store: tinystore.Store) -> None:
    q = store.queue("typed-keys", Counts)
    jid = await q.add(Counts({1: 10, 2: 20}))
    job = await q.get(jid)
    assert job is not None and job.value == Counts({1: 10, 2: 20})


@pytest.mark.parametrize(
    ("value", "why"), NOT_JSON, ids=["nan", "inf", "nested-inf", "2**64", "below-int64", "int-key"]
)
async def test_a_result_json_cannot_hold_fails_the_attempt(store: tinystore.Store, value: Any, why: str) -> None:
    q = store.queue("odd-results", attempts=1)
    jid = await q.add({})
    refused: list[str] = []

    async def handler(_: Any, run: tinystore.Run) -> Any:
        try:
            run.set_progress(value)
        except InvalidError as exc:
            refused.append(exc.message)
        try:
            await run.step("s", lambda: value)
        except InvalidError as exc:
            refused.append(exc.message)
        return value

    assert await q.run_due(handler) == 1
    job = await q.get(jid)
    assert job is not None and len(refused) == 2, refused
    assert re.search(rf"queue odd-results: job {jid}: the progress does not encode as JSON: {why}", refused[0])
    assert re.search(rf"job {jid}: the result of step 's' does not encode as JSON: {why}", refused[1])
    assert (job.state, job.result, job.steps) == ("dead", None, {})
    assert job.error is not None
    assert re.search(rf"queue odd-results: job {jid}: the result does not encode as JSON: {why}", job.error)


async def test_the_server_refuses_raw_json_with_integers_past_64_bits(store: tinystore.Store) -> None:
    await store.queue("raw-ints").add({})
    for text in ("18446744073709551616", '{"a": [-9223372036854775809]}'):
        with pytest.raises(InvalidError, match="does not fit in 64 bits"):
            await store._call("jobs.add", Add(queue="raw-ints", jobs=[NewJob(value=text)]), list[str], write=True)
    ok = await store._call(
        "jobs.add", Add(queue="raw-ints", jobs=[NewJob(value='{"id": "12345678901234567890123"}')]), list[str]
    )
    assert len(ok) == 1 and len((await store.queue("raw-ints").list()).jobs) == 2


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"backoff": ("x", "y")}, r"queue q: option backoff: cannot read 'x' as a duration"),
        ({"backoff": ("1s", "later")}, r"queue q: option backoff: cannot read 'later'"),
        ({"backoff": ("1s", "2s", "3s")}, r"queue q: option backoff: .* is not \(first, cap\)"),
        ({"backoff": ("1m", "1s")}, r"queue q: option backoff: the first delay is above the cap"),
        ({"timeout": float("nan")}, r"queue q: option timeout: a duration must be finite"),
        ({"timeout": "400d"}, r"queue q: option timeout: .* at most a year"),
        ({"timeout": 0}, r"queue q: option timeout: 0s is not above 0"),
        ({"keep": "abc"}, r"queue q: option keep: cannot read 'abc'"),
        ({"lease": "soon"}, r"queue q: option lease: cannot read 'soon'"),
        ({"lease": "100ms"}, r"queue q: option lease: 0.1s is not between 1s and 3600s"),
        ({"expected": -1}, r"queue q: option expected: a duration must be finite and not negative"),
        ({"expected": [1]}, r"queue q: option expected: expected a duration"),
        ({"max_running": 0}, r"queue q: option max_running: 0 is not between 1 and 1,000,000 \(None: no limit\)"),
        ({"max_running_per_tenant": -2}, r"queue q: option max_running_per_tenant: -2 is not between 1 and 1,000,000"),
        ({"max_running": 2.0}, r"queue q: option max_running: 2.0 is not an int"),
        ({"attempts": -1}, r"queue q: option attempts: -1 is not between 1 and 1000"),
        ({"attempts": 0}, r"queue q: option attempts: 0 is not between 1 and 1000"),
        ({"attempts": True}, r"queue q: option attempts: True is not an int"),
        ({"database": "Bad Name"}, r"queue q: option database: database name 'Bad Name'"),
    ],
)
async def test_a_bad_queue_option_is_refused_at_once_naming_the_queue_and_the_option(
    store: tinystore.Store, options: dict[str, Any], match: str
) -> None:
    with pytest.raises(InvalidError, match=match):
        store.queue("q", **options)  # at once, before any call
    assert await store.queue("q").list() is not None  # nothing was kept for the queue: the defaults hold
    assert (await store.queue("q").options())["attempts"] == 5


async def test_a_list_cursor_that_is_not_a_job_id_is_refused(store: tinystore.Store) -> None:
    q = store.queue("cursors")
    ids = await q.add_many([{"n": i} for i in range(3)])
    page = await q.list(limit=2)
    assert page.next is not None and [j.id for j in (await q.list(after=page.next)).jobs] == [ids[0]]
    for bad in ("garbage", "", "0" * 25, "U" * 26, 123):
        with pytest.raises(InvalidError, match=r"queue cursors: list: cursor after=.* is not a job id"):
            await q.list(after=bad)  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match=r"cursor after='garbage' is not a job id"):
        await store._call("jobs.list", ListRequest(queue="cursors", after="garbage"), Page)
    assert (await q.list(after="0" * 26)).jobs == []  # well-formed, before every job: an empty page


async def test_a_job_id_that_is_not_a_str_is_refused(store: tinystore.Store) -> None:
    q = store.queue("ids")
    jid = await q.add({})
    for call in (q.get, q.cancel, q.retry):
        with pytest.raises(InvalidError, match=r"queue ids: (get|cancel|retry): job id 123 is not a str"):
            await call(123)  # type: ignore[arg-type]
    with pytest.raises(InvalidError, match=r"queue ids: watch: job id 123 is not a str"):
        async for _ in q.watch(123):  # type: ignore[arg-type]
            pass
    unknown = "0" * 26
    assert await q.get(unknown) is None and await q.cancel(unknown) is False and await q.retry(unknown) is False
    assert await q.get("not-an-id") is None  # an unknown id finds nothing; it is not an error
    job = await q.get(jid)
    assert job is not None and job.state == "queued"


async def test_a_raw_call_with_a_job_id_that_is_not_a_str_is_refused_by_the_server(store: tinystore.Store) -> None:
    await store.queue("raw-ids").add({})
    for method in ("jobs.get", "jobs.cancel", "jobs.retry"):
        with pytest.raises(InvalidError):
            await store._call(method, Get(queue="raw-ids", id=123), Any, write=True)  # type: ignore[arg-type]
    with pytest.raises(InvalidError):
        await store._call("jobs.find", Find(id=123), Any)  # type: ignore[arg-type]


async def test_text_fields_that_are_not_valid_unicode_are_refused(store: tinystore.Store) -> None:
    q = store.queue("unicode")
    for field in ("key", "tenant", "user", "type"):
        with pytest.raises(InvalidError, match=rf"queue unicode: add: {field} .* is not valid Unicode text"):
            await q.add({}, **{field: "a\ud800"})  # type: ignore[arg-type]
    assert (await q.list()).jobs == []


def test_the_job_events_channel_is_reserved_for_the_store() -> None:
    assert "tinystore-jobs" in RESERVED_CHANNELS
    with pytest.raises(PermissionDeniedError, match="channel tinystore-jobs: the store publishes its own job events"):
        check_client_publish("tinystore-jobs")
    check_client_publish("tinystore-jobs-mine")  # other channels are the application's
    check_client_publish("chat")


async def test_a_client_cannot_publish_fake_job_events(store: tinystore.Store) -> None:
    q = store.queue("spoofed")
    jid = await q.add({})
    events = store.channel("tinystore-jobs", tinystore.JobEvent)
    with pytest.raises(PermissionDeniedError, match="tinystore-jobs"):
        await events.under("spoofed", jid).publish(tinystore.JobEvent(kind="state", job_id=jid, state="succeeded"))
    job = await q.get(jid)
    assert job is not None and job.state == "queued"


# contract: JOB-02
async def test_a_queue_cannot_make_a_database_named_like_the_stores_own(store: tinystore.Store) -> None:
    """``tinystore-…`` names are kept for the store's own databases: ``store.database()`` refuses to make one, and so
    does a queue's ``database=`` (trial Z: the queue made it, and then store.database() opened it)."""
    q = store.queue("tq", database="tinystore-other")
    with pytest.raises(PermissionDeniedError, match=r"queue tq: option database: tinystore-other starts with"):
        await q.add({"x": 1})
    with pytest.raises(PermissionDeniedError):
        await store.database("tinystore-other")
    assert store.directory is not None
    assert not (store.directory / "sql" / "tinystore-other.db").exists()
    jid = await store.queue("tq", database="tinystore-jobs").add({"x": 1})  # the jobs database is the default
    assert (await store.queue("tq").get(jid)) is not None


# contract: JOB-01
async def test_an_add_inside_a_transaction_of_the_queues_database_says_how_to_add_with_it(
    store: tinystore.Store,
) -> None:
    # from trial BG: the error said only "call it outside the transaction"; the docs' way is tx.with_(queue).add
    db = await store.database("app", migrations=[("001.sql", "create table t (id integer primary key);")])
    q = store.queue("in-tx-add", database=db)

    async def inside(tx: tinystore.SqlTx) -> None:
        with pytest.raises(InvalidError, match=r"tx\.with_\(queue\)\.add"):
            await q.add({})
        await tx.with_(q).add({})

    await db.tx(inside)
    assert len((await q.list()).jobs) == 1
