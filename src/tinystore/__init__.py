"""TinyStore: SQL databases, durable job queues, channels and locks in one directory, owned by one process.

Open a store with :func:`open` (the directory's server, a private child server, or ``embedded=True``) or
:func:`connect` (TCP/TLS). The guides are the project's ``docs/`` (sql.md, jobs.md, channels.md, locks.md,
serving.md); ``help()`` of each class gives its calls, their shapes and the errors they raise.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .client.channels import Channel, ChannelIterator, Message, Missed, Subscription, TxChannel
from .client.jobs import Job, JobError, JobEvent, JobPage, JobState, Outcome, Queue, QueueOptions, Run, TxQueue, Worker
from .client.locks import Hold, Lease, Lock, Permit, Semaphore
from .client.sql import Database, SqlTx
from .client.store import Durability, Store, StoreClock, connect, open
from .durations import Duration
from .errors import (
    ClosedError,
    ConflictError,
    CorruptError,
    InUseError,
    InvalidError,
    LimitError,
    LostError,
    OutcomeUnknownError,
    PermanentError,
    PermissionDeniedError,
    TimeoutError_,
    TinystoreError,
    UnauthenticatedError,
    UnavailableError,
)
from .limits import Limits
from .protocol.sql import Done

__all__ = [
    "Channel",
    "ChannelIterator",
    "ClosedError",
    "ConflictError",
    "CorruptError",
    "Database",
    "Done",
    "Durability",
    "Duration",
    "Hold",
    "InUseError",
    "InvalidError",
    "Job",
    "JobError",
    "JobEvent",
    "JobPage",
    "JobState",
    "Lease",
    "LimitError",
    "Limits",
    "Lock",
    "LostError",
    "Message",
    "Missed",
    "Outcome",
    "OutcomeUnknownError",
    "PermanentError",
    "PermissionDeniedError",
    "Permit",
    "Queue",
    "QueueOptions",
    "Run",
    "Semaphore",
    "SqlTx",
    "Store",
    "StoreClock",
    "Subscription",
    "TimeoutError_",
    "TinystoreError",
    "TxChannel",
    "TxQueue",
    "UnauthenticatedError",
    "UnavailableError",
    "Worker",
    "__version__",
    "connect",
    "open",
]
