"""Trial CW: what a refused delay, a refused option and a refused clock move say."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

import tinystore

from ..cli.support import run_cli
from ..helpers import ServerProcess, open_store


@pytest.mark.parametrize("mode", ["embedded", "private"])
async def test_a_delay_past_the_end_of_9999_is_named_as_the_delay(tmp_path: Path, mode: str) -> None:
    # it said "at 2.53402e+11 (epoch seconds) is not between 1970 and the end of 9999", an at nobody gave
    async with open_store(mode, tmp_path / "s", clock=datetime(9999, 12, 31, 23, tzinfo=UTC)) as store:
        q = store.queue("q")
        with pytest.raises(tinystore.InvalidError) as caught:
            await q.add({}, delay="2h")
        # (named as a duration is written: "2h", not "7200s", nor "2.592e+07s" for "300d")
        assert caught.value.message.startswith("queue q: the job: delay 2h from now (9999-12-31T23:00"), caught
        with pytest.raises(tinystore.InvalidError, match=r"the job: delay 1d1h from now"):
            await q.add({}, delay=90000)
        assert "past the end of 9999" in caught.value.message
        with pytest.raises(tinystore.InvalidError, match=r"at 1960-01-01T00:00:00\+00:00 is not between 1970"):
            await q.add({}, at=datetime(1960, 1, 1, tzinfo=UTC))
        # the clock's own refusal names the move as given, embedded as over a socket
        with pytest.raises(tinystore.InvalidError, match=r"clock advance: '2h' would take the test clock past"):
            await store.clock.advance("2h")


def test_an_option_out_of_bounds_is_told_in_seconds_not_in_exponent_notation(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    ServerProcess(directory).start().stop()
    done = run_cli("jobs", str(directory), "configure", "q", "--timeout", "367d")
    assert done.returncode != 0
    assert "option timeout: 31708800s is not above 0 and at most a year" in " ".join(done.stderr.split()), done.stderr
    done = run_cli("jobs", str(directory), "configure", "q", "--keep", "4000d")
    assert "option keep: 345600000s is not between 0 and ten years" in " ".join(done.stderr.split()), done.stderr
