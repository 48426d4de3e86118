"""``tinystore jobs DIR list|show|retry|cancel|queues`` (JOB-02, JOB-11): rich tables and ``--json``."""

from __future__ import annotations

import asyncio
import json
import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from click.testing import CliRunner

import tinystore
from tinystore.cli import main

from .util import claim, other_client


def make_store(d: Path) -> dict[str, str]:
    """A store with a succeeded, a dead, a queued job and one left running for ten minutes (stuck)."""

    async def go() -> dict[str, str]:
        store = await tinystore.open(d, embedded=True, clock=datetime.now(UTC) - timedelta(minutes=10))
        try:
            q = store.queue("mail", attempts=1, expected="1m", timeout="1h")
            ok = await q.add({"to": "a@x"}, tenant="org-1", type="send")
            bad = await q.add({"to": "b@x", "fail": True}, tenant="org-2", type="send")

            async def handler(value: Any, run: tinystore.Run) -> str:
                if value.get("fail"):
                    raise ConnectionError("smtp refused")
                return "sent"

            await q.run_due(handler)
            stuck = await q.add({"to": "c@x"}, tenant="org-1")
            async with other_client(store) as other:
                await claim(other, "mail")  # a worker took it and never came back
            queued = await q.add({"to": "d@x"}, tenant="org-2", delay="1d")
            return {"ok": ok, "bad": bad, "stuck": stuck, "queued": queued}
        finally:
            await store.close()

    return asyncio.run(go())


def cli(*args: str) -> Any:
    result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return result


def test_list_show_retry_cancel(tmp_path: Path) -> None:
    d = tmp_path / "store"
    ids = make_store(d)
    r = cli("jobs", str(d), "list", "--json")
    assert r.exit_code == 0, r.output
    rows = [json.loads(line) for line in r.output.splitlines() if line.startswith("{")]
    by_id = {row["id"]: row for row in rows}
    assert set(by_id) == set(ids.values())
    assert by_id[ids["bad"]]["state"] == "dead" and by_id[ids["bad"]]["error"] == "ConnectionError: smtp refused"
    assert by_id[ids["stuck"]]["state"] == "running" and by_id[ids["stuck"]]["stuck"] is True

    r = cli("jobs", str(d), "list", "--state", "dead", "--json")
    assert [json.loads(line)["id"] for line in r.output.splitlines() if line.startswith("{")] == [ids["bad"]]
    r = cli("jobs", str(d), "list", "--tenant", "org-2", "--json")
    got = {json.loads(line)["id"] for line in r.output.splitlines() if line.startswith("{")}
    assert got == {ids["bad"], ids["queued"]}
    r = cli("jobs", str(d), "list", "--state", "stuck", "--json")
    assert [json.loads(line)["id"] for line in r.output.splitlines() if line.startswith("{")] == [ids["stuck"]]

    r = cli("jobs", str(d), "list")
    assert r.exit_code == 0 and "stuck" in r.output and "mail" in r.output
    r = cli("jobs", str(d), "list", "--tenant", "nobody")  # (trial IH: an empty table's frame)
    assert r.exit_code == 0 and r.output.strip() == "no jobs match", r.output

    r = cli("jobs", str(d), "show", ids["bad"], "--json")
    shown = json.loads(r.output)
    assert shown["attempts"] == 1 and [e["error"] for e in shown["errors"]] == ["ConnectionError: smtp refused"]
    r = cli("jobs", str(d), "show", ids["bad"])
    assert r.exit_code == 0 and "smtp refused" in r.output and "failed attempts" in r.output
    # a table's times say they are UTC (a server's log and the JSON are UTC too): "…:05Z", never bare
    assert re.search(r"created_at\W+\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ", r.output), r.output

    r = cli("jobs", str(d), "retry", ids["bad"])
    assert r.exit_code == 0 and "queued again" in r.output
    r = cli("jobs", str(d), "retry", ids["ok"])
    assert r.exit_code == 1 and "unchanged" in r.output
    r = cli("jobs", str(d), "cancel", ids["queued"])
    assert r.exit_code == 0 and "cancelled" in r.output
    r = cli("jobs", str(d), "cancel", ids["queued"])
    assert r.exit_code == 1
    # --json, as every jobs command takes (trial Z: retry and cancel refused it)
    r = cli("jobs", str(d), "cancel", ids["queued"], "--json")
    assert r.exit_code == 1
    assert json.loads(r.output) == {
        "id": ids["queued"],
        "action": "cancel",
        "changed": False,
        "state_before": "cancelled",
    }
    r = cli("jobs", str(d), "retry", ids["queued"], "--json")
    assert r.exit_code == 0
    assert json.loads(r.output) == {
        "id": ids["queued"],
        "action": "retry",
        "changed": True,
        "state_before": "cancelled",
    }
    r = cli("jobs", str(d), "cancel", ids["queued"], "--json")
    assert r.exit_code == 0 and json.loads(r.output)["changed"] is True

    r = cli("jobs", str(d), "show", ids["bad"], "--json")
    assert json.loads(r.output)["state"] == "queued" and json.loads(r.output)["attempts"] == 0
    r = cli("jobs", str(d), "queues", "--json")
    info = json.loads(r.output.splitlines()[0])
    assert info["queue"] == "mail" and info["counts"]["cancelled"] == 1 and info["options"]["attempts"] == 1
    r = cli("jobs", str(d), "queues")
    assert r.exit_code == 0 and "mail" in r.output


