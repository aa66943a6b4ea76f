"""Being asked to stop (docs/alerts.md).

``should_stop()`` says whether the job was asked to stop: by an alert rule's ``checkpoint,stop``,
by ``--budget``, or by ``lockstepctl stop``. A program that asks writes its checkpoint at the
next step boundary and returns::

    lockstep.should_stop()  # once before the loop: from here on a request is noted, not fatal
    for x, y in loader:
        ...
        if lockstep.should_stop():
            torch.save(state, path)
            break

The agent asks by SIGTERM, and kills the ranks still running once the stop's grace period is over
(a minute for an alert's ``checkpoint,stop``). The first call to ``should_stop()`` (from the main
thread, where Python lets a program set handlers) installs a SIGTERM handler that only notes the
request, and then calls the program's own handler if it had one; the agent's SIGKILL at the end of
the grace stops a rank that does not leave. A program that never calls it is stopped by SIGTERM as
before.
"""

import signal
import threading

_requested = False
_installed = False


def _install():
    global _installed
    if threading.current_thread() is not threading.main_thread():
        return  # Python lets only the main thread set handlers: a later call from it installs
    previous = signal.getsignal(signal.SIGTERM)

    def noted(signum, frame):
        global _requested
        _requested = True
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, noted)
    _installed = True


def should_stop():
    """True once the job was asked to stop: checkpoint, then leave the training loop."""
    if not _installed:
        _install()
    return _requested
