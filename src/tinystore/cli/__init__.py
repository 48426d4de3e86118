"""The ``tinystore`` command: serve, stop, status, sql (and one group per engine)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import io
import json
import math
import os
import re
import shlex
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from datetime import datetime
from pathlib import Path
from typing import Any, Concatenate, NoReturn, ParamSpec, TypeVar

import click
from rich.console import Console
from rich.table import Table
from rich.text import Text

from ..errors import InUseError, InvalidError, PermissionDeniedError, TinystoreError, UnavailableError
from ..protocol.frames import TOKEN_MAX
from ..server.listener import MIN_TOKEN

T = TypeVar("T")
P = ParamSpec("P")


def _closed_streams() -> None:
    """A command started with its standard output or error closed (``>&-``, as some daemon wrappers start a
    server) writes them to ``/dev/null`` (trial AX: Python has no ``sys.stdout`` then, and every command died
    at import; uvloop aborted with no standard error). Opened in order, each takes its own descriptor number."""
    for name in ("stdout", "stderr"):
        if getattr(sys, name) is None:
            setattr(sys, name, open(os.devnull, "w"))  # (the process's own, to its end)


class _Output(io.TextIOWrapper):
    """The CLI's stdout: a text layer over a buffer over the descriptor, which keeps (``failed``) an ``OSError`` a
    write or a flush raised, other than the reader going away: whatever raised it then (click, rich, a
    subscription's handler), the command tells it in one line (trial DS, DU: a traceback and status 120, or for a
    large output, where the failed write left the buffer empty, a traceback still)."""

    failed: OSError | None = None

    def write(self, text: str) -> int:
        try:
            return super().write(text)
        except OSError as exc:
            self._failing(exc)
            raise

    def flush(self) -> None:
        try:
            super().flush()
        except OSError as exc:
            self._failing(exc)
            raise

    def _failing(self, exc: OSError) -> None:
        if not isinstance(exc, BrokenPipeError) and self.failed is None:
            self.failed = exc


def _own_streams() -> None:
    """stdout as an :class:`_Output`, and stderr (when unbuffered) through a buffer; what the output's encoding
    cannot hold is escaped (``\\u65e5``), not an error.

    Under ``PYTHONUNBUFFERED`` (``python -u``, set in many container images) ``sys.stdout`` writes straight to
    its descriptor, and a write the kernel takes only in part (a pipe whose reader is slow: the first 64 KiB)
    loses the rest without a word: CPython's text layer does not write again (trial DL: ``jobs show --json |
    (sleep 1; cat)`` gave 65,536 of 1,000,432 bytes, status 0). A buffer in between writes all of it, flushed at
    each line as unbuffered output is. Only the streams Python made are replaced (not one a test harness put in
    their place); those stay as they were (``sys.__stdout__``)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if type(stream) is not io.TextIOWrapper:
            continue
        unbuffered = isinstance(stream.buffer, io.RawIOBase)
        if name == "stderr" and not unbuffered:
            continue
        with contextlib.suppress(OSError, ValueError):
            raw = io.FileIO(stream.fileno(), "w", closefd=False)
            kind = _Output if name == "stdout" else io.TextIOWrapper
            wrapped = kind(
                io.BufferedWriter(raw),
                encoding=stream.encoding,
                # (trial DV: a value the encoding has no room for, PYTHONIOENCODING=latin-1 or a C locale, was a
                # traceback: written as Python writes it to stderr, escaped)
                # (a C locale's is surrogateescape, as strict for every character but those: trial DW)
                errors="backslashreplace" if stream.errors in ("strict", "surrogateescape") else stream.errors,
                line_buffering=unbuffered or stream.line_buffering,
            )
            if name == "stdout":
                stream.flush()
            _REPLACED.append(stream)  # (kept open: the /dev/null of _closed_streams closes its descriptor once lost)
            setattr(sys, name, wrapped)


_REPLACED: list[Any] = []
"""The streams :func:`_own_streams` put others in the place of."""


_closed_streams()
_own_streams()


# written to a file or a pipe, rich would fold tables to 80 columns: give them room (a terminal keeps its width)
# markup=False: what the store holds (a value "[/]", a job's error, a path) is printed as it is, never read as
# rich markup (which would restyle it or fail); styles are given with Text
class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The output's reader went away (``| head -1``): it had what it wanted; status 0 (rich exits 1)."""
        self.quiet = True
        silence_stdout()
        raise SystemExit(0)


console = _Console(width=None if sys.stdout.isatty() else 200, markup=False)
# messages are lines: never folded (trial AX: a backup's summary came out in three lines, a path cut in two)
err_console = Console(stderr=True, markup=False, soft_wrap=True)


