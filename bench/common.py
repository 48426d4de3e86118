"""Shared helpers of the benchmarks: timing, percentiles, JSON output, redis-server, temp dirs, peers.

Standard library only, so that bench/peers/original.py (Python 3.12, its own venv) imports it too.
Every benchmark prints one JSON object on stdout; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
ORIG_PYTHON = BENCH / ".venv-orig" / "bin" / "python"
ORIG_SCRIPT = BENCH / "peers" / "original.py"

# Ours, the peers, and which of them the ratios are taken against.
OURS = ("tinystore_embedded", "tinystore_sidecar")


def log(*parts: object) -> None:
    print(*parts, file=sys.stderr, flush=True)


def error_text(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".strip()
    return text if len(text) <= 500 else text[:497] + "..."


# ---------------------------------------------------------------- arguments and sizes


class Sizes:
    """How long and how much: --quick for CI smoke (under ~60 s a script), else a few minutes at most."""

    def __init__(self, quick: bool) -> None:
        self.quick = quick
        self.seconds = 0.5 if quick else 2.0  # one timed phase
        self.warmup = 0.1 if quick else 0.3
        self.rounds = 1 if quick else 3  # every system once a round; the median of the rounds is reported

    def as_dict(self) -> dict[str, Any]:
        return {"quick": self.quick, "seconds": self.seconds, "warmup": self.warmup, "rounds": self.rounds}


def parse_args(description: str, systems: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--quick", action="store_true", help="a short run for CI smoke (under ~60 s)")
    parser.add_argument("--only", default="", help=f"comma-separated systems to run, of: {', '.join(systems)}")
    parser.add_argument("--rounds", type=int, default=None, help="rounds (default: 1 with --quick, else 3)")
    parser.add_argument("--seconds", type=float, default=None, help="seconds of one timed phase")
    parser.add_argument("--out", default="", help="also write the JSON to this file")
    parser.add_argument(
        "--loop",
        choices=("uvloop", "asyncio"),
        default="uvloop",
        help="the event loop of every system (default: uvloop when installed)",
    )
    args = parser.parse_args()
    chosen = [s for s in args.only.split(",") if s] or systems
    unknown = [s for s in chosen if s not in systems]
    if unknown:
        parser.error(f"unknown systems: {', '.join(unknown)}")
    args.systems = chosen
    return args


def sizes_from(args: argparse.Namespace) -> Sizes:
    sizes = Sizes(args.quick)
    if args.rounds:
        sizes.rounds = args.rounds
    if args.seconds:
        sizes.seconds = args.seconds
    return sizes


def use_uvloop(wanted: str | None = None) -> str:
    """Runs every system on the same loop: uvloop when installed (tinystore uses it), else asyncio.

    The choice goes to the original's subprocess through BENCH_LOOP.
    """
    wanted = wanted or os.environ.get("BENCH_LOOP", "uvloop")
    os.environ["BENCH_LOOP"] = wanted
    if wanted != "uvloop":
        return "asyncio"
    try:
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return "asyncio"
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return "uvloop"


def machine() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }


# ---------------------------------------------------------------- timing


async def rate(op: Callable[[int], Awaitable[object]], callers: int, seconds: float, warmup: float = 0.0) -> float:
    """Calls per second of `op(caller_index)`, run back to back by `callers` concurrent tasks.

    Warm-up calls are not counted. The rate is completed calls over the time until the last caller ended.
    """
    if warmup > 0:
        await _run_callers(op, callers, warmup)
    count, elapsed = await _run_callers(op, callers, seconds)
    return count / elapsed if elapsed > 0 else 0.0


async def _run_callers(op: Callable[[int], Awaitable[object]], callers: int, seconds: float) -> tuple[int, float]:
    counts = [0] * callers
    start = time.perf_counter()
    deadline = start + seconds

    async def caller(i: int) -> None:
        n = 0
        while time.perf_counter() < deadline:
            await op(i)
            n += 1
        counts[i] = n

    await asyncio.gather(*(caller(i) for i in range(callers)))
    return sum(counts), time.perf_counter() - start


def thread_rate(fn: Callable[[int], object], threads: int, seconds: float, warmup: float = 0.0) -> float:
    """Calls per second of the blocking `fn(thread_index)`, run back to back by `threads` threads."""
    if warmup > 0:
        _run_threads(fn, threads, warmup)
    count, elapsed = _run_threads(fn, threads, seconds)
    return count / elapsed if elapsed > 0 else 0.0


def _run_threads(fn: Callable[[int], object], threads: int, seconds: float) -> tuple[int, float]:
    counts = [0] * threads
    start = time.perf_counter()
    deadline = start + seconds

    def caller(i: int) -> None:
        n = 0
        while time.perf_counter() < deadline:
            fn(i)
            n += 1
        counts[i] = n

    pool = [threading.Thread(target=caller, args=(i,), daemon=True) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    return sum(counts), time.perf_counter() - start


def percentile(samples: list[float], p: float) -> float | None:
    """The p-th percentile (nearest rank) of samples, or None for none."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(p / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def latency_summary(seconds: list[float], prefix: str) -> dict[str, float | None]:
    """p50 and p99 of latencies in seconds, as microseconds."""
    out: dict[str, float | None] = {}
    for p in (50, 99):
        value = percentile(seconds, p)
        out[f"{prefix}_p{p}_us"] = None if value is None else round(value * 1e6, 1)
    return out


