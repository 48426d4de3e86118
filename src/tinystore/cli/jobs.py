"""``tinystore jobs DIR …``: list, show, retry and cancel jobs, and list the queues."""

from __future__ import annotations

import logging
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click
from rich.table import Table

from . import (
    JSON_META,
    DirGroup,
    Target,
    UserPath,
    console,
    fail,
    open_for_cli,
    pass_store_dir,
    print_table,
    run_async,
    to_json,
    visible,
)


def _at(when: datetime | None) -> str:
    """A table's time: UTC to the second, marked ``Z`` (RFC 3339's UTC mark), so that it is not read as local time."""
    if when is None:
        return ""
    return when.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _state(job: Any) -> str:
    return f"{job.state} (stuck)" if job.stuck else str(job.state)


def _short(value: Any, width: int = 40) -> str:
    if value is None:
        return ""
    text = value if isinstance(value, str) else to_json(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def _as_dict(job: Any) -> dict[str, Any]:
    return {
        "id": job.id,
        "queue": job.queue,
        "state": job.state,
        "stuck": job.stuck,
        "attempts": job.attempts,
        "max_attempts": job.max_attempts,
        "fence": job.fence,
        "key": job.key,
        "tenant": job.tenant,
        "user": job.user,
        "type": job.type,
        "priority": job.priority,
        "progress": job.progress,
        "result": job.result,
        "error": job.error,
        "errors": [{"attempt": e.attempt, "error": e.error, "at": e.at, "traceback": e.traceback} for e in job.errors],
        "steps": job.steps,
        "value": job.value,
        "run_at": job.run_at,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }


class _JsonFirstGroup(DirGroup):
    """A group whose ``--json`` may also come between its DIRECTORY and the command's name (``tinystore jobs DIR
    --json retry ID``), where click looks for the name only."""

    leading_flags = ("--json",)

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        while args and args[0] == "--json":
            ctx.meta[JSON_META] = True
            args = args[1:]
        if not args:
            ctx.fail(f"Missing command ({', '.join(self.list_commands(ctx))}).")
        return super().resolve_command(ctx, args)


def register(main: click.Group) -> None:
    """Add the ``jobs`` group to the ``tinystore`` command."""

    @main.group(cls=_JsonFirstGroup)
    @click.argument("directory", type=UserPath(file_okay=False, path_type=Path, remote=True))
    @click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts (as each command's --json).")
    @click.pass_context
    def jobs(ctx: click.Context, directory: Target, as_json: bool) -> None:
        """Jobs of the store in DIRECTORY: list, show, retry, cancel, queues, configure.

        Through the directory's server when one runs, else on the store opened in this command (no server is
        started). DIRECTORY must exist: `tinystore serve DIRECTORY` makes a store there. It may be a server's
        tcp://HOST:PORT or tls://HOST:PORT, with its token in $TINYSTORE_TOKEN (`configure` needs an admin one)."""
        ctx.obj = directory
        if as_json:  # (trial BL: `jobs DIR --json retry ID` was "No such option")
            ctx.meta[JSON_META] = True

    @jobs.command("list")
    @click.option("--queue", default="", help="Only this queue (default: every queue).")
    @click.option(
        "--state",
        type=click.Choice(["queued", "running", "succeeded", "failed", "dead", "cancelled", "stuck"]),
        default=None,
        help="Only jobs in this state (stuck: running past their expected time).",
    )
    @click.option("--tenant", default=None, help="Only this tenant's jobs.")
    @click.option("--user", default=None, help="Only this user's jobs.")
    @click.option("--type", "type_", default=None, help="Only jobs of this type.")
    @click.option("--limit", default=50, show_default=True, help="At most this many jobs (1..1000).")
    @click.option("--after", default=None, help="The cursor a previous page printed.")
    @click.option("--wide", is_flag=True, help="Also show type, progress, created and finished.")
    @click.option(
        "--json",
        "as_json",
        is_flag=True,
        help='Print one JSON object a line: a job each, then {"next": CURSOR} when more follow (give it to --after).',
    )
    @pass_store_dir
    def list_(
        directory: Target,
        queue: str,
        state: str | None,
        tenant: str | None,
        user: str | None,
        type_: str | None,
        limit: int,
        after: str | None,
        wide: bool,
        as_json: bool,
    ) -> None:
        """List jobs, newest first (stuck ones show as "running (stuck)")."""
        from ..client.jobs import list_jobs

        async def go() -> Any:
            store = await open_for_cli(directory)
            try:
                return await list_jobs(store, queue, state, tenant, type_, limit, after, user)
            finally:
                await store.close()

        page, unreadable = run_async(go)
        for error in unreadable:  # (the other queues' jobs are listed: trial FF, one missing database failed it all)
            sys.stderr.write(f"{error}\n")
        if as_json:
            for job in page.jobs:
                click.echo(to_json(_as_dict(job)))
            if page.next:
                # a page may hold fewer than --limit jobs (its size, or jobs that left the filter): only this tells
                # that more follow (trial CA)
                click.echo(to_json({"next": page.next}))
            return
        if not page.jobs and not page.next:
            # (trial IH: an empty table's frame, where a line says it)
            console.print("no jobs" + (" match" if state or tenant or user or type_ or queue else ""), highlight=False)
            return
        table = Table(show_lines=False)
        table.add_column("id", no_wrap=True, min_width=26)
        names = ["queue", "state", "tries", "tenant"]
        if wide:
            names += ["type", "progress", "created", "finished"]
        for name in [*names, "error"]:
            table.add_column(name, overflow="fold")
        for j in page.jobs:
            cells = [j.queue, _state(j), f"{j.attempts}/{j.max_attempts}", j.tenant or ""]
            if wide:
                cells += [j.type or "", _short(j.progress, 24), _at(j.created_at), _at(j.finished_at)]
            # a job that succeeded after failed attempts keeps its last error (`show ID` lists them), but in a list
            # that is scanned for failures it read as one (trial BL)
            error = "" if j.state == "succeeded" else _short(j.error, 60)
            table.add_row(j.id, *(visible(str(c)) for c in cells), visible(error))
        console.print(table)
        if page.next:
            console.print(f"more: --after {page.next}", highlight=False)

    @jobs.command()
    @click.argument("job_id")
    @click.option("--json", "as_json", is_flag=True, help="Print JSON.")
    @pass_store_dir
    def show(directory: Target, job_id: str, as_json: bool) -> None:
        """Show one job, with its attempts and errors."""
        from ..client.jobs import find
        from ..errors import InvalidError

        async def go() -> Any:
            store = await open_for_cli(directory)
            try:
                job = await find(store, job_id)
                if job is None:
                    raise InvalidError(_not_found(job_id, directory))
                return job
            finally:
                await store.close()

        job = run_async(go)
        d = _as_dict(job)
        if as_json:
            click.echo(to_json(d))
            return
        rows = [
            [
                # (trial FG: a job that succeeded on its third attempt showed "error  RuntimeError: ..." and read as
                # failed; its last failed attempt's error is named so)
                "last failed attempt's error" if k == "error" and job.state == "succeeded" else k,
                _short(v, 100) if k not in ("run_at", "created_at", "started_at", "finished_at") else _at(v),
            ]
            for k, v in d.items()
            if k != "errors" and not (k == "error" and v is None and job.state == "succeeded")
        ]
        print_table(f"job {job.id}", ["field", "value"], rows)
        if job.errors:
            # a retry by hand counts attempts from 0 again, its errors after the earlier ones: each run of attempts
            # is numbered (trial IF: "1, 2, 3, 1, 2, 3", the retry told only by the times)
            rounds, n, last_attempt = [], 1, 0
            for e in job.errors:
                if e.attempt <= last_attempt:
                    n += 1
                rounds.append(n)
                last_attempt = e.attempt
            rows = [[e.attempt, _at(e.at), e.error] for e in job.errors]
            if n > 1:
                print_table(
                    "failed attempts (a run of attempts each time the job was retried)",
                    ["run", "attempt", "at", "error"],
                    [[r, *row] for r, row in zip(rounds, rows, strict=True)],
                )
            else:
                print_table("failed attempts", ["attempt", "at", "error"], rows)
            last = next((e for e in reversed(job.errors) if e.traceback), None)
            if last is not None and last.traceback is not None:
                # (control characters escaped, as in the tables: an error's text comes from anywhere, trial CB)
                lines = "\n".join(visible(line) for line in last.traceback.rstrip().split("\n"))
                click.echo(f"\ntraceback of attempt {last.attempt}:\n{lines}")

    def _change(directory: Target, job_id: str, what: str, as_json: bool = False) -> None:
        from ..client.jobs import cancel_job, find, retry_job
        from ..errors import InvalidError

        async def go() -> tuple[bool, str | None]:
            store = await open_for_cli(directory)
            try:
                job = await find(store, job_id)
                if job is None:
                    if as_json:
                        return False, None
                    raise InvalidError(_not_found(job_id, directory))
                fn = cancel_job if what == "cancel" else retry_job
                return await fn(store, job.queue, job_id), job.state
            finally:
                await store.close()

        ok, state = run_async(go)
        if as_json and state is None:
            # (trial HL: a script reading stdout got nothing; the same line, with why)
            line = {"id": job_id, "action": what, "changed": False, "state_before": None}
            click.echo(to_json({**line, "error": _not_found(job_id, directory)}))
            raise SystemExit(1)
        if as_json:
            click.echo(to_json({"id": job_id, "action": what, "changed": ok, "state_before": state}))
            if not ok:
                raise SystemExit(1)
            return
        if ok:
            console.print(f"job {job_id}: {'cancelled' if what == 'cancel' else 'queued again'}", highlight=False)
        else:
            console.print(f"job {job_id}: unchanged (it is {state})", highlight=False)
            raise SystemExit(1)

    @jobs.command()
    @click.argument("job_id")
    @click.option("--json", "as_json", is_flag=True, help='Print {"id", "action", "changed", "state_before"} as JSON.')
    @pass_store_dir
    def retry(directory: Target, job_id: str, as_json: bool) -> None:
        """Put a dead or cancelled job back to queued, attempts from 0. Exits 1 when it changed nothing."""
        _change(directory, job_id, "retry", as_json)

    @jobs.command()
    @click.argument("job_id")
    @click.option("--json", "as_json", is_flag=True, help='Print {"id", "action", "changed", "state_before"} as JSON.')
    @pass_store_dir
    def cancel(directory: Target, job_id: str, as_json: bool) -> None:
        """Cancel a job: a waiting one never runs; a running one's handler is cancelled. Exits 1 when it changed
        nothing."""
        _change(directory, job_id, "cancel", as_json)

    @jobs.command("queues")
    @click.option("--json", "as_json", is_flag=True, help="Print one JSON object a line.")
    @pass_store_dir
    def queues_(directory: Target, as_json: bool) -> None:
        """List the queues with their options and their jobs counted by state."""
        from ..client.jobs import queues

        async def go() -> Any:
            store = await open_for_cli(directory)
            try:
                return await queues(store)
            finally:
                await store.close()

        infos = run_async(go)
        if as_json:
            for i in infos:
                line = {"queue": i.queue, "counts": i.counts, "options": _opts(i.options)}
                click.echo(to_json(line if i.error is None else line | {"error": i.error}))
            return
        states = ["queued", "running", "failed", "succeeded", "dead", "cancelled"]
        print_table(
            None,
            ["queue", "database", *states, "attempts", "lease", "timeout", "expected"],
            [
                [
                    i.queue,
                    i.options.database,
                    *[i.counts.get(s, 0) if i.error is None else "?" for s in states],
                    i.options.attempts,
                    _took(i.options.lease_ms),
                    _took(i.options.timeout_ms),
                    _took(i.options.expected_ms),
                ]
                for i in infos
            ],
        )
        for i in infos:
            if i.error is not None:  # (its counts are "?": its jobs cannot be read)
                sys.stderr.write(f"{i.error}\n")

    @jobs.command()
    @click.argument("queue")
    @click.option("--attempts", type=int, default=None, help="Attempts before a job ends dead.")
    @click.option("--backoff", default=None, metavar="FIRST,CAP", help="Retry delays: first and cap (10s,270s).")
    @click.option("--lease", default=None, help="A claim's lease (30s, 1m, ...).")
    @click.option("--timeout", default=None, help="How long a handler may run.")
    @click.option("--expected", default=None, help="Running past this, a job is reported stuck.")
    @click.option("--max-running", type=int, default=None, help="Jobs running at once, all tenants (0: no limit).")
    @click.option(
        "--max-running-per-tenant", type=int, default=None, help="Jobs running at once per tenant (0: no limit)."
    )
    @click.option("--keep", default=None, help="How long ended jobs are kept.")
    @click.option("--json", "as_json", is_flag=True, help="Print the queue's options as JSON.")
    @pass_store_dir
    def configure(
        directory: Target,
        queue: str,
        attempts: int | None,
        backoff: str | None,
        lease: str | None,
        timeout: str | None,
        expected: str | None,
        max_running: int | None,
        max_running_per_tenant: int | None,
        keep: str | None,
        as_json: bool,
    ) -> None:
        """Change the options the store keeps for QUEUE (those not given stay). Every process must open a queue
        with the options the store keeps: after a deploy that changes them in code, run this once (needs the
        admin capability over TCP)."""
        from ..client.jobs import configure as configure_queue
        from ..durations import seconds
        from ..errors import InvalidError, TinystoreError
        from ..protocol.jobs import Options

        def ms(text: str | None, what: str) -> int | None:
            return None if text is None else round(seconds(text, what) * 1000)

        try:
            first = cap = None
            if backoff is not None:
                parts = backoff.split(",")
                if len(parts) != 2:
                    # (one error[invalid] line, exit 1, as a delay that does not read: trial EP, it was click's usage)
                    raise InvalidError(f"--backoff: {backoff!r}: give FIRST,CAP, as in 10s,270s")
                first, cap = ms(parts[0].strip(), "--backoff"), ms(parts[1].strip(), "--backoff")
            options = Options(
                attempts=attempts,
                backoff_first_ms=first,
                backoff_cap_ms=cap,
                lease_ms=ms(lease, "--lease"),
                timeout_ms=ms(timeout, "--timeout"),
                expected_ms=ms(expected, "--expected"),
                max_running=max_running,
                max_running_per_tenant=max_running_per_tenant,
                keep_ms=ms(keep, "--keep"),
            )
        except TinystoreError as exc:
            fail(exc)

        async def go() -> Any:
            store = await open_for_cli(directory)
            try:
                return await configure_queue(store, queue, options)
            finally:
                await store.close()

        # the engines of a store this command opened itself log the same warning as the one below: said once (the
        # trials' CY list: it was printed twice)
        engine_log = logging.getLogger("tinystore.jobs")
        engine_log.addFilter(_not_the_expected_warning)
        try:
            info = run_async(go)
        finally:
            engine_log.removeFilter(_not_the_expected_warning)
        o = info.options
        if o.expected_ms is not None and o.timeout_ms is not None and o.expected_ms >= o.timeout_ms:
            # (the server logs it; this is who asked: trial CD)
            click.echo(
                f"warning: queue {info.queue}: expected ({_took(o.expected_ms)}) is not below timeout "
                f"({_took(o.timeout_ms)}): a handler is cancelled at its timeout, so no job of this queue is ever "
                "reported stuck",
                err=True,
            )
        if as_json:
            click.echo(to_json({"queue": info.queue, "options": _opts(info.options)}))
            return
        print_table(f"queue {info.queue}", ["option", "value"], _shown(info.options))


def _not_the_expected_warning(record: logging.LogRecord) -> bool:
    """A logging filter: all records but the engine's warning that ``expected`` is not below ``timeout``."""
    return "is not below timeout" not in str(record.msg)


def _not_found(job_id: str, directory: Target) -> str:
    """Why a job id names no job: not an id at all (26 characters of Crockford base32), or one no queue has."""
    if len(job_id) != 26 or not all(c in "0123456789abcdefghjkmnpqrstvwxyz" for c in job_id):
        return f"job {job_id}: not a job id (a job id is 26 characters of 0-9 and a-z, as `jobs list` shows)"
    return f"job {job_id}: no queue of the store {directory} has it (ended jobs are deleted after the queue's keep)"


def _opts(o: Any) -> dict[str, Any]:
    """The options as JSON: durations in ms (the ``_ms`` names say so); ``max_running*`` null for no limit."""
    import msgspec

    out: dict[str, Any] = msgspec.to_builtins(o)
    for name in ("max_running", "max_running_per_tenant"):
        if not out.get(name):
            out[name] = None
    return out


def _took(ms: int | None) -> str:
    """A duration in ms as ``configure`` and ``queues`` show it (``1m``, ``90s``, ``7d``; one way in both)."""
    if ms is None:
        return ""
    s = ms / 1000
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size and s % size == 0:
            return f"{s / size:g}{unit}"
    return f"{s:g}s"


def _shown(o: Any) -> list[list[Any]]:
    """The options for people: named as ``store.queue(...)`` takes them, durations as durations."""
    took = _took

    return [
        ["database", o.database],
        ["attempts", o.attempts],
        ["backoff", f"{took(o.backoff_first_ms)}, {took(o.backoff_cap_ms)}"],
        ["lease", took(o.lease_ms)],
        ["timeout", took(o.timeout_ms)],
        ["expected", took(o.expected_ms)],
        ["max_running", o.max_running or "no limit"],
        ["max_running_per_tenant", o.max_running_per_tenant or "no limit"],
        ["keep", took(o.keep_ms)],
    ]