def run_async(fn: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run ``fn()`` on uvloop when available; a TinyStore error prints ``error[code] message`` and exits 1."""
    try:
        try:
            import uvloop

            return uvloop.run(fn())
        except ImportError:  # pragma: no cover
            return asyncio.run(fn())
    except TinystoreError as exc:
        return fail(exc)


def fail(exc: TinystoreError) -> NoReturn:
    """Print ``error[code] message`` (one line: people read it, and a parent process parses it) and exit 1."""
    sys.stderr.write(f"error[{exc.code}] {exc.message}\n")
    sys.exit(1)


_ADDRESS = re.compile(r"[a-z][a-z0-9+.-]*://", re.IGNORECASE)
_HALF_ADDRESS = re.compile(r"(?:tcp|tls):/?(?!/)", re.IGNORECASE)  # tcp:/host:port, tls:host:port


TOKEN_ENV = "TINYSTORE_TOKEN"
"""The environment variable that holds the token for a server's address given as DIRECTORY (never an option: an
option's value shows in the process list)."""


class Address(str):
    """A server's address given where a command takes a DIRECTORY: ``tcp://HOST:PORT`` or ``tls://HOST:PORT``
    (``status``, ``sql``, ``jobs``, ``channels`` and ``lock`` reach a store through its server so; the token is
    ``$TINYSTORE_TOKEN``)."""


Target = Path | Address
"""A command's DIRECTORY: a store's directory, or (for the commands that take one) a server's address."""


class UserPath(click.Path):
    """A path argument read as a shell reads it: a leading ``~`` or ``~user`` is that home folder (a shell expands
    it only when unquoted; ``"~/data"`` in a script reached the CLI as a folder named ``~``). ``remote``: a
    DIRECTORY that may also be a server's address (an :class:`Address`)."""

    def __init__(self, *args: Any, remote: bool = False, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.remote = remote

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str):
            if _ADDRESS.match(value) and param is not None and param.name == "dest":
                # (trial CK: `backup DIR tcp://host:7600` backed up into a folder named "tcp:")
                fail(InvalidError(f"DEST {value}: an address; a backup is written to a directory on this machine"))
            if _ADDRESS.match(value) and (param is None or param.name == "directory"):
                # (trial BL: `tinystore status tcp://127.0.0.1:7600` said "no such directory tcp:/127.0.0.1:7600",
                # and that `tinystore serve tcp:/…` would make a store there)
                if self.remote and value.lower().startswith(("tcp://", "tls://")):
                    return Address(value)
                if self.remote:
                    why = "an address is tcp://HOST:PORT or tls://HOST:PORT"
                else:
                    command = f"tinystore {ctx.command.name}" if ctx is not None else "this command"
                    why = (
                        f"`{command}` takes a store's directory, not an address: run it on the machine that holds "
                        "the store (status, sql, jobs, channels and lock also take tcp:// and tls:// addresses)"
                    )
                fail(InvalidError(f"{value}: {why}"))
            if _HALF_ADDRESS.match(value) and (param is None or param.name in ("directory", "dest")):
                # (trial CK: `status tcp:/127.0.0.1:7600` said to make a store there with `tinystore serve tcp:/…`)
                fail(
                    InvalidError(f"{value}: an address needs // after its scheme (tcp://HOST:PORT or tls://HOST:PORT)")
                )
            if not value.strip():
                # (an empty argument would be the current folder: `backup DIR ""` said "inside the store")
                fail(InvalidError(f"{param.human_readable_name if param else 'path'}: {value!r} is no path"))
            value = os.path.expanduser(value)
            if (param is None or param.name == "directory") and os.path.isdir(value):
                if not os.access(value, os.R_OK | os.X_OK):
                    # (trial EP: click's usage error, exit 2, where a store of mode 0755 said this in one line)
                    fail(
                        PermissionDeniedError(
                            f"store {value}: this user may not enter the directory (it is for the user that owns "
                            "the store: run the command as that user)"
                        )
                    )
        return super().convert(value, param, ctx)


#: seconds the CLI waits for the directory's server to answer its handshake (a local socket: it answers in
#: milliseconds unless it is suspended or stuck)
ANSWER_TIMEOUT = 5.0


class Stopping(UnavailableError):
    """The directory's server is stopping: it takes no new connection, and owns the directory until done."""


class NoAnswer(UnavailableError):
    """The directory's server is there (it holds the socket) but does not answer."""


class Busy(NoAnswer):
    """The directory's server listens and takes no connection: its queue of connections is full."""


def need_store_dir(directory: Target) -> None:
    """Refuse a DIRECTORY that does not exist or holds no store (exit 1, ``error[invalid] …``), before anything
    is made: every command but ``serve`` and ``demo`` works on an existing store, and a typo (``tinystore
    status ~``) must not make a new one. A server's address is checked when the command connects."""
    from ..server.dirlock import LOCK, is_store

    if isinstance(directory, Address):
        return

    make = f"to make a store there: `tinystore serve {shlex.quote(str(directory))}`"
    try:
        if directory.is_dir() and directory.stat().st_mode & 0o002:
            # (trial HT: serve then refused it, every user may write it: /tmp, a folder of mode 777)
            make = (
                f"a store cannot be made there either: every user may write it (mode "
                f"{directory.stat().st_mode & 0o777:o}); make one in a folder of its own: `mkdir -m 700 "
                f"{shlex.quote(str(directory / 'store'))}`, then `tinystore serve` it"
            )
    except OSError:
        pass
    if not directory.exists():
        fail(InvalidError(f"store {directory}: no such directory ({make})"))
    if not is_store(directory):
        fail(InvalidError(f"store {directory}: this directory holds no store (no {LOCK} file in it; {make})"))


JSON_META = "tinystore.json"
"""``click.Context.meta`` key: a group's ``--json`` was given (``tinystore jobs DIR --json list``)."""


def pass_store_dir(fn: Callable[Concatenate[Target, P], T]) -> Callable[P, T]:
    """``click.pass_obj`` for the groups whose object is their DIRECTORY argument (``channels``, ``lock``,
    ``jobs``), refusing one that does not exist or holds no store (:func:`need_store_dir`). The check is made by
    the command, not the group, so that ``tinystore channels DIR publish --help`` still works."""

    @functools.wraps(fn)
    def command(*args: P.args, **kwargs: P.kwargs) -> T:
        ctx = click.get_current_context()
        directory: Target = ctx.obj
        need_store_dir(directory)
        if ctx.meta.get(JSON_META) and "as_json" in kwargs:
            kwargs["as_json"] = True  # the group's --json, before the command's name
        return fn(directory, *args, **kwargs)

    return command


# control characters (a terminal would act on them: colours, a cleared screen, a line that looks like two rows)
# and the bidirectional controls (which reorder what is shown), written as escapes in tables
_VISIBLE = {
    i: ("\\n" if i == 10 else "\\t" if i == 9 else "\\r" if i == 13 else f"\\x{i:02x}")
    for i in (*range(0x20), *range(0x7F, 0xA0))
} | {i: f"\\u{i:04x}" for i in (0x200E, 0x200F, *range(0x202A, 0x202F), *range(0x2066, 0x206A))}


def visible(text: str) -> str:
    """``text`` with its control and bidirectional-control characters written as escapes (``\\n``, ``\\x1b``)."""
    return text.translate(_VISIBLE)


#: rows a table shows at most (rich lays a table out whole: 100,000 rows took 40 s); ``--json`` prints every row
TABLE_ROWS = 1000
# the least room a column of a table takes (borders and padding, 3, and 4 characters of text); a table whose columns
# cannot all have it is shown as records (:func:`print_table`)
RECORD_COLUMN_WIDTH = 7


def print_table(title: str | None, columns: list[str], rows: list[list[Any]]) -> None:
    """``rows`` as a rich table, at most :data:`TABLE_ROWS` of them (a line on stderr says how many more there are
    and that ``--json`` prints them all). A cell too wide for the terminal folds onto more lines, never cut: a
    number shown ``12345…`` would be a wrong number."""
    cells = [
        ["NULL" if v is None else (f"x'{v.hex()}'" if isinstance(v, bytes) else visible(str(v))) for v in r]
        for r in rows[:TABLE_ROWS]
    ]
    names = [visible(str(c)) for c in columns]
    if len(names) * RECORD_COLUMN_WIDTH + 1 > console.width:
        # more columns than the terminal has room for, each a few characters wide, headers and cells folded to a
        # character a line (known low: at 30 columns in 80, cells came out blank): one record after another, a
        # line a column, as psql's expanded display (\x) shows them
        if title:
            console.print(title)
        for i, r in enumerate(cells, 1):
            record = Table(title=f"row {i}", title_justify="left", show_header=False, show_edge=False, box=None)
            # (names fold too, never cut: trial FB saw two long names cut to one)
            record.add_column(style="bold", max_width=max(console.width // 3, 8), overflow="fold")
            record.add_column(overflow="fold")
            for name, value in zip(names, r, strict=False):
                record.add_row(name, value)
            console.print(record)
    else:
        table = Table(title=title, show_lines=False)
        for name in names:
            table.add_column(name, overflow="fold")
        for r in cells:
            table.add_row(*r)
        console.print(table)
    if len(rows) > TABLE_ROWS:
        sys.stderr.write(
            f"showing the first {TABLE_ROWS:,} of {len(rows):,} rows: --json prints them all (or add a LIMIT)\n"
        )


def to_json(value: Any) -> str:
    """``value`` as one line of valid JSON: bytes as hex, datetimes as ISO text, other objects as ``str``, and a
    float that is NaN or infinite (JSON has none: a message of an older store, ``select 1e999``) as ``null``,
    as JavaScript's ``JSON.stringify`` and msgspec write it."""

    def default(o: Any) -> Any:
        if isinstance(o, bytes):
            return o.hex()
        if isinstance(o, datetime):
            return o.isoformat()
        return str(o)

    # (to an output that is not UTF-8, in JSON's own escapes, \\u65e5: the output's would not be JSON, trial DW)
    ascii_only = not _utf8_output()
    try:
        return json.dumps(value, default=default, ensure_ascii=ascii_only, allow_nan=False)
    except ValueError:  # a NaN or an infinity somewhere (the usual value has none: this costs nothing then)
        return json.dumps(_finite(value), default=default, ensure_ascii=ascii_only, allow_nan=False)
    except TypeError:
        # a dict key JSON has no text for (a tuple, from a store's client that did not check: trial FH, the message
        # was skipped with a traceback): the key as its JSON text, the value printed all the same
        return json.dumps(_finite(_text_keys(value)), default=default, ensure_ascii=ascii_only, allow_nan=False)


def _text_keys(value: Any) -> Any:
    """``value`` with every dict key that is not a str, int, float, bool or None written as its JSON text (a key
    that is text there, a date's, as that text: trial FS, it kept its quotes)."""
    if isinstance(value, dict):
        return {k if isinstance(k, str | int | float | None) else _key_text(k): _text_keys(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_text_keys(v) for v in value]
    return value


def _key_text(key: Any) -> str:
    text = to_json(key)
    if text.startswith('"'):
        unquoted: str = json.loads(text)
        return unquoted
    return text


def _utf8_output() -> bool:
    """Whether stdout writes UTF-8 (else :func:`to_json` writes JSON in ASCII)."""
    encoding = (getattr(sys.stdout, "encoding", None) or "").lower().replace("-", "").replace("_", "")
    return encoding in ("utf8", "utf8sig")


def _finite(value: Any) -> Any:
    """``value`` with every NaN or infinite float (in lists, tuples and dicts, keys too) as ``None``."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {_finite(k): _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


class _Group(click.Group):
    """The command group: a command whose output's reader went away (``| head -1``) ends quietly with status 0,
    its reader having had what it wanted (click exits 1 with nothing said; trial AX)."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()
            return result
        except BrokenPipeError:
            silence_stdout()
            ctx.exit(0)

    def main(self, *args: Any, **kwargs: Any) -> Any:
        """click's ``main``; output that cannot be written (stdout to a full disk, ``> /dev/full``) is told in one
        line on stderr, status 1 (trial DS: a traceback, then Python's "Exception ignored" of the last flush,
        status 120). A stderr that cannot be written either is let go of at the end, the status kept (trial DU:
        120 for every command)."""
        try:
            try:
                return super().main(*args, **kwargs)
            except OSError:
                failed = _output_failed()
                if failed is None:
                    raise
                silence(sys.stdout)
                with contextlib.suppress(OSError, ValueError):
                    sys.stderr.write(f"tinystore: the output could not be written: {failed.strerror or failed}\n")
                sys.exit(1)
        finally:
            try:
                sys.stderr.flush()
            except (OSError, ValueError):
                silence(sys.stderr)


class DirGroup(click.Group):
    """A group whose DIRECTORY argument comes before the command's name (``tinystore channels DIR publish``):
    ``tinystore channels publish --help``, the directory left out, shows the help of ``publish`` (click read
    ``publish`` as the directory and showed the group's help: trial JG)."""

    #: flags of the group that may come before the DIRECTORY (``tinystore jobs --json list --help``)
    leading_flags: tuple[str, ...] = ()

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        first = 0
        while first < len(args) and args[first] in self.leading_flags:
            first += 1
        name = args[first] if first < len(args) else None
        if (
            name is not None
            and name in self.commands
            and any(a in ctx.help_option_names for a in args[first + 1 :])
            and not os.path.isdir(name)  # (a store in a folder of that name: `tinystore lock hold hold ...`)
        ):
            command = self.commands[name]
            parent = click.Context(self, info_name=ctx.info_name, parent=ctx.parent)
            with click.Context(command, info_name=name, parent=parent) as sub:
                click.echo(command.get_help(sub), color=ctx.color)
            ctx.exit(0)
        return super().parse_args(ctx, args)


def _output_failed() -> OSError | None:
    """The error that writing stdout met (:class:`_Output`), or that flushing what it holds meets now; ``None``
    when it can be written (a reader gone, ``BrokenPipeError``, is not a failure: see :meth:`_Group.invoke`)."""
    failed = getattr(sys.stdout, "failed", None)
    if isinstance(failed, OSError):
        return failed
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        return None
    except OSError as exc:
        return exc
    except ValueError:
        return None
    return None


def silence_stdout() -> None:
    """Point stdout at ``/dev/null``: its reader is gone, and the interpreter's last flush must not raise
    ``BrokenPipeError`` at exit (the Python docs' advice for SIGPIPE)."""
    silence(sys.stdout)


def silence(stream: Any) -> None:
    """Point ``stream``'s descriptor at ``/dev/null``: what it holds can no longer be written, and the interpreter's
    last flush must not fail at exit (status 120)."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)


@click.group(cls=_Group)
@click.version_option(package_name="tinystore")
def main() -> None:
    """TinyStore: SQL databases, job queues, channels and locks in one directory, owned by one process."""


@main.command()
@click.argument("directory", type=UserPath(file_okay=False, path_type=Path))
@click.option("--listen", multiple=True, help="Also listen on tcp://HOST:PORT or tls://HOST:PORT.")
@click.option(
    "--tokens",
    type=UserPath(dir_okay=False),
    help="Tokens file: '<admin|data> <token>' a line ('#' comments); each token at least "
    f"{MIN_TOKEN} characters, at most {TOKEN_MAX} bytes, and on one line only. Needed with --listen.",
)
@click.option("--tls-cert", type=UserPath(dir_okay=False), help="Certificate (PEM) for the tls:// addresses.")
@click.option("--tls-key", type=UserPath(dir_okay=False), help="Its private key (PEM), for the tls:// addresses.")
@click.option("--durability", type=click.Choice(["full", "os"]), default="full", show_default=True)
@click.option("--idle", default=None, help="Exit after this long without connections (sidecars).")
@click.option("--sidecar", is_flag=True, hidden=True)
@click.option("--existing", is_flag=True, hidden=True, help="Serve only a store that ran there (make none).")
@click.option("--store-id", default="", hidden=True, help="With --existing: only the store of this id.")
@click.option("--private", is_flag=True, hidden=True)
@click.option("--parent-pid", type=int, default=None, hidden=True)
@click.option("--clock", default=None, hidden=True, help="Start a test clock at this ISO datetime.")
@click.option(
    "--limits",
    default=None,
    metavar="JSON",
    help='Limits other than the defaults, as JSON: \'{"tx_idle": 2, "client_output_bytes": 268435456}\' (the fields '
    "of tinystore.Limits; seconds and bytes).",
)
@click.option("--handshake-timeout", type=float, default=None, hidden=True, help="Seconds to finish a handshake.")
def serve(
    directory: Path,
    listen: tuple[str, ...],
    tokens: str | None,
    tls_cert: str | None,
    tls_key: str | None,
    durability: str,
    idle: str | None,
    sidecar: bool,
    existing: bool,
    store_id: str,
    private: bool,
    parent_pid: int | None,
    clock: str | None,
    limits: str | None,
    handshake_timeout: float | None,
) -> None:
    """Own DIRECTORY and serve it on its Unix socket (and on --listen addresses) until SIGTERM (or SIGINT, SIGHUP)
    or `tinystore stop`; a second of these signals ends the calls' grace at once."""
    import logging

    from ..clock import Clock
    from ..durations import seconds
    from ..limits import Limits
    from ..server.main import ServeOptions, announce_ready, run

    # a private server writes on its program's standard error: its warnings only, as an embedded store's reach it
    # (trial GW: each unused database closed was a line there)
    level = logging.WARNING if private else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        opts = ServeOptions(
            directory=directory.resolve(),
            listen=list(listen),
            tokens=tokens,
            tls_cert=tls_cert,
            tls_key=tls_key,
            idle=seconds(idle, "--idle") if idle else None,
            parent_pid=parent_pid,
            clock=Clock(datetime.fromisoformat(clock)) if clock else None,
            limits=Limits.from_json(limits) if limits else None,
            durability=durability,
            mode="sidecar" if sidecar else "private" if private else "serve",
            existing=existing,
            expect_id=store_id,
        )
        if handshake_timeout is not None:
            opts.handshake_timeout = handshake_timeout
        if opts.idle == 0:
            opts.idle = None

        def ready(listeners: Any) -> None:
            if private:
                announce_ready(listeners)
            elif sidecar:
                # (in sidecar.log, among the store's log lines: with their time, to tell when a restart came up;
                # trial CG)
                logging.getLogger("tinystore.server").info(
                    "tinystore serving %s on %s", opts.directory, ", ".join(lst.description for lst in listeners)
                )
            else:
                # (trial DV: with stderr to a full disk, this line failed the start half-way, its address and
                # socket left behind: the store is served all the same, its line lost)
                with contextlib.suppress(OSError, ValueError):
                    err_console.print(
                        f"tinystore serving {opts.directory} on " + ", ".join(lst.description for lst in listeners),
                        highlight=False,
                        soft_wrap=True,  # one line, however long the paths: a log line, and scripts read it
                    )

        status = run(opts, ready)
    except InUseError as exc:
        if sidecar:  # (processes that open a store at once each start one; one wins: docs/serving.md)
            from ..client.store import SIDECAR_NOT_NEEDED

            exc.message = SIDECAR_NOT_NEEDED + exc.message
        fail(exc)
    except TinystoreError as exc:
        fail(exc)
    if status:
        sys.exit(status)  # it stopped because its directory or socket went away (not asked to)


async def _connect_dir(directory: Path) -> Any:
    """Connect to the directory's running server (never starts one)."""
    from ..client.store import Store
    from ..client.transport import HANDSHAKE_WAIT, RemoteTransport
    from ..protocol.messages import COMMAND_LINE
    from ..server import paths

    sock = paths.served_socket(directory.resolve())

    async def endpoint() -> tuple[str, Any]:
        return "unix", str(sock)

    # (the handshake's own wait outlasts ANSWER_TIMEOUT: a server that does not answer is told as one, below)
    transport = RemoteTransport(
        endpoint,
        # (named so: a server out of descriptors lets it in on those it keeps for the command line)
        name=f"{COMMAND_LINE}, pid {os.getpid()}",
        description=str(directory),
        reconnect_timeout=2.0,
        handshake_wait=HANDSHAKE_WAIT,
    )
    try:
        async with asyncio.timeout(ANSWER_TIMEOUT):
            # a burst of clients connecting at once is waited out, most of the wait (trial GY: it said the server's
            # queue of connections was full, out of descriptors or stuck, 1 s into a burst)
            await transport.connect(crowd_wait=ANSWER_TIMEOUT - 1.0)
    except TimeoutError:
        # a server holds the socket (the connection was taken) but does not answer: suspended (SIGSTOP), stuck,
        # or out of descriptors. Saying that no server runs, or that another process owns the directory, misleads.
        pid = (paths.read_address(directory.resolve()) or {}).get("pid")
        raise NoAnswer(
            f"store {directory}: the server of {directory}{f' (pid {pid})' if pid else ''} does not answer "
            f"(no handshake within {ANSWER_TIMEOUT:g}s): is it suspended or stuck?"
        ) from None
    except UnavailableError as exc:
        from ..client.store import _busy, _can_connect, _stopping_until

        if exc.extra.get("crowded") and not exc.extra.get("backlog"):
            # (told so by the server, which runs; a full listen queue may be a server stopped or stuck too: below)
            raise Busy(
                f"store {directory}: its server is crowded by clients connecting at once (for "
                f"{ANSWER_TIMEOUT - 1.0:g}s now: {exc.message}); try again in a moment"
            ) from None
        try:
            reachable = await asyncio.to_thread(_can_connect, sock)
        except PermissionError:
            # (trial EP: a traceback) the server's socket folder is its owner's alone (0700)
            raise PermissionDeniedError(
                f"store {directory}: this user may not reach its server (its socket {sock} is for the user that "
                "started it: run the command as that user)"
            ) from None
        if reachable is None:
            # it listens and takes no connection: its queue of connections is full (out of descriptors?)
            raise Busy(_busy(directory.resolve(), sock).message) from None
        until = _stopping_until(directory.resolve())
        if until is not None:
            # it stops, its calls under way given their grace: it takes no new connection, and owns the directory
            # until it is done (trial AX: commands said "owned by another process" or "no server is running")
            pid = (paths.read_address(directory.resolve()) or {}).get("pid")
            left = max(0.0, until - time.time())
            raise Stopping(
                f"store {directory}: its server (pid {pid}) is stopping (the calls under way have {left:.0f}s "
                "more at most); try again once it has stopped",
                pid=pid,
            ) from None
        raise UnavailableError(
            f"store {directory}: no server is running there "
            f"(start one with `tinystore serve {shlex.quote(str(directory))}`)"
        ) from None
    return Store(transport, mode="cli", directory=directory.resolve())


async def connect_address(address: Address, reconnect_timeout: float = 2.0) -> Any:
    """The store of the server at ``address``, with the token in ``$TINYSTORE_TOKEN`` (a ``tls://`` address is
    verified with the system's CAs, or the file ``$SSL_CERT_FILE`` names). Raises ``InvalidError`` when the
    variable is not set, and what :func:`tinystore.connect` raises."""
    import tinystore

    # (a token holds no blank: one around it is the shell's, `$'...\n'` or a file read with its line end; trial FK:
    # it was "the token is wrong")
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not token:
        raise InvalidError(
            f"{address}: set ${TOKEN_ENV} to one of the server's tokens (its `tinystore serve --tokens` file; a data "
            "token reads and writes, an admin token is needed for `jobs configure`)"
        )
    return await tinystore.connect(address, token=token, reconnect_timeout=reconnect_timeout)


COMMAND_WAIT = 10.0
"""Seconds a command waits for another that owns the directory (one that opened the store itself, as no server
ran) to end, or for a server that owns it to serve it."""


async def open_for_cli(directory: Target) -> Any:
    """The directory's server if one runs, else the store embedded in this command (no socket: a client that
    connected to it would be left without a server when the command ends), waiting up to :data:`COMMAND_WAIT` for
    another command that owns it so; for an address, the server there (:func:`connect_address`).
    Others wait for this command as it runs (trial CR: they were refused at once)."""
    import tinystore

    if isinstance(directory, Address):
        return await connect_address(directory)
    from ..server.dirlock import changing_hands, owned_by_command

    deadline = time.monotonic() + COMMAND_WAIT
    while True:
        try:
            return await _connect_dir(directory)
        except (NoAnswer, Stopping):
            raise  # a server owns the directory: opening it here would only say so, less clearly
        except UnavailableError:
            if not directory.exists():
                raise
        try:
            _quiet_queue_loads()
            return await tinystore.open(directory, embedded=True, serve=False)
        except InUseError:
            # another command that opened the store itself (it lets go when it ends), or a server still starting
            # (a sidecar a client just started: trial CS): waited for, a while
            if time.monotonic() >= deadline or (owned_by_command(directory) is None and not changing_hands(directory)):
                raise
        await asyncio.sleep(0.1)


def _quiet_queue_loads() -> None:
    """Drop the embedded store's "queue ... could not be loaded" log: the commands tell a queue's error themselves
    (``jobs list``, ``jobs queues``, ``status``; trials FQ, FS: printed twice)."""
    import logging

    jobs_log = logging.getLogger("tinystore.jobs")
    if not any(getattr(f, "__name__", "") == "_queue_load" for f in jobs_log.filters):

        def _queue_load(record: logging.LogRecord) -> bool:
            return not str(record.msg).startswith("jobs: queue %s could not be loaded")

        jobs_log.addFilter(_queue_load)


def _runs(pid: int) -> bool:
    """Whether process ``pid`` runs: it exists and is no zombie (a zombie still answers ``kill 0``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        return True
    return stat.rpartition(")")[2].split()[:1] not in (["Z"], ["X"])


def _suspended(pid: int) -> bool:
    """Whether process ``pid`` is stopped by a signal (SIGSTOP, SIGTSTP: ``T`` in ``/proc/PID/stat``)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(")")[2].split()[:1] == ["T"]


@main.command()
@click.argument("directory", type=UserPath(file_okay=False, path_type=Path))
@click.option(
    "--grace", default="10s", show_default=True, help='How long calls under way may take to finish ("2s", "500ms", 2).'
)
def stop(directory: Path, grace: str) -> None:
    """Stop the server that owns DIRECTORY gracefully (as SIGTERM does); fails when none runs."""
    from ..durations import seconds

    need_store_dir(directory)
    try:
        grace_s = seconds(grace, "--grace")
    except TinystoreError as exc:
        fail(exc)

    async def go() -> None:
        from ..client.store import _stopping_until
        from ..server import paths
        from ..server.dirlock import is_server, live_owner, lock_holders, owner_pid, socket_gone

        pid: Any
        by_lock = False
        wait = grace_s + 5
        try:
            store = await _connect_dir(directory)
        except Stopping as exc:
            pid = exc.extra.get("pid")  # stopping already: wait for it as for our own stop, to its grace's end
            err_console.print(f"the server of {directory} (pid {pid}) is stopping already", highlight=False)
            wait = max(0.0, (_stopping_until(directory.resolve()) or time.time()) - time.time()) + 5
        except UnavailableError as exc:
            # its server runs and nothing can ask it to stop: it takes no connection (out of descriptors?), or its
            # socket was removed. SIGTERM stops it as gracefully (STORE-05)
            sock = None if isinstance(exc, Busy) else socket_gone(directory.resolve())
            info = paths.read_address(directory.resolve()) or {}
            pid = int(info.get("pid", 0))
            holders = lock_holders(directory.resolve())
            unowned = holders is not None and pid not in holders
            if pid <= 0 or unowned or not _runs(pid):
                # no server of the address owns the directory; another process may all the same (trial CW: "no
                # server is running there", and `serve` then failed): a `tinystore serve` whose server/ folder was
                # removed, or still starting, is stopped as one that lost its socket; a program's embedded store
                # that serves no socket, or a command, is named (trial CY)
                owner = owner_pid(directory.resolve())
                if owner is not None and is_server(owner):
                    pid, info, by_lock = owner, {}, True
                    sock = sock or str(paths.socket_path(directory.resolve()))
                elif owner is not None:
                    err = live_owner(directory.resolve())
                    raise InvalidError(
                        f"{err.message if err else exc.message}; `tinystore stop` stops a server only"
                    ) from None
                elif pid > 0 and unowned:
                    # a killed server's address, its pid perhaps another process's now: nothing to signal (trial AS)
                    raise UnavailableError(
                        f"store {directory}: no server runs there: its address names pid {pid}, which does not hold "
                        f"{directory / 'LOCK'} (a server killed outright leaves its address behind)"
                    ) from None
                else:
                    raise
            elif sock is None and not isinstance(exc, Busy):
                if not isinstance(exc, NoAnswer):
                    raise
                if _suspended(pid):
                    # (trial IA: after a SIGCONT the server ran on; it was not clear that the stop had not been asked)
                    raise NoAnswer(
                        f"{exc.message}; nothing was stopped (a suspended server: `kill -CONT {pid}`, then stop it "
                        "again)"
                    ) from None
                # (one that runs and does not answer, busy or out of descriptors, is stopped by SIGTERM: trial IK,
                # it was said to be suspended, and left running)
                exc = NoAnswer(
                    f"the server of {directory} (pid {pid}) does not answer (busy, stuck, or out of descriptors: "
                    "see its log)"
                )
            if info.get("mode") == "embedded":
                # the program's own store: a signal would end the program, not a server (docs/serving.md)
                what = "takes no connection" if sock is None else f"lost its socket {sock}"
                raise InvalidError(
                    f"store {directory}: the store is embedded in process {pid} (it {what}); stop that program "
                    "(or close its store) to stop it"
                ) from None
            os.kill(pid, signal.SIGTERM)
            why = exc.message if sock is None else f"the server of {directory} (pid {pid}) lost its socket {sock}"
            err_console.print(f"{why}: sent it SIGTERM", highlight=False)
        else:
            pid = (paths.read_address(directory.resolve()) or {}).get("pid")
            await store.stop_server(grace_s)
            await store.close()
        deadline = time.monotonic() + wait
        # the server removes DIR/server/address once it let the directory go (a zombie pid would fool kill 0)
        while pid and time.monotonic() < deadline:
            if by_lock:  # (a server with no address of its own: until it lets the directory go)
                if not _runs(int(pid)) or owner_pid(directory.resolve()) != pid:
                    break
            else:
                now = paths.read_address(directory.resolve())
                if not now or now.get("pid") != pid or not _runs(int(pid)):
                    break  # (a server killed outright leaves its address behind)
            await asyncio.sleep(0.05)
        else:
            if pid:
                # (trial DZ: a server busy with a long VACUUM was said to stop "once it runs again")
                how = (
                    "it is suspended (SIGSTOP?), and stops once it runs again"
                    if _suspended(int(pid))
                    else "it still finishes (what its databases ran was interrupted at the grace's end, but not a "
                    "wait for another process holding a database's write lock, nor a COMMIT on a disk that does not "
                    "answer), and stops once that ends"
                )
                raise UnavailableError(
                    f"store {directory}: its server (pid {pid}) did not stop within {wait:.0f}s; it was told to: "
                    f"{how} (`kill -9 {pid}` ends it at once)"
                )
        console.print(f"stopped the server of {directory}", highlight=False)

    run_async(go)


NOT_RUNNING = 3
"""The exit status of ``status --require-server`` when no server runs (LSB init scripts' "program is not
running")."""


def _db_open(d: dict[str, Any]) -> str:
    """The "open" cell of a database: "yes", or "no" with why (closed as unused) and its file's size."""
    if d.get("open", True):
        return "yes"
    why = "unused, closed" if d.get("closed_as_unused") else "no"
    size = d.get("bytes")
    return why if size is None else f"{why} ({size:,} bytes)"


@main.command()
@click.argument("directory", type=UserPath(file_okay=False, path_type=Path, remote=True))
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
@click.option(
    "--require-server",
    is_flag=True,
    help="Exit with status 3, without opening the store, when no server runs (a health check's use).",
)
def status(directory: Target, as_json: bool, require_server: bool) -> None:
    """Show the store of DIRECTORY: version, connections, databases, and what each engine holds.

    Asks the directory's server when one runs, else opens the store in this command (no server is started; the
    output says so, and "server_running" is false), unless --require-server is given: then it exits with status 3
    (as LSB's status actions do for "not running"). DIRECTORY may be a server's tcp://HOST:PORT or tls://HOST:PORT,
    with its token in $TINYSTORE_TOKEN."""
    need_store_dir(directory)

    async def go() -> dict[str, Any]:
        if require_server and not isinstance(directory, Address):
            # (trial IT: a health check read exit status 0 from a store this command opened itself, with no server;
            # and owning the directory meanwhile, it made a starting `tinystore serve` fail)
            try:
                store = await _connect_dir(directory)
            except UnavailableError as exc:
                if not directory.exists():
                    raise
                click.echo(f"error[not_running] {exc.message} (--require-server: the store was not opened)", err=True)
                sys.exit(NOT_RUNNING)
        else:
            store = await open_for_cli(directory)
        try:
            if store.mode == "embedded":
                # opened here: load the queues as a server does at its start, so that they are listed (trial EP)
                from ..client.jobs import queues

                await queues(store)
            result: dict[str, Any] = await store.status()
            # no server runs: the store was opened by this command, for this command only
            result["server_running"] = store.mode != "embedded"
            return result
        finally:
            await store.close()

    st = run_async(go)
    if as_json:
        click.echo(to_json(st))
        return
    console.print(
        Text.assemble(
            (f"tinystore {st['version']}", "bold"),
            f"  {st['directory']}  pid {st['pid']}  mode {st['mode']}  up {st['uptime']:.1f}s  "
            f"durability {st['durability']}  SQLite {st.get('sqlite_version', '?')}",
        ),
        highlight=False,
    )
    if not st["server_running"]:
        console.print("no server runs: this command opened the store itself (it is closed again)", highlight=False)
    limits = st.get("limits")
    if isinstance(limits, dict):
        import msgspec

        from ..limits import Limits

        defaults = msgspec.to_builtins(Limits())
        changed = [f"{k} {v}" for k, v in limits.items() if defaults.get(k) != v]
        console.print(f"limits {'  '.join(changed) if changed else 'the defaults'}", highlight=False)
    files = st.get("files")
    if isinstance(files, dict) and files.get("open") is not None:
        cap = files.get("limit")
        of = f" of the {cap:,} this process may open" if isinstance(cap, int) and 0 < cap < 1 << 40 else ""
        console.print(f"files {files['open']:,} open{of}", highlight=False)
    conns = st.get("connections", [])
    print_table(
        "connections",
        ["id", "name", "local", "capability", "calls"],
        [[c["id"], c["name"], c["local"], c["capability"], c["calls"]] for c in conns],
    )
    unsent = st.get("unsent") or {}
    if unsent.get("bytes") or unsent.get("evicted"):
        console.print(
            f"unsent to clients: {unsent.get('bytes', 0):,} bytes (Limits.client_output_bytes "
            f"{unsent.get('limit', 0):,}); connections closed past it: {unsent.get('evicted', 0)}",
            highlight=False,
        )
    dbs = st.get("databases", {})
    print_table(
        "databases",
        ["name", "path", "open", "writes", "commits", "reads", "transactions"],
        [
            [n, d["path"], _db_open(d)]
            + ["" if d.get(k) is None else d[k] for k in ("writes", "commits", "reads", "transactions")]
            for n, d in dbs.items()
        ],
    )
    for key in ("channels", "locks", "jobs"):
        if key in st:
            _print_engine(key, st[key])


@main.command()
@click.argument("directory", type=UserPath(file_okay=False, path_type=Path))
@click.argument("dest", type=UserPath(path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print JSON for scripts.")
def backup(directory: Path, dest: Path, as_json: bool) -> None:
    """Copy the store of DIRECTORY, while it runs, into DEST (a new or empty folder): a store directory of its
    own, which `tinystore serve DEST` opens. Each database is copied as one read transaction sees it, with
    SQLite's online backup API; writes go on meanwhile."""
    need_store_dir(directory)

    async def go() -> dict[str, Any]:
        store = await open_for_cli(directory)
        try:
            result: dict[str, Any] = await store.backup(dest)
            return result
        finally:
            await store.close()

    result = run_async(go)
    if as_json:
        click.echo(to_json(result))
        return
    dbs = result["databases"]
    print_table("databases copied", ["name", "bytes"], [[n, f"{b:,}"] for n, b in dbs.items()])
    for name, why in result.get("skipped", {}).items():
        # (a database's name, or the name of a file whose name is none: it has its suffix; trial CR)
        err_console.print(f"not copied: sql/{name if '.' in name else name + '.db'}: {why}", highlight=False)
    err_console.print(
        f"backed up {directory} into {result['dest']}: {len(dbs)} database{'s' if len(dbs) != 1 else ''} in "
        f"{result['seconds']:.2f}s",
        highlight=False,
    )


STATUS_ROWS = 100
"""The most rows ``tinystore status`` prints of a list (its ``--json`` gives what the store lists: printing a table
of 10,000 queues took 10 s)."""


def _print_engine(key: str, value: Any) -> None:
    if isinstance(value, dict):
        scalars = {k: v for k, v in value.items() if not isinstance(v, list | dict)}
        console.print(
            Text.assemble((key, "bold"), " " + "  ".join(f"{k} {v}" for k, v in scalars.items())), highlight=False
        )
        for k, v in value.items():
            if isinstance(v, list) and v and isinstance(v[0], dict):
                cols = list(v[0].keys())
                total = value.get(f"{k}_total", len(v))
                shown = v[:STATUS_ROWS]
                print_table(f"{key}: {k}", cols, [[_cell(row.get(c)) for c in cols] for row in shown])
                if total > len(shown):
                    more = total - len(shown)
                    console.print(f"  ... {more:,} more {k} of {key} (--json lists more)", highlight=False)


def _cell(value: Any) -> Any:
    """A status value as a table shows it: a list's items comma-separated (a key's fences, its holders)."""
    return ", ".join(map(str, value)) if isinstance(value, list) else value


def _db_name(stem: str) -> bool:
    """Whether ``stem`` (a file's name less ``.db``) is a database's name: the store opens no other file."""
    from ..errors import InvalidError
    from ..names import check_name

    try:
        check_name("database", stem)
    except InvalidError:
        return False
    return True


class _SqlCommand(click.Command):
    """A command whose arguments are SQL: one that starts with a line comment (``-- how many rows``, then the
    statement on the next line) is an argument, not an unknown option (trial CZ: "No such option '-- how many
    rows ...'"). An option's name never has a space after its ``--``."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        kept: dict[str, str] = {}
        shown: list[str] = []
        for arg in args:
            if len(arg) > 2 and arg.startswith("--") and arg[2].isspace():
                key = f"\x00{len(kept)}"
                kept[key] = arg
                shown.append(key)
            else:
                shown.append(arg)
        rest = super().parse_args(ctx, shown)
        for name, value in list(ctx.params.items()):
            if isinstance(value, str) and value in kept:
                ctx.params[name] = kept[value]
            elif isinstance(value, tuple):
                ctx.params[name] = tuple(kept.get(v, v) if isinstance(v, str) else v for v in value)
        return rest


@main.command(cls=_SqlCommand)
@click.argument("directory", type=UserPath(file_okay=False, path_type=Path, remote=True))
@click.argument("statement")
@click.argument("params", nargs=-1)
@click.option(
    "--db", "database", default=None, help="The database's name (default: main, or the store's only database)."
)
@click.option("--json", "as_json", is_flag=True, help="Print JSON lines for scripts.")
@click.option("--write", is_flag=True, help="Allow a statement that writes.")
@click.option("--create", is_flag=True, help="Create the database when it does not exist (with --write).")
@click.option("--text", "as_text", is_flag=True, help="Send every parameter as text (007 stays '007').")
def sql(
    directory: Target,
    statement: str,
    params: tuple[str, ...],
    database: str | None,
    as_json: bool,
    write: bool,
    create: bool,
    as_text: bool,
) -> None:
    """Run STATEMENT on a database of DIRECTORY and print the rows (a table, or JSON with --json).

    PARAMS fill the statement's ? placeholders in order, or, when its placeholders are named (:owner), are each
    NAME=VALUE (owner=ann). Through the directory's server when one runs, else on the store opened in this command
    (no server is started). DIRECTORY may be a server's tcp://HOST:PORT or tls://HOST:PORT, with its token in
    $TINYSTORE_TOKEN."""
    need_store_dir(directory)

    async def go() -> tuple[list[str], list[list[Any]], Any]:
        if isinstance(directory, Address):
            store = await open_for_cli(directory)
            try:
                return await run(store, check(sorted((await store.status())["databases"])))
            finally:
                await store.close()
        # (before the store is opened; a file the store does not open, App.db, is no database: trial DE)
        sql_dir = directory / "sql"
        if sql_dir.is_dir() and not os.access(sql_dir, os.R_OK | os.X_OK):
            # (trial EP: as another user, the listing was empty: "no database 'app' (databases: none)")
            raise PermissionDeniedError(
                f"store {directory}: this user may not read its databases ({sql_dir} is for the user that owns the "
                "store: run the command as that user)"
            )
        name = check(sorted(p.stem for p in sql_dir.glob("*.db") if _db_name(p.stem)))
        store = await open_for_cli(directory)
        try:
            return await run(store, name)
        finally:
            await store.close()

    def check(known: list[str]) -> str:
        """The database's name (``--db``, or the default), refused when it does not exist and may not be made."""
        from ..errors import InvalidError
        from ..names import RESERVED_DB_PREFIX, check_name

        name = database
        if name is None:
            apps = [k for k in known if not k.startswith(RESERVED_DB_PREFIX)]
            name = apps[0] if len(apps) == 1 and "main" not in known else "main"
        # a database that does not exist is made only when asked for by name (trial BL: a typo in --db with --write
        # made one, and the store's "only database" that --db defaults to was no longer the only one)
        if name not in known and not (write and create and not name.startswith(RESERVED_DB_PREFIX)):
            if not name.startswith(RESERVED_DB_PREFIX):
                check_name("database", name)  # a name no database can have: say so, not "no database"
            if name.startswith(RESERVED_DB_PREFIX):
                hint = " (it is made when the store first opens a queue)" if name == "tinystore-jobs" else ""
                make = ""
            else:
                # (trial EF: with --create given, "add --write --create" read as though it had not been)
                hint = ""
                make = ", or add --write to create it (--create makes one only with --write)" if create else ""
                make = make or ", or add --write --create to create it"
            raise InvalidError(
                f"store {directory}: no database {name!r}{hint} (databases: {', '.join(known) or 'none'}; "
                f"choose one with --db{make})"
            )
        return name

    async def run(store: Any, name: str) -> tuple[list[str], list[list[Any]], Any]:
        from ..engines.sql_guard import WRITER_ONLY
        from ..engines.sql_text import is_vacuum, named_placeholder
        from ..errors import InvalidError
        from ..names import RESERVED_DB_PREFIX, reserved_db_error

        db = await store.database(name)
        named = named_placeholder(statement)
        texts = list(params)
        if named is not None:
            # values by name (NAME=VALUE), for a statement whose placeholders are named (:a, @a, $a)
            pairs = [_named_param(i, p, named) for i, p in enumerate(params, 1)]
            texts = [text for _, text in pairs]
            names = [n for n, _ in pairs]
            twice = next((n for n in names if names.count(n) > 1), None)
            if twice is not None:  # (trial IC: the last one won, without a word)
                raise InvalidError(f"parameter {twice}: given more than once")
        values = list(texts) if as_text else [_param(p) for p in texts]
        for i, v in enumerate(values, 1):
            if type(v) is int and not -(1 << 63) <= v < 1 << 63:
                raise InvalidError(
                    f"parameter {i}: {params[i - 1]} is past 64 bits, which SQLite cannot hold as an int; "
                    "--text sends every parameter as text (a 40-digit fence stays whole)"
                )
            if type(v) is float and math.isinf(v):
                raise InvalidError(
                    f"parameter {i}: {params[i - 1]} is past what a float holds (it would be stored as an "
                    "infinity); --text sends every parameter as text"
                )
        if named is not None:
            values = [dict(zip((n for n, _ in pairs), values, strict=True))]

        async def on_the_writer() -> tuple[list[str], list[list[Any]], Any]:
            sent["served"] = store.mode == "cli"
            sent["write"] = True
            done = await db.exec(statement, *values)
            return done.columns, [list(r) for r in done.rows], done

        if write and (_PRAGMA_HEAD.match(statement) is not None or is_vacuum(statement)):
            # (a PRAGMA that sets something must reach the writer: a reader's connection takes some and
            # answers nothing, page_size for one; VACUUM and a checkpoint run there only, of the store's own
            # databases too, which refuse a reader's write as the store's own: trial HL)
            return await on_the_writer()
        try:
            # a statement that only reads runs as a read, --write given or not: its rows alone, and no "changed"
            # line that a script reading --json lines takes for one more row (trial FF: with --write, a select that
            # matched no row printed {"changes": 0, ...}); one that writes fails on the reader before it changes
            # anything (SQLite checks when its program starts), and with --write goes to the writer
            rows = await db._query(statement, values, "all")
        except InvalidError as exc:
            writes = "readonly" in exc.message or "read-only" in exc.message
            if write and (writes or WRITER_ONLY in exc.message):
                return await on_the_writer()
            if writes:
                if name.startswith(RESERVED_DB_PREFIX):
                    raise reserved_db_error(name, "this statement writes") from None
                raise InvalidError(f"database {name}: this statement writes: add --write to run it") from None
            raise
        return rows.columns, [list(r) for r in rows.rows], None

    sent: dict[str, bool] = {"write": False, "served": False}
    try:
        columns, rows, done = run_async(go)
    except KeyboardInterrupt:
        # (trial EP: click said "Aborted!", and the write went on and committed)
        if not sent["write"]:
            why = "interrupted"
        elif sent["served"]:
            why = (
                "interrupted: the write was sent, and Ctrl-C does not stop a write: it commits or fails on its own "
                "in the server (a long one holds the writer until it ends, or Limits.statement_timeout stops it); "
                "look with a read"
            )
        else:
            why = "interrupted: the store this command opened was closed: the write committed whole or not at all"
        sys.stderr.write(f"{why}\n")
        sys.exit(130)
    # a write ends with what it changed, rows returned or not (trial FB: `delete ... returning *` matching none printed
    # nothing at all); a PRAGMA that answered rows and changed nothing is a read
    summary = done is not None and not (rows and done.changes == 0)
    if as_json:
        keys = _unique(columns)
        for r in rows:
            click.echo(to_json(dict(zip(keys, r, strict=False))))
        if summary:
            click.echo(to_json({"changes": done.changes, "last_insert_rowid": done.last_insert_rowid}))
        return
    if columns:
        print_table(None, columns, rows)
    if summary:
        console.print(f"{done.changes} row(s) changed, last rowid {done.last_insert_rowid}")


_PRAGMA_HEAD = re.compile(r"(?:\s|;|--[^\n]*(?:\n|\Z)|/\*(?:[^*]|\*(?!/))*(?:\*/|\Z))*pragma\b", re.IGNORECASE)
"""A statement that is a PRAGMA (blanks, comments and semicolons before it)."""


def _unique(columns: list[str]) -> list[str]:
    """``columns`` as JSON keys: a name that comes again gets ``_2``, ``_3``, ... (the first free one), so that no
    column's value is lost (trial EP: ``select a.id, b.id`` gave one ``id``, the last)."""
    seen: set[str] = set()
    out: list[str] = []
    for name in columns:
        key, n = name, 1
        while key in seen:
            n += 1
            key = f"{name}_{n}"
        seen.add(key)
        out.append(key)
    return out


_INT_TEXT = re.compile(r"[+-]?[0-9]+\Z", re.ASCII)
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?\Z", re.ASCII)


_PARAM_NAME = re.compile(r"[:@$]?([^=\s]+)=")  # (any name SQLite takes: é, 1, a$, a::b; trial ID)


def _named_param(i: int, text: str, placeholder: str) -> tuple[str, str]:
    """Parameter ``i`` of ``tinystore sql`` for a statement with named placeholders (``placeholder`` is its first):
    ``NAME=VALUE`` (``:NAME=VALUE`` too) as its name and its value's text; ``InvalidError`` otherwise."""
    from ..errors import InvalidError

    m = _PARAM_NAME.match(text)
    if m is None:
        raise InvalidError(
            f"parameter {i}: {text!r}: the statement's placeholders are named ({placeholder}): give each parameter "
            f"as NAME=VALUE ({placeholder[1:]}=...)"
        )
    return m.group(1), text[m.end() :]


def _param(text: str) -> Any:
    """A parameter of ``tinystore sql``: an int when it is ASCII digits (an optional sign first), else a float when
    it is a decimal number (``1.5``, ``-2e3``), else the text itself. Not Python's ``int()``, which also reads
    ``1_000``, `` 7`` and digits of other scripts (``٣``); ``nan`` and ``inf`` stay text."""
    if _INT_TEXT.match(text):
        return int(text)
    if _FLOAT_TEXT.match(text):
        return float(text)
    return text


def _load_groups() -> None:
    for name in ("channels", "locks", "jobs", "demo"):
        try:
            module = __import__(f"{__package__}.{name}", fromlist=["register"])
        except ModuleNotFoundError as exc:
            if exc.name != f"{__package__}.{name}":
                raise
            continue
        module.register(main)


_load_groups()