# ---------------------------------------------------------------- running systems softly


async def soft(results: dict[str, Any], name: str, coro: Awaitable[Any], within: float) -> None:
    """Awaits one measured case into results[name]; a failure or a hang is recorded, never raised."""
    try:
        async with asyncio.timeout(within):
            value = await coro
    except Exception as exc:  # a peer or our own package not working yet: measure the rest
        log(f"  {name}: {error_text(exc)}")
        if os.environ.get("BENCH_TRACEBACK"):
            traceback.print_exc(file=sys.stderr)
        results.setdefault("errors", {})[name] = error_text(exc)
        return
    if isinstance(value, float) and abs(value) >= 10:
        value = round(value, 1)
    if isinstance(value, dict):
        results.update(value)
    else:
        results[name] = value
    log(f"  {name}: {value}")


def median_of_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Merges one system's rounds: each numeric metric's median, errors and notes kept as seen."""
    merged: dict[str, Any] = {}
    spread: dict[str, list[float]] = {}
    keys: list[str] = []
    for r in rounds:
        keys.extend(k for k in r if k not in keys)
    for key in keys:
        values = [r[key] for r in rounds if key in r]
        numbers = [v for v in values if isinstance(v, int | float) and not isinstance(v, bool)]
        if numbers and len(numbers) == len(values):
            middle = statistics.median(numbers)
            merged[key] = round(middle, 1) if abs(middle) >= 10 else middle
            if len(numbers) > 1:
                spread[key] = [min(numbers), max(numbers)]
        elif key == "errors":
            errors: dict[str, str] = {}
            for v in values:
                errors.update(v)
            merged[key] = errors
        else:
            merged[key] = values[-1]
    if len(rounds) > 1:
        merged["rounds"] = len(rounds)
        merged["spread"] = spread  # each figure's lowest and highest of the rounds
    return merged


def ratios(results: dict[str, dict[str, Any]], peers: list[str]) -> dict[str, dict[str, float]]:
    """ours / peer for every numeric metric both have (for *_us latencies, below 1 is better)."""
    out: dict[str, dict[str, float]] = {}
    for mine in OURS:
        for peer in peers:
            a, b = results.get(mine, {}), results.get(peer, {})
            shared = {}
            for key, value in a.items():
                other = b.get(key)
                if key in ("rounds", "missed_1", "missed_16") or not _number(value) or not _number(other) or not other:
                    continue
                shared[key] = round(value / other, 2)
            if shared:
                out[f"{mine}/{peer}"] = shared
    return out


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_goals(
    results: dict[str, dict[str, Any]], checks: list[tuple[str, str, str, str, str, float]]
) -> dict[str, bool | None]:
    """Each check: (label, ours, metric, peer, metric, factor); passes when ours >= factor × peer.

    A latency metric (ending in _us) passes when ours <= factor × peer. None: not measured.
    """
    out: dict[str, bool | None] = {}
    for label, mine, mkey, peer, pkey, factor in checks:
        a = results.get(mine, {}).get(mkey)
        b = results.get(peer, {}).get(pkey)
        if not _number(a) or not _number(b):
            out[label] = None
        elif mkey.endswith("_us"):
            out[label] = a <= factor * b
        else:
            out[label] = a >= factor * b
    return out


def emit(report: dict[str, Any], out: str = "") -> None:
    """The one JSON object on stdout (and in `out` when given)."""
    text = json.dumps(report, indent=2, default=str)
    if out:
        Path(out).parent.mkdir(parents=True, exist_ok=True)
        Path(out).write_text(text + "\n")
    print(text, flush=True)


# ---------------------------------------------------------------- temp dirs and processes


@contextlib.contextmanager
def temp_dir(prefix: str = "tsb-") -> Iterator[Path]:
    """A fresh directory under /tmp (short, so that unix socket paths fit), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp" if os.path.isdir("/tmp") else None))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def pids_using(path: Path) -> list[int]:
    """Processes (not this one) whose command line names path: the servers a benchmark started for it."""
    needle = str(path).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if needle in cmdline:
            found.append(int(entry.name))
    return found


