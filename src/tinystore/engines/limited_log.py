"""A warning logged at most once a minute, from any thread (an engine's own threads too), with the count of those
left out since the last one logged."""

from __future__ import annotations

import logging
import threading
import time
from typing import Any


class LimitedLog:
    """``warning(message, *args)`` logs on ``logger`` at most once every ``every`` seconds; the next one logged says
    how many were left out in between (a burst's last ones are told only with the next: no timer runs)."""

    def __init__(self, logger: logging.Logger, every: float = 60.0) -> None:
        self._logger = logger
        self._every = every
        self._lock = threading.Lock()
        self._last = -float("inf")
        self._skipped = 0

    def warning(self, message: str, *args: Any) -> None:
        with self._lock:
            now = time.monotonic()
            if now - self._last < self._every:
                self._skipped += 1
                return
            skipped, since = self._skipped, now - self._last
            self._skipped, self._last = 0, now
        if skipped:
            message += f" (and {skipped} more times in the last {since:.0f}s)"
        self._logger.warning(message, *args)
