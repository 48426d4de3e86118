"""``tinystore demo``: the live chat of the seeds (``examples/chat``), on a store in ``./data``.

- ``tinystore demo [DIR]``: one process: the engines embedded (serving ``DIR``'s socket, so ``tinystore
  status DIR`` works meanwhile), the web app, and the reply and summary workers.
- ``tinystore demo [DIR] --web-processes N``: N web processes (on ports PORT, PORT+1, ...) and one worker
  process, all reaching one store through the directory's server (a sidecar, started when none runs). A
  message posted through one process reaches the tabs connected to another.

The chat's code lives in the source tree's ``examples/chat`` and is installed with the package as
``tinystore/_chat`` (so ``pip install tinystore`` alone can run it); ``$TINYSTORE_CHAT_EXAMPLE`` names another
folder. The model is the offline one unless ``--model-url`` names an OpenAI-compatible endpoint (the key
comes from ``$OPENAI_API_KEY``).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import importlib
import importlib.util
import logging
import os
import signal
import subprocess
import sys
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, ModuleType
from typing import Any

import click

PACKAGE = "tinystore_chat_example"
READY = "ready "
"""The first line a child process prints on stdout once it serves: ``ready <address>``."""
START_WITHIN = 60.0
"""Seconds a child process has to print that it is ready."""


def find_example() -> Path:
    """The chat example's folder: ``$TINYSTORE_CHAT_EXAMPLE``, the installed package's ``_chat``, the source
    tree's ``examples/chat``, or
    ``./examples/chat``. Raises ``click.ClickException`` when none holds ``app.py``."""
    candidates = [
        os.environ.get("TINYSTORE_CHAT_EXAMPLE"),
        Path(__file__).parent.parent / "_chat",  # the package's copy (in a wheel; a link in the source tree)
        Path(__file__).resolve().parents[3] / "examples" / "chat",
        Path.cwd() / "examples" / "chat",
    ]
    for c in candidates:
        if c and (Path(c) / "app.py").is_file():
            return Path(c).resolve()
    raise click.ClickException(
        "the chat example (examples/chat) was not found: run from a checkout of TinyStore, or set "
        "TINYSTORE_CHAT_EXAMPLE to its folder"
    )


def load_example(folder: Path | None = None) -> ModuleType:
    """Import the chat example as the package ``tinystore_chat_example``; returns its ``app`` module."""
    if PACKAGE not in sys.modules:
        folder = folder or find_example()
        spec = importlib.util.spec_from_file_location(
            PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        if spec is None or spec.loader is None:
            raise click.ClickException(f"cannot load the chat example from {folder}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[PACKAGE]
            raise
    return importlib.import_module(f"{PACKAGE}.app")


def make_model(url: str | None, name: str, token_delay: float = 0.03) -> Any:
    """The offline model (``token_delay`` seconds a token), or the OpenAI-compatible endpoint at ``url``."""
    model = importlib.import_module(f"{PACKAGE}.model")
    if url:
        return model.OpenAICompatibleModel(url, model=name)
    return model.OfflineModel(delay=token_delay)


STOPPING = (
    "stopping: a reply being written gets a few seconds, else it is handed back to its queue and finishes after the "
    "next start"
)


def _uvicorn_server(app: Any, host: str, port: int, say_stopping: bool = True) -> Any:
    import uvicorn

    from ..sse import end_streams

    class Server(uvicorn.Server):
        """uvicorn, ending the open event streams as soon as it is told to stop (the browsers reconnect), and
        not raising the signal again once it stopped, so the store closes cleanly after it."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if not self.should_exit and say_stopping:  # (said once; by run_many for its web processes)
                print(STOPPING, file=sys.stderr, flush=True)
            end_streams()
            super().handle_exit(sig, frame)

        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            previous = {sig: signal.signal(sig, self.handle_exit) for sig in (signal.SIGINT, signal.SIGTERM)}
            try:
                yield
            finally:
                for sig, handler in previous.items():
                    signal.signal(sig, handler)

    config = uvicorn.Config(
        app,
        host=host,
        port=port,
        lifespan="on",
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    return Server(config)


def _address(server: Any, host: str) -> str:
    """The address to open: a wildcard host (0.0.0.0, ::) is shown as this machine's loopback address, followed by
    its address on the network (what a phone on the same network opens), when it has one."""
    sock = server.servers[0].sockets[0]
    port = sock.getsockname()[1]
    shown = {"0.0.0.0": "127.0.0.1", "::": "[::1]", "": "127.0.0.1"}.get(host, f"[{host}]" if ":" in host else host)
    address = f"http://{shown}:{port}"
    if host in ("0.0.0.0", "::", ""):
        lan = _network_address()
        if lan:
            address += f" (on this network: http://{lan}:{port})"
    return address


def _network_address() -> str | None:
    """This machine's IPv4 address on its network: the source address of a route outwards (a UDP socket's
    connect sends nothing), or ``None`` when there is no such route."""
    import socket

    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(("192.0.2.1", 9))  # TEST-NET-1 (RFC 5737): never reached, only routed
            addr = str(s.getsockname()[0])
    except OSError:
        return None
    return None if addr.startswith("127.") or addr == "0.0.0.0" else addr


async def _serve(server: Any, host: str, on_ready: Any) -> None:
    """Run a uvicorn server until it stops (Ctrl-C, SIGTERM); call ``on_ready(address)`` once it serves.
    Raises ``click.ClickException`` when it cannot start (uvicorn has logged why, e.g. the port is taken)."""

    async def serve() -> None:
        try:
            await server.serve()
        except SystemExit:  # uvicorn's way to say its startup failed: told below, once, without a traceback
            if server.started:
                raise

    task = asyncio.ensure_future(serve())
    try:
        while not server.started:
            if task.done():
                break
            await asyncio.sleep(0.02)
        if server.started:
            on_ready(_address(server, host))
        await task
    finally:
        if not task.done():
            server.should_exit = True
            with contextlib.suppress(BaseException):
                await task
    if not server.started:
        raise click.ClickException(
            f"the web server could not start on {host}:{server.config.port} (another program may be using the "
            "port: pick another with --port, or --port 0 for any free one)"
        )


def _check_ports(host: str, ports: list[int]) -> None:
    """Raise ``click.ClickException`` when one of ``ports`` is taken on ``host``: before anything starts, so a busy
    port leaves no new store directory and no web server's own error behind (trial AA)."""
    import socket

    for port in ports:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            return  # (a host that does not resolve: the web server says so)
        family, kind, proto, _, address = infos[0]
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                raise click.ClickException(
                    f"port {port} on {host} is not free ({exc.strerror or exc}): pick another with --port, or "
                    "--port 0 for any free one"
                ) from None


def _run(coro_fn: Any) -> None:
    try:
        import uvloop

        uvloop.run(coro_fn())
    except ImportError:  # pragma: no cover
        asyncio.run(coro_fn())


# ------------------------------------------------------------------------------------------ roles


def run_single(
    directory: Path, host: str, port: int, model_url: str | None, model_name: str, token_delay: float
) -> None:
    """Everything in this process, on an embedded store (or on the directory's server when one runs)."""
    app_module = load_example()
    model = make_model(model_url, model_name, token_delay)

    async def main() -> None:
        import tinystore

        try:
            store = await tinystore.open(directory, embedded=True)
            how = "embedded"
        except tinystore.InUseError:
            store = await tinystore.open(directory)
            how = "through the directory's running server"
        try:
            app = app_module.create_app(store=store, workers=True, model=model, listen_host=host)
            server = _uvicorn_server(app, host, port)

            def ready(address: str) -> None:
                click.echo(f"TinyStore chat: {address}  (store {directory}, {how}; Ctrl-C stops)")
                click.echo(f"  open it in two tabs, or on a phone; `tinystore status {directory}` shows the store")
                sys.stdout.flush()

            await _serve(server, host, ready)
        finally:
            await store.close()

    _run(main)


def run_web(directory: Path, host: str, port: int, model_url: str | None, model_name: str, token_delay: float) -> None:
    """A web process of ``--web-processes``: the app on the directory's shared store, no workers."""
    _die_with_parent()
    app_module = load_example()
    app = app_module.create_app(
        directory=directory,
        embedded=False,
        workers=False,
        model=make_model(model_url, model_name, token_delay),
        listen_host=host,
    )
    server = _uvicorn_server(app, host, port, say_stopping=False)

    def ready(address: str) -> None:
        sys.stdout.write(f"{READY}{address}\n")
        sys.stdout.flush()

    _run(lambda: _serve(server, host, ready))


def run_worker(directory: Path, model_url: str | None, model_name: str, token_delay: float) -> None:
    """The worker process of ``--web-processes``: the reply and summary jobs, until SIGTERM or SIGINT."""
    _die_with_parent()
    load_example()
    service = importlib.import_module(f"{PACKAGE}.service")

    async def main() -> None:
        import tinystore

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        store = await tinystore.open(directory)
        try:
            chat = await service.Chat(store, make_model(model_url, model_name, token_delay)).open()
            chat.start_workers()
            sys.stdout.write(f"{READY}worker {os.getpid()}\n")
            sys.stdout.flush()
            beating = asyncio.ensure_future(_beat(stop))
            try:
                await stop.wait()
            finally:
                beating.cancel()
                await asyncio.gather(beating, return_exceptions=True)
                await chat.stop_workers()
        finally:
            await store.close()

    _run(main)


BEAT_ENV = "TINYSTORE_DEMO_BEAT"
"""Seconds between the lines the worker of ``--web-processes`` writes to say it is alive (see :func:`_beat`)."""
BEAT = b"alive"


async def _beat(stop: asyncio.Event) -> None:
    """In the worker of ``--web-processes``: a line on stdout every ``$TINYSTORE_DEMO_BEAT`` seconds, from its
    loop, which the demo reads (:func:`_heard`): a worker whose loop is stuck, or that was stopped, writes none."""
    try:
        every = float(os.environ.get(BEAT_ENV, ""))
    except ValueError:
        return
    while not stop.is_set():
        try:
            sys.stdout.buffer.write(BEAT + b"\n")
            sys.stdout.flush()
        except (OSError, ValueError):
            return  # (the demo is gone)
        await asyncio.sleep(every)


def run_many(
    directory: Path,
    host: str,
    port: int,
    processes: int,
    model_url: str | None,
    model_name: str,
    token_delay: float,
    hang_after: float = 30.0,
) -> None:
    """N web processes and a worker process on the directory's server; one that exits is started again, and one
    that does not answer (or, the worker, beat) for ``hang_after`` seconds is killed and started again (see
    :func:`_supervise`); stops them all on Ctrl-C / SIGTERM."""
    load_example()  # fail here, not in every child

    async def main() -> None:
        import tinystore

        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        # the store's server (a sidecar), kept up while the demo runs; migrations applied once, here. One this
        # demo started is stopped with it (else it would stay until idle); one already serving is left running.
        from ..client.store import _can_connect
        from ..server import paths

        serving = (
            directory.is_dir() and (await asyncio.to_thread(_can_connect, paths.socket_path(directory))) is not False
        )
        store = await tinystore.open(directory)
        service = importlib.import_module(f"{PACKAGE}.service")
        await service.Chat(store).open()
        children: list[asyncio.subprocess.Process] = []  # every process started (each stopped at the end)
        os.environ[BEAT_ENV] = repr(beat_every(hang_after))  # (the worker's beat: its children have it)
        base = [sys.executable, "-m", "tinystore", "demo", str(directory), "--host", host]
        base += ["--token-delay", repr(token_delay)]
        if model_url:
            base += ["--model-url", model_url, "--model-name", model_name]
        try:
            slots: list[_Slot] = []
            addresses: list[str] = []
            for i in range(processes):
                p = 0 if port == 0 else port + i
                argv = [*base, "--port", str(p), "--role", "web"]
                proc, address = await _start_child(children, argv)
                # started again, it takes the same port, so that its pages reconnect to it (the address is the
                # URL, then, for a wildcard host, "(on this network: ...)": trial DR)
                probe = _probe_at(address)
                argv[argv.index("--port") + 1] = str(probe[1] if probe else p)
                slots.append(_Slot(f"web process {i + 1} ({address.split()[0]})", argv, proc, probe))
                addresses.append(address)
            argv = [*base, "--role", "worker"]
            proc, _ = await _start_child(children, argv)
            slots.append(_Slot("the worker", argv, proc))
            click.echo(
                f"TinyStore chat: {processes} web process{'es' if processes > 1 else ''} and a worker share the "
                f"store {directory} (through its server); Ctrl-C stops"
            )
            for i, address in enumerate(addresses, 1):
                click.echo(f"  web process {i}: {address}")
            sys.stdout.flush()
            asked = await _supervise(slots, children, stop, hang_after)
        finally:
            await _stop_children(children)
            if not serving:
                with contextlib.suppress(tinystore.TinystoreError, OSError):
                    await store.stop_server(5.0)
            await store.close()
        if not asked:  # (stopped as its processes kept exiting: not a stop anyone asked for, trial DR)
            raise SystemExit(1)

    _run(main)


@dataclasses.dataclass
class _Slot:
    """A process of ``--web-processes``: what it is (for messages), how it starts, the process now."""

    label: str
    argv: list[str]
    proc: asyncio.subprocess.Process
    probe: tuple[str, int] | None = None  # (host, port) of a web process, asked for /healthz
    beat: float = 0.0  # the worker: when its last line came (loop time; see _heard)


RESTARTS_MAX = 5
"""Starts again within :data:`RESTARTS_WITHIN` seconds, over all the demo's processes, past which the demo stops
(a process that exits at once would otherwise be started forever)."""
RESTARTS_WITHIN = 60.0


async def _supervise(
    slots: list[_Slot], children: list[asyncio.subprocess.Process], stop: asyncio.Event, hang_after: float = 30.0
) -> bool:
    """Until ``stop``: a process that exits (killed, crashed, or failed to start again) is started again, in its
    place (a web process on its port), while the others go on serving (trial DQ: one web process killed stopped
    the whole demo, and every page, those of the other process too, stayed "reconnecting"). A web process that
    does not answer ``GET /healthz`` for ``hang_after`` seconds (hung, or stopped with SIGSTOP) is killed, and so
    started again (:func:`_watch_hangs`; gunicorn's worker ``timeout`` does the same, 30 s by default). ``stop``
    ends a start under way too. Returns whether the demo stopped as asked; ``False`` once the processes exited
    more than :data:`RESTARTS_MAX` times within :data:`RESTARTS_WITHIN` seconds (then the demo stops, status 1)."""
    loop = asyncio.get_running_loop()
    restarts: collections.deque[float] = collections.deque()
    stopping = asyncio.ensure_future(stop.wait())
    watchdog = asyncio.ensure_future(_watch_hangs(slots, hang_after))
    listening = {asyncio.ensure_future(_heard(slot, slot.proc)) for slot in slots if slot.probe is None}
    try:
        while True:
            waits = {asyncio.ensure_future(slot.proc.wait()): slot for slot in slots}
            try:
                done, _ = await asyncio.wait([*waits, stopping], return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waits:
                    w.cancel()
                await asyncio.gather(*waits, return_exceptions=True)
            if stop.is_set():
                click.echo(STOPPING, err=True)
                return True
            for slot in (waits[w] for w in done if w in waits):
                now = loop.time()
                restarts.append(now)
                while restarts[0] < now - RESTARTS_WITHIN:
                    restarts.popleft()
                if len(restarts) > RESTARTS_MAX:
                    click.echo(
                        f"{slot.label} exited (status {slot.proc.returncode}); the demo's processes exited "
                        f"{len(restarts)} times within {RESTARTS_WITHIN:g}s: stopping the others",
                        err=True,
                    )
                    return False
                click.echo(f"{slot.label} exited (status {slot.proc.returncode}); starting it again", err=True)
                start = asyncio.ensure_future(_start_child(children, slot.argv))
                await asyncio.wait([start, stopping], return_when=asyncio.FIRST_COMPLETED)
                if stop.is_set():  # (trial DR: a start that hung kept a Ctrl-C waiting up to 70 s)
                    start.cancel()
                    await asyncio.gather(start, return_exceptions=True)
                    click.echo(STOPPING, err=True)
                    return True
                try:
                    slot.proc, _ = start.result()
                    if slot.probe is None:
                        listening = {t for t in listening if not t.done()}
                        listening.add(asyncio.ensure_future(_heard(slot, slot.proc)))
                except click.ClickException as exc:
                    # (trial DR: one failed start, a port taken meanwhile, stopped the others too) it counts as an
                    # exit, and is tried again after a moment, until the limit above
                    click.echo(f"{slot.label}: {exc.message}", err=True)
                    failed = children[-1]
                    if failed.returncode is None:
                        with contextlib.suppress(ProcessLookupError):
                            failed.kill()
                        await failed.wait()
                    slot.proc = failed
                    await asyncio.wait([stopping], timeout=1.0)
    finally:
        stopping.cancel()
        watchdog.cancel()
        for t in listening:
            t.cancel()
        await asyncio.gather(stopping, watchdog, *listening, return_exceptions=True)


async def _heard(slot: _Slot, proc: asyncio.subprocess.Process) -> None:
    """Read the worker ``proc``'s lines (its :func:`_beat`) until it ends, noting in ``slot`` when each came."""
    loop = asyncio.get_running_loop()
    slot.beat = loop.time()
    if proc.stdout is None:
        return
    while await proc.stdout.readline():
        slot.beat = loop.time()


def _probe_at(address: str) -> tuple[str, int] | None:
    """Where to ask a web process that printed ``address`` (its URL, then perhaps "(on this network: ...)") for its
    health: its host (this machine's loopback for a wildcard one) and port."""
    parts = urllib.parse.urlsplit(address.split()[0])
    if parts.port is None:
        return None
    host = parts.hostname or "127.0.0.1"
    return {"0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host), parts.port


async def _watch_hangs(slots: list[_Slot], hang_after: float) -> None:
    """Kill (SIGKILL) a web process of ``slots`` that has not answered ``GET /healthz`` for ``hang_after``
    seconds, or the worker when no line of its :func:`_beat` came for that long; :func:`_supervise` then starts
    it again as for any exit. Asked every third of that (at most every 5 s); a process that exited, or is being
    started again, is not asked. Runs until cancelled."""
    loop = asyncio.get_running_loop()
    every = beat_every(hang_after)
    answered: dict[int, float] = {}  # pid → when it last answered (or was first seen)
    while True:
        await asyncio.sleep(every)
        live = [s for s in slots if s.proc.returncode is None]
        answers = await asyncio.gather(
            *(_answers(*s.probe, timeout=every) if s.probe is not None else _beat_since(s, every) for s in live)
        )
        now = loop.time()
        for slot, ok in zip(live, answers, strict=True):
            pid = slot.proc.pid
            since = answered.setdefault(pid, now)
            if ok:
                answered[pid] = now
            elif now - since > hang_after and slot.proc.returncode is None:
                click.echo(
                    f"{slot.label} did not answer for {now - since:.0f}s (hung, or stopped): killing it", err=True
                )
                with contextlib.suppress(ProcessLookupError):
                    slot.proc.kill()
                del answered[pid]
        for pid in [p for p in answered if all(s.proc.pid != p for s in slots)]:
            del answered[pid]


def beat_every(hang_after: float) -> float:
    """Seconds between two looks at the demo's processes (and between the worker's lines): a third of
    ``hang_after``, at most 5."""
    return min(5.0, hang_after / 3)


async def _beat_since(slot: _Slot, every: float) -> bool:
    """Whether the worker of ``slot`` wrote a line within the last two ``every`` (its beat's period)."""
    return asyncio.get_running_loop().time() - slot.beat < 2 * every


async def _answers(host: str, port: int, timeout: float) -> bool:
    """Whether the web process at ``host``:``port`` answers ``GET /healthz`` with 200 within ``timeout`` seconds."""
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, port)
            try:
                writer.write(b"GET /healthz HTTP/1.0\r\nHost: tinystore-demo\r\n\r\n")
                await writer.drain()
                status = await reader.readline()
            finally:
                writer.close()
        return status.startswith(b"HTTP/1.") and status.split(b" ", 2)[1:2] == [b"200"]
    except (OSError, TimeoutError, ValueError):
        return False


async def _start_child(
    children: list[asyncio.subprocess.Process], argv: list[str]
) -> tuple[asyncio.subprocess.Process, str]:
    """Start a demo process (it ends with this one: see :func:`_die_with_parent`); it and what it said once ready.
    Raises ``ClickException`` when it does not get ready."""
    env = {**os.environ, PARENT_ENV: str(os.getpid())}
    # in a session of its own: a Ctrl-C reaches the demo alone, which stops its processes in order (trial DR: a
    # process starting then printed a KeyboardInterrupt traceback)
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, env=env, start_new_session=True
    )
    children.append(proc)
    assert proc.stdout is not None
    try:
        async with asyncio.timeout(START_WITHIN):
            line = (await proc.stdout.readline()).decode(errors="replace").strip()
    except TimeoutError:
        raise click.ClickException(f"{_what(argv)} did not start within {START_WITHIN:g}s") from None
    if not line.startswith(READY):
        raise click.ClickException(f"{_what(argv)} exited before it served (status {await proc.wait()})")
    return proc, line[len(READY) :]


def _what(argv: list[str]) -> str:
    """A demo process's name for messages: ``the worker`` or ``a web process (port 8000)``."""
    if argv[argv.index("--role") + 1] == "worker":
        return "the worker"
    port = argv[argv.index("--port") + 1]
    return "a web process" + ("" if port == "0" else f" (port {port})")


PARENT_ENV = "TINYSTORE_DEMO_PARENT"
"""The pid of the demo that started a web or worker process of ``--web-processes``."""


def _die_with_parent() -> None:
    """In a process of ``--web-processes``: be sent SIGTERM when the demo that started it dies (Linux's
    ``PR_SET_PDEATHSIG``), so that a demo killed with SIGKILL leaves none of them serving its ports (trial DQ:
    they ran on, and a new demo found its port taken). Nothing elsewhere, or for a process started otherwise."""
    parent = os.environ.get(PARENT_ENV, "")
    if not parent.isdigit():
        return
    with contextlib.suppress(OSError, AttributeError):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    if os.getppid() != int(parent):  # (it died before the line above)
        os.kill(os.getpid(), signal.SIGTERM)


async def _stop_children(children: list[asyncio.subprocess.Process]) -> None:
    for c in children:
        if c.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                c.send_signal(signal.SIGTERM)
                c.send_signal(signal.SIGCONT)  # (one stopped, SIGSTOP, takes its SIGTERM then: trial DR waited 10 s)
    for c in children:
        try:
            async with asyncio.timeout(10):
                await c.wait()
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                c.kill()
            await c.wait()


# ------------------------------------------------------------------------------------------ the command


def register(main: click.Group) -> None:
    """Add ``tinystore demo`` to the command group ``main``."""
    from . import UserPath

    @main.command()
    @click.argument("directory", default="./data", type=UserPath(file_okay=False, path_type=Path))
    @click.option(
        "--port", default=8000, show_default=True, type=click.IntRange(0, 65535), help="The web port (0: any free one)."
    )
    @click.option(
        "--host",
        default="127.0.0.1",
        show_default=True,
        help="The address to listen on. A request that comes over loopback must name loopback (localhost, "
        "127.x.x.x, [::1]) in its Host, against DNS rebinding; on another address (0.0.0.0, for phones), requests "
        "from the network are answered under any name.",
    )
    @click.option(
        "--web-processes",
        default=0,
        show_default=True,
        type=click.IntRange(0, 64),
        help="Run N web processes (ports PORT..PORT+N-1) and a worker process on the directory's server, "
        "instead of one process on an embedded store.",
    )
    @click.option("--model-url", default=None, help="An OpenAI-compatible API (e.g. http://localhost:11434/v1).")
    @click.option("--model-name", default="gpt-4o-mini", show_default=True, help="The model at --model-url.")
    @click.option(
        "--token-delay",
        default=0.03,
        show_default=True,
        type=click.FloatRange(0, 10),
        help="Seconds between the offline model's tokens.",
    )
    @click.option("--role", type=click.Choice(["web", "worker"]), default=None, hidden=True)
    @click.option("--hang-after", type=click.FloatRange(0.3, 3600), default=30.0, hidden=True)
    def demo(
        directory: Path,
        port: int,
        host: str,
        web_processes: int,
        model_url: str | None,
        model_name: str,
        token_delay: float,
        role: str | None,
        hang_after: float,
    ) -> None:
        """Run the live chat on a store in DIRECTORY (./data): open the address it prints in two tabs."""
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        from ..errors import InvalidError, TinystoreError
        from ..server.main import permission_error
        from ..server.paths import make_directory
        from . import fail

        directory = directory.resolve()
        if model_url is not None:
            from urllib.parse import urlsplit

            parts = urlsplit(model_url)
            if parts.scheme not in ("http", "https") or not parts.netloc:
                fail(
                    InvalidError(
                        f"--model-url {model_url!r}: expected an http:// or https:// address of an OpenAI-compatible "
                        "API, such as http://localhost:11434/v1"
                    )
                )
        if role is None and port:
            _check_ports(host, [port + i for i in range(max(web_processes, 1))])
        try:
            make_directory(directory, "demo")
        except PermissionError as exc:
            fail(permission_error(directory, exc))
        except TinystoreError as exc:
            fail(exc)
        if role == "web":
            run_web(directory, host, port, model_url, model_name, token_delay)
        elif role == "worker":
            run_worker(directory, model_url, model_name, token_delay)
        elif web_processes:
            run_many(directory, host, port, web_processes, model_url, model_name, token_delay, hang_after)
        else:
            run_single(directory, host, port, model_url, model_name, token_delay)
