"""docs/jobs.md's fenced upsert, run as written (trial GM: the snippet before compared fences of different jobs,
and a re-ingest's write, its fence equal to the first job's, was dropped without a word)."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import tinystore

DOC = Path(__file__).parents[2] / "docs" / "jobs.md"


@dataclasses.dataclass
class Ingest:
    doc_id: str
    version: int
    text: str


def snippet_sql() -> str:
    """The statement of the docs' fenced upsert, as the docs write it."""
    block = re.search(r'await db\.exec\(\n((?:    ".*\n)+)    job\.doc_id, job\.version, run\.fence', DOC.read_text())
    assert block is not None, "the fenced upsert of docs/jobs.md"
    return "".join(re.findall(r'"(.*)"', block.group(1)))


# contract: JOB-08
async def test_the_docs_fenced_upsert_keeps_a_newer_job_and_refuses_a_late_attempt(
    any_store: tinystore.Store,
) -> None:
    sql = snippet_sql()
    db = await any_store.database(
        "app",
        migrations=[("001.sql", "create table summaries (doc_id text primary key, version int, fence int, text text)")],
    )
    ingest = any_store.queue("ingest", Ingest, database=db)
    fences: dict[int, int] = {}

    async def run_ingest(job: Ingest, run: tinystore.Run) -> None:
        fences[job.version] = run.fence
        await db.exec(sql, job.doc_id, job.version, run.fence, job.text)
        await db.exec(sql, job.doc_id, job.version, run.fence, job.text + ", again")  # an attempt writes again

    await ingest.add(Ingest("d-17", 1, "first version"))
    assert await ingest.run_due(run_ingest) == 1
    await ingest.add(Ingest("d-17", 2, "second version"))
    assert await ingest.run_due(run_ingest) == 1
    # (two jobs' first attempts: their fences need not differ, the version orders them)
    assert await db.one("select version, text from summaries") == {"version": 2, "text": "second version, again"}
    # a late attempt of the first job, its fence higher than any before: refused all the same
    late = max(fences.values()) + 1
    await db.exec(sql, "d-17", 1, late, "stale")
    assert await db.scalar("select text from summaries") == "second version, again"
    # an attempt of the second job older than the one that wrote: refused; a newer one: written
    await db.exec(sql, "d-17", 2, fences[2] - 1, "older attempt")
    assert await db.scalar("select text from summaries") == "second version, again"
    await db.exec(sql, "d-17", 2, fences[2] + 1, "newer attempt")
    assert await db.scalar("select text from summaries") == "newer attempt"
