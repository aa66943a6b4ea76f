"""Lockstep's instrumentation for your own training program.

Two lines give a PyTorch DDP script every Lockstep KPI, live, per rank::

    import lockstep
    ddp = DistributedDataParallel(model)
    lockstep.watch(ddp)                        # data, compute, exposed all-reduce per step
    for x, y in loader:
        ...; opt.step()
        lockstep.step(samples=len(x), loss=loss)   # tokens= for sequence models

``watch`` times each step's data wait, compute and the all-reduce time not hidden behind backward
(through a DDP communication hook: wall clock for Gloo on CPUs, CUDA events for NCCL on GPUs, so
the host never waits for the GPU) and counts the bytes all-reduced. ``step`` closes the step and
sends one report to the agent that started the rank, the way lockstep-trainer reports
(docs/own-program.md).

Outside Lockstep (no ``LOCKSTEP_REPORT`` in the environment) both are no-ops, so the same script
runs under torchrun or alone. Reports never block training: when the agent is slow or gone they
are dropped and counted (``dropped()``), and the script goes on.

When a job stops moving, the agent says which rank is stuck, where and why: every rank keeps a
progress record (its step, its phase, the collectives it entered, since when) that the agent reads
without the rank's help, and dumps every thread's stack when asked (faulthandler, on a real-time
signal). ``watch`` and ``step`` keep the record; a long phase the program names itself is
announced, so that it is judged against its own history rather than the step's::

    with lockstep.phase("checkpoint"):         # also a decorator: @lockstep.phase("eval")
        torch.save(state, path)

An alert rule that stops the job with a checkpoint (docs/alerts.md) asks the program first:
``lockstep.should_stop()`` turns true, and the program writes its checkpoint and leaves.

Threading: call ``step`` from the training loop's thread.
"""

from lockstep import _progress
from lockstep._report import active, close, dropped
from lockstep._api import phase, step, watch
from lockstep._stop import should_stop

_progress.install()  # the record and the stacks, when the agent asked for them; else nothing

__all__ = ["watch", "step", "phase", "should_stop", "active", "dropped", "close"]
__version__ = "0.1.0"
