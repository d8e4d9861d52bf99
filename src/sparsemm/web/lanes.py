"""A first-come, first-served semaphore for the server's search lanes.

``threading.Semaphore`` is not fair: a released slot goes to whichever thread next finds
the count above zero, so a request arriving just then takes it before the waiter that
was woken for it, and the woken waiter goes back to the end of the queue. Under 100
clients that made a few requests wait several times longer than the rest (measured in
docs/results.md, "Server load"). Here ``release`` hands the slot straight to the oldest
waiter, so lanes are taken in arrival order.
"""

from __future__ import annotations

import collections
import threading
from threading import Event


class FairSemaphore:
    """A bounded semaphore whose waiters get slots in arrival order.

    ``acquire(timeout)`` returns False when no slot came within ``timeout`` seconds (a slot
    granted at the same moment is kept, not lost); ``release`` of a slot not held raises
    ValueError, as ``threading.BoundedSemaphore`` does.
    """

    def __init__(self, value: int) -> None:
        if value < 1:
            raise ValueError("a semaphore needs at least one slot")
        self._bound = self._free = value
        self._lock = threading.Lock()
        self._waiters: collections.deque[Event] = collections.deque()

    def acquire(self, timeout: float | None = None) -> bool:
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return True
            granted = Event()
            self._waiters.append(granted)
        if timeout is not None:
            timeout = min(max(timeout, 0.0), threading.TIMEOUT_MAX)
        try:
            if granted.wait(timeout):
                return True
        except BaseException:  # interrupted while waiting: the slot must not go with it
            with self._lock:
                if granted.is_set():
                    self._release_locked()  # granted meanwhile: pass it on
                else:
                    self._waiters.remove(granted)
            raise
        with self._lock:
            if granted.is_set():  # handed over between the timeout and this lock
                return True
            self._waiters.remove(granted)
            return False

    def release(self) -> None:
        with self._lock:
            self._release_locked()

    def _release_locked(self) -> None:
        if self._waiters:
            self._waiters.popleft().set()  # the slot passes on without being freed
        elif self._free < self._bound:
            self._free += 1
        else:
            raise ValueError("FairSemaphore released more often than acquired")

    @property
    def waiting(self) -> int:
        """Threads waiting for a slot now."""
        return len(self._waiters)
