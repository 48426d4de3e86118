"""Sync-behind for a SQLite database in WAL mode: commits are acknowledged once an ``fdatasync`` of the WAL file
that began after them has returned.

With ``durability="full"`` the writer could commit with ``PRAGMA synchronous = FULL``: SQLite then syncs the
WAL inside each ``COMMIT``, and the writer thread waits for the disk before it can start the next batch. Instead
the writer commits with ``synchronous = NORMAL`` (SQLite writes the WAL frames but does not sync them; it still
syncs around checkpoints, see https://www.sqlite.org/pragma.html#pragma_synchronous) and hands the batch's
outcomes to a :class:`WalSync` thread, which syncs the WAL file and only then delivers them. While the disk
works, the writer runs the next batch, and one sync covers every commit made before it began: the group commit
of database logs, with the log flush taken out of the writer's way (Gray and Reuter, *Transaction Processing:
Concepts and Techniques*, 1993, on group commit).

What a caller sees is unchanged: an ``exec`` or a ``tx`` returns once its commit is on disk (SQL-02). What
changes: another reader may see a commit whose sync is still under way (a few hundred microseconds); after a power
loss such a commit may be gone, though no caller had been told it was done.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("tinystore.sql")

# macOS has no fdatasync; its fsync is what SQLite uses there too
_datasync: Callable[[int], None] = getattr(os, "fdatasync", os.fsync)

Deliver = Callable[[list[Any]], None]


class WalSync:
    """The thread that syncs ``wal_path`` and then passes outcomes to ``deliver`` (in the order they came).

    ``fail(items, exc)`` gets the items instead when the sync fails (``OSError``): their commits are visible
    but may not be on disk."""

    def __init__(self, name: str, wal_path: str, deliver: Deliver, fail: Callable[[list[Any], OSError], None]) -> None:
        self.wal_path = wal_path
        self._deliver = deliver
        self._fail = fail
        self._cond = threading.Condition(threading.Lock())
        self._pending: list[Any] = []
        self._stopping = False
        self._fd = -1
        self.syncs = 0
        self._thread = threading.Thread(target=self._main, name=f"tinystore-sql-{name}-sync", daemon=True)
        self._thread.start()

    def after_commit(self, items: list[Any]) -> None:
        """Deliver ``items`` once a sync that begins after this call has returned (from the writer thread, right
        after a commit)."""
        with self._cond:
            wake = not self._pending
            self._pending.extend(items)
            if wake:
                self._cond.notify()

    def stop(self) -> None:
        """Sync and deliver what is pending, then end the thread (waits for it)."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        self._thread.join()

    def _main(self) -> None:
        cond = self._cond
        try:
            while True:
                with cond:
                    while not self._pending and not self._stopping:
                        cond.wait()
                    items, self._pending = self._pending, []
                    if not items and self._stopping:
                        return
                try:
                    self._sync()
                except OSError as exc:
                    log.error("sync of %s failed: %s", self.wal_path, exc)
                    self._fail(items, exc)
                    continue
                self.syncs += 1
                self._deliver(items)
        finally:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _sync(self) -> None:
        fd = self._fd
        if fd >= 0 and os.fstat(fd).st_nlink == 0:
            # the WAL file was removed (and its frames checkpointed) since: sync the one in its place
            os.close(fd)
            fd = self._fd = -1
        if fd < 0:
            fd = self._fd = os.open(self.wal_path, os.O_RDONLY | os.O_CLOEXEC)
        _datasync(fd)
