"""The folders a store's socket lies in are this user's own (trial S): a ``DIR/server`` or a short-path folder
(``$TMPDIR/tinystore-<uid>``) planted by another user, or a symbolic link there, is refused rather than used (that
user could replace the socket and read what clients send), and a client does not connect through a short-path
folder that others may enter."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import tinystore
from tinystore import PermissionDeniedError
from tinystore.server import paths

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="giving a folder to another user needs root")


async def test_a_symlink_planted_as_dir_server_is_refused(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o755)
    directory = tmp_path / "s"
    directory.mkdir()
    (directory / "server").symlink_to(elsewhere)
    with pytest.raises(PermissionDeniedError, match="is a symbolic link or not a folder"):
        await tinystore.open(directory, embedded=True)
    assert elsewhere.stat().st_mode & 0o777 == 0o755  # was chmod'ed to 0700 through the link
    assert list(elsewhere.iterdir()) == []


@root_only
async def test_a_dir_server_of_another_user_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    (directory / "server").mkdir(parents=True)
    os.chown(directory / "server", 65534, 65534)
    with pytest.raises(PermissionDeniedError, match=r"belongs to another user \(uid 65534"):
        await tinystore.open(directory, embedded=True)


@pytest.fixture
def short_tmp(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A short TMPDIR of this test's own (a socket address holds 108 bytes: pytest's tmp_path may be too long)."""
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    short = Path(tempfile.mkdtemp(prefix="ts", dir="/tmp"))
    monkeypatch.setattr(tempfile, "tempdir", str(short))
    try:
        yield short
    finally:
        shutil.rmtree(short, ignore_errors=True)


def long_store_dir(tmp_path: Path) -> Path:
    directory = tmp_path / ("d" * 60) / ("e" * 60)
    assert paths.socket_path(directory).parent.name.startswith("tinystore-")  # the short path is used
    return directory


@root_only
async def test_a_short_path_folder_of_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    planted = tmp_path / "tmp" / f"tinystore-{os.getuid()}"
    planted.mkdir(parents=True, mode=0o777)
    os.chown(planted, 65534, 65534)
    with pytest.raises(PermissionDeniedError, match=r"belongs to another user \(uid 65534"):
        await tinystore.open(long_store_dir(tmp_path), embedded=True)


async def test_a_client_does_not_connect_through_a_short_path_folder_others_may_enter(
    tmp_path: Path, short_tmp: Path
) -> None:
    directory = long_store_dir(tmp_path)
    store = await tinystore.open(directory, embedded=True)
    try:
        folder = paths.socket_path(directory).parent
        assert folder.stat().st_mode & 0o777 == 0o700
        client = await tinystore.open(directory)  # this user's own folder: fine
        await client.close()
        folder.chmod(0o777)
        with pytest.raises(PermissionDeniedError, match="not a folder of this user's own that no one else may enter"):
            await tinystore.open(directory)
    finally:
        await store.close()


async def test_a_new_store_is_its_users_alone(tmp_path: Path) -> None:
    # trial S: with umask 022 every database (and LOCK) was readable by every local user, and LOCK lockable
    directory = tmp_path / "s"
    async with await tinystore.open(directory, embedded=True) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (a)")])
        await db.exec("insert into t values (1)")
        modes = {
            p.name: p.stat().st_mode & 0o777 for p in (directory, directory / "sql", *directory.glob("sql/app.db*"))
        }
        modes["LOCK"] = (directory / "LOCK").stat().st_mode & 0o777
    assert modes.pop(directory.name) == 0o700 and modes.pop("sql") == 0o700, modes
    assert set(modes) >= {"app.db", "app.db-wal", "LOCK"} and set(modes.values()) == {0o600}, modes


async def test_a_database_file_planted_as_a_symlink_is_refused(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"")
    directory = tmp_path / "s"
    async with await tinystore.open(directory, embedded=True) as store:
        (directory / "sql" / "app.db").symlink_to(victim)
        with pytest.raises(PermissionDeniedError, match="is a symbolic link"):
            await store.database("app")
        (directory / "sql" / "app.db").unlink()
        (directory / "sql" / "other.db-wal").symlink_to(victim)
        with pytest.raises(PermissionDeniedError, match=r"other\.db-wal is a symbolic link"):
            await store.database("other")
    assert victim.read_bytes() == b""
    assert not (tmp_path / "victim-wal").exists()


@pytest.mark.parametrize("name", ["LOCK", "EPOCH", "EPOCH.tmp"])
async def test_a_store_file_planted_as_a_symlink_is_never_written_through(tmp_path: Path, name: str) -> None:
    # trial V: LOCK or EPOCH.tmp planted as a symlink: the server truncated and overwrote its target
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    directory = tmp_path / "s"
    directory.mkdir(mode=0o700)
    (directory / name).symlink_to(victim)
    if name == "EPOCH.tmp":  # a leftover name: removed, never followed
        async with await tinystore.open(directory, embedded=True, serve=False):
            pass
    else:
        with pytest.raises(PermissionDeniedError, match=f"{name} is a symbolic link"):
            await tinystore.open(directory, embedded=True, serve=False)
    assert victim.read_text() == "precious\n"


async def test_a_store_directory_every_user_may_write_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "s"
    directory.mkdir()
    directory.chmod(0o777)
    with pytest.raises(PermissionDeniedError, match="may be written by every user"):
        await tinystore.open(directory, embedded=True, serve=False)
    assert not (directory / "LOCK").exists()


async def test_a_store_made_before_files_were_private_is_made_private(tmp_path: Path) -> None:
    # trial V: a store made by an older version kept its 0644 databases and LOCK (and SQLite made new -wal files so)
    directory = tmp_path / "s"
    async with await tinystore.open(directory, embedded=True, serve=False) as store:
        db = await store.database("app", migrations=[("001.sql", "create table t (a)")])
        await db.exec("insert into t values (1)")
    for p in (directory / "LOCK", directory / "sql" / "app.db"):
        p.chmod(0o644)
    (directory / "sql").chmod(0o755)
    async with await tinystore.open(directory, embedded=True, serve=False) as store:
        db = await store.database("app")
        await db.exec("insert into t values (2)")
        modes = {p.name: p.stat().st_mode & 0o777 for p in (directory / "LOCK", *directory.glob("sql/app.db*"))}
        assert (directory / "sql").stat().st_mode & 0o777 == 0o700
    assert set(modes.values()) == {0o600}, modes
