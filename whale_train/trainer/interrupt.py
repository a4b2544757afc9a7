"""Ctrl-C during a run: ``whale train``'s SIGINT handler and the flag the trainer checks before it keeps a
unit or an evaluation, so an interrupted one is never recorded."""

from __future__ import annotations

import contextlib
import os
import signal
import threading

#: Set by ``whale train``'s SIGINT handler. The handler raises KeyboardInterrupt at once, but a
#: KeyboardInterrupt can land in a thread pool or a ``__del__`` and be swallowed; the trainer checks this
#: flag before it keeps a unit or an evaluation, so an interrupted unit is never recorded.
INTERRUPTED = threading.Event()


def stop_if_interrupted() -> None:
    if INTERRUPTED.is_set():
        raise KeyboardInterrupt


def _in_finalizer(frame) -> bool:
    while frame is not None:
        if frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def sigint_stops_run():
    """While a run trains: Ctrl-C sets ``INTERRUPTED`` and raises KeyboardInterrupt. Not inside a
    ``__del__`` (a ``subprocess.Popen`` being collected): raised there, Python prints "Exception ignored
    in Popen.__del__" with a traceback and drops it; the signal is sent again a moment later instead."""

    def handler(_sig, frame):
        INTERRUPTED.set()
        if _in_finalizer(frame):
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGINT)).start()
            return
        raise KeyboardInterrupt

    INTERRUPTED.clear()
    try:
        previous = signal.signal(signal.SIGINT, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
        INTERRUPTED.clear()
