"""A worker process for the crash tests: ``python -m tests.jobs.worker_proc DIR QUEUE MODE LOG [CONCURRENCY]``.

It connects to the store's running server, works QUEUE with a handler chosen by MODE, and appends one line
per attempt it starts to LOG (``start <job id> <attempt> <fence> <pid>``, flushed to disk before the handler
goes on), so the test can count attempts even across SIGKILL. Modes:

- ``kill``: the handler kills its own process with SIGKILL (a worker that dies on this job every time);
- ``hang``: the handler sleeps for an hour (the test kills or freezes the process);
- ``ok``: the handler returns ``{"pid": <pid>}`` at once;
- ``effect``: the handler sleeps ``value["sleep"]`` seconds, then writes its effect to table ``effects`` of
  database ``app`` through its fence (a write with an older fence than the stored one changes nothing) and
  returns ``{"pid": <pid>}``;
- ``fault``: the fault test's handler: ``value["n"] % 50 == 0`` raises PermanentError; otherwise it applies
  the job's effect once (a transaction that records the job id with the attempt's fence and bumps a counter
  only when no attempt applied it yet) and returns ``value["n"]``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from typing import Any

import tinystore


def log_line(path: str, text: str) -> None:
    with open(path, "a") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())


async def main(directory: str, queue: str, mode: str, log: str, concurrency: int) -> None:
    store = await tinystore.open(directory, idle="0s")
    db = await store.database("app") if mode in ("effect", "fault") else None
    q = store.queue(queue)

    async def handler(value: Any, run: tinystore.Run) -> Any:
        log_line(log, f"start {run.job_id} {run.attempt} {run.fence} {os.getpid()}")
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if mode == "hang":
            await asyncio.sleep(3600)
        if mode == "effect":
            assert db is not None
            await asyncio.sleep(float(value.get("sleep", 0)))
            done = await db.exec(
                "insert into effects (job_id, fence, pid) values (?, ?, ?) on conflict (job_id) do update "
                "set fence = excluded.fence, pid = excluded.pid where excluded.fence > effects.fence",
                run.job_id,
                run.fence,
                os.getpid(),
            )
            log_line(log, f"effect {run.job_id} {run.fence} {done.changes}")
        if mode == "fault":
            assert db is not None
            if value["n"] % 50 == 0:
                raise tinystore.PermanentError(f"job {value['n']} cannot succeed")

            async def apply(tx: tinystore.SqlTx) -> None:
                had = await tx.scalar("select fence from effects where job_id = ?", run.job_id)
                if had is not None:
                    return  # an earlier attempt applied it and died before reporting
                await tx.exec("insert into effects (job_id, fence, pid) values (?, ?, ?)", run.job_id, run.fence, 0)
                await tx.exec("update counter set n = n + 1 where id = 1")

            await db.tx(apply)
            return value["n"]
        return {"pid": os.getpid()}

    worker = q.work(handler, concurrency=concurrency)
    print("ready", flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await worker.stop(grace=0)
    await store.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]) if len(sys.argv) > 5 else 1))
