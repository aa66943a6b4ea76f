"""watch() and step(): what a rank measures of its steps, and the report that closes each one."""

import collections
import math
import threading
import time

from lockstep import _report

_IMPORTED = time.perf_counter()  # the first step of a program that never calls watch() starts here
_MAX_PENDING_GPU_STEPS = 64      # steps whose CUDA events have not completed yet, beyond: dropped


class _Measured:
    """What the hooks saw during the step now running."""

    __slots__ = ("forward_start", "intervals", "gpu", "bytes")

    def __init__(self):
        self.forward_start = None  # host time of the step's first forward
        self.intervals = []        # (ready, done) per bucket: host seconds, or CUDA events
        self.gpu = False
        self.bytes = 0


def _union_length(intervals):
    total, end = 0.0, None
    for start, stop in sorted(intervals):
        if end is None or start > end:
            total += stop - start
            end = stop
        elif stop > end:
            total += stop - end
            end = stop
    return total


class _Watcher:
    """Hooks on one model. The comm hook replaces DDP's built-in all-reduce with the same
    operation (sum, then divide by the world size) plus a timestamp when each bucket is ready and
    when its reduction is done."""

    def __init__(self, module):
        import torch.distributed as dist

        self._dist = dist
        self.step_start = time.perf_counter()
        self.current = _Measured()
        self.comm_hooked = False
        self.pending = collections.deque()  # GPU steps waiting for their events
        module.register_forward_pre_hook(self._on_forward)
        if hasattr(module, "register_comm_hook") and dist.is_available() and dist.is_initialized():
            try:
                module.register_comm_hook(None, self._comm_hook)
                self.comm_hooked = True
            except RuntimeError as e:  # the program registered its own hook already
                _report._warn("not timing all-reduce: %s" % e)

    def _on_forward(self, module, inputs):
        if self.current.forward_start is None:
            self.current.forward_start = time.perf_counter()

    def _comm_hook(self, state, bucket):
        dist = self._dist
        tensor = bucket.buffer()
        measured = self.current
        measured.bytes += tensor.numel() * tensor.element_size()
        if tensor.is_cuda:
            import torch

            measured.gpu = True
            ready = torch.cuda.Event(enable_timing=True)
            ready.record()  # on the stream that produced the gradients
            slot = [ready, None]
        else:
            slot = [time.perf_counter(), None]
        measured.intervals.append(slot)
        tensor.div_(dist.get_world_size())
        future = dist.all_reduce(tensor, async_op=True).get_future()

        def done(fut):
            if slot[0].__class__ is float:
                slot[1] = time.perf_counter()
            else:
                import torch

                finished = torch.cuda.Event(enable_timing=True)
                finished.record()  # on the stream the reduction's result is ready on
                slot[1] = finished
            return fut.value()[0]

        return future.then(done)

    def close_step(self, end):
        """The step's host times, and its measured intervals (turned into seconds later on GPUs)."""
        measured, self.current = self.current, _Measured()
        start, self.step_start = self.step_start, end
        return start, measured


_watcher = None
_watch_lock = threading.Lock()
_last_step = 0
_last_end = None


def watch(model):
    """Times every step of `model` (a DistributedDataParallel module, or any nn.Module: then
    without the all-reduce). Returns `model`. Outside Lockstep it does nothing."""
    global _watcher
    if _report.reporter() is None:
        return model
    with _watch_lock:
        if _watcher is not None:
            _report._warn("watch() was called again: only the first model is timed")
            return model
        _watcher = _Watcher(model)
        _report._before_close.append(_flush_all)
    return model


def _seconds_to_us(seconds):
    return max(0, int(round(seconds * 1e6)))


def _loss_value(loss):
    if loss is None:
        return None
    if hasattr(loss, "detach"):  # a tensor: read it without forcing a CUDA sync when it is on a GPU
        loss = loss.detach()
        if loss.is_cuda:
            return loss
        loss = loss.item()
    return float(loss)