def stop_servers_of(directory: Path, timeout: float = 10.0) -> list[int]:
    """Stops the server of a store directory: `tinystore stop DIR` of this venv, then SIGTERM/SIGKILL by pid.

    Returns the pids that had to be signalled.
    """
    cli = Path(sys.executable).parent / "tinystore"
    if cli.exists() and pids_using(directory):
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(
                [str(cli), "stop", str(directory)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=timeout,
                check=False,
            )
    signalled = []
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = pids_using(directory)
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
            signalled.append(pid)
        deadline = time.monotonic() + timeout / 2
        while time.monotonic() < deadline and pids_using(directory):
            time.sleep(0.05)
    return sorted(set(signalled))


# ---------------------------------------------------------------- redis-server


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class RedisServer:
    """A redis-server of this run: 127.0.0.1 on a free port and a unix socket, no persistence."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.port = free_port()
        self.unix_socket = str(directory / "redis.sock")
        self.process: subprocess.Popen[bytes] | None = None
        self.version = ""

    def start(self, timeout: float = 10.0) -> RedisServer:
        exe = shutil.which("redis-server")
        if not exe:
            raise RuntimeError("redis-server is not installed: run bash bench/setup.sh")
        self.version = subprocess.run([exe, "--version"], capture_output=True, text=True, check=False).stdout.strip()
        self.process = subprocess.Popen(
            [
                exe,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--unixsocket",
                self.unix_socket,
                "--unixsocketperm",
                "700",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self.directory),
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {self.process.returncode}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(1)
                    s.connect(self.unix_socket)
                    s.sendall(b"PING\r\n")
                    if s.recv(64).startswith(b"+PONG"):
                        return self
            except OSError:
                pass
            time.sleep(0.05)
        self.stop()
        raise RuntimeError("redis-server did not answer PING")

    def stop(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(5)

    def describe(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "transport": "unix socket",
            "persistence": "none (--save '' --appendonly no)",
        }


@contextlib.contextmanager
def redis_server() -> Iterator[RedisServer]:
    with temp_dir("tsb-redis-") as directory:
        server = RedisServer(directory).start()
        try:
            yield server
        finally:
            server.stop()


# ---------------------------------------------------------------- our package and the original


def import_ours() -> Any:
    """Our tinystore: the installed one, else the work tree's src/ (then also on PYTHONPATH for a sidecar)."""
    src = str(ROOT / "src")
    try:
        import tinystore
    except ImportError:
        if src not in sys.path:
            sys.path.append(src)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), src) if p)
        import tinystore
    if not hasattr(tinystore, "open"):
        raise RuntimeError("tinystore has no open() yet: the package has not landed")
    return tinystore