def test_an_unknown_job(tmp_path: Path) -> None:
    d = tmp_path / "store"
    make_store(d)
    r = CliRunner().invoke(main, ["jobs", str(d), "show", "nope"])
    assert r.exit_code == 1
    # trial HL: with --json, retry and cancel print their line for an id no queue has too (a script read nothing)
    for action in ("retry", "cancel"):
        r = CliRunner().invoke(main, ["jobs", str(d), action, "nope", "--json"])
        assert r.exit_code == 1
        line = json.loads(r.stdout)
        assert line["error"] and {k: v for k, v in line.items() if k != "error"} == {
            "id": "nope",
            "action": action,
            "changed": False,
            "state_before": None,
        }


def test_configure_changes_the_options_the_store_keeps(tmp_path: Path) -> None:
    """A deploy that changes a queue's options in code: `tinystore jobs DIR configure` changes what the store
    keeps, after which the new code opens the queue and the old options are the ones refused."""
    d = tmp_path / "s"

    async def open_with(**options: Any) -> str:
        store = await tinystore.open(d, embedded=True)
        try:
            return await store.queue("mail", **options).add({"to": "a@x"})
        finally:
            await store.close()

    asyncio.run(open_with(attempts=3))
    try:
        asyncio.run(open_with(attempts=7))
        raise AssertionError("a queue opened with other options than the store keeps was accepted")
    except tinystore.InvalidError as exc:
        assert "attempts is 7 here but the store keeps 3" in exc.message

    r = cli("jobs", str(d), "configure", "mail", "--attempts", "7", "--backoff", "5s,1m", "--lease", "10s", "--json")
    assert r.exit_code == 0, r.output
    got = json.loads(r.output)["options"]
    assert got["attempts"] == 7 and got["backoff_first_ms"] == 5000 and got["backoff_cap_ms"] == 60000
    assert got["lease_ms"] == 10000 and got["timeout_ms"] == 60000  # what was not given stays
    asyncio.run(open_with(attempts=7, backoff=("5s", "1m"), lease="10s"))
    try:
        asyncio.run(open_with(attempts=3))
        raise AssertionError("the old options were still accepted")
    except tinystore.InvalidError as exc:
        assert "attempts is 3 here but the store keeps 7" in exc.message

    bad = cli("jobs", str(d), "configure", "mail", "--backoff", "1m,5s")
    assert bad.exit_code == 1 and "first delay is above the cap" in bad.output, bad.output
    missing = cli("jobs", str(d), "configure", "nope", "--attempts", "2")
    assert missing.exit_code == 1 and "queue nope does not exist" in missing.output, missing.output
    for value in ("5s", "5x,1m"):  # (trial EP: one exited 2 with click's usage, the other 1)
        one = cli("jobs", str(d), "configure", "mail", "--backoff", value)
        assert one.exit_code == 1 and one.output.startswith("error[invalid] --backoff: "), one.output
    negative = cli("jobs", str(d), "configure", "mail", "--lease", "-1s")
    assert negative.exit_code == 1 and "--lease" in negative.output, negative.output


