"""The jobs engine's deadline heap (leases, delays) keeps one clock timer at its earliest deadline, whatever its
callbacks push while it fires."""

from __future__ import annotations

from datetime import UTC, datetime

from tinystore.clock import Clock
from tinystore.engines.jobs_index import Deadlines


# contract: JOB-01
async def test_a_later_deadline_pushed_while_firing_does_not_hold_back_an_earlier_one() -> None:
    """A renewed lease is pushed again, later, from its own (outdated) deadline's callback: that push armed the
    timer for the later time, and a lost worker's lease ending before it went unnoticed until then."""
    clock = Clock(datetime(2031, 1, 1, tzinfo=UTC))
    t0 = clock.now()
    fired: list[tuple[str, float]] = []
    renewed = {"a": t0 + 17}

    def on_due(item: str) -> None:
        fired.append((item, clock.now() - t0))
        if item == "a" and renewed.pop("a", None) is not None:
            deadlines.push(t0 + 17, "a")  # a's lease was renewed meanwhile: it ends later

    deadlines = Deadlines(clock, on_due)
    deadlines.push(t0 + 10, "a")
    deadlines.push(t0 + 14, "b")  # b's worker is lost: its lease ends at 14
    for step in range(1, 20):
        clock.advance(1)
        if step == 14:
            assert ("b", 14.0) in [(i, round(t)) for i, t in fired], fired
    assert [i for i, _ in fired] == ["a", "b", "a"]
    deadlines.close()
    clock.close()
