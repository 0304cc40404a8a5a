"""The process's garbage-collection policy while partitioning (not IR: any pass that builds
many cyclic objects pauses the collector the same way).

Every value and op reference each other (a cycle), so building or lowering a program of n
ops allocates O(n) container objects, and each of the collector's full passes walks every
live object: with the imported program and its device-local versions alive, the collections
triggered along the way cost as much as the pass itself (half the time of a lowering at 10k
ops), growing with the program.
"""

from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator


class _Pause:
    """How many `gc_paused` blocks are open, over all threads, and whether the first one
    found the collector enabled (only then does the last one enable it again)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.depth = 0
        self.resume = False


_PAUSE = _Pause()


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while a pass builds IR.

    Re-entrant, also across threads (the report's rows are made on another thread while XLA
    compiles, while the caller may partition the next step): a count of open blocks under a
    lock, so the collector resumes when the last one ends, not when the first does. Afterwards
    what the passes allocated is moved to the oldest generation unwalked (`tenure`). A long
    search inside collects now and then itself. A collector someone else disabled stays so.
    """
    with _PAUSE.lock:
        if _PAUSE.depth == 0:
            _PAUSE.resume = gc.isenabled()
            gc.disable()
        _PAUSE.depth += 1
    try:
        yield
    finally:
        with _PAUSE.lock:
            _PAUSE.depth -= 1
            if _PAUSE.depth == 0 and _PAUSE.resume:
                # Tenured before the collector resumes: its first allocation after would
                # otherwise start a young collection of everything the passes allocated.
                tenure()
                gc.enable()


def tenure() -> None:
    """Move every object in the young generations to the oldest one without walking them.

    What a partitioning allocates is alive when it ends (the IR, its lowered programs and
    their reports; collections there found no cyclic garbage on any benchmark model), so
    the young collection that would walk it next finds nothing to free, and the full
    collection its promotion then triggers walks the whole heap for nothing (0.2 s and
    0.4 s after partitioning the GNS at L=32). `gc.freeze()` then `gc.unfreeze()` moves the
    young generations to the oldest in O(1); a cycle among them is freed by the next full
    collection, whenever the interpreter runs one, so a pass that leaves much garbage
    collects it itself first (`AutomaticPartition`, after its search). Objects someone else
    froze stay frozen: with any, one middle collection walks the young ones instead.
    """
    if gc.get_freeze_count():
        gc.collect(1)
        return
    gc.freeze()
    gc.unfreeze()
