"""How a process's file descriptors are shared between its databases' files and the connections it accepts.

Each open database holds a few descriptors (its writer's, its readers' and the reads' in the loop: about 2 a
connection, files and WAL). Opened until none was left, a server could accept no connection any more, and its
clients were told that it was stopped or stuck (trial CN); only a restart mended it, as a database stays open.
Accepted until none was left, its databases could open nothing (trials IA, ID). One rule serves both: the first
:func:`reserve` connections are the connections' own (a database's open leaves room for those not accepted yet);
past them, a connection is accepted only while room is left for the databases' files (:func:`kept_for_files`).
"""

from __future__ import annotations

import os
import resource

from ..errors import UnavailableError

_FD_DIRS = ("/proc/self/fd", "/dev/fd")


def open_files_limit() -> int:
    """The soft limit on this process's open files (``RLIMIT_NOFILE``), or -1 when unknown."""
    try:
        return int(resource.getrlimit(resource.RLIMIT_NOFILE)[0])
    except (OSError, ValueError):  # pragma: no cover
        return -1


def open_descriptors() -> int | None:
    """How many descriptors this process has open (``None`` when the system does not say)."""
    for d in _FD_DIRS:
        try:
            return len(os.listdir(d))
        except OSError:
            continue
    return None


def reserve(soft: int) -> int:
    """The descriptors kept back for connections (and what the application opens) under a limit of ``soft``: an
    eighth of it, 16 at least, 256 at most."""
    return min(256, max(16, soft // 8))


def check_room(
    name: str,
    need: int,
    coming: int = 0,
    connections: int = 0,
    spare: int = 0,
    *,
    what: str = "not opened",
    takes: str = "a database takes about {need}",
    advice: str = "open fewer databases",
) -> None:
    """Raise ``UnavailableError`` when opening database ``name``, which takes about ``need`` descriptors, would
    leave too few of this process's limit (``RLIMIT_NOFILE``, its soft value) free for the connections: the
    :func:`reserve`, less the ``connections`` already accepted (each holds its descriptor). ``coming``:
    descriptors not open yet that are already spoken for (databases opening beside it, files the open ones open
    on their first reads: trial CO). ``spare``: descriptors kept besides (:data:`LOCAL_KEPT`, for the directory's
    socket beside a TCP listener: trial II, remote clients that opened databases took them). ``what``, ``takes``
    (formatted with ``need``) and ``advice`` word the error for another use than a database's open (a read-only
    transaction's connection: trial IK)."""
    soft = open_files_limit()
    if soft == resource.RLIM_INFINITY or soft <= 0:
        return
    used = open_descriptors()
    if used is None:
        return
    # (with the reserve's connections accepted, what is left is the databases' as much as the connections':
    # trial ID's 100 clients came with the first use of a database, and its open found the reserve still kept)
    kept = max(0, reserve(soft) - connections) + spare
    used += coming
    if used + need + kept > soft:
        raise UnavailableError(
            f"database {name}: {what}: this process may open {soft} files and has {used} open or spoken for; "
            f"{takes.format(need=need)}, and {kept} are kept for connections (a server that used them all could "
            f"accept none): raise `ulimit -n` (a server takes the hard limit when it starts), or {advice}"
        )


def database_files(readers: int) -> int:
    """The descriptors a database's open takes with ``readers`` readers: its writer's, its readers' and the loop's
    connections, about 2 files each (some opened at its first read), and one more."""
    return 2 * (readers + 2) + 1


def kept_for_files(open_databases: int, readers: int) -> int:
    """The descriptors a server keeps from the connections it accepts, for the databases' files: those the open
    ones open on their first reads (their readers' WAL, a read transaction's connection), one more database's
    open, and a few for the rest (a log, a backup's copy). Accepted until none was left, the databases could
    open nothing more, and every client failed: some with "out of file descriptors", the others waiting in vain for
    their handshake (trial IA: 80 clients of a server limited to 64 files, and not one served)."""
    return 16 + database_files(readers) + (readers + 2) * open_databases


LOCAL_KEPT = 4
"""Descriptors a server's TCP and TLS listeners leave for connections to the directory's own socket (the command
line's ``status`` and ``stop``): trial IG, remote clients that held every descriptor kept an operator out."""


def room_to_accept(connections: int, open_databases: int, readers: int, spare: int = 0) -> tuple[int, int, int] | None:
    """``None`` when a server holding ``connections`` may accept one more; else ``(used, kept, soft)``: the
    descriptors open, those kept for the databases' files (:func:`kept_for_files`) and the limit. The first
    :func:`reserve` connections are always let in (the databases leave room for them: :func:`check_room`); past
    them, what is open is counted, a listing of ``/proc/self/fd`` each. ``spare``: descriptors this listener leaves
    for another (a TCP listener's :data:`LOCAL_KEPT`, for the directory's socket), counted in both."""
    soft = open_files_limit()
    if soft <= 0 or soft == resource.RLIM_INFINITY or connections + spare < reserve(soft):
        return None
    used = open_descriptors()
    if used is None:
        return None
    kept = kept_for_files(open_databases, readers) + spare
    if used + 1 + kept <= soft:
        return None
    return used, kept, soft