async def run_original(bench: str, mode: str, sizes: Sizes, within: float) -> dict[str, Any]:
    """Runs bench/peers/original.py under bench/.venv-orig for one mode; its JSON, or an error/unavailable."""
    if not ORIG_PYTHON.exists():
        return {"unavailable": f"{ORIG_PYTHON} is missing: run bash bench/setup.sh"}
    argv = [
        str(ORIG_PYTHON),
        str(ORIG_SCRIPT),
        bench,
        "--mode",
        mode,
        "--seconds",
        str(sizes.seconds),
        "--warmup",
        str(sizes.warmup),
    ]
    if sizes.quick:
        argv.append("--quick")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE, stderr=None, env=env)
    try:
        async with asyncio.timeout(within):
            out, _ = await proc.communicate()
    except TimeoutError:
        proc.kill()
        await proc.wait()
        return {"error": f"original.py {bench} {mode} took over {within:.0f} s"}
    try:
        result: dict[str, Any] = json.loads(out.decode() or "null")
    except json.JSONDecodeError:
        return {"error": f"original.py {bench} {mode} printed no JSON (exit {proc.returncode})"}
    if not isinstance(result, dict):
        return {"error": f"original.py {bench} {mode} exited {proc.returncode} without a result"}
    return result


@contextlib.asynccontextmanager
async def open_store(ts: Any, mode: str, prefix: str = "tsb-") -> AsyncIterator[Any]:
    """A store of module `ts` (ours or the original: same open()) in a fresh dir, closed and stopped after.

    mode: "embedded" (`open(dir, embedded=True)`) or "sidecar" (`open(dir)`, its sidecar stopped at the end).
    """
    with temp_dir(prefix) as directory:
        store = None
        try:
            async with asyncio.timeout(30):
                if mode == "embedded":
                    store = await ts.open(str(directory), embedded=True)
                elif mode == "sidecar":
                    store = await ts.open(str(directory))
                else:
                    raise ValueError(f"unknown mode {mode}")
            yield store
        finally:
            if store is not None:
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(30):
                        await store.close()
            signalled = await asyncio.to_thread(stop_servers_of, directory)
            if signalled and mode == "embedded":
                log(f"  stopped leftover processes of {directory}: {signalled}")


# ---------------------------------------------------------------- one benchmark's run


def run_benchmark(
    name: str,
    description: str,
    systems: list[str],
    measure: Callable[[str, Sizes], Awaitable[dict[str, Any]]],
    *,
    goal: str,
    checks: list[tuple[str, str, str, str, str, float]],
    units: dict[str, str],
    params: dict[str, Any],
) -> None:
    """Measures every system, round after round, and prints the report: one JSON object on stdout.

    `measure(system, sizes)` returns the system's metrics; what it raises is recorded as the system's
    "error". A system whose result is an "error" or "unavailable" as a whole is not tried in later rounds.
    """
    args = parse_args(description, systems)
    sizes = sizes_from(args)
    loop = use_uvloop(args.loop)
    started = time.perf_counter()

    seen: dict[str, list[dict[str, Any]]] = {s: [] for s in args.systems}
    aborted = ""

    async def rounds() -> None:
        for r in range(sizes.rounds):
            shift = r % len(args.systems)  # each round starts with another system
            for system in args.systems[shift:] + args.systems[:shift]:
                if any("error" in x or "unavailable" in x for x in seen[system]):
                    continue
                log(f"[{name}] round {r + 1}/{sizes.rounds}: {system}")
                try:
                    result = await measure(system, sizes)
                except Exception as exc:
                    log(f"  {system}: {error_text(exc)}")
                    if os.environ.get("BENCH_TRACEBACK"):
                        traceback.print_exc(file=sys.stderr)
                    result = {"error": error_text(exc)}
                seen[system].append(result)

    try:
        asyncio.run(rounds())
    except BaseException as exc:  # interrupted or broken: still print what was measured
        traceback.print_exc(file=sys.stderr)
        aborted = error_text(exc) or type(exc).__name__
    results = {system: median_of_rounds(rs) for system, rs in seen.items() if rs}
    peers = [s for s in args.systems if s not in OURS]
    report = {
        "benchmark": name,
        "goal": goal,
        "goal_checks": check_goals(results, checks),
        "units": units,
        "results": results,
        "ratios": ratios(results, peers),
        "params": params,
        "sizes": sizes.as_dict(),
        "loop": loop,
        "machine": machine(),
        "elapsed_s": round(time.perf_counter() - started, 1),
        "note": "ratios are ours / peer (for *_us latencies, below 1 is better); absolute figures are of a "
        "shared, noisy machine: quote the ratios",
    }
    if aborted:
        report["aborted"] = aborted
    emit(report, args.out)
    if aborted:
        sys.exit(1)
