"""`gc_paused` across threads (issue 35, review §6c-6): the report's rows are made on another
thread while XLA compiles, while the caller may partition the next step; the collector must
stay paused until the last block ends, on whichever thread."""

from __future__ import annotations

import gc
import threading

from partir_plugin._gc import gc_paused


def test_gc_stays_paused_until_the_last_block_on_any_thread_ends():
    assert gc.isenabled()
    entered, leave = threading.Event(), threading.Event()

    def other():
        with gc_paused():
            entered.set()
            leave.wait(timeout=30)

    with gc_paused():
        thread = threading.Thread(target=other)
        thread.start()
        assert entered.wait(timeout=30)
    # This thread's block ended first: the other's is still open.
    assert not gc.isenabled()
    leave.set()
    thread.join()
    assert gc.isenabled()


def test_a_collector_someone_disabled_stays_disabled():
    gc.disable()
    try:
        with gc_paused(), gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
