"""Waiting for a collective until a deadline, leaving nothing behind that can abort the
process at exit (the checkpoint's arrival check, :func:`gs_horovod.checkpoint.arrive`).

A collective that did not complete in time stays pending. A Python thread that waits on it
inside the framework re-takes the GIL whenever the framework wakes it: Horovod's
``WaitAndClear`` (horovod.torch) does so in a loop, TF's eager executor when the op fails at
Horovod's shutdown. If that happens while the interpreter finalizes, CPython ends the daemon
thread with ``pthread_exit``, whose unwinding through a C++ ``noexcept`` frame calls
``std::terminate``: the rank aborts (exit 134, "terminate called without an active exception")
after its work is done. So a waiter never outlives the interpreter:

- :func:`poll_until`: where the framework polls a pending collective (horovod.torch handles,
  torch.distributed works), the calling thread polls until the deadline and nothing waits after;
- :func:`wait_on_thread`: where it cannot (horovod.tensorflow), a daemon thread waits; if it is
  still waiting at exit, an exit handler ends what it waits on (``end``: Horovod's shutdown, which
  fails every pending collective) and joins it before the interpreter finalizes.
"""

from __future__ import annotations

import atexit
import threading
import time
from typing import Callable, Optional, TypeVar

T = TypeVar("T")

EXIT_JOIN_SECONDS = 10.0
"""How long the exit handler of :func:`wait_on_thread` waits for the thread after ``end()``."""


def poll_until(done: Callable[[], bool], result: Callable[[], T], timeout: float) -> Optional[T]:
    """``result()`` once ``done()`` is true, polled on this thread (pauses from 0.1 ms doubling
    to 10 ms), or None when ``timeout`` seconds passed first (the collective stays pending)."""
    deadline, pause = time.monotonic() + timeout, 1e-4
    while not done():
        if time.monotonic() >= deadline:
            return None
        time.sleep(pause)
        pause = min(2 * pause, 0.01)
    return result()


def wait_on_thread(collective: Callable[[], T], timeout: float, end: Callable[[], None]) -> Optional[T]:
    """``collective()`` (blocking) run on a daemon thread: its value, or None when it had not
    finished within ``timeout`` seconds; its error re-raises here. A thread still waiting at
    exit is ended by ``end()`` and joined (at most :data:`EXIT_JOIN_SECONDS`) in an exit handler,
    which runs before Horovod's own (registered later, so called first)."""
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(collective())
        except Exception as error:  # handed to the caller's thread, or dropped at exit
            outcome.append(error)

    thread = threading.Thread(target=run, name="gs_horovod.pending", daemon=True)
    thread.start()
    thread.join(timeout)
    if not outcome:
        atexit.register(_end_and_join, thread, end)
        return None
    if isinstance(outcome[0], Exception):
        raise outcome[0]
    return outcome[0]  # type: ignore[return-value]


def _end_and_join(thread: threading.Thread, end: Callable[[], None]) -> None:
    if thread.is_alive():
        end()
        thread.join(EXIT_JOIN_SECONDS)
