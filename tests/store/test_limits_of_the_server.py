"""``store.limits`` are those the store's server holds to (trial AH): a second process opening a running sidecar with
other limits had them applied by its own SDK's checks (a job value refused that the server takes), while the server
held to its own, and nothing said so."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

import tinystore

from ..helpers import open_store


async def test_a_sidecar_found_running_keeps_its_limits_and_the_caller_is_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    directory = tmp_path / "s"
    async with open_store("sidecar", directory) as first:
        assert first.limits.job_value_bytes == tinystore.Limits().job_value_bytes
        caplog.set_level(logging.WARNING, logger="tinystore.client")
        asked = tinystore.Limits(job_value_bytes=10, tx_idle=0.5)
        async with await tinystore.open(directory, limits=asked, durability="os") as second:
            assert second.limits == first.limits  # the server's, not the ones asked
            assert "job_value_bytes 1048576 (asked 10)" in caplog.text
            assert "durability 'full' (asked 'os')" in caplog.text
            # the SDK checks against what the server holds to: a 20-byte value is a job
            job = await second.queue("q").add({"text": "twenty bytes, or so"})
            assert (await first.queue("q").get(job)).state == "queued"


@pytest.mark.parametrize("mode", ["private", "tcp"])
async def test_a_client_checks_against_the_limits_its_server_was_started_with(tmp_path: Path, mode: str) -> None:
    limits = tinystore.Limits(channel_message_bytes=1000, job_value_bytes=100)
    async with open_store(mode, tmp_path / "s", limits=limits) as store:
        assert store.limits == limits
        with pytest.raises(tinystore.LimitError, match="100"):
            await store.queue("q").add({"text": "x" * 200})
