"""The chat of the seeds: posting, streamed replies, saved replies, bad input, summaries under a fenced lock."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

import tinystore

from ..helpers import open_store
from ..sse.harness import client, open_sse, serve
from .example import app as app_module
from .example import fast_model, model, service


@pytest.fixture(params=["embedded", "sidecar"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tinystore.Store]:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


@pytest.fixture
async def web(store: tinystore.Store) -> AsyncIterator[str]:
    async with serve(app_module.create_app(store=store, model=fast_model()), lifespan="on") as url:
        yield url


async def new_chat(http: httpx.AsyncClient, web: str) -> int:
    r = await http.post(f"{web}/api/chats", json={"title": "test"})
    assert r.status_code == 201
    return int(r.json()["id"])


async def test_a_post_streams_the_reply_then_saves_it(store: tinystore.Store, web: str) -> None:
    async with client() as http:
        chat_id = await new_chat(http, web)
        async with (
            open_sse(http, f"{web}/api/chats/{chat_id}/events") as tab1,
            open_sse(http, f"{web}/api/chats/{chat_id}/events") as tab2,
        ):
            r = await http.post(f"{web}/api/chats/{chat_id}/messages", json={"text": "How do live updates work?"})
            assert r.status_code == 201
            asked = r.json()
            assert asked["role"] == "user"
            for tab in (tab1, tab2):
                first = await tab.next()
                assert (first.type, json.loads(first.data)) == (
                    "message",
                    {"kind": "message", "id": asked["id"], "text": "", "at": None, "so_far": None},
                )
                start = await tab.next()
                assert (start.type, json.loads(start.data)["id"]) == ("start", asked["id"])
                tokens = []
                while (ev := await tab.next()).type == "token":
                    token = json.loads(ev.data)
                    # where it goes: after the reply before it, in UTF-16 code units (JavaScript's length)
                    assert token["at"] == len("".join(tokens).encode("utf-16-le")) // 2
                    assert token["so_far"] in (None, "".join(tokens))
                    tokens.append(token["text"])
                assert ev.type == "done"
                saved = await tab.next()
                assert saved.type == "message"
                reply_id = json.loads(saved.data)["id"]
                assert len(tokens) > 5
        rows = (await http.get(f"{web}/api/chats/{chat_id}/messages", params={"after": asked["id"]})).json()
        assert [(m["id"], m["role"], m["reply_to"]) for m in rows] == [(reply_id, "assistant", asked["id"])]
        assert rows[0]["text"] == "".join(tokens).strip()  # what streamed is what was saved


async def test_bad_input_gets_clear_http_errors(store: tinystore.Store, web: str) -> None:
    async with client() as http:
        chat_id = await new_chat(http, web)
        url = f"{web}/api/chats/{chat_id}/messages"
        cases = [
            ({"text": ""}, 400),
            ({"text": "   \n"}, 400),
            ({"text": "x" * 4001}, 413),
            ({"text": 7}, 400),
            ({}, 400),
            ([1, 2], 400),
        ]
        for body, status in cases:
            r = await http.post(url, json=body)
            assert r.status_code == status, (body, r.text)
            assert r.json()["error"]
        r = await http.post(f"{web}/api/chats", json={"title": "t" * 201})  # refused, not cut short
        assert r.status_code == 413 and "at most 200 characters, this one has 201" in r.json()["error"], r.text
        as_json = {"content-type": "application/json"}  # (without it a POST is refused: trial EB)
        r = await http.post(url, content=b"{not json", headers=as_json)
        assert r.status_code == 400
        r = await http.post(url, content=b"x" * 70_000, headers=as_json)
        assert r.status_code == 413
        assert (await http.post(f"{web}/api/chats/999/messages", json={"text": "hi"})).status_code == 404
        assert (await http.get(f"{web}/api/chats/999/events")).status_code == 404
        assert (await http.get(f"{web}/api/chats/999/messages")).status_code == 404
        assert (await http.get(f"{web}/api/chats/{chat_id}/messages?after=x")).status_code == 400
        # an id past 64 bits names no chat; a lone surrogate is no text a database keeps; a title the same
        huge = 10**30
        assert (await http.get(f"{web}/api/chats/{huge}/messages")).status_code == 404
        assert (await http.post(f"{web}/api/chats/{huge}/messages", json={"text": "hi"})).status_code == 404
        r = await http.post(url, content=b'{"text": "\\ud83d"}', headers={"content-type": "application/json"})
        assert r.status_code == 400 and "Unicode" in r.json()["error"], r.text
        r = await http.post(f"{web}/api/chats", content=b'{"title": "\\ud83d"}', headers=as_json)
        # (trial HI: said with the database's words, "database chat: parameter 1: ...")
        assert r.status_code == 400 and r.json()["error"].startswith("a chat's title must be valid Unicode"), r.text
        # trial HI: a control character was kept; JSON nested past Python's recursion limit was a 500 and a traceback
        r = await http.post(url, json={"text": "a\x00b"})
        assert r.status_code == 400 and "control character U+0000" in r.json()["error"], r.text
        r = await http.post(f"{web}/api/chats", json={"title": "a\x1bb"})
        assert r.status_code == 400 and "control character U+001B" in r.json()["error"], r.text
        for target in (url, f"{web}/api/chats"):
            r = await http.post(target, content=b"[" * 30_000 + b"]" * 30_000, headers=as_json)
            assert r.status_code == 400 and "nested too deeply" in r.json()["error"], r.text
        # nothing of the refused posts was saved, and the chat still works
        assert (await http.get(url)).json() == []
        assert (await http.post(url, json={"text": "ünïcödé \r\n data: x\n: y"})).status_code == 201
        assert (await http.get(url)).json()[0]["text"] == "ünïcödé \r\n data: x\n: y"


async def test_the_message_and_its_reply_job_commit_together(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        chat = await service.Chat(store, fast_model()).open()
        created = await chat.create_chat("t")
        message = await chat.post(created["id"], "hello")
        jobs = (await chat.replies.list()).jobs
        assert [(j.key, j.value, j.state) for j in jobs] == [
            (f"reply/{message['id']}", service.Ask(created["id"], message["id"]), "queued")
        ]
        # a post that fails inside its transaction leaves neither a message nor a job
        with pytest.raises(service.NotFound):
            await chat.post(12345, "nobody here")
        assert await chat.db.scalar("select count(*) from messages") == 1
        assert len((await chat.replies.list()).jobs) == 1


class Flaky:
    """A model that fails its first answer, as a rate-limited endpoint would."""

    def __init__(self) -> None:
        self.calls = 0
        self.inner = fast_model()

    async def stream(self, history: Sequence[Any]) -> AsyncIterator[str]:
        self.calls += 1
        if self.calls == 1:
            yield "partial "
            raise model.ModelError("429 rate limited")
        async for t in self.inner.stream(history):
            yield t

    async def summarize(self, history: Sequence[Any]) -> str:
        return await self.inner.summarize(history)


async def test_a_failed_reply_is_retried_with_backoff_and_saved_once(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", clock=datetime.now(UTC)) as store:
        flaky = Flaky()
        chat = await service.Chat(store, flaky).open()
        chat_id = (await chat.create_chat("t"))["id"]
        seen: list[Any] = []
        sub = await chat.events.under(chat_id).subscribe(lambda m: seen.append(m.value))
        message = await chat.post(chat_id, "hi")
        assert await chat.replies.run_due(chat.reply) == 1  # fails
        assert await chat.db.scalar("select count(*) from messages where reply_to = ?", message["id"]) == 0
        assert await chat.replies.run_due(chat.reply) == 0  # not due yet: backoff
        await store.clock.advance("3s")
        assert await chat.replies.run_due(chat.reply) == 1
        assert await chat.db.scalar("select count(*) from messages where reply_to = ?", message["id"]) == 1
        # a duplicate run (jobs run at least once) saves nothing more
        await chat.reply(service.Ask(chat_id, message["id"]), None)
        assert await chat.db.scalar("select count(*) from messages where reply_to = ?", message["id"]) == 1
        await asyncio.sleep(0.05)
        await sub.stop()
        kinds = [e.kind for e in seen]
        assert kinds[0] == "message" and "failed" in kinds and kinds[-1] == "message"
        assert kinds.index("failed") < kinds.index("done")
        # each attempt starts the reply over: a tab drops what the failed one streamed ("partial ")
        assert [k for k in kinds if k in ("start", "failed", "done")] == ["start", "failed", "start", "done"]
        assert "gave_up" not in kinds
        assert (await chat.messages(chat_id))[0]["failed"] is None


class Refused:
    """A model whose endpoint refuses the key (a 4xx that will not fix itself), until ``fixed``."""

    def __init__(self) -> None:
        self.fixed = False
        self.inner = fast_model()

    async def stream(self, history: Sequence[Any]) -> AsyncIterator[str]:
        if not self.fixed:
            raise tinystore.PermanentError("the model endpoint answered 401: bad key")
        async for t in self.inner.stream(history):
            yield t

    async def summarize(self, history: Sequence[Any]) -> str:
        return await self.inner.summarize(history)


async def test_a_reply_the_model_gives_up_on_is_told_and_kept_until_a_retry_answers(tmp_path: Path) -> None:
    """Trial AA: a reply job that ended dead left the tab saying "trying again shortly" for ever, and a reload
    showed the message as if it still waited for its answer."""
    async with open_store("embedded", tmp_path / "s", clock=datetime.now(UTC)) as store:
        refused = Refused()
        chat = await service.Chat(store, refused).open()
        chat_id = (await chat.create_chat("t"))["id"]
        seen: list[Any] = []
        sub = await chat.events.under(chat_id).subscribe(lambda m: seen.append(m.value))
        message = await chat.post(chat_id, "hi")
        assert await chat.replies.run_due(chat.reply) == 1
        [job] = (await chat.replies.list()).jobs
        assert job.state == "dead" and job.attempts == 1
        await asyncio.sleep(0.05)
        kinds = [(e.kind, e.text) for e in seen if e.kind != "message"]
        assert kinds == [("start", ""), ("gave_up", "the model endpoint answered 401: bad key")]
        rows = await chat.messages(chat_id)
        assert [(m["id"], m["failed"]) for m in rows] == [(message["id"], "the model endpoint answered 401: bad key")]

        refused.fixed = True  # the key is mended; the job is retried by hand (tinystore jobs DIR retry ID)
        assert await chat.replies.retry(job.id)
        assert await chat.replies.run_due(chat.reply) == 1
        rows = await chat.messages(chat_id)
        assert [(m["role"], m["failed"]) for m in rows] == [("user", None), ("assistant", None)]
        await sub.stop()


async def test_the_last_attempt_that_fails_gives_up_too(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", clock=datetime.now(UTC)) as store:

        class Down(Refused):
            async def stream(self, history: Sequence[Any]) -> AsyncIterator[str]:
                raise model.ModelError("503 the model is overloaded")
                yield ""

        chat = await service.Chat(store, Down()).open()
        chat_id = (await chat.create_chat("t"))["id"]
        message = await chat.post(chat_id, "hi")
        for _ in range(service.REPLY_ATTEMPTS):
            assert await chat.replies.run_due(chat.reply) == 1
            await store.clock.advance("61s")
        [job] = (await chat.replies.list()).jobs
        assert (job.state, job.attempts) == ("dead", service.REPLY_ATTEMPTS)
        [row] = await chat.messages(chat_id)
        assert (row["id"], row["failed"]) == (message["id"], "503 the model is overloaded")


class Hangs(Refused):
    """A model that never answers: each attempt is cancelled at the queue's timeout (2 minutes)."""

    def __init__(self) -> None:
        super().__init__()
        self.streams = 0  # attempts that began streaming (their timeout's timer is set by then)

    async def stream(self, history: Sequence[Any]) -> AsyncIterator[str]:
        self.streams += 1
        await asyncio.Event().wait()
        yield ""


