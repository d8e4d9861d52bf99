"""The server's search lanes are handed out first come, first served (FairSemaphore)."""

from __future__ import annotations

import threading

import pytest

import sparsemm.web.lanes as lanes
from sparsemm.web.lanes import FairSemaphore


def _wait_for(sem: FairSemaphore, n: int) -> None:
    for _ in range(10_000):
        if sem.waiting == n:
            return
        threading.Event().wait(0.001)
    raise AssertionError(f"{sem.waiting} waiters, expected {n}")


def test_waiters_get_the_slot_in_arrival_order() -> None:
    sem = FairSemaphore(1)
    assert sem.acquire()
    order: list[int] = []
    threads = []
    for i in range(6):
        t = threading.Thread(target=lambda i=i: (sem.acquire(), order.append(i)))
        t.start()
        _wait_for(sem, i + 1)  # thread i is queued before thread i + 1 starts
        threads.append(t)
    for i in range(6):
        sem.release()  # passes the slot to the oldest waiter, which records itself
        for _ in range(10_000):
            if len(order) == i + 1:
                break
            threading.Event().wait(0.001)
    for t in threads:
        t.join()
    assert order == list(range(6))
    sem.release()
    with pytest.raises(ValueError, match="released more often"):
        sem.release()


def test_a_released_slot_is_not_taken_by_a_newcomer() -> None:
    """threading.Semaphore lets a thread that arrives at the right moment take the slot a
    waiter was woken for; here the slot already belongs to the waiter."""
    sem = FairSemaphore(1)
    assert sem.acquire()
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (sem.acquire(), got.set()))
    waiter.start()
    _wait_for(sem, 1)
    sem.release()
    assert not sem.acquire(timeout=0)  # the waiter owns it, woken or not
    waiter.join()
    assert got.is_set()
    sem.release()
    assert sem.acquire(timeout=0)


def test_a_timed_out_waiter_leaves_the_queue() -> None:
    sem = FairSemaphore(2)
    assert sem.acquire() and sem.acquire()
    assert not sem.acquire(timeout=0.01)
    assert sem.waiting == 0
    sem.release()
    assert sem.acquire(timeout=0)  # the freed slot was not handed to the gone waiter
    with pytest.raises(ValueError, match="at least one slot"):
        FairSemaphore(0)


@pytest.mark.parametrize("granted_meanwhile", [False, True])
def test_an_interrupted_waiter_does_not_take_the_slot_with_it(
    monkeypatch: pytest.MonkeyPatch, granted_meanwhile: bool
) -> None:
    """An exception in the wait (Ctrl+C, a signal handler) leaves no dead waiter that a
    release would hand the slot to; a slot granted just before it is passed on."""
    sem = FairSemaphore(1)
    assert sem.acquire()

    class Interrupted(threading.Event):
        def wait(self, timeout: float | None = None) -> bool:
            if granted_meanwhile:
                sem.release()  # the holder lets go: the slot is handed to this waiter
            raise KeyboardInterrupt

    monkeypatch.setattr(lanes, "Event", Interrupted)
    with pytest.raises(KeyboardInterrupt):
        sem.acquire(timeout=float("inf"))  # an unbounded timeout is clamped, not refused
    monkeypatch.undo()
    assert sem.waiting == 0
    if not granted_meanwhile:
        sem.release()
    assert sem.acquire(timeout=0)  # the one slot is free again
    assert not sem.acquire(timeout=0)
