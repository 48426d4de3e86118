"""A COMMIT whose fsync of the WAL fails (EIO, injected by a shim preloaded into the server process).

Its frames are in the WAL file all the same, and the next start finds and keeps them: the writes of that commit
were answered with a definite failure, and came back after a ``kill -9``. Now they get ``OutcomeUnknownError``, and
the database takes no more writes until the store restarts (a later commit would write over those frames: what
was kept would then depend on when the crash came), reads go on, and ``status`` says why."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

import tinystore

from ..helpers import ServerProcess, write_tokens

SHIM = r"""
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The next fsync or fdatasync of a file whose path ends with $TS_FAIL_SUFFIX fails with EIO, syncing nothing,
   when the file $TS_FAIL_TRIGGER exists (removed then: once a trigger). */
static int fail_now(int fd) {
    const char *trigger = getenv("TS_FAIL_TRIGGER"), *suffix = getenv("TS_FAIL_SUFFIX");
    char link[64], path[4096];
    if (!trigger || !suffix) return 0;
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    if (n <= 0) return 0;
    path[n] = 0;
    size_t ls = strlen(suffix);
    if ((size_t)n < ls || strcmp(path + n - ls, suffix) != 0) return 0;
    return unlink(trigger) == 0;
}

int fdatasync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    if (fail_now(fd)) { errno = EIO; return -1; }
    return real(fd);
}

int fsync(int fd) {
    static int (*real)(int);
    if (!real) real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    if (fail_now(fd)) { errno = EIO; return -1; }
    return real(fd);
}
"""


@pytest.fixture(scope="module")
def shim(tmp_path_factory: pytest.TempPathFactory) -> Path:
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.fail("gcc is needed to build the fsync shim (./scripts/test installs it)")
    d = tmp_path_factory.mktemp("shim")
    (d / "failsync.c").write_text(SHIM)
    subprocess.run(
        [gcc, "-shared", "-fPIC", "-O2", "-o", str(d / "failsync.so"), str(d / "failsync.c"), "-ldl"], check=True
    )
    return d / "failsync.so"


class Failing:
    def __init__(self, trigger: Path, server: ServerProcess, store: tinystore.Store) -> None:
        self.trigger, self.server, self.store = trigger, server, store

    def fail_next_sync(self) -> None:
        self.trigger.touch()


@pytest.fixture(params=["sidecar", "tcp"])
async def failing(request: pytest.FixtureRequest, tmp_path: Path, shim: Path) -> AsyncIterator[Failing]:
    import os

    d = tmp_path / "store"
    trigger = tmp_path / "fail-next-sync"
    env = dict(os.environ, LD_PRELOAD=str(shim), TS_FAIL_TRIGGER=str(trigger), TS_FAIL_SUFFIX=".db-wal")
    if request.param == "tcp":
        tokens, admin, _ = write_tokens(tmp_path)
        server = ServerProcess(d, "--listen", "tcp://127.0.0.1:0", "--tokens", str(tokens), env=env).start()
        store = await tinystore.connect(server.tcp, token=admin)
    else:
        server = ServerProcess(d, env=env).start()
        store = await tinystore.open(d)
    try:
        yield Failing(trigger, server, store)
    finally:
        await store.close()
        server.kill()


async def _rows(directory: Path) -> list[str]:
    store = await tinystore.open(directory, embedded=True)
    try:
        db = await store.database("app")
        return [r["v"] for r in await db.all("select v from t order by id")]
    finally:
        await store.close()


# contract: SQL-02
async def test_writes_of_a_commit_whose_fsync_failed_are_unknown_and_the_database_stops_writing(
    failing: Failing,
) -> None:
    store = failing.store
    db = await store.database("app", migrations=[("1.sql", "create table t (id integer primary key, v text)")])
    await db.exec("insert into t (v) values ('before')")

    failing.fail_next_sync()
    got = await asyncio.gather(
        *(db.exec("insert into t (v) values (?)", f"during {i}") for i in range(5)), return_exceptions=True
    )
    assert not failing.trigger.exists()
    for r in got:
        assert isinstance(r, tinystore.OutcomeUnknownError), r
        assert "may have been kept or not" in r.message and "SQLITE_IOERR_FSYNC" in r.message

    # nothing more is written until a restart, and the refusals say why; reads go on
    with pytest.raises(tinystore.UnavailableError, match="restart the store"):
        await db.exec("insert into t (v) values ('after')")

    async def in_tx(tx: Any) -> None:
        await tx.exec("insert into t (v) values ('in a transaction')")

    with pytest.raises(tinystore.UnavailableError, match="takes no more writes"):
        await db.tx(in_tx)
    assert await db.scalar("select count(*) from t") == 1
    status = (await store.status())["databases"]["app"]
    assert "file system failed a commit" in status["broken"]
    other = await store.database("other", migrations=[("1.sql", "create table u (x)")])
    await other.exec("insert into u values (1)")  # another database writes on

    failing.server.kill()  # kill -9: the next start settles the unknown commit, all of it or none of it
    rows = await _rows(failing.server.directory)
    assert rows[0] == "before" and "after" not in rows and "in a transaction" not in rows
    assert rows[1:] in ([], [f"during {i}" for i in range(5)]), rows


# contract: SQL-01
async def test_a_transaction_whose_commit_fsync_failed_is_unknown(failing: Failing) -> None:
    db = await failing.store.database("app", migrations=[("1.sql", "create table t (id integer primary key, v text)")])

    async def transfer(tx: Any) -> None:
        await tx.exec("insert into t (v) values ('debit')")
        await tx.exec("insert into t (v) values ('credit')")
        failing.fail_next_sync()

    with pytest.raises(tinystore.OutcomeUnknownError, match="may have been kept or not"):
        await db.tx(transfer)
    with pytest.raises(tinystore.UnavailableError):
        await db.exec("insert into t (v) values ('after')")

    # a graceful stop and a start: the database writes again, and holds the transaction whole or not at all
    assert failing.server.stop() == 0
    rows = await _rows(failing.server.directory)
    assert rows in ([], ["debit", "credit"]), rows
    store = await tinystore.open(failing.server.directory, embedded=True)
    try:
        db = await store.database("app")
        await db.exec("insert into t (v) values ('after the restart')")
        assert (await store.status())["databases"]["app"]["broken"] is None
    finally:
        await store.close()