async def until(check: Any, what: str) -> Any:
    for _ in range(1000):
        got = await check()
        if got:
            return got
        await asyncio.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


async def test_a_last_attempt_that_times_out_is_told_by_the_workers(tmp_path: Path) -> None:
    """Trial AA, left then: a reply whose last attempt timed out (or lost its worker) ended dead with nothing told
    and nothing kept, so its tab said 'trying again shortly' for ever."""
    async with open_store("embedded", tmp_path / "s", clock=datetime.now(UTC)) as store:
        hangs = Hangs()
        chat = await service.Chat(store, hangs).open()
        chat_id = (await chat.create_chat("t"))["id"]
        seen: list[Any] = []
        sub = await chat.events.under(chat_id).subscribe(lambda m: seen.append(m.value))
        chat.start_workers()
        try:
            message = await chat.post(chat_id, "hi")
            [job] = (await chat.replies.list()).jobs
            for attempt in range(1, service.REPLY_ATTEMPTS + 1):

                async def running(n: int = attempt) -> bool:
                    return hangs.streams == n

                await until(running, f"attempt {attempt}")
                await store.clock.advance("121s")  # past the timeout; then past the backoff (60 s at most)

                async def ended(n: int = attempt) -> bool:
                    j = await chat.replies.get(job.id)
                    return j is not None and j.state in ("failed", "dead")

                await until(ended, f"attempt {attempt}'s end")
                await store.clock.advance("61s")

            async def told() -> bool:
                return any(e.kind == "gave_up" for e in seen)

            await until(told, "gave_up")
            assert (await chat.replies.get(job.id)).state == "dead"
            [gave_up] = [e for e in seen if e.kind == "gave_up"]
            assert (gave_up.id, gave_up.text) == (message["id"], "timed out after 120s")
            [row] = await chat.messages(chat_id)
            assert row["failed"] == "timed out after 120s"
        finally:
            await chat.stop_workers()
            await sub.stop()


