"""Limits and durations refuse what they cannot mean, with an InvalidError naming it: a lock_ttl outside
lock_ttl_min .. lock_ttl_max, a job_backoff_first above job_backoff_cap, an unknown key in Limits JSON, JSON
that is not text; a duration text with an exponent or digits other than ASCII 0-9."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

import tinystore
from tests.helpers import open_store
from tinystore.durations import seconds

Limits = tinystore.Limits


@pytest.mark.parametrize("ttl", [0.1, 0.5, 3601, 7200])
def test_a_lock_ttl_outside_its_bounds_is_refused_naming_both(ttl: float) -> None:
    with pytest.raises(
        tinystore.InvalidError,
        match=rf"Limits: lock_ttl = {ttl!r}: it must be within lock_ttl_min \(1.0\) .. lock_ttl_max \(3600.0\)",
    ):
        Limits(lock_ttl=ttl)
    with pytest.raises(
        tinystore.InvalidError, match=f"Limits: lock_ttl = {float(ttl)!r}: it must be within lock_ttl_min"
    ):
        Limits.from_json(f'{{"lock_ttl": {ttl}}}')


def test_a_lock_ttl_within_bounds_given_is_taken() -> None:
    assert Limits(lock_ttl=0.5, lock_ttl_min=0.1).lock_ttl == 0.5
    assert Limits(lock_ttl=7200, lock_ttl_max=7200).lock_ttl == 7200
    with pytest.raises(tinystore.InvalidError, match=r"lock_ttl = 3: it must be within lock_ttl_min \(5\)"):
        Limits(lock_ttl=3, lock_ttl_min=5)


def test_the_default_lock_ttl_follows_bounds_that_exclude_it() -> None:
    """Limits(lock_ttl_max=5) is a store whose locks last at most 5 s: a lock made without a ttl gets 5 s, not an
    error at every ``store.lock(name)``."""
    assert Limits(lock_ttl_min=0.1, lock_ttl_max=5).lock_ttl == 5
    assert Limits(lock_ttl_min=20).lock_ttl == 20
    assert Limits().lock_ttl == 10
    limits = Limits(lock_ttl_max=5)
    assert Limits.from_json(limits.to_json()) == limits
    assert Limits.from_json('{"lock_ttl_max": 5}').lock_ttl == 5


async def test_a_lock_made_without_a_ttl_in_a_store_with_a_lower_max(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", limits=Limits(lock_ttl_min=0.1, lock_ttl_max=5)) as store:
        lock = store.lock("l")
        assert lock.ttl == 5
        async with lock.try_hold("k") as lease:
            assert lease is not None


def test_a_first_backoff_above_its_cap_is_refused_and_the_default_follows_the_cap() -> None:
    with pytest.raises(
        tinystore.InvalidError, match=r"Limits: job_backoff_first = 300: it must be at most job_backoff_cap \(270.0\)"
    ):
        Limits(job_backoff_first=300)
    with pytest.raises(
        tinystore.InvalidError, match=r"job_backoff_first = 20.0: it must be at most job_backoff_cap \(15.0\)"
    ):
        Limits.from_json('{"job_backoff_first": 20, "job_backoff_cap": 15}')
    assert Limits(job_backoff_cap=5).job_backoff_first == 5
    assert Limits(job_backoff_first=5, job_backoff_cap=5).job_backoff_first == 5


async def test_a_queue_of_a_store_with_a_low_backoff_cap_opens(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s", limits=Limits(job_backoff_cap=5)) as store:
        options = await store.queue("q").options()
        assert options["backoff"] == (5, 5)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ('{"tx_idel": 1}', "Limits: unknown limit 'tx_idel'; did you mean 'tx_idle'?"),
        ('{"channel_log": 5, "lockttl": 3}', "Limits: unknown limit 'lockttl'; did you mean 'lock_ttl'?"),
        ('{"zzz": 1}', "Limits: unknown limit 'zzz'; the limits are channel_linger, "),
    ],
)
def test_limits_json_with_an_unknown_key_is_refused_naming_it(text: str, message: str) -> None:
    with pytest.raises(tinystore.InvalidError) as err:
        Limits.from_json(text)
    assert err.value.message.startswith(message)


@pytest.mark.parametrize(
    ("given", "message"),
    [
        (5, "Limits.from_json: expected JSON text (str or bytes), got int"),
        (None, "Limits.from_json: expected JSON text (str or bytes), got NoneType"),
        ({"channel_log": 5}, "Limits.from_json: expected JSON text (str or bytes), got dict"),
        ("[1, 2]", "Limits: expected a JSON object of limits, got list"),
        ("5", "Limits: expected a JSON object of limits, got int"),
    ],
)
def test_limits_json_that_is_not_an_object_in_text_is_refused(given: Any, message: str) -> None:
    with pytest.raises(tinystore.InvalidError) as err:
        Limits.from_json(given)
    assert err.value.message.startswith(message)


def test_limits_json_round_trips_and_takes_bytes() -> None:
    limits = Limits(channel_log=100, tx_idle=1, inline_read=0)
    assert Limits.from_json(limits.to_json()) == limits
    assert Limits.from_json(limits.to_json().encode()) == limits
    assert Limits.from_json(b"{}") == Limits()
    assert Limits.to_json.__doc__ and "seconds" in Limits.to_json.__doc__


@pytest.mark.parametrize("text", ["٣s", "٣", "1m٣٠s", "３s", "1.٥s"])
def test_a_duration_with_digits_other_than_ascii_is_refused(text: str) -> None:
    with pytest.raises(tinystore.InvalidError, match=f"ttl: cannot read '{text}' as a duration: its digits must be"):
        seconds(text, "ttl")


@pytest.mark.parametrize("text", ["1e3", "1E3", "1e3s", "1E3s", "2e-1", "1.5e2ms", "inf", "nan", "1_000", "+5", ".5"])
def test_a_duration_in_another_number_form_is_refused(text: str) -> None:
    with pytest.raises(tinystore.InvalidError, match=re.escape(f"ttl: cannot read '{text}' as a duration (use")):
        seconds(text, "ttl")


@pytest.mark.parametrize("text", ["30s1m", "1s1s", "30m1h", "250ms1s"])
def test_duration_parts_go_largest_first_each_once(text: str) -> None:
    with pytest.raises(tinystore.InvalidError, match=f"cannot read '{text}' as a duration: give each unit once"):
        seconds(text, "ttl")


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("30s", 30),
        ("1m30s", 90),
        ("250ms", 0.25),
        ("2h", 7200),
        ("7d", 7 * 86400),
        ("1h30m", 5400),
        ("1d2h3m4s5ms", 86400 + 7200 + 180 + 4.005),
        ("1.5s", 1.5),
        ("30", 30),
        ("1.5", 1.5),
        (" 30 s ", 30),
        ("-0s", 0),
    ],
)
def test_the_documented_duration_texts_still_read(text: str, value: float) -> None:
    assert seconds(text) == pytest.approx(value)


async def test_a_lock_ttl_in_another_script_is_refused_by_the_lock(tmp_path: Path) -> None:
    async with open_store("embedded", tmp_path / "s") as store:
        with pytest.raises(tinystore.InvalidError, match="lock l: ttl: cannot read '٣s' as a duration"):
            store.lock("l", ttl="٣s")
        with pytest.raises(tinystore.InvalidError, match="lock l: ttl: cannot read '1e3' as a duration"):
            store.lock("l", ttl="1e3")


def test_an_int_subclass_as_a_limit_is_a_plain_int() -> None:
    # an IntEnum count was refused ("readers = <N.A: 8>: it must be an int from 1 to 1024"), and a duration kept
    # the enum's type
    import enum

    class N(enum.IntEnum):
        EIGHT = 8

    limits = tinystore.Limits(readers=N.EIGHT, lock_ttl=N.EIGHT)
    assert limits.readers == 8 and type(limits.readers) is int
    assert limits.lock_ttl == 8 and type(limits.lock_ttl) is int
    assert tinystore.Limits.from_json(limits.to_json()) == limits
