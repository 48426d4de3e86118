"""A job row whose value is not JSON (written by other means than the store: a client can no longer write the
jobs tables, trial S) is a ``CorruptError`` naming the job for ``get``, not a raw decode error."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

import tinystore


async def test_a_job_whose_value_is_not_json_is_corrupt_naming_it(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    async with await tinystore.open(directory, embedded=True, serve=False) as store:
        job_id = await store.queue("mail").add({"to": "a@x"})
    conn = sqlite3.connect(directory / "sql" / "tinystore-jobs.db")
    conn.execute("update _tinystore_jobs set value = 'not json {' where id = ?", (job_id,))
    conn.commit()
    conn.close()
    async with await tinystore.open(directory, embedded=True, serve=False) as store:
        with pytest.raises(tinystore.CorruptError, match=rf"queue mail: job {job_id}: its kept value is not JSON"):
            await store.queue("mail").get(job_id)
        other = await store.queue("other").add({"x": 1})  # the store goes on
        assert (await store.queue("other").get(other)) is not None