async def test_reply_jobs_that_died_while_no_worker_ran_are_told_when_workers_start(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", clock=datetime.now(UTC)) as store:
        hangs = Hangs()
        chat = await service.Chat(store, hangs).open()
        chat_id = (await chat.create_chat("t"))["id"]
        message = await chat.post(chat_id, "hi")
        for attempt in range(1, service.REPLY_ATTEMPTS + 1):
            run = asyncio.create_task(chat.replies.run_due(chat.reply))

            async def running(n: int = attempt) -> bool:
                return hangs.streams == n

            await until(running, f"attempt {attempt}")
            await store.clock.advance("121s")
            assert await run == 1
            await store.clock.advance("61s")
        [job] = (await chat.replies.list()).jobs
        assert job.state == "dead"
        assert [m["failed"] for m in await chat.messages(chat_id)] == [None]  # nothing told: no worker heard it
        seen: list[Any] = []
        sub = await chat.events.under(chat_id).subscribe(lambda m: seen.append(m.value))
        chat.start_workers()
        try:

            async def told() -> bool:
                return any(e.kind == "gave_up" for e in seen)

            await until(told, "gave_up")
            assert [(m["id"], m["failed"]) for m in await chat.messages(chat_id)] == [
                (message["id"], "timed out after 120s")
            ]
            assert await chat.sweep_dead_replies() == 0  # told once only
            # retried by hand: the message waits for its reply again, and a new death is told again
            assert await chat.replies.retry(job.id)

            async def waiting() -> bool:
                return [m["failed"] for m in await chat.messages(chat_id)] == [None]

            await until(waiting, "the kept failure to go when the retry starts")
        finally:
            await chat.stop_workers()
            await sub.stop()


async def test_a_long_chat_gets_its_summary_from_one_fenced_writer(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        chat = await service.Chat(store, fast_model(), summary_after=3).open()
        chat_id = (await chat.create_chat("t"))["id"]
        for text in ("tell me about channels", "and about locks"):
            await chat.post(chat_id, text)
            assert await chat.replies.run_due(chat.reply) == 1
        # 4 messages, past 3: a summary job was added; run it
        assert await chat.summary_jobs.run_due(chat.summarize) == 1
        row = await chat.db.one("select summary, summary_fence from chats where id = ?", chat_id)
        assert row["summary"] and "channels" in row["summary"]
        assert len(row["summary_fence"]) == 40 and row["summary_fence"].isdigit()
        first_fence = row["summary_fence"]

        # another worker holds the chat's key: this one writes nothing
        await chat.db.exec("update chats set summary = 'kept' where id = ?", chat_id)
        held, release = asyncio.Event(), asyncio.Event()

        async def other_worker() -> None:
            async with chat.summaries.try_hold(chat_id) as lease:
                assert lease is not None
                held.set()
                await release.wait()

        other = asyncio.ensure_future(other_worker())
        try:
            await held.wait()
            await chat.summarize(service.Summarize(chat_id), None)
        finally:
            release.set()
            await other
        assert await chat.db.scalar("select summary from chats where id = ?", chat_id) == "kept"

        # a later fence wins; a writer whose fence is older than the stored one is refused by the where clause
        await chat.summarize(service.Summarize(chat_id), None)
        fence = await chat.db.scalar("select summary_fence from chats where id = ?", chat_id)
        assert fence > first_fence
        await chat.db.exec("update chats set summary = 'newest', summary_fence = ? where id = ?", "9" * 40, chat_id)
        await chat.summarize(service.Summarize(chat_id), None)
        assert await chat.db.scalar("select summary from chats where id = ?", chat_id) == "newest"


async def test_the_page_and_its_script_are_served(store: tinystore.Store, web: str) -> None:
    async with client() as http:
        for path in ("/", "/chats/3"):
            r = await http.get(f"{web}{path}")
            assert r.status_code == 200 and "/static/app.js" in r.text
        js = await http.get(f"{web}/static/app.js")
        assert js.status_code == 200 and "new EventSource(" in js.text
        assert (await http.get(f"{web}/healthz")).json()["ok"] is True


# --------------------------------------------------------------------------------------------- the model


async def fake_completions(request: Any) -> Any:
    from starlette.responses import JSONResponse, StreamingResponse

    body = await request.json()
    if request.headers.get("authorization") != "Bearer k-1":
        return JSONResponse({"error": {"message": "bad key"}}, status_code=401)
    if body["model"] == "busy":
        return JSONResponse({"error": {"message": "slow down"}}, status_code=429)
    assert body["messages"][-1]["role"] in ("user", "assistant")
    if body["stream"]:

        async def gen() -> AsyncIterator[str]:
            yield ": a comment line\n\n"
            yield 'data: {"choices":[{"delta":{"role":"assistant"}}]}\n\n'
            for piece in ["Hel", "lo,", " wor", "ld"]:
                yield f"data: {json.dumps({'choices': [{'delta': {'content': piece}}]})}\n\n"
                await asyncio.sleep(0.01)
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")
    return JSONResponse({"choices": [{"message": {"role": "assistant", "content": " A summary. "}}]})


async def test_the_openai_compatible_adapter(tmp_path: Path) -> None:
    from starlette.applications import Starlette
    from starlette.routing import Route

    Turn = model.Turn
    fake = Starlette(routes=[Route("/v1/chat/completions", fake_completions, methods=["POST"])])
    async with serve(fake) as url:
        m = model.OpenAICompatibleModel(f"{url}/v1", model="m", api_key="k-1")
        assert [t async for t in m.stream([Turn("user", "hi")])] == ["Hel", "lo,", " wor", "ld"]
        assert await m.summarize([Turn("user", "hi")]) == "A summary."
        with pytest.raises(model.ModelError, match="429"):
            [
                t
                async for t in model.OpenAICompatibleModel(
                    f"{url}/v1/chat/completions", model="busy", api_key="k-1"
                ).stream([])
            ]
        with pytest.raises(tinystore.PermanentError, match="401"):
            [t async for t in model.OpenAICompatibleModel(url + "/v1", api_key="wrong").stream([])]
        with pytest.raises(model.ModelError, match="could not be reached"):
            [t async for t in model.OpenAICompatibleModel("http://127.0.0.1:9/v1", api_key="k-1").stream([])]

        # through the chat: the reply job streams and saves what the endpoint said
        async with open_store("embedded", tmp_path / "s") as store:
            chat = await service.Chat(store, m).open()
            chat_id = (await chat.create_chat("t"))["id"]
            message = await chat.post(chat_id, "hi")
            assert await chat.replies.run_due(chat.reply) == 1
            assert await chat.db.scalar("select text from messages where reply_to = ?", message["id"]) == "Hello, world"


async def test_token_events_place_text_in_utf16_code_units_as_the_page_counts(tmp_path: Path) -> None:
    # from trial AP: an emoji is one character in Python and two in JavaScript: after "👍" the page took every
    # later token for one it had, and showed "…" for the rest of the reply
    class Emoji:
        async def stream(self, history: Sequence[Any]) -> AsyncIterator[str]:
            for t in ["Sure ", "👍 ", "here ", "is ", "é", " the answer."]:
                yield t

        async def summarize(self, history: Sequence[Any]) -> str:
            return ""

    async with open_store("embedded", tmp_path / "s") as store:
        chat = await service.Chat(store, Emoji()).open()
        chat_id = (await chat.create_chat("t"))["id"]
        seen: list[Any] = []
        sub = await chat.events.under(chat_id).subscribe(lambda m: seen.append(m.value))
        await chat.post(chat_id, "hi")
        assert await chat.replies.run_due(chat.reply) == 1
        await asyncio.sleep(0.2)
        await sub.stop()
        tokens = [e for e in seen if e.kind == "token"]
        assert [(t.text, t.at) for t in tokens] == [
            ("Sure ", 0),
            ("👍 ", 5),
            ("here ", 8),
            ("is ", 13),
            ("é", 16),
            (" the answer.", 17),
        ]
        assert all(t.so_far is None or len(t.so_far.encode("utf-16-le")) // 2 == t.at for t in tokens)


# contract: CHAN-01
async def test_a_reply_longer_than_a_channel_message_is_streamed_and_saved(tmp_path: Path) -> None:
    # from trial BO: each token event carried the whole reply so far; past 64 KiB its publish failed, every
    # attempt, and a long reply (code, a translation) was streamed five times and never saved
    class Long:
        async def stream(self, history: Sequence[Any]) -> AsyncIterator[str]:
            yield "界" * 30_000  # one huge token (90 KB of UTF-8)
            for i in range(4_000):
                yield f"word{i % 10} "

        async def summarize(self, history: Sequence[Any]) -> str:
            return ""

    async with open_store("embedded", tmp_path / "s") as store:
        chat = await service.Chat(store, Long()).open()
        chat_id = (await chat.create_chat("t"))["id"]
        seen: list[Any] = []
        sub = await chat.events.under(chat_id).subscribe(lambda m: seen.append(m.value))
        message = await chat.post(chat_id, "hi")
        assert await chat.replies.run_due(chat.reply) == 1
        saved = await chat.db.scalar("select text from messages where reply_to = ?", message["id"])
        assert saved is not None and len(saved) == 30_000 + 4_000 * 6 - 1  # (saved without its last space)
        await asyncio.sleep(0.2)
        await sub.stop()
        tokens = [e for e in seen if e.kind == "token"]
        assert "".join(t.text for t in tokens).strip() == saved
        assert all(t.so_far is None or len(t.so_far.encode("utf-16-le")) // 2 == t.at for t in tokens)
