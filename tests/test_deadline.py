"""gs_horovod.transports.deadline: a collective waited for until a deadline leaves nothing
waiting at exit (the real ranks' check is in tests/test_idioms.py)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import threading

import pytest
from conftest import ROOT

from gs_horovod.transports.deadline import poll_until, wait_on_thread


def test_poll_until_returns_the_result_once_done_and_none_after_the_deadline():
    polls = iter([False, False, True])
    assert poll_until(lambda: next(polls), lambda: "sum", timeout=5.0) == "sum"
    never = threading.Event()
    assert poll_until(never.is_set, lambda: "sum", timeout=0.05) is None


def test_wait_on_thread_returns_the_value_or_re_raises_its_error():
    assert wait_on_thread(lambda: 3, 5.0, end=lambda: None) == 3

    def fails() -> int:
        raise ValueError("rank 1 left")

    with pytest.raises(ValueError, match="rank 1 left"):
        wait_on_thread(fails, 5.0, end=lambda: None)


@pytest.mark.slow
def test_a_thread_still_waiting_at_exit_is_ended_and_joined_before_the_interpreter_finalizes():
    program = textwrap.dedent("""
        import threading
        from gs_horovod.transports.deadline import wait_on_thread

        released = threading.Event()

        def waits():
            released.wait()
            print("waiter returned", flush=True)

        def end():
            print("end called", flush=True)
            released.set()

        print("within:", wait_on_thread(waits, 0.05, end), flush=True)
    """)
    proc = subprocess.run([sys.executable, "-c", program], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["within: None", "end called", "waiter returned"]