def step(samples, loss=None, tokens=None, epoch=None, lr=None, step=None):
    """Closes the step that just ended on this rank and reports it.

    samples: this rank's samples in the step; loss: its mean loss (a float or a tensor; a CUDA
    tensor is read once the step's GPU work is done); tokens: its tokens, for sequence models;
    epoch, lr: shown beside the step; step: the optimizer step's number when the program knows it
    (a resumed run), else the count of calls. Never raises on bad values: it says so once and skips.
    """
    global _last_step, _last_end
    r = _report.reporter()
    if r is None:
        return
    end = time.perf_counter()
    try:
        number = int(step) if step is not None else _last_step + 1
        fields = {
            "step": number,
            "samples": int(samples),
            "epoch": int(epoch) if epoch is not None else None,
            "lr": float(lr) if lr is not None and math.isfinite(float(lr)) and float(lr) > 0 else None,
            "tokens": int(tokens) if tokens is not None else None,
            "time_unix_us": _report.now_unix_us(),
        }
        loss_value = _loss_value(loss)
        if number < 1 or fields["samples"] < 0 or fields["samples"] >= 2**32 or (fields["tokens"] or 0) < 0:
            raise ValueError("step %d with %d samples" % (number, fields["samples"]))
    except (TypeError, ValueError) as e:
        _report._warn("step not reported: %s" % e)
        return
    _last_step = number
    w = _watcher
    if w is None:
        start = _last_end if _last_end is not None else _IMPORTED
        _last_end = end
        fields["step_time_us"] = _seconds_to_us(end - start)
        _send(r, fields, loss_value)
        return
    start, measured = w.close_step(end)
    fields["step_time_us"] = _seconds_to_us(end - start)
    data = max(0.0, measured.forward_start - start) if measured.forward_start is not None else 0.0
    fields["data_time_us"] = _seconds_to_us(data)
    if w.comm_hooked:
        fields["bytes_reduced"] = measured.bytes
    if measured.gpu:
        # Read once the GPU got there: the host never waits for it.
        w.pending.append((fields, loss_value, measured, end - start, data))
        if len(w.pending) > _MAX_PENDING_GPU_STEPS:
            w.pending.popleft()
            r.dropped += 1
        _flush_gpu(r, w, wait=False)
        return
    exposed, allreduce = 0.0, 0.0
    if measured.intervals:
        exposed = max(0.0, max(d for _, d in measured.intervals) - max(s for s, _ in measured.intervals))
        allreduce = _union_length(measured.intervals)
    _close_split(fields, end - start, data, exposed if w.comm_hooked else None, allreduce if w.comm_hooked else None)
    _send(r, fields, loss_value)


def _close_split(fields, step_seconds, data, exposed, allreduce):
    """Data, compute and exposed communication add up to the step time, in whole microseconds."""
    step_us, data_us = fields["step_time_us"], min(fields["data_time_us"], fields["step_time_us"])
    fields["data_time_us"] = data_us
    exposed_us = 0
    if exposed is not None:
        exposed_us = min(_seconds_to_us(exposed), step_us - data_us)
        fields["exposed_comm_time_us"] = exposed_us
        fields["allreduce_time_us"] = max(exposed_us, _seconds_to_us(allreduce))
    fields["compute_time_us"] = step_us - data_us - exposed_us


def _send(r, fields, loss_value):
    if loss_value is not None and not isinstance(loss_value, float):
        loss_value = float(loss_value.item())
    fields["loss"] = loss_value if loss_value is not None else float("nan")
    r.send(fields)


def _flush_gpu(r, w, wait):
    """Reports the pending GPU steps whose events completed, oldest first. With `wait` (at exit)
    it waits for them, but at most 5 s in all: a hung GPU does not hang the program's exit."""
    deadline = time.monotonic() + 5.0
    while w.pending:
        fields, loss_value, measured, step_seconds, data = w.pending[0]
        if any(d is None for _, d in measured.intervals):  # cannot happen after backward; be safe
            w.pending.popleft()
            r.dropped += 1
            continue
        last_done = measured.intervals[-1][1]
        while not last_done.query():
            if not wait or time.monotonic() > deadline:
                return
            time.sleep(0.001)
        anchor = measured.intervals[0][0]
        intervals = [(anchor.elapsed_time(s) / 1e3, anchor.elapsed_time(d) / 1e3) for s, d in measured.intervals]
        exposed = max(0.0, max(d for _, d in intervals) - max(s for s, _ in intervals))
        _close_split(fields, step_seconds, data, exposed, _union_length(intervals))
        w.pending.popleft()
        _send(r, fields, loss_value)


def _flush_all():
    r, w = _report.reporter(), _watcher
    if r is not None and w is not None:
        _flush_gpu(r, w, wait=True)
