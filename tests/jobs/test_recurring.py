"""docs/jobs.md "Recurring jobs": a key of the slot and its time as ``at``; each run adds the next one first."""

from __future__ import annotations

import dataclasses
from datetime import UTC, date, datetime, time, timedelta
from pathlib import Path

import tinystore

from ..helpers import open_store


@dataclasses.dataclass
class Reembed:
    night: str


def coming_night(now: datetime) -> date:
    return now.date() if now.time() < time(2, 0) else now.date() + timedelta(days=1)


async def plan(queue: tinystore.Queue[Reembed], night: date) -> None:
    at = datetime.combine(night, time(2, 0), tzinfo=UTC)
    await queue.add(Reembed(night.isoformat()), key=f"reembed/{night}", at=at)


async def test_the_recurring_job_recipe_runs_once_a_night_and_survives_a_dead_run(tmp_path: Path) -> None:
    start = datetime(2026, 12, 1, 1, 0, tzinfo=UTC)
    async with open_store("embedded", tmp_path / "s", clock=start) as store:
        queue = store.queue("maintenance", Reembed, attempts=1)
        ran: list[str] = []

        async def reembed(job: Reembed, run: tinystore.Run) -> None:
            now = datetime.fromtimestamp(await store.clock.now(), UTC)
            await plan(queue, max(date.fromisoformat(job.night) + timedelta(days=1), coming_night(now)))
            ran.append(job.night)
            if job.night == "2026-12-02":
                raise tinystore.PermanentError("the model endpoint is down")  # dead: the chain goes on

        for _ in range(3):  # three processes start, each plans tonight's
            await plan(queue, start.date())
        assert len((await queue.list()).jobs) == 1
        assert await queue.run_due(reembed) == 0  # 01:00: not yet
        await store.clock.advance("1h")
        assert await queue.run_due(reembed) == 1
        for _ in range(3):
            await store.clock.advance("1d")
            assert await queue.run_due(reembed) == 1
        assert ran == ["2026-12-01", "2026-12-02", "2026-12-03", "2026-12-04"]
        states = {j.value.night: j.state for j in (await queue.list(limit=50)).jobs}
        assert states == {
            "2026-12-01": "succeeded",
            "2026-12-02": "dead",
            "2026-12-03": "succeeded",
            "2026-12-04": "succeeded",
            "2026-12-05": "queued",
        }

        # four nights when nothing ran (trial AE: every missed night then ran, back to back): the one planned runs
        # once, and plans the coming night, not the next of its own
        await store.clock.advance("4d")
        assert await queue.run_due(reembed) == 1
        assert await queue.run_due(reembed) == 0
        assert ran[-1] == "2026-12-05"
        queued = [j.value.night for j in (await queue.list(state="queued")).jobs]
        assert queued == ["2026-12-09"]  # the clock is at 2026-12-08 02:00: the coming 02:00 is the 9th's
