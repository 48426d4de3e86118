"""The commands that reach a store through its server (status, sql, jobs, channels, lock) take its address in
place of DIRECTORY, with the token in ``$TINYSTORE_TOKEN``: the command line of a store served on another
machine (it took a directory only, and said to use the SDK)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

from ..helpers import ServerProcess, write_tokens
from .support import popen_cli, run_cli


# contract: STORE-03
def test_the_command_line_reaches_a_server_by_its_address(tmp_path: Path) -> None:
    tokens, admin, data = write_tokens(tmp_path)
    server = ServerProcess(tmp_path / "s", "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens)).start()
    try:
        at = server.tcp
        done = run_cli("status", at)
        assert done.returncode == 1 and "set $TINYSTORE_TOKEN to one of the server's tokens" in done.stderr
        done = run_cli("status", at, env={"TINYSTORE_TOKEN": "x" * 32})
        assert done.returncode == 1 and done.stderr.startswith("error[unauthenticated]"), done.stderr

        as_admin, as_data = {"TINYSTORE_TOKEN": admin}, {"TINYSTORE_TOKEN": data}
        done = run_cli("sql", at, "create table t (x)", "--write", "--create", env=as_data)
        assert done.returncode == 1 and "needs the admin capability" in done.stderr, done.stderr
        done = run_cli("sql", at, "create table t (x)", "--write", "--create", env=as_admin)
        assert done.returncode == 0, done.stderr
        done = run_cli("sql", at, "insert into t values (?)", "7", "--write", env=as_data)
        assert done.returncode == 0, done.stderr
        done = run_cli("sql", at, "select x from t", "--json", env=as_data)
        assert done.returncode == 0 and done.stdout == '{"x": 7}\n', done.stderr
        # a blank around the token (a line end the shell kept) is not part of it (trial FK: "the token is wrong")
        done = run_cli("sql", at, "select x from t", "--json", env={"TINYSTORE_TOKEN": f" {data}\n"})
        assert done.returncode == 0 and done.stdout == '{"x": 7}\n', done.stderr
        done = run_cli("sql", at, "select 1", "--db", "nope", env=as_data)
        assert done.returncode == 1 and "no database 'nope' (databases: main;" in done.stderr, done.stderr

        done = run_cli("status", at, "--json", env=as_data)
        assert done.returncode == 0 and "main" in json.loads(done.stdout)["databases"], done.stderr
        done = run_cli("jobs", at, "queues", "--json", env=as_data)
        assert done.returncode == 0, done.stderr
        done = run_cli("jobs", at, "configure", "q", "--attempts", "3", env=as_data)
        assert done.returncode == 1 and "admin" in done.stderr, done.stderr

        listener = popen_cli(
            "channels", at, "subscribe", "news", "--for", "10s", stdout=subprocess.PIPE, env={**os.environ, **as_data}
        )
        try:
            assert listener.stdout is not None
            deadline = time.monotonic() + 15
            while json.loads(run_cli("status", at, "--json", env=as_data).stdout)["channels"]["subscriptions"] < 1:
                assert listener.poll() is None and time.monotonic() < deadline, "the CLI did not subscribe"
                time.sleep(0.1)
            done = run_cli("channels", at, "publish", "news", '{"a": 1}', env=as_data)
            assert done.returncode == 0, done.stderr
            assert json.loads(listener.stdout.readline())["value"] == {"a": 1}
        finally:
            listener.terminate()
            listener.wait(10)

        started = time.monotonic()
        done = run_cli("lock", at, "hold", "nightly", "k", "--", "sh", "-c", "echo $TINYSTORE_FENCE", env=as_data)
        assert done.returncode == 0 and int(done.stdout) > 0, done.stderr
        assert time.monotonic() - started < 15
    finally:
        assert server.stop() == 0