def test_configure_shows_options_as_a_queue_takes_them_and_ids_are_checked(tmp_path: Path) -> None:
    d = tmp_path / "s"

    async def go() -> str:
        store = await tinystore.open(d, embedded=True)
        try:
            return await store.queue("mail").add({"to": "a@x"})
        finally:
            await store.close()

    jid = asyncio.run(go())
    r = cli("jobs", str(d), "configure", "mail", "--lease", "90s")
    assert r.exit_code == 0, r.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in r.output.splitlines() if "│" in line}
    assert rows["lease"] == "90s" and rows["timeout"] == "1m" and rows["keep"] == "7d"
    assert rows["max_running"] == "no limit" and rows["backoff"] == "10s, 270s"
    got = json.loads(cli("jobs", str(d), "configure", "mail", "--json").output)["options"]
    assert got["max_running"] is None and got["lease_ms"] == 90_000  # no limit is null, as the SDK has it
    bad = cli("jobs", str(d), "cancel", "garbage")
    assert bad.exit_code == 1 and "not a job id" in bad.output, bad.output
    gone = cli("jobs", str(d), "show", "0" * 26)
    assert gone.exit_code == 1 and "no queue of" in gone.output, gone.output
    assert cli("jobs", str(d), "show", jid).exit_code == 0


# contract: JOB-02
def test_the_groups_json_before_the_command_and_durations_written_one_way(tmp_path: Path) -> None:
    # from trial BL: `jobs DIR --json retry ID` was "No such option: --json"; `queues` showed a timeout of 1m as 60s
    # while `configure` showed 1m
    d = tmp_path / "store"
    ids = make_store(d)
    r = cli("jobs", str(d), "--json", "retry", ids["bad"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["action"] == "retry"
    r = cli("jobs", str(d), "--json", "list")
    assert all(json.loads(line)["queue"] == "mail" for line in r.output.splitlines() if line.strip())
    r = cli("jobs", str(d), "queues")
    assert r.exit_code == 0 and "30s" in r.output and "1h" in r.output and "3600s" not in r.output, r.output
    r = cli("jobs", str(d), "--json")
    assert r.exit_code == 2 and "Missing command" in r.output


def mail_job(d: Path, handler: Any, *, retried: int = 0) -> tuple[str, list[str]]:
    """A store in ``d`` on a test clock whose queue ``mail`` (2 attempts, backoff 1 s) runs one job with ``handler``
    through both attempts; with ``retried``, retried by hand that many times, each run through again. Returns the
    job's id and its state after each run through."""

    async def go() -> tuple[str, list[str]]:
        store = await tinystore.open(d, embedded=True, clock=datetime(2030, 1, 1, tzinfo=UTC))
        try:
            q = store.queue("mail", attempts=2, backoff=("1s", "1s"))
            job = await q.add({"to": "a@x"})
            states: list[str] = []
            for i in range(retried + 1):
                if i:
                    await q.retry(job)
                await q.run_due(handler)
                store.clock.advance("2s")
                await q.run_due(handler)
                states.append((await q.get(job)).state)  # type: ignore[union-attr]
            return job, states
        finally:
            await store.close()

    return asyncio.run(go())


def test_show_names_the_error_of_a_job_that_succeeded_after_failing(tmp_path: Path) -> None:
    # trial FG: a job that succeeded on its second attempt showed "error │ RuntimeError: ..." and read as failed
    d = tmp_path / "store"

    async def handler(value: Any, run: tinystore.Run) -> str:
        if run.attempt == 1:
            raise RuntimeError("SMTP 421 try later")
        return "sent"

    job, states = mail_job(d, handler)
    assert states == ["succeeded"]
    r = cli("jobs", str(d), "show", job)
    assert r.exit_code == 0, r.output
    assert not re.search(r"^│ error\b", r.output, re.M), r.output
    assert re.search(r"last failed attempt's\s.*SMTP 421", r.output, re.S), r.output
    assert "failed attempts" in r.output


# contract: JOB-02
def test_show_numbers_each_run_of_attempts_after_a_retry(tmp_path: Path) -> None:
    """Trial IF: a job retried by hand, and dead again, showed its failed attempts as "1, 2, 1, 2", the retry told
    only by their times."""
    d = tmp_path / "store"

    async def handler(value: Any, run: tinystore.Run) -> None:
        raise ConnectionError(f"smtp refused, try {run.attempt}")

    job, states = mail_job(d, handler, retried=1)
    assert states == ["dead", "dead"]
    r = cli("jobs", str(d), "show", job)
    assert r.exit_code == 0, r.output
    rows = [line.split("│")[1:3] for line in r.output.splitlines() if "smtp refused" in line and line.count("│") == 5]
    assert [(run.strip(), attempt.strip()) for run, attempt in rows] == [("1", "1"), ("1", "2"), ("2", "1"), ("2", "2")]
