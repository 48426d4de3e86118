"""``user=""`` and ``type=""`` are none, as ``tenant=""`` is (trial JF, session of 2026-12-07, eighth): they were
kept as "", apart from the jobs given none, and no list could find the jobs without a user or a type."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import open_store


@pytest.fixture(params=["embedded", "sidecar"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> Any:
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


# contract: JOB-02
async def test_an_empty_user_or_type_is_none_and_lists_with_the_jobs_without_one(store: tinystore.Store) -> None:
    q = store.queue("who")
    plain = await q.add({})
    empty = await q.add({}, user="", type="")
    [many] = await q.add_many([{}], user="", type="")
    named = await q.add({}, user="u-3", type="reply")
    for jid in (plain, empty, many):
        job = await q.get(jid)
        assert job is not None and job.user is None and job.type is None and job.tenant is None, job
    for field in ("user", "type"):
        listed = {j.id for j in (await q.list(**{field: ""})).jobs}
        assert listed == {plain, empty, many}, field
    assert [j.id for j in (await q.list(user="u-3")).jobs] == [named]
    assert [j.id for j in (await q.list(type="reply")).jobs] == [named]


# contract: JOB-02
async def test_an_empty_user_or_type_added_in_a_transaction_is_none(store: tinystore.Store) -> None:
    db = await store.database("app")
    q = store.queue("inapp", database=db)

    async def add(tx: tinystore.SqlTx) -> str:
        jid: str = await tx.with_(q).add({}, user="", type="")
        return jid

    jid = await db.tx(add)
    job = await q.get(jid)
    assert job is not None and job.user is None and job.type is None, job


# contract: JOB-02
async def test_a_row_written_with_an_empty_user_or_type_before_reads_back_none(tmp_path: Path) -> None:
    """A store written before ``""`` was kept as none holds rows whose user and type are ``""`` (trial JH)."""
    d = tmp_path / "store"
    async with await tinystore.open(d, embedded=True, serve=False) as store:
        jid = await store.queue("old").add({}, user="u", type="t")
    with contextlib.closing(sqlite3.connect(d / "sql" / "tinystore-jobs.db")) as conn:
        assert conn.execute("update _tinystore_jobs set user = '', type = '' where id = ?", (jid,)).rowcount == 1
        conn.commit()
    async with await tinystore.open(d, embedded=True, serve=False) as store:
        q = store.queue("old")
        job = await q.get(jid)
        assert job is not None and job.user is None and job.type is None, job
        assert [j.id for j in (await q.list(user="")).jobs] == [jid]
        seen: list[tuple[str | None, str | None]] = []

        async def handler(value: Any, run: tinystore.Run) -> None:
            seen.append((run.user, run.type))

        assert await q.run_due(handler) == 1
        assert seen == [(None, None)]
