"""Reports leave in bursts: step() only notes a step, and a burst goes every FLUSH_S, from the
training loop or, when it is busy elsewhere (an evaluation, a checkpoint), from a timer thread.
Both transports (_report.py's ZeroMQ, _native.py's liblockstep-reporter) build on this; it imports
neither, so the package's modules import in one direction: _api -> _report -> _native -> _bursts.
"""

import sys
import threading
import time


def warn(text):
    print("lockstep: " + text, file=sys.stderr, flush=True)


class _Bursts:
    """Holds reports and hands them on in bursts: each send wakes the transport's I/O thread, which
    on a node whose cores the ranks keep busy preempts the training loop (190 us a send, measured
    on the 2-core build machine; one wake-up serves a whole burst)."""

    FLUSH_S = 0.1
    BURST = 64

    def __init__(self):
        self.made = 0          # reports given to send()
        self._dropped = 0      # reports lost on this side (a full queue, a GPU step never read)
        self._held = []        # their fields, not yet handed on
        self._holding = threading.Lock()   # guards _held: taken for an append or a swap, never longer
        self._last_flush = time.monotonic()
        self._flushing = threading.Lock()  # the transport is used by one thread at a time
        self._stop = threading.Event()
        self._timer = threading.Thread(target=self._tick, name="lockstep-reports", daemon=True)
        self._timer.start()

    @property
    def dropped(self):
        return self._dropped

    def count_drop(self, n=1):
        self._dropped += n

    def send(self, fields, kind="step"):
        """fields: the StepReport's (kind "step") or PhaseReport's ("phase") values by their proto
        names, only those known. Never waits."""
        self.made += 1
        with self._holding:
            self._held.append((kind, fields))
            due = len(self._held) >= self.BURST or time.monotonic() - self._last_flush >= self.FLUSH_S
        if due:
            self.flush(wait=False)

    def flush(self, wait=True):
        """Hands the held reports on. Without `wait`, gives way when the timer is at it already."""
        if not self._flushing.acquire(blocking=wait):
            return
        try:
            with self._holding:
                self._last_flush = time.monotonic()
                held, self._held = self._held, []
            if held:
                self._deliver(held)
        finally:
            self._flushing.release()

    def _tick(self):
        while not self._stop.wait(self.FLUSH_S):
            if self._held and time.monotonic() - self._last_flush >= self.FLUSH_S:
                self.flush()

    def close(self):
        self._stop.set()
        self.flush()
