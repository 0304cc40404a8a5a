"""Work done while XLA compiles (issue 23).

After `partir.jit` partitions a step, the next thing its caller waits for is XLA's compile of
the program that embeds it: seconds of C++ that release the GIL and keep about one core busy.
Work queued here with `while_xla_compiles` starts on a daemon thread when the next compile
on the queuing thread begins (jax records its backend-compile event as a scalar on entry), so
it runs on another core meanwhile: the per-tactic report's rows, which a caller who reads the
report after compiling then finds made. It costs CPU time, not wall time; where the process
may use one core only, nothing is queued (the work would only stretch the compile), and the
work is done where it is first needed instead.

A queued task is held weakly: if the object it belongs to is dropped before any compile, the
task is forgotten with it. A task must be safe to run on another thread (the report's rows
are made under a lock) and must not raise (a failed row is made again, and raises, on read).
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable

# Recorded by jax (a scalar: the start time) as XLA's compile of a lowered module begins, on the
# thread that compiles; the duration event of the same name follows when it ends.
_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"

_queued = threading.local()  # per thread: weak references to the tasks its next compile starts
_started: list[threading.Thread] = []  # threads started and maybe still running (for `wait`)
_lock = threading.Lock()
_listening: bool | None = None  # None: not asked yet


def usable_cores() -> int:
    """The cores this process may run on (its affinity where the OS has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def while_xla_compiles(task: Callable[[], None]) -> bool:
    """Run the bound method `task` on a daemon thread when this thread's next XLA compile
    begins. False (nothing queued) where the process has a single core."""
    if usable_cores() < 2 or not _listen():
        return False
    queue = getattr(_queued, "tasks", None)
    if queue is None:
        queue = _queued.tasks = []
    queue.append(weakref.WeakMethod(task))
    return True


def wait(timeout: float | None = None) -> None:
    """Wait for the tasks started so far (tests; a caller that wants them done)."""
    with _lock:
        threads = list(_started)
    for t in threads:
        t.join(timeout)
    with _lock:
        _started[:] = [t for t in _started if t.is_alive()]


def _listen() -> bool:
    """Listen to jax's compile events (once); False where this jax has no scalar events."""
    global _listening
    with _lock:
        if _listening is None:
            import jax.monitoring

            register = getattr(jax.monitoring, "register_scalar_listener", None)
            if register is not None:
                register(_on_scalar)
            _listening = register is not None
        return _listening


def _on_scalar(event: str, value: float, **kwargs) -> None:
    if event != _COMPILE_EVENT:
        return
    queue = getattr(_queued, "tasks", None)
    if not queue:
        return
    _queued.tasks = []
    for ref in queue:
        task = ref()
        if task is None:
            continue
        thread = threading.Thread(target=task, name="partir-while-xla-compiles", daemon=True)
        with _lock:
            _started[:] = [t for t in _started if t.is_alive()]
            _started.append(thread)
        thread.start()
