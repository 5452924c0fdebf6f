"""SIGINT and SIGTERM end every rank at once, without a collective shutdown.

A rank may be inside a blocking MPI call when a signal arrives (a collective, a lock on
a window), where Python never gets to run its handler, and its partners may be
anywhere. So the handler does nothing in the main thread; :func:`install` sets a wakeup
file descriptor instead, which the C-level handler writes even while the main thread is
blocked, and a watcher thread reading it calls ``on_signal(signum)``: that reports the
interrupt once and ends the run (``MPI_Abort`` over every rank under MPI, else
``os._exit``), never waiting for the other ranks. Results already on disk were written
atomically (``chem.outcome``), and the watcher takes the write lock first, so the
interrupt never lands in the middle of a rename.
"""

from __future__ import annotations

import os
import signal
import threading

SIGNALS = (signal.SIGINT, signal.SIGTERM)


def install(on_signal) -> None:
    """Route SIGINT and SIGTERM to ``on_signal(signum)`` on a watcher thread (call from
    the main thread of a process that runs the command line, never inside a library)."""
    read_fd, write_fd = os.pipe()
    os.set_blocking(write_fd, False)
    for sig in SIGNALS:
        signal.signal(sig, lambda *_: None)        # the watcher does the work
    signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

    def watch():
        while True:
            data = os.read(read_fd, 1)
            if data and data[0] in {int(s) for s in SIGNALS}:
                on_signal(signal.Signals(data[0]))
                return
    threading.Thread(target=watch, name="tessera-signals", daemon=True).start()
