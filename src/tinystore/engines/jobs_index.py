"""The in-memory index of one job queue (:class:`JobQueue`): its jobs that have not ended, where each stands
(due, delayed, claiming, running, ending), and the scheduling choices taken from it: which due job runs next (a
higher priority first; within it, the tenant served least recently, JOB-07) under ``max_running`` and
``max_running_per_tenant``; and the deadlines (delayed jobs, leases, ``expected``) on the store's clock
(:class:`Deadlines`). The jobs engine (``engines/jobs.py``) keeps it in step with the rows and writes every change
of state; nothing here does I/O."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..clock import Clock, Timer
from ..protocol.jobs import Claimed
from .base import Peer
from .sql import Later, SqlDatabase

if TYPE_CHECKING:
    from .jobs import JobsEngine, QueueOptions

log = logging.getLogger("tinystore.jobs")


COMPACT_MIN = 1024
"""A deadline heap is first looked through for items that no longer matter at this many items (Deadlines)."""


# where an entry of the in-memory index is
READY, DELAYED, CLAIMING, RUNNING, ENDING, GONE = range(6)
# where a job placed in the index before its row was written (JobsEngine._place_early) stands: its insert is in
# flight, or it was not written after all
INSERTING, UNWRITTEN = 1, 2


@dataclass(eq=False, slots=True)
class Entry:
    """A job that has not ended, as the index knows it."""

    id: str
    tenant: str
    priority: int
    run_at: float
    where: int = READY
    attempts: int = 0
    fence: int = 0
    lease_until: float = math.inf
    started_at: float = 0.0
    overdue_at: float = math.inf  # a running attempt ends here, renewed or not (its timeout and a lease more)
    lease: float = 0.0  # the lease a running attempt was given (renewals give it again, whatever a configure)
    peer: Peer | None = None
    counted: bool = False  # counted in the running totals (claiming or running)
    stuck: bool = False
    cancel_queued: bool = False  # a cancel write waits behind this job's claim write
    busy: asyncio.Future[None] | None = None  # a write changing this job is in flight
    unwritten: int = 0  # placed early (JobsEngine._place_early): INSERTING until its insert is answered, UNWRITTEN
    # if it failed
    turn: int = 0  # its tenant's turn when it was picked (``served``), and the turn before, or -1 for none: a job
    turn_before: int = -1  # placed early whose row was not written after all gives its turn back (unserve)


@dataclass(eq=False, slots=True)
class Waiter:
    """A claim waiting for jobs."""

    peer: Peer
    n: int
    worker: str
    due_before: float
    fut: asyncio.Future[list[Claimed]]
    token: str = ""
    claiming: bool = False
    expired: bool = False  # its wait ran out while it was claiming: should that claim get nothing, it ends
    settled: asyncio.Future[None] | None = None  # made by who waits for its claim to land (its cancel, a
    # release_claim of its token): set once that claim's write has landed, and what it got is handed back when
    # the claim was given up
    asked: float = 0.0  # the loop's time when the claim came (Claimed.waited_ms counts from it)


class Deadlines:
    """A heap of ``(when, item)`` with one clock timer at its earliest; ``on_due(item)`` for each due item.

    An item stays in the heap until its time even when it no longer matters (a cancelled delayed job, the lease of
    an attempt that ended): ``live(item)`` is false for such an item, whose ``on_due`` would do nothing. Once the
    heap reaches ``compact_at`` items, those are dropped, and the next look comes at twice what is left (at least
    :data:`COMPACT_MIN`): the heap holds at most about twice its live items, for O(1) amortized work a push. A
    delayed job added and cancelled stayed in memory until its time (days); every claimed attempt's lease and
    ``expected`` deadlines stayed 30 s after it ended (at 10,000 jobs/s, 600,000 items)."""

    def __init__(
        self, clock: Clock, on_due: Callable[[Any], None], live: Callable[[Any], bool] = lambda item: True
    ) -> None:
        self.clock = clock
        self.on_due = on_due
        self.live = live
        self.heap: list[tuple[float, int, Any]] = []
        self.seq = itertools.count()
        self.timer: Timer | None = None
        self.when = math.inf
        self.closed = False
        self.compact_at = COMPACT_MIN

    def push(self, when: float, item: Any) -> None:
        if self.closed or math.isinf(when):
            return
        heapq.heappush(self.heap, (when, next(self.seq), item))
        if len(self.heap) >= self.compact_at:
            self._compact()
        if when < self.when:
            self._arm(when)

    def _compact(self) -> None:
        # (the timer stays armed where it is: should its item be gone, it fires early, finds nothing due and arms
        # itself at the earliest left)
        live = self.live
        self.heap = [entry for entry in self.heap if live(entry[2])]
        heapq.heapify(self.heap)
        self.compact_at = max(COMPACT_MIN, 2 * len(self.heap))

    def _arm(self, when: float) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.when = when
        self.timer = self.clock.call_at(when, self._fire)

    def _fire(self) -> None:
        self.timer = None
        self.when = math.inf
        if self.closed:
            return
        now = self.clock.now()
        due = []
        while self.heap and self.heap[0][0] <= now:
            due.append(heapq.heappop(self.heap)[2])
        for item in due:
            try:
                self.on_due(item)
            except Exception:
                log.exception("a jobs timer failed")
        # (an on_due may have pushed a later deadline, which armed the timer for then: the earliest one left
        # in the heap must not wait for it)
        if self.heap and self.heap[0][0] < self.when:
            self._arm(self.heap[0][0])

    def __len__(self) -> int:
        return len(self.heap)

    def close(self) -> None:
        self.closed = True
        if self.timer is not None:
            self.timer.cancel()
        self.heap.clear()


class JobQueue:
    """One loaded queue: its options, its database and the index of its jobs that have not ended."""

    def __init__(self, engine: JobsEngine, name: str, options: QueueOptions, db: SqlDatabase) -> None:
        self.name = name
        self.clock = engine.clock
        self.loaded_at = (
            engine.clock.now()
        )  # when this server loaded the queue (its attempts from before: see _on_stuck)
        self.options = options
        self.db = db
        self.entries: dict[str, Entry] = {}
        self.ready: dict[str, dict[int, deque[Entry]]] = {}
        self.running: dict[str, int] = {}
        self.running_total = 0
        self.served: dict[str, int] = {}
        self.serve_count = 0
        self.served_compact_at = COMPACT_MIN  # (see compact_served)
        self.tenants: list[tuple[int, int, str]] = []  # heap of (-priority, last served, tenant), lazily exact
        self.tenant_keys: dict[str, tuple[int, int]] = {}  # each tenant's current key in that heap
        self.stale_ready = 0  # jobs ended while due, left in their lines (and keys in ``tenants``) until passed
        self.spent_at_load: list[Entry] = []  # waiting jobs the load found with all their attempts made
        self.blocked: set[str] = set()  # tenants with due jobs at max_running_per_tenant
        self.waiters: deque[Waiter] = deque()
        self.watchers: dict[str, list[asyncio.Future[None]]] = {}
        # each ``live`` is what its ``on_due`` looks at before it does anything
        self.delayed = Deadlines(engine.clock, lambda e: engine._on_due(self, e), self._delayed)
        self.leases = Deadlines(engine.clock, lambda item: engine._on_lease(self, *item), self._running)
        self.stuck_at = Deadlines(
            engine.clock,
            lambda item: engine._on_stuck(self, *item),
            lambda item: self._running(item) and not item[0].stuck,
        )
        self.sweep_timer: Timer | None = None
        self.sweep_when = math.inf
        self.stuck_reports = 0
        self.pump_soon = False  # a _pump of this queue is due at the end of this loop turn
        # attempt ends asked for in this loop turn, written together at its end: (values, future of the row)
        self.ends: list[tuple[list[Any], asyncio.Future[tuple[Any, ...] | None]]] = []
        # adds asked for in this loop turn, written together at its end: (rows, future of the ids)
        self.adds: list[tuple[list[list[Any]], Later]] = []
        # one for each big add whose committed jobs are indexed over several loop turns, set once they all are
        # (see JobsEngine._added_in_turns): a cancel of a job not indexed yet waits for them
        self.placing: set[asyncio.Event] = set()
        self.schema: asyncio.Future[Any] | None = None  # the tables being made in an application database

    def _delayed(self, e: Entry) -> bool:
        """Whether ``e`` still waits for its time (what a delayed job's deadline is for)."""
        return e.where == DELAYED and self.entries.get(e.id) is e

    def _running(self, item: tuple[Entry, int]) -> bool:
        """Whether the attempt ``(entry, fence)`` still runs, or may again: its end's write is in flight, and
        should it fail the attempt runs on (what a lease's or an ``expected`` deadline is for)."""
        e, fence = item
        return (e.where == RUNNING or e.where == ENDING) and e.fence == fence and self.entries.get(e.id) is e

    def schema_ready(self) -> bool:
        return self.schema is None or (
            self.schema.done() and not self.schema.cancelled() and not self.schema.exception()
        )

    async def wait_schema(self) -> None:
        if self.schema is not None and not self.schema_ready():
            await asyncio.shield(self.schema)

    def close(self) -> None:
        for d in (self.delayed, self.leases, self.stuck_at):
            d.close()
        if self.sweep_timer is not None:
            self.sweep_timer.cancel()

    # ------------------------------------------------------------------------------- the index

    def place(self, e: Entry, front: bool = False) -> None:
        """Put a waiting job where it belongs: due (ready, by tenant and priority) or delayed (a timer)."""
        if self._put(e, self.clock.now(), front):
            self.refresh(e.tenant)

    def place_loaded(self, entries: list[Entry]) -> None:
        """:meth:`place` of waiting jobs read at a queue's load, in the order of their ids: each due one joins the end
        of its line, and each tenant's key in the heap of tenants is set once for all of them (at once for each job,
        a queue of a million jobs took seconds more to load)."""
        now = self.clock.now()
        touched = {e.tenant for e in entries if self._put(e, now)}
        for tenant in sorted(touched):
            self.refresh(tenant)

    def _put(self, e: Entry, now: float, front: bool = False) -> bool:
        """``e`` in its line when due at ``now`` (``True``: its tenant's key is then to be refreshed), else under a
        timer."""
        if e.run_at > now:
            e.where = DELAYED
            self.delayed.push(e.run_at, e)
            return False
        e.where = READY
        prios = self.ready.get(e.tenant)
        if prios is None:
            prios = self.ready[e.tenant] = {}
        line = prios.get(e.priority)
        if line is None:
            line = prios[e.priority] = deque()
        if front:
            line.appendleft(e)
        else:
            line.append(e)
        return True

    def head(self, tenant: str) -> Entry | None:
        """The tenant's next due job (highest priority, first in), dropping what is no longer due in its lines."""
        prios = self.ready.get(tenant)
        if not prios:
            self.ready.pop(tenant, None)
            return None
        for p in sorted(prios, reverse=True) if len(prios) > 1 else list(prios):
            line = prios[p]
            while line and (line[0].where != READY or self.entries.get(line[0].id) is not line[0]):
                line.popleft()
            if line:
                return line[0]
            del prios[p]
        self.ready.pop(tenant, None)
        return None

    def refresh(self, tenant: str) -> None:
        """Put the tenant in the heap of tenants with due jobs at its current key (-priority, last served);
        a tenant at ``max_running_per_tenant`` waits aside until one of its jobs ends."""
        if tenant in self.blocked:
            return
        head = self.head(tenant)
        if head is None:
            self.tenant_keys.pop(tenant, None)
            return
        key = (-head.priority, self.served.get(tenant, 0))
        if self.tenant_keys.get(tenant) != key:
            self.tenant_keys[tenant] = key
            heapq.heappush(self.tenants, (key[0], key[1], tenant))

    def drop(self, e: Entry) -> None:
        """``e`` has ended: it leaves the index. Where it was due, its place in its line is dropped lazily (see
        ``stale_ready``), and all such places at once when they outnumber the jobs left (:meth:`compact_ready`)."""
        if self.entries.get(e.id) is e:
            del self.entries[e.id]
        if self.stale_ready >= COMPACT_MIN and self.stale_ready > len(self.entries):
            self.compact_ready()

    def compact_ready(self) -> None:
        """Drop the ended jobs from the lines of due jobs, and the outdated keys from the heap of tenants. Both
        are dropped lazily as a worker passes them, so with no worker (or behind a job that waits) cancelled jobs
        stayed in memory. Called once there are more of them than live jobs: O(1) amortized a cancel."""
        for prios in self.ready.values():
            for line in prios.values():
                # (a job whose cancel is being written keeps its place: should the write fail, it waits on there)
                kept = [x for x in line if (x.where == READY or x.where == ENDING) and self.entries.get(x.id) is x]
                if len(kept) != len(line):
                    line.clear()
                    line.extend(kept)
        self.tenants = [(key[0], key[1], tenant) for tenant, key in self.tenant_keys.items()]
        heapq.heapify(self.tenants)
        self.stale_ready = 0

    def pick(self, due_before: float) -> Entry | None:
        """The next job to run: a higher priority first; within it, the tenant served least recently (tenants never
        served first, by name); tenants at ``max_running_per_tenant`` are passed over, and nothing runs past
        ``max_running``. O(log tenants)."""
        opts = self.options
        if opts.max_running and self.running_total >= opts.max_running:
            return None
        per_tenant = opts.max_running_per_tenant
        heap = self.tenants
        while heap:
            neg_prio, served, tenant = heap[0]
            if self.tenant_keys.get(tenant) != (neg_prio, served):
                heapq.heappop(heap)  # stale: the tenant was served or its best priority changed since
                continue
            if per_tenant and self.running.get(tenant, 0) >= per_tenant:
                heapq.heappop(heap)
                del self.tenant_keys[tenant]
                self.blocked.add(tenant)
                continue
            head = self.head(tenant)
            if head is None or head.priority != -neg_prio:
                heapq.heappop(heap)
                del self.tenant_keys[tenant]
                self.refresh(tenant)
                continue
            if due_before and head.run_at > due_before:
                # (run_due: the first in the line came due after it began; the tenants are scanned then. Only
                # then: a scan for each job made a drain of N jobs over N tenants take N² steps, trial EI)
                return self._pick_due_before(due_before)
            self.ready[tenant][head.priority].popleft()
            self.serve(head)
            return head
        return None

    def _pick_due_before(self, due_before: float) -> Entry | None:
        """:meth:`pick` for ``run_due``: only jobs due at or before ``due_before`` (a scan of the tenants)."""
        per_tenant = self.options.max_running_per_tenant
        best: Entry | None = None
        best_key: tuple[int, int, str] = (0, 0, "")
        for tenant in list(self.ready):
            if per_tenant and self.running.get(tenant, 0) >= per_tenant:
                continue
            head = self._head_due_before(tenant, due_before)
            if head is None:
                continue
            key = (-head.priority, self.served.get(tenant, 0), tenant)
            if best is None or key < best_key:
                best, best_key = head, key
        if best is not None:
            self.ready[best.tenant][best.priority].popleft()
            self.serve(best)
        return best

    def _head_due_before(self, tenant: str, due_before: float) -> Entry | None:
        """The tenant's next job due at or before ``due_before``: the highest priority whose line has one first (a
        job of a higher priority made due again since, by a snooze or a retry, does not hide it)."""
        prios = self.ready.get(tenant)
        if not prios:
            return None
        for p in sorted(prios, reverse=True):
            line = prios[p]
            while line and (line[0].where != READY or self.entries.get(line[0].id) is not line[0]):
                line.popleft()
            if line and line[0].run_at <= due_before:
                return line[0]
        return None

    def serve(self, e: Entry) -> None:
        """``e`` was picked: it counts as running from now, and its tenant moves back in the line."""
        e.where = CLAIMING
        e.counted = True
        self.count(e, 1)
        self.serve_count += 1
        e.turn_before = self.served.get(e.tenant, -1)
        e.turn = self.served[e.tenant] = self.serve_count
        if len(self.served) >= self.served_compact_at:
            self.compact_served()
        self.refresh(e.tenant)

    def compact_served(self) -> None:
        """Forget when tenants with no due or running job were last served, if that was before every tenant that has
        one (and was served): such a tenant, back with a job, goes before those as it would have, and among the
        tenants never served or forgotten, by name. Of the others with nothing to do, the :data:`COMPACT_MIN`
        served most recently are kept; one forgotten among the rest, back, goes first as well, ahead of its due
        turn by one job at most. Called once ``served`` doubled since the last look: O(1) amortized a claim, and
        ``served`` holds about twice the tenants with jobs, plus :data:`COMPACT_MIN` (trial Z: one entry per tenant
        ever served stayed until the store stopped; with a user id as the tenant, 400,000 tenants took some 50 MB;
        trial AB: a tenant whose job runs for hours held every later one)."""
        live = self.ready.keys() | self.running.keys()
        served = self.served
        floor = min((served[t] for t in live if t in served), default=math.inf)
        kept = {t: n for t, n in served.items() if n >= floor or t in live}
        idle = [(n, t) for t, n in kept.items() if t not in live]
        if len(idle) > COMPACT_MIN:  # (a tenant whose job runs for hours holds the floor down)
            idle.sort()
            for _, t in idle[: len(idle) - COMPACT_MIN]:
                del kept[t]
        self.served = kept
        self.served_compact_at = max(COMPACT_MIN, 2 * len(kept))

    def unserve(self, e: Entry) -> None:
        """``e`` was picked, but its row turned out never written (placed early, see
        :meth:`JobsEngine._place_early`): its tenant gets back the turn it had, unless it was served again since."""
        if self.served.get(e.tenant) == e.turn:
            if e.turn_before < 0:
                del self.served[e.tenant]
            else:
                self.served[e.tenant] = e.turn_before
            self.refresh(e.tenant)

    def count(self, e: Entry, delta: int) -> None:
        n = self.running.get(e.tenant, 0) + delta
        if n > 0:
            self.running[e.tenant] = n
        else:
            self.running.pop(e.tenant, None)
        self.running_total += delta
        if delta < 0 and e.tenant in self.blocked:
            self.blocked.discard(e.tenant)
            self.refresh(e.tenant)
