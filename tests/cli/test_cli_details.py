"""What a new user met on the command line: a directory that cannot be made, a port out of range, durations
for --grace, values that look like rich markup, the database --db defaults to, and a status with no server."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import os
import re
import sqlite3
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import ServerProcess
from .support import popen_cli, run_cli


@pytest.mark.parametrize("command", ["serve", "demo"])
def test_a_directory_that_cannot_be_made_is_one_error_line(tmp_path: Path, command: str) -> None:
    (tmp_path / "file").write_text("")
    for directory, why in (
        ("/proc/tinystore-nope", "cannot make the store's directory"),
        (tmp_path / "file" / "x", "is not a directory"),
    ):
        # (any free port for the demo: its port is checked first, and 8000 may be taken on the machine)
        done = run_cli(command, str(directory), *(["--port", "0"] if command == "demo" else []))
        assert done.returncode == 1, (done.stdout, done.stderr)
        assert done.stderr.startswith(f"error[invalid] {command}: ") and why in done.stderr, done.stderr
        assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1


def test_a_demo_port_out_of_range_is_refused(tmp_path: Path) -> None:
    for port in ("99999", "65536", "-1"):
        done = run_cli("demo", str(tmp_path / "d"), "--port", port)
        assert done.returncode == 2 and "is not in the range 0<=x<=65535" in done.stderr, done.stderr


async def _store_with(tmp_path: Path, *names: str) -> Path:
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        for name in names:
            db = await store.database(name, migrations=[("001.sql", "create table t (a, b);")])
            await db.exec("insert into t values (?, ?)", "[/]", "[bold]x[/bold]")
            await db.exec("insert into t values (?, ?)", b"\x00\xff", None)
            await db.exec("insert into t values (?, ?)", "two\nlines \x1b[2J \u202e", 3)
    finally:
        await store.close()
    return directory


# contract: SQL-01
async def test_a_typo_in_db_with_write_makes_no_database(tmp_path: Path) -> None:
    # from trial BL: `--db shpo --write "delete from orders"` made an empty database shpo (the statement failed), and
    # the command's default database (the store's only one) was then no longer found
    directory = await _store_with(tmp_path, "shop")
    done = run_cli("sql", str(directory), "--db", "shpo", "--write", "delete from t")
    assert done.returncode == 1
    assert "no database 'shpo' (databases: shop; choose one with --db, or add --write --create" in done.stderr
    assert not (directory / "sql" / "shpo.db").exists()
    assert run_cli("sql", str(directory), "select count(*) as n from t").returncode == 0  # still the only one
    done = run_cli("sql", str(directory), "--db", "new", "--write", "--create", "create table n (x)")
    assert done.returncode == 0, done.stderr
    assert (directory / "sql" / "new.db").exists()


async def test_values_that_look_like_markup_print_as_they_are(tmp_path: Path) -> None:
    directory = await _store_with(tmp_path, "app")
    done = run_cli("sql", str(directory), "select * from t")  # the store's only database: no --db needed
    assert done.returncode == 0, done.stderr
    assert "[/]" in done.stdout and "[bold]x[/bold]" in done.stdout  # printed, not read as rich markup
    assert "x'00ff'" in done.stdout and "NULL" in done.stdout  # a blob as SQL writes it (--json: hex)
    assert "two\\nlines \\x1b[2J \\u202e" in done.stdout and "\x1b" not in done.stdout  # controls as escapes
    rows = [
        json.loads(line) for line in run_cli("sql", str(directory), "select * from t", "--json").stdout.splitlines()
    ]
    assert rows[:2] == [{"a": "[/]", "b": "[bold]x[/bold]"}, {"a": "00ff", "b": None}]


async def test_without_db_the_only_database_or_main_else_a_choice(tmp_path: Path) -> None:
    directory = await _store_with(tmp_path, "app", "other")
    done = run_cli("sql", str(directory), "select count(*) as n from t")
    assert done.returncode == 1
    want = "no database 'main' (databases: app, other; choose one with --db, or add --write --create to create it)"
    assert want in done.stderr, done.stderr
    done = run_cli("sql", str(directory), "select 1", "--db", "newdb")
    want = "no database 'newdb' (databases: app, other; choose one with --db, or add --write --create to create it)"
    assert want in done.stderr
    done = run_cli("sql", str(directory), "select 1", "--db", "newdb", "--create")  # trial EF
    assert "or add --write to create it (--create makes one only with --write))" in done.stderr, done.stderr
    done = run_cli("sql", str(directory), "select 1", "--db", "tinystore-jobs")
    assert "no database 'tinystore-jobs' (it is made when the store first opens a queue)" in done.stderr
    assert "--write" not in done.stderr  # the store makes it, not --write
    done = run_cli("sql", str(directory), "select 1", "--db", "BAD")  # trial AH: "no database 'BAD'"
    assert "database name 'BAD': names are 1 to 64 characters" in done.stderr, done.stderr


async def test_status_of_a_directory_whose_owner_does_not_serve_says_so(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        # trial DH: taken moments ago (under 10 s), it was said to be "most likely still starting", to be opened
        # again in a moment, though it was open and would never serve: its server/unserved says so at once
        done = await asyncio.to_thread(run_cli, "status", str(directory))
        assert (directory / "server" / "unserved").read_text() == f"{os.getpid()}\n"
        # trial DI: another program's tinystore.open() (the sidecar's way) still waited 10 s to be told so
        script = (
            "import asyncio, sys, time, tinystore\n"
            "began = time.monotonic()\n"
            "try:\n"
            f"    asyncio.run(tinystore.open({str(directory)!r}))\n"
            "except tinystore.InUseError as exc:\n"
            "    print(round(time.monotonic() - began, 1), exc.message)\n"
        )
        other = await asyncio.to_thread(
            subprocess.run, [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
        took, _, message = other.stdout.partition(" ")
        assert float(took) < 5 and "which does not serve its socket (an embedded store opened with serve=False" in (
            message
        ), other
    finally:
        await store.close()
    assert not (directory / "server" / "unserved").exists()
    assert done.returncode == 1, done.stdout
    assert done.stderr.startswith(f"error[in_use] store {directory}: the directory is owned by another process")
    assert f"(pid {os.getpid()}), which does not serve its socket (an embedded store opened with serve=False" in (
        done.stderr
    )
    assert "instead of owning it" not in done.stderr


# contract: STORE-02
async def test_status_shows_the_limits_the_server_holds_to(tmp_path: Path) -> None:
    """Trial IA: an operator could not see, short of Python, that a `serve --limits` had taken."""
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True, limits=tinystore.Limits(tx_idle=2, readers=3))
    try:
        assert (await store.status())["limits"]["tx_idle"] == 2.0
        done = await asyncio.to_thread(run_cli, "status", str(directory))
        assert done.returncode == 0, done.stderr
        assert re.search(r"^limits tx_idle 2(\.0)?  readers 3$", done.stdout, re.M), done.stdout
        # the files open and the process's limit, which the connections and the databases' files share (trial IE)
        assert re.search(r"^files \d+ open of the [\d,]+ this process may open$", done.stdout, re.M), done.stdout
        done = await asyncio.to_thread(run_cli, "status", str(directory), "--json")
        assert json.loads(done.stdout)["limits"]["readers"] == 3
        files = json.loads(done.stdout)["files"]
        assert 0 < files["open"] < files["limit"], files
    finally:
        await store.close()
    done = await asyncio.to_thread(run_cli, "status", str(directory))  # (opened by the command: the defaults)
    assert re.search(r"^limits the defaults$", done.stdout, re.M), done.stdout


async def test_status_without_a_server_says_so(tmp_path: Path) -> None:
    directory = await _store_with(tmp_path, "app")
    done = run_cli("status", str(directory))
    assert done.returncode == 0 and "no server runs: this command opened the store itself" in done.stdout
    st = json.loads(run_cli("status", str(directory), "--json").stdout)
    assert st["server_running"] is False
    # the SQLite its SQL is (trial GN: a migration's default of a later SQLite's was NULL here)
    assert st["sqlite_version"] == sqlite3.sqlite_version and sqlite3.sqlite_version in done.stdout  # (rich may wrap)


async def test_status_without_a_server_lists_the_queues(tmp_path: Path) -> None:
    # (trial EP: a served store listed its queues, the same store with no server listed none)
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True)
    await store.queue("mail", dict).add({"to": "a"})
    await store.close()
    queues = json.loads(run_cli("status", str(directory), "--json").stdout)["jobs"]["queues"]
    assert [(q["queue"], q["queued"]) for q in queues] == [("mail", 1)], queues
    assert "mail" in run_cli("status", str(directory)).stdout
    # and a store with no queue gets no jobs database from a status, nor from a list of its jobs
    other = await _store_with(tmp_path / "other", "app")
    assert run_cli("status", str(other), "--json").returncode == 0
    assert run_cli("jobs", str(other), "list").returncode == 0
    assert sorted(p.name for p in (other / "sql").iterdir()) == ["app.db"]


async def test_a_queue_whose_database_is_not_a_database_does_not_hide_the_others(tmp_path: Path) -> None:
    # trial FQ: a missing file was passed over (FF), but one that is not a database failed the list, the queues, and
    # show or cancel of a job of another queue
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True, serve=False)
    db = await store.database("app")
    await store.queue("mail", dict, database=db).add({"to": "a"})
    kept = await store.queue("other", dict).add({"to": "b"})  # (in the store's own jobs database)
    await store.close()
    for f in (directory / "sql").glob("app.db-*"):
        f.unlink()
    (directory / "sql" / "app.db").write_bytes(b"not a database" * 300)
    done = run_cli("jobs", str(directory), "list", "--json")
    assert done.returncode == 0, done.stderr
    assert [json.loads(x)["id"] for x in done.stdout.splitlines()] == [kept], done.stdout
    assert done.stderr.count("database app: file is not a database") == 1, done.stderr  # (FQ, FS: twice)
    done = run_cli("jobs", str(directory), "queues", "--json")
    assert done.returncode == 0, done.stderr
    lines = {q["queue"]: q for q in map(json.loads, done.stdout.splitlines())}
    assert "not a database" in lines["mail"]["error"] and lines["other"]["counts"]["queued"] == 1, lines
    done = run_cli("jobs", str(directory), "show", kept)
    assert done.returncode == 0 and kept in done.stdout, done.stderr
    done = run_cli("jobs", str(directory), "cancel", kept)
    assert done.returncode == 0 and "cancelled" in done.stdout, done.stderr
    # and a status lists the queue, saying why it could not be loaded (trial FS: left out)
    done = run_cli("status", str(directory), "--json")
    assert done.returncode == 0, done.stderr
    listed = {q["queue"]: q for q in json.loads(done.stdout)["jobs"]["queues"]}
    assert "not a database" in (listed["mail"]["error"] or "") and listed["other"]["error"] is None, listed


async def test_a_queue_whose_tables_went_with_its_emptied_file_is_not_made_anew(tmp_path: Path) -> None:
    # trial FS: an application database emptied (or replaced) under a queue was given the queue's tables anew by a
    # look (tinystore jobs queues), its jobs gone without a word
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True, serve=False)
    db = await store.database("app")
    job = await store.queue("mail", dict, database=db).add({"to": "a"})
    await store.close()
    for f in (directory / "sql").glob("app.db-*"):
        f.unlink()
    (directory / "sql" / "app.db").write_bytes(b"")
    done = run_cli("jobs", str(directory), "queues", "--json")
    assert done.returncode == 0, done.stderr
    line = json.loads(done.stdout.splitlines()[0])
    assert "its jobs' tables are missing from database app" in (line.get("error") or ""), line
    with sqlite3.connect(directory / "sql" / "app.db") as conn:  # the queue's tables not made there
        assert not conn.execute("select name from sqlite_master where name like '_tinystore_job%'").fetchall()
    done = run_cli("jobs", str(directory), "show", job)
    assert done.returncode == 1 and "tables are missing" in done.stderr, done.stderr
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        with pytest.raises(tinystore.UnavailableError, match=r"was its file \(app\.db\) replaced or emptied"):
            await store.queue("mail", dict, database=await store.database("app")).add({"to": "b"})
    finally:
        await store.close()
    # the way out it names: the file deleted, the application's database() makes it anew, and the queue's tables
    # with it (trial FB: said loudly)
    for f in (directory / "sql").glob("app.db*"):
        f.unlink()
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        queue = store.queue("mail", dict, database=await store.database("app"))
        again = await queue.add({"to": "c"})
        assert [j.id for j in (await queue.list()).jobs] == [again]
    finally:
        await store.close()


async def test_a_queue_whose_database_is_missing_is_not_made_again_by_a_look(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # known low: an offline status of a store whose queue's application database was moved away loaded the queue,
    # which made an empty app.db in its place; the file could not be put back over it without losing what it took
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True, serve=False)
    db = await store.database("app", migrations=[("001.sql", "create table t (a);")])
    job = await store.queue("mail", dict, database=db).add({"to": "a"})
    kept = await store.queue("other", dict).add({"to": "b"})  # (in the store's own jobs database)
    await store.close()
    moved = tmp_path / "moved"
    moved.mkdir()
    for f in (directory / "sql").glob("app.db*"):
        f.rename(moved / f.name)
    done = run_cli("status", str(directory), "--json")
    assert done.returncode == 0, done.stderr
    listed = {q["queue"]: q for q in json.loads(done.stdout)["jobs"]["queues"]}
    assert "queue mail: its jobs' database app is missing: no file" in (listed["mail"]["error"] or ""), listed
    assert "database app is missing" not in done.stderr  # (told in the status, once)
    done = run_cli("jobs", str(directory), "queues", "--json")
    assert done.returncode == 0, done.stderr
    line, _ = [json.loads(x) for x in done.stdout.splitlines()]
    assert line["queue"] == "mail" and line["counts"] == {} and "database app is missing" in line["error"], line
    # a list of every queue's jobs lists the others', saying which queue it could not read (trial FF: it failed whole)
    done = run_cli("jobs", str(directory), "list", "--json")
    assert done.returncode == 0, done.stderr
    assert [json.loads(x)["id"] for x in done.stdout.splitlines()] == [kept], done.stdout
    assert "queue mail: its jobs' database app is missing" in done.stderr, done.stderr
    done = run_cli("jobs", str(directory), "list", "--queue", "mail")
    assert done.returncode == 1 and "error[unavailable] queue mail: its jobs' database app is missing" in done.stderr
    done = run_cli("jobs", str(directory), "show", kept)
    assert done.returncode == 0 and kept in done.stdout, done.stderr
    done = run_cli("jobs", str(directory), "show", job)  # (it may be in mail's: not "no such job")
    assert done.returncode == 1 and "in no queue that can be read; queue mail: its jobs' database app" in done.stderr
    assert sorted(p.name for p in (directory / "sql").iterdir()) == ["tinystore-jobs.db"]  # nothing made
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        with pytest.raises(tinystore.UnavailableError, match="queue mail: its jobs' database app is missing"):
            await store.queue("mail", dict).add({"to": "b"})
    finally:
        await store.close()
    for f in moved.iterdir():  # put back: the job is there
        f.rename(directory / "sql" / f.name)
    rows = [json.loads(x) for x in run_cli("jobs", str(directory), "list", "--json").stdout.splitlines()]
    assert [r["id"] for r in rows] == [kept, job], rows
    # the application's own database() makes it anew, as any database that does not exist, saying loudly that a
    # queue's jobs were in a file of that name (trial FB: the queue went on in the new file without a word)
    for f in (directory / "sql").glob("app.db*"):
        f.rename(moved / f.name)
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        with caplog.at_level("WARNING", logger="tinystore"):
            await store.database("app")
        assert "database app was made anew, empty, but queue(s) mail kept their jobs in a database of that" in (
            caplog.text
        )
        caplog.clear()
        with caplog.at_level("WARNING", logger="tinystore"):
            await store.database("other")  # (no queue's: nothing said)
        assert "made anew" not in caplog.text
    finally:
        await store.close()


async def test_stop_takes_a_duration_for_grace(tmp_path: Path) -> None:
    directory = tmp_path / "store"
    server = popen_cli("serve", str(directory))
    try:
        for _ in range(200):
            if run_cli("status", str(directory), "--json").stdout.count('"server_running": true'):
                break
            await asyncio.sleep(0.05)
        done = run_cli("stop", str(directory), "--grace", "2s")
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == f"stopped the server of {directory}"  # the command's result: on stdout
        assert server.wait(10) == 0
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    done = run_cli("stop", str(directory), "--grace", "soon")
    assert done.returncode == 1 and "error[invalid] --grace: cannot read 'soon' as a duration" in done.stderr


# contract: SQL-04
async def test_sql_json_keeps_every_column_of_a_name_that_comes_again(tmp_path: Path) -> None:
    # from trial EP: the JSON object kept the last of the columns named alike ({"a": 2, "b": 3}); a join lost ids
    directory = await _store_with(tmp_path, "app")
    done = run_cli("sql", str(directory), "--db", "app", "--json", "select 1 as a, 2 as a, 3 as b, 4 as a_2")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"a": 1, "a_2": 2, "b": 3, "a_2_2": 4}


async def test_sql_parameters_of_named_placeholders_are_name_equals_value(tmp_path: Path) -> None:
    """Trial HZ: named placeholders were refused; the command line takes their values as NAME=VALUE."""
    directory = await _store_with(tmp_path, "app")
    run_cli("sql", str(directory), "--db", "app", "--write", "create table p (k, v)")
    done = run_cli("sql", str(directory), "--db", "app", "--write", "insert into p values (:k, @v)", "k=007", ":v=1.5")
    assert done.returncode == 0, done.stderr
    done = run_cli("sql", str(directory), "--db", "app", "--json", "--text", "select :k as k", "k=007")
    assert json.loads(done.stdout) == {"k": "007"}
    done = run_cli("sql", str(directory), "--db", "app", "--json", "select k, v from p where k = $k", "k=7")
    assert json.loads(done.stdout) == {"k": 7, "v": 1.5}
    done = run_cli("sql", str(directory), "--db", "app", "select :k", "7")
    assert done.returncode == 1 and "placeholders are named (:k): give each parameter as NAME=VALUE (k=...)" in (
        done.stderr
    )
    done = run_cli("sql", str(directory), "--db", "app", "select :k", "j=7")
    assert done.returncode == 1 and "binding parameter :k" in done.stderr
    done = run_cli("sql", str(directory), "--db", "app", "select :k", "k=1", "k=2")  # (trial IC: the last won)
    assert done.returncode == 1 and "parameter k: given more than once" in done.stderr
    done = run_cli("sql", str(directory), "--db", "app", "--json", "select :é as e", "é=1")  # (trial ID)
    assert json.loads(done.stdout) == {"e": 1}, done.stderr


async def test_sql_parameters_are_ints_only_when_ascii_digits(tmp_path: Path) -> None:
    # from trial AM: Python's int() read "1_000", " 7" and digits of other scripts as ints
    directory = await _store_with(tmp_path, "app")
    run_cli("sql", str(directory), "--db", "app", "--write", "create table p (v)")
    for text in ["1_000", " 7", "０７", "٣", "nan", "inf", "12", "-3", "1.5", "-2e3"]:
        done = run_cli("sql", str(directory), "--db", "app", "--write", "insert into p values (?)", "--", text)
        assert done.returncode == 0, done.stderr
    done = run_cli("sql", str(directory), "--db", "app", "--json", "select v, typeof(v) as type from p order by rowid")
    got = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(g["v"], g["type"]) for g in got] == [
        ("1_000", "text"),
        (" 7", "text"),
        ("０７", "text"),
        ("٣", "text"),
        ("nan", "text"),
        ("inf", "text"),
        (12, "integer"),
        (-3, "integer"),
        (1.5, "real"),
        (-2000.0, "real"),
    ]
    done = run_cli("sql", str(directory), "--db", "app", "--write", "insert into p values (?)", "9223372036854775808")
    assert done.returncode == 1 and "parameter 1: 9223372036854775808 is past 64 bits" in done.stderr
    assert "--text" in done.stderr
    done = run_cli("sql", str(directory), "--db", "app", "--write", "insert into p values (?)", "--", "-1e999")
    assert done.returncode == 1 and "parameter 1: -1e999 is past what a float holds" in done.stderr


async def test_a_quoted_tilde_is_the_home_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A script that quotes its path (``tinystore sql "~/store" ...``) meant the home folder's store, as
    ``tinystore.open("~/store")`` does; it reached the CLI as a folder named ``~`` ("no such directory")."""
    directory = await _store_with(tmp_path, "app")
    monkeypatch.setenv("HOME", str(tmp_path))
    done = run_cli("sql", "~/store", "select count(*) as n from t", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == {"n": 3}
    done = run_cli("jobs", "~/store", "list", "--json")
    assert done.returncode == 0, done.stderr
    assert not (Path.cwd() / "~").exists() and directory.exists()


async def test_a_command_whose_output_is_closed_or_whose_reader_left_ends_quietly(tmp_path: Path) -> None:
    """From trial AX: with stdout closed (`>&-`, as daemon wrappers start a server) every command died at import
    with a traceback; with its reader gone (`| head -1`), `status` and `sql` exited 1 saying nothing."""
    import subprocess
    import sys

    directory = await _store_with(tmp_path, "main")
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        db = await store.database("main")
        await db.exec(
            "insert into t (a) with recursive c(x) as (select 1 union all select x + 1 from c where x < 5000) "
            "select x from c"
        )
    finally:
        await store.close()
    for args in (["--version"], ["status", str(directory)], ["sql", str(directory), "select * from t"]):
        closed = await asyncio.to_thread(
            subprocess.run,
            ["sh", "-c", 'exec "$0" -m tinystore "$@" >&-', sys.executable, *args],
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
        assert closed.returncode == 0 and "Traceback" not in closed.stderr, (args, closed.stderr)
        if args == ["--version"]:
            continue  # (click's own option: exits 1 when its reader left, as click does)
        reader_gone = subprocess.Popen(
            [sys.executable, "-m", "tinystore", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        assert reader_gone.stdout is not None
        reader_gone.stdout.close()  # the reader left before reading anything
        _, err = await asyncio.to_thread(reader_gone.communicate, timeout=60)
        assert reader_gone.returncode == 0 and err == b"", (args, reader_gone.returncode, err)


async def test_messages_on_stderr_are_one_line_whatever_their_length(tmp_path: Path) -> None:
    # from trial AX: written to a file, a backup's summary was folded at 80 columns, its path cut in two
    directory = await _store_with(tmp_path, "main")
    dest = tmp_path / ("a-destination-with-a-name-long-enough-to-pass-eighty-columns-" + "x" * 40)
    done = await asyncio.to_thread(run_cli, "backup", str(directory), str(dest))
    assert done.returncode == 0, done.stderr
    lines = (done.stdout + done.stderr).strip().splitlines()
    assert any(str(dest) in line for line in lines), lines


def test_an_empty_path_argument_is_refused_naming_it(tmp_path: Path) -> None:
    # from trial AX: `backup DIR ""` took "" for the current folder and said it was inside the store
    for args, name in ((["backup", str(tmp_path), ""], "DEST"), (["status", ""], "DIRECTORY")):
        done = run_cli(*args)
        assert done.returncode == 1 and done.stderr == f"error[invalid] {name}: '' is no path\n", done.stderr


@pytest.mark.parametrize(
    "args", [["serve", "tcp://127.0.0.1:7600"], ["stop", "tls://h:7600"], ["backup", "tcp://h:1", "/tmp/b"]]
)
def test_an_address_for_a_directory_says_the_command_takes_a_directory(tmp_path: Path, args: list[str]) -> None:
    # from trial BL: "no such directory tcp:/127.0.0.1:7600 (to make a store there: tinystore serve tcp:/…)"
    done = run_cli(*args)
    assert done.returncode == 1
    assert f"{args[1]}: `tinystore {args[0]}` takes a store's directory, not an address" in done.stderr, done.stderr
    assert "status, sql, jobs, channels and lock also take tcp:// and tls:// addresses" in done.stderr
    done = run_cli("status", "http://h:1")
    assert done.returncode == 1 and "http://h:1: an address is tcp://HOST:PORT or tls://HOST:PORT" in done.stderr
    # (trial CK: an address as DEST made a folder named "tcp:")
    done = run_cli("backup", str(tmp_path), "tcp://127.0.0.1:7600")
    assert done.returncode == 1 and "DEST tcp://127.0.0.1:7600: an address; a backup is written" in done.stderr
    assert not (Path.cwd() / "tcp:").exists()
    # (trial CK: one slash was a directory to make a store in; "tcp://" said "no scheme")
    done = run_cli("status", "tcp:/127.0.0.1:7600")
    assert done.returncode == 1 and "tcp:/127.0.0.1:7600: an address needs // after its scheme" in done.stderr
    done = run_cli("status", "tcp://", env={"TINYSTORE_TOKEN": "x" * 20})
    assert done.returncode == 1 and "(no host and port after the scheme)" in done.stderr, done.stderr


async def test_a_statement_that_starts_with_a_line_comment_is_the_statement(tmp_path: Path) -> None:
    # trial CZ: click took it for an option: "No such option '-- how many rows\nselect ...'", exit 2
    async with await tinystore.open(tmp_path / "s", embedded=True, serve=False) as store:
        await (await store.database("main")).exec("create table t (x)")
    statement = "-- how many rows\nselect count(*) as n from t where ? = ?"
    done = run_cli("sql", str(tmp_path / "s"), statement, "-- a", "-- a", "--json")
    assert done.returncode == 0 and json.loads(done.stdout) == {"n": 0}, done.stderr
    done = run_cli("sql", str(tmp_path / "s"), "select 1", "--wirte")  # a mistyped option is still one
    assert done.returncode == 2 and "No such option '--wirte'" in done.stderr, done.stderr


async def test_open_tells_of_the_command_that_held_the_store_for_all_of_its_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # trial DE: open() gave up naming "a sidecar still starting on a busy machine" while `tinystore sql` ran on
    import tinystore.client.store as client_store

    async with await tinystore.open(tmp_path / "s", embedded=True, serve=False) as store:
        await (await store.database("main")).exec("create table t (x)")
    endless = "with recursive c(x) as (select 1 union all select x + 1 from c) select count(*) from c"
    command = popen_cli("sql", str(tmp_path / "s"), endless)
    try:
        deadline = time.monotonic() + 10
        while (tmp_path / "s" / "LOCK").read_text().strip() != str(command.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # (its statement begun)
        real = client_store.ensure_server

        async def short(directory: Path, sock: Path, extra: list[str], timeout: float = 20.0, **kw: Any) -> Path:
            return await real(directory, sock, extra, timeout=1.0, **kw)

        monkeypatch.setattr(client_store, "ensure_server", short)
        with pytest.raises(tinystore.UnavailableError) as caught:
            await tinystore.open(tmp_path / "s")
        message = caught.value.message
        assert f"the command `tinystore sql` (pid {command.pid}) has held the store for all of the 1s" in message
        assert "tinystore serve" in message, message
    finally:
        command.kill()
        command.wait()


async def test_a_file_the_store_does_not_open_is_not_a_database_for_the_default(tmp_path: Path) -> None:
    # trial DE: App.db (not a database name; the store skips it) made `--db` default to main, "databases: App, app"
    async with await tinystore.open(tmp_path / "s", embedded=True, serve=False) as store:
        await (await store.database("app")).exec("create table t (x)")
    (tmp_path / "s" / "sql" / "App.db").write_bytes((tmp_path / "s" / "sql" / "app.db").read_bytes())
    done = run_cli("sql", str(tmp_path / "s"), "select count(*) as n from t", "--json")
    assert done.returncode == 0 and json.loads(done.stdout) == {"n": 0}, done.stderr


async def test_max_running_out_of_bounds_is_told_in_the_apis_terms(tmp_path: Path) -> None:
    # trial DE: "1000001 is not between 0 (no limit) and 1,000,000", where this API refuses 0
    async with await tinystore.open(tmp_path / "s", embedded=True, serve=False) as store:
        for bad in (0, 1_000_001):
            with pytest.raises(tinystore.InvalidError, match=rf"max_running: {bad} is not between 1 and 1,000,000 \("):
                store.queue("q", max_running=bad)


async def test_a_large_result_shows_its_first_rows_and_says_how_many_more(tmp_path: Path) -> None:
    # (trial EP: a table of 100,000 rows was laid out whole before anything printed: 40 s)
    directory = await _store_with(tmp_path, "app")
    done = run_cli(
        "sql",
        str(directory),
        "--db",
        "app",
        "with recursive c(x) as (select 1 union all select x + 1 from c where x < 1005) select x from c",
    )
    assert done.returncode == 0, done.stderr
    shown = [int(cell) for cell in re.findall(r"^│ (\d+)\s*│$", done.stdout, re.M)]
    assert shown == list(range(1, 1001))
    assert done.stderr == "showing the first 1,000 of 1,005 rows: --json prints them all (or add a LIMIT)\n"
    every = run_cli("sql", str(directory), "--db", "app", "--json", "select x from (select 1 as x)")
    assert every.stdout == '{"x": 1}\n' and every.stderr == ""


async def test_a_cell_wider_than_the_terminal_folds_and_is_never_cut(tmp_path: Path) -> None:
    # (trial EP: on a narrow terminal, numbers were cut to "12345…")
    directory = await _store_with(tmp_path, "app")
    digits = "1234567890" * 40  # wider than any terminal the command lays its table out for
    done = run_cli("sql", str(directory), "--db", "app", "select ? as n", "--text", digits)
    assert done.returncode == 0, done.stderr
    assert "…" not in done.stdout
    assert "".join(re.findall(r"│ (\d+)\s*│", done.stdout)) == digits


async def test_a_read_run_with_write_prints_its_rows_alone(tmp_path: Path) -> None:
    # known low: `--write --json` on a select printed {"changes": 0, "last_insert_rowid": 0} after the rows, which a
    # script reading JSON lines took for one more row
    directory = await _store_with(tmp_path, "app")
    done = run_cli("sql", str(directory), "select a from t where b = 3", "--write", "--json")
    assert done.returncode == 0, done.stderr
    assert [json.loads(line) for line in done.stdout.splitlines()] == [{"a": "two\nlines \x1b[2J \u202e"}]
    done = run_cli("sql", str(directory), "select count(*) as n from t", "--write")
    assert done.returncode == 0 and "changed" not in done.stdout, done.stdout
    # nor when it matched no row (trial FF: it printed {"changes": 0, ...}, one line a script took for a row)
    done = run_cli("sql", str(directory), "select a from t where b = 99", "--write", "--json")
    assert done.returncode == 0 and done.stdout == "", done.stdout
    done = run_cli("sql", str(directory), "with x(n) as (select 1) select n from x where n > 1", "--write")
    assert done.returncode == 0 and "changed" not in done.stdout, done.stdout
    # a PRAGMA that sets goes to the writer, and a write that starts with WITH is a write
    done = run_cli("sql", str(directory), "pragma user_version = 7", "--write", "--json")
    assert done.returncode == 0 and json.loads(done.stdout)["changes"] == 0, done.stdout + done.stderr
    assert run_cli("sql", str(directory), "pragma user_version", "--json").stdout == '{"user_version": 7}\n'
    done = run_cli("sql", str(directory), "with x(n) as (select 5) insert into t select n, n from x", "--write")
    assert done.returncode == 0 and "1 row(s) changed" in done.stdout, done.stdout
    done = run_cli("sql", str(directory), "delete from t where b = 5", "--write", "--json")
    assert json.loads(done.stdout)["changes"] == 1, done.stdout
    # a write still ends with what it changed, rows returned or not
    done = run_cli("sql", str(directory), "insert into t values (4, 4) returning b", "--write", "--json")
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert lines == [{"b": 4}, {"changes": 1, "last_insert_rowid": 4}], lines
    done = run_cli("sql", str(directory), "delete from t where b = 4", "--write", "--json")
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 1 and lines[0]["changes"] == 1, lines
    # a write that returned no row says it changed none (trial FB: it printed nothing at all)
    done = run_cli("sql", str(directory), "delete from t where b = 99 returning *", "--write", "--json")
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(lines) == 1 and lines[0]["changes"] == 0, lines


async def test_more_columns_than_the_width_holds_are_shown_as_records(tmp_path: Path) -> None:
    # known low: 30 columns in a narrow terminal came out as a table of cells folded a character a line, some blank;
    # a table that has no room for each column shows one record after another, a line a column (psql's \x)
    directory = tmp_path / "store"
    store = await tinystore.open(directory, embedded=True, serve=False)
    try:
        table = "create table t (" + ", ".join(f"column_{i} text" for i in range(40)) + ");"
        db = await store.database("app", migrations=[("001.sql", table)])
        await db.exec("insert into t values (" + ", ".join("?" * 40) + ")", *[f"value_{i}" for i in range(40)])
        await db.exec("insert into t (column_0) values ('second')")
    finally:
        await store.close()
    done = run_cli("sql", str(directory), "select * from t")  # (not a terminal: 200 columns wide)
    assert done.returncode == 0, done.stderr
    lines = [line.split() for line in done.stdout.splitlines()]
    assert ["row", "1"] in lines and ["row", "2"] in lines, done.stdout
    for i in range(40):
        assert [f"column_{i}", f"value_{i}"] in lines, done.stdout
    assert ["column_0", "second"] in lines and ["column_39", "NULL"] in lines
    # a name wider than its column folds, never cut (trial FB: two long names cut alike read as one)
    long = ", ".join(f"{i} as customer_billing_address_line_{i}_of_the_account_holder_{'x' * 40}" for i in range(40))
    done = run_cli("sql", str(directory), f"select {long}")
    assert done.returncode == 0, done.stderr
    for i in range(40):
        assert f"customer_billing_address_line_{i}_of_the_account_holder_" in done.stdout, done.stdout
    assert done.stdout.count("x") == 40 * 40, done.stdout  # every name whole, its end on the lines below
    done = run_cli("sql", str(directory), "select column_0, column_1 from t")  # room enough: a table
    assert "┃ column_0 ┃ column_1 ┃" in done.stdout, done.stdout


def test_a_key_json_writes_as_text_is_printed_as_that_text() -> None:
    # trial FS: a datetime key (from a client that did not check) was printed with its quotes inside the key
    from tinystore.cli import to_json

    printed = to_json({dt.datetime(2020, 1, 1, tzinfo=dt.UTC): 1, (1, 2): 3, uuid.UUID(int=1): 2, b"ab": 4})
    assert json.loads(printed) == {
        "2020-01-01T00:00:00+00:00": 1,
        "[1, 2]": 3,
        "00000000-0000-0000-0000-000000000001": 2,
        "6162": 4,
    }


# contract: STORE-01
def test_status_require_server_exits_3_without_opening_the_store_when_no_server_runs(tmp_path: Path) -> None:
    # trial IT: a health check read status 0 from a store the command opened itself, no server running
    directory = tmp_path / "s"
    server = ServerProcess(directory).start()
    try:
        done = run_cli("status", str(directory), "--require-server", "--json")
        assert done.returncode == 0 and json.loads(done.stdout)["server_running"] is True, done.stderr
    finally:
        server.stop()
    epoch = (directory / "EPOCH").read_text()
    done = run_cli("status", str(directory), "--require-server")
    assert done.returncode == 3 and "no server is running there" in done.stderr, done.stderr
    assert "the store was not opened" in done.stderr and done.stdout == ""
    assert (directory / "EPOCH").read_text() == epoch  # (not opened: no new epoch)
    assert run_cli("status", str(directory)).returncode == 0  # (without the flag: opened by the command, as before)
