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

Threading: call ``step`` from the training loop's thread.
"""

from lockstep._report import active, close, dropped
from lockstep._api import step, watch

__all__ = ["watch", "step", "active", "dropped", "close"]
__version__ = "0.1.0"
