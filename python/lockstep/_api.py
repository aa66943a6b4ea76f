"""watch() and step(): what a rank measures of its steps, and the report that closes each one.

Two ways of timing the all-reduce, chosen by where the model lives:

- On CPUs (Gloo), DDP's own all-reduce is left as it is. Registering any comm hook, even DDP's
  built-in one, costs a second pass over the gradients there (DDP then copies them into its
  buckets and divides apart, instead of dividing while it copies): 1.8 ms of a 35 ms step on the
  reference workload, measured. Instead each forward hooks its output's gradient, which backward
  computes before any parameter's; that hook queues an autograd callback. Callbacks run in the
  order they were queued, after the graph: DDP queues its own, which waits for the reductions,
  only when its last bucket is ready, so ours runs first, when backward's compute is done, and
  queues a second, which runs after DDP's. The time between the two is the exposed communication.
- On GPUs (NCCL) the host's clock says nothing about the GPU's. A comm hook does what DDP's
  built-in one does (on DDP's process group) and records CUDA events when a bucket's gradients
  are ready and when its reduction is done; they are read once they completed, steps later, so
  the host never waits. A CUDA loss is copied to pinned memory without waiting, and read then too.

The same hooks keep the rank's progress record (_progress.py) saying where the rank is: data (from
step() to the first forward), forward, backward, all-reduce (CPU: from the end of backward's
compute until DDP's reductions are done; GPU: each bucket's launch is counted), optimizer.
"""

import collections
import math
import threading
import time

from lockstep import _collectives, _flops, _progress, _report

_IMPORTED = time.perf_counter()  # the first step of a program that never calls watch() starts here
_MAX_PENDING_GPU_STEPS = 64      # steps whose CUDA events have not completed yet, beyond: dropped
_U32, _I63 = 2**32, 2**63
_DATA, _FORWARD, _BACKWARD, _ALL_REDUCE, _OPTIMIZER = "data", "forward", "backward", "all-reduce", "optimizer"


class _Measured:
    """What the hooks saw during the step now running."""

    __slots__ = ("forward_start", "exposed", "synced", "intervals", "compute_done", "evaluating", "excluded",
                 "optimizer_start", "after_optimizer", "in_phases", "ddp_spans", "collectives", "waited_before_forward",
                 "waited_before_optimizer")

    def __init__(self):
        self.forward_start = None  # host time of the step's first forward with autograd on
        self.exposed = 0.0         # host seconds backward waited for the reductions (CPU)
        self.synced = False        # a backward of this step all-reduced (not under no_sync())
        self.intervals = []        # (ready, done) CUDA events per bucket (GPU)
        self.compute_done = None   # host time the running backward's compute ended (CPU)
        self.evaluating = None     # host time a forward without autograd began
        self.excluded = 0.0        # seconds of such forwards and named phases before the step's first: not data time
        self.optimizer_start = None  # host time DDP's reductions were done: the optimizer's turn (CPU)
        self.after_optimizer = 0.0   # seconds since then in evaluations and named phases: not the optimizer's
        self.in_phases = 0.0         # seconds of the loop's own named phases (checkpoint, eval): not the step's
        self.ddp_spans = []          # (start, seconds) of each wait for DDP's reductions (CPU)
        self.collectives = None      # the step's other collectives (_collectives.Steps.close()), at its end
        self.waited_before_forward = 0.0    # seconds waited on them before the first forward: not data time
        self.waited_before_optimizer = 0.0  # ... before the optimizer's turn: the rest is not the optimizer's


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


def _first_grad_tensor(output):
    if hasattr(output, "requires_grad"):
        return output if output.requires_grad else None
    items = output.values() if isinstance(output, dict) else output if isinstance(output, (list, tuple)) else ()
    for item in items:
        found = _first_grad_tensor(item)
        if found is not None:
            return found
    return None


class _Watcher:
    """Hooks on one model (docstring above)."""

    def __init__(self, module, precision=None):
        import torch
        import torch.distributed as dist

        self._torch, self._dist = torch, dist
        self.step_start = time.perf_counter()
        self.current = _Measured()
        self.pending = collections.deque()  # GPU steps waiting for their events
        self.ddp = hasattr(module, "require_backward_grad_sync")
        lazy = getattr(torch.nn.parameter, "is_lazy", None)  # a LazyLinear's, before its first forward: no size
        parameters = [p for p in module.parameters() if p.requires_grad and not (lazy is not None and lazy(p))]
        self.bytes_per_sync = sum(p.numel() * p.element_size() for p in parameters)
        self.gpu = self.ddp and bool(parameters) and parameters[0].is_cuda
        self.timed = self.ddp  # whether this model's all-reduce is timed at all
        self.syncing = False      # whether the latest forward's backward all-reduces (not no_sync())
        self.in_collective = False  # the progress record says the rank waits in DDP's all-reduce (CPU)
        self.buckets = 0          # DDP's buckets, as the latest last one said (GPU)
        self.thread = threading.get_ident()  # the training loop's: where watch() and forwards with autograd run
        self.collectives = _collectives.install()  # every other collective the rank issues
        self.on_gpu = bool(parameters) and parameters[0].is_cuda
        if self.collectives is not None:
            self.collectives.loop_thread = self.thread
        self._queue = torch.autograd.Variable._execution_engine.queue_callback
        try:
            self.flops = _flops.Counter(module, precision)  # the step's FLOPs and precision (MFU)
        except Exception as e:  # a model this does not know: reported without them
            _report._warn("not counting flops: %s: %s" % (type(e).__name__, e))
            self.flops = None
        module.register_forward_pre_hook(self._before_forward)
        module.register_forward_hook(self._after_forward)
        if self.gpu:
            try:
                module.register_comm_hook(module.process_group, self._comm_hook)
            except RuntimeError as e:  # the program registered its own hook already
                _report._warn("not timing all-reduce: %s" % e)
                self.timed = False

    def _waited(self):
        """Seconds the step waited on collectives so far (not DDP's)."""
        return self.collectives.steps.waited_so_far() if self.collectives is not None else 0.0

    def _elsewhere(self):
        """Whether this hook runs on another thread than the training loop's (an evaluation or a
        checkpoint's forward beside it): the loop's step is not its to time."""
        return threading.get_ident() != self.thread

    def _before_forward(self, module, inputs):
        if self._elsewhere():
            return
        measured = self.current
        if not self._torch.is_grad_enabled():
            measured.evaluating = time.perf_counter()  # an evaluation between steps is not a step
            return
        if measured.forward_start is None:
            measured.forward_start = time.perf_counter()
            measured.waited_before_forward = self._waited()
            if self.on_gpu and self.collectives is not None:  # the stream the loop computes on
                self.collectives.compute_stream = self._torch.cuda.current_stream()
        self.thread = threading.get_ident()
        if self.collectives is not None:
            self.collectives.loop_thread = self.thread
        self.syncing = getattr(module, "require_backward_grad_sync", False)
        if self.syncing:
            measured.synced = True
        p = _progress.writer()
        if p is not None:
            p.phase(_FORWARD)

    def _after_forward(self, module, inputs, output):
        if self._elsewhere():
            return
        measured = self.current
        if measured.evaluating is not None:
            if _phase_depth() == 0:  # inside a named phase, the phase counts its own time
                if measured.forward_start is None:
                    measured.excluded += time.perf_counter() - measured.evaluating
                elif measured.optimizer_start is not None:
                    measured.after_optimizer += time.perf_counter() - measured.evaluating
            measured.evaluating = None
            return
        if self.ddp and not self.gpu:
            tensor = _first_grad_tensor(output)
            if tensor is not None:
                tensor.register_hook(self._backward_began)
        elif self.gpu and _progress.writer() is not None:
            tensor = _first_grad_tensor(output)
            if tensor is not None:
                tensor.register_hook(self._gpu_backward_began)

    # ---- CPU: two autograd callbacks around DDP's own ----

    def _backward_began(self, grad):
        if self.collectives is not None and self.syncing:
            self.collectives.in_ddp_backward = True
        p = _progress.writer()
        if p is not None:
            p.phase(_BACKWARD)
        self._queue(self._compute_done)

    def _compute_done(self):
        self.current.compute_done = time.perf_counter()
        self._queue(self._reductions_done)  # queued now: after DDP's finalizer, which waits for them
        if self.syncing and not self.in_collective:
            p = _progress.writer()
            if p is not None:
                self.in_collective = True
                p.collective_begin(phase=_ALL_REDUCE)  # DDP's finalizer now waits for the buckets

    def _reductions_done(self):
        if self.collectives is not None:
            self.collectives.in_ddp_backward = False
        measured = self.current
        if measured.compute_done is None:
            return
        now = time.perf_counter()
        measured.exposed += now - measured.compute_done
        if self.syncing:
            measured.ddp_spans.append((measured.compute_done, now - measured.compute_done))
        measured.compute_done = None
        if self.syncing:
            measured.optimizer_start = now  # the gradients are whole: the optimizer's turn
            measured.waited_before_optimizer = self._waited()
            measured.after_optimizer = 0.0
        p = _progress.writer()
        if p is None:
            return
        if self.in_collective:
            self.in_collective = False
            p.collective_end(phase=_OPTIMIZER)
        else:
            p.phase(_DATA)  # a backward under no_sync(): the next micro-batch comes next

    def _gpu_backward_began(self, grad):
        p = _progress.writer()
        if p is not None:
            p.phase(_BACKWARD)
            self._queue(self._gpu_compute_done)

    def _gpu_compute_done(self):
        # The host has launched backward's kernels and the buckets' all-reduces; the optimizer's
        # come next (the GPU catches up later: the host does not wait for it here).
        p = _progress.writer()
        if p is not None:
            p.phase(_OPTIMIZER)

    # ---- GPU: a comm hook with CUDA events ----

    def _comm_hook(self, group, bucket):
        torch, dist = self._torch, self._dist
        tensor = bucket.buffer()
        ready = torch.cuda.Event(enable_timing=True)
        ready.record()  # on the stream that produced the gradients
        slot = [ready, None]
        self.current.intervals.append(slot)
        tensor.div_(group.size() if group is not None else dist.get_world_size())  # as DDP's built-in hook
        p = _progress.writer()
        if p is not None:  # counts the collectives this rank launched: the wavefront across ranks
            try:
                index = bucket.index()
                if bucket.is_last():  # DDP rebuilds its buckets after the first step
                    self.buckets = index + 1
                p.collective_begin(index + 1, self.buckets if self.buckets > index else 0)
            except Exception:  # another torch's GradBucket: the record goes without
                p = None
        all_reduce = self.collectives.original("all_reduce") if self.collectives else dist.all_reduce
        future = all_reduce(tensor, group=group, async_op=True).get_future()  # timed here, not again there
        if p is not None:
            p.collective_end()  # launched (NCCL's communicator made): the host does not wait for it

        def done(fut):
            finished = torch.cuda.Event(enable_timing=True)
            finished.record()  # on the stream the reduction's result is ready on
            slot[1] = finished
            return fut.value()[0]

        return future.then(done)

    def close_step(self, end):
        """The step's start and what the hooks measured; a new step begins."""
        measured, self.current = self.current, _Measured()
        start, self.step_start = self.step_start, end
        return start, measured


_watcher = None
_watch_lock = threading.Lock()
_last_step = 0
_last_end = None


def watch(model, precision=None):
    """Times every step of `model` (a DistributedDataParallel module; any other nn.Module is timed
    without the all-reduce) and counts its FLOPs (_flops.py). Returns `model`. precision: what its
    matrix math runs in, "fp32", "tf32", "bf16", "fp16" or "fp8", or a torch dtype (torch.bfloat16,
    torch.float16, torch.float32, a float8 one; a ValueError otherwise); left out, it is detected.
    Outside Lockstep it does nothing."""
    global _watcher
    precision = _flops.checked_precision(precision)
    if _report.reporter() is None:
        return model
    with _watch_lock:
        if _watcher is not None:
            _report._warn("watch() was called again: only the first model is timed")
            return model
        _watcher = _Watcher(model, precision)
        _report._before_close.append(_flush_all)
    return model


def _seconds_to_us(seconds):
    return max(0, int(round(seconds * 1e6)))


class _CudaLoss:
    """A CUDA loss on its way to the host: copied to pinned memory without waiting."""

    __slots__ = ("value", "ready")

    def __init__(self, loss):
        import torch

        self.value = torch.empty((), dtype=loss.dtype, pin_memory=True)
        self.value.copy_(loss.detach().reshape(()), non_blocking=True)
        self.ready = torch.cuda.Event()
        self.ready.record()

    def read(self):
        return float(self.value) if self.ready.query() else None


def _loss_value(loss):
    if loss is None:
        return None
    if hasattr(loss, "is_cuda"):  # a tensor
        if loss.numel() != 1:
            raise ValueError("loss has %d elements; give its mean" % loss.numel())
        return _CudaLoss(loss) if loss.is_cuda else loss.item()
    return float(loss)


def _checked_fields(samples, tokens, epoch, lr, number, flops=None):
    """A step's report fields, checked so that no value can fail later, in the transport."""
    fields = {"step": number, "samples": int(samples), "time_unix_us": time.time_ns() // 1000}
    if flops is not None:
        fields["flops"] = _flops.declared(flops)
        fields["flops_basis"] = _flops.DECLARED
    if epoch is not None:
        fields["epoch"] = int(epoch)
    if lr is not None and math.isfinite(float(lr)) and float(lr) > 0:
        fields["lr"] = float(lr)
    if tokens is not None:
        fields["tokens"] = int(tokens)
    for name, top in (("step", _I63), ("samples", _U32), ("epoch", _U32), ("tokens", _I63)):
        if name in fields and not (1 if name == "step" else 0) <= fields[name] < top:
            raise ValueError("%s is %d, outside [%d, %d)" % (name, fields[name], name == "step", top))
    return fields


def step(samples, loss=None, tokens=None, epoch=None, lr=None, step=None, flops=None):
    """Closes the step that just ended on this rank and reports it.

    samples: this rank's samples in the step; loss: its mean loss (a float or a one-element tensor;
    a CUDA tensor is read once the GPU got there, without waiting); tokens: its tokens, for
    sequence models; epoch, lr: shown beside the step; step: the optimizer step's number when the
    program knows it (a resumed run), else the count of calls; flops: this rank's model FLOPs in
    the step (forward and backward, every micro-batch), when the program counts them itself (else
    they are estimated, from tokens or the layers: _flops.py). Never raises: a bad value is said on
    stderr and the step is not reported.
    """
    global _last_step, _last_end
    r = _report.reporter()
    p = _progress.stepping_writer()
    if r is None and p is None:
        return
    end = time.perf_counter()
    w = _watcher
    try:
        number = int(step) if step is not None else _last_step + 1
    except (TypeError, ValueError) as e:
        _report._warn("step not reported: %s" % e)
        return
    if p is not None:
        if w is not None and w.in_collective:  # a backward that raised inside DDP's all-reduce
            w.in_collective = False
            p.collective_end()
        p.step_done(number, _DATA if w is not None else "")
        if r is None:
            _last_step = number
            return
    counter = w.flops if w is not None else None
    try:
        fields = _checked_fields(samples, tokens, epoch, lr, number, flops)
        loss_value = _loss_value(loss)
    except (TypeError, ValueError, RuntimeError) as e:
        _report._warn("step not reported: %s" % e)
        if counter is not None:
            counter.skip_step()  # the next step's layers start from none
        return
    if counter is not None:
        try:
            counter.close_step(fields, fields.get("tokens"))
        except Exception as e:  # never raises into the program: the step goes without its flops
            fields.pop("precision", None)
            if flops is None:  # a count of its own, not the program's
                fields.pop("flops", None)
                fields.pop("flops_basis", None)
            _report._warn("flops not counted: %s: %s" % (type(e).__name__, e))
    _last_step = number
    if w is None:
        start = _last_end if _last_end is not None else _IMPORTED
        _last_end = end
        fields["step_time_us"] = _seconds_to_us(end - start)
        _send(r, fields, loss_value)
        return
    record = w.collectives.steps.close() if w.collectives is not None else None
    start, measured = w.close_step(end)
    measured.collectives = record
    waited = sum(t[2] for t in record[0].values()) if record is not None else 0.0
    # The loop's named phases (a checkpoint between steps) are boxes of their own, not the step's.
    fields["step_time_us"] = _seconds_to_us(end - start - measured.in_phases)
    if measured.forward_start is not None:
        data = max(0.0, measured.forward_start - start - measured.excluded - measured.waited_before_forward)
    else:
        data = 0.0
    fields["data_time_us"] = _seconds_to_us(data)
    if w.timed:
        fields["bytes_reduced"] = w.bytes_per_sync if measured.synced else 0
    gpu_collectives = record is not None and record[2]
    if (w.gpu or gpu_collectives) and (measured.intervals or w.pending or isinstance(loss_value, _CudaLoss)
                                       or gpu_collectives):
        # Read once the GPU got there: the host never waits for it. A step without events waits
        # behind the ones before it, so that reports keep their order.
        w.pending.append((fields, loss_value, measured))
        if len(w.pending) > _MAX_PENDING_GPU_STEPS:
            w.pending.popleft()
            r.count_drop()
        _flush_gpu(r, w, wait=False)
        return
    optimizer = None
    if measured.optimizer_start is not None:
        optimizer = max(0.0, end - measured.optimizer_start - measured.after_optimizer
                        - (waited - measured.waited_before_optimizer))
    ddp = None
    if w.timed and measured.synced:  # on CPUs only the wait for DDP's reductions is seen: its time is unknown (0)
        ddp = (len(measured.ddp_spans), 0.0, measured.exposed, w.bytes_per_sync, measured.ddp_spans)
    exposed = _with_collectives(fields, w, measured, ddp, measured.exposed if w.timed else None)
    _close_split(fields, exposed, optimizer=optimizer)
    _send(r, fields, loss_value)


def _with_collectives(fields, w, measured, ddp, exposed):
    """Adds the step's collectives, and DDP's all-reduce (`ddp`: count, time, exposed, bytes and
    spans, host seconds), to the report. Returns the step's exposed seconds: DDP's (`exposed`,
    None when not timed) and the collectives' (None when nothing timed either)."""
    if w.collectives is None:
        return exposed
    unknown = w.ddp and not w.timed  # DDP under a comm hook of the program's own, on GPUs: its wait is not seen
    totals, spans, _, elsewhere = measured.collectives or ({}, [], [], set())
    if ddp is not None:
        count, seconds, ddp_exposed, nbytes, ddp_spans = ddp
        if _collectives.ALL_REDUCE in elsewhere:
            # A comm hook of the program's own issued DDP's all-reduces through the wrappers, off
            # the loop's thread: they are counted; only the loop's wait for them is DDP's to add.
            count = seconds = nbytes = 0
            ddp_spans = ()
        _collectives.add_to(totals, spans, _collectives.ALL_REDUCE, max(count, 1) if nbytes else 0, seconds,
                            ddp_exposed, nbytes)
        for began, took in ddp_spans:
            _collectives.add_to({}, spans, _collectives.ALL_REDUCE, 1, took, took, nbytes, began)
    others = _add_collectives(fields, w.collectives, totals, spans) - (ddp[2] if ddp is not None else 0.0)
    return None if unknown else (exposed or 0.0) + others


def _add_collectives(fields, instrumented, totals, spans):
    """The collectives' fields; returns their exposed seconds."""
    collectives, out_spans, exposed = _collectives.fields_of(instrumented.steps, totals, spans)
    if collectives:
        fields["collectives"] = collectives
        fields["collective_spans"] = out_spans[:_collectives.MAX_SPANS]
    return exposed


def _close_split(fields, exposed, allreduce=None, optimizer=None):
    """Data, compute and exposed communication add up to the step time, in whole microseconds; the
    optimizer's time (from DDP's reductions done until step()) is a part of compute."""
    step_us, data_us = fields["step_time_us"], min(fields["data_time_us"], fields["step_time_us"])
    fields["data_time_us"] = data_us
    exposed_us = 0
    if exposed is not None:
        exposed_us = min(_seconds_to_us(exposed), step_us - data_us)
        fields["exposed_comm_time_us"] = exposed_us
        if allreduce is not None:
            fields["allreduce_time_us"] = max(exposed_us, _seconds_to_us(allreduce))
    fields["compute_time_us"] = step_us - data_us - exposed_us
    if optimizer is not None:
        fields["optimizer_time_us"] = min(_seconds_to_us(optimizer), fields["compute_time_us"])


def _send(r, fields, loss_value):
    if isinstance(loss_value, _CudaLoss):
        loss_value = loss_value.read()
    fields["loss"] = loss_value if loss_value is not None and math.isfinite(loss_value) else float("nan")
    r.send(fields)


def _gpu_done(measured, loss_value):
    """Whether a pending GPU step's events (and its loss's copy) completed."""
    if isinstance(loss_value, _CudaLoss) and not loss_value.ready.query():
        return False
    if measured.collectives is not None and not _collectives.gpu_ready(measured.collectives[2]):
        return False
    return all(d is not None and d.query() for _, d in measured.intervals[-1:])


def _flush_gpu(r, w, wait):
    """Reports the pending GPU steps whose events completed, oldest first. With `wait` (at exit)
    it waits for them, but at most 5 s in all: a hung GPU does not hang the program's exit."""
    deadline = time.monotonic() + 5.0
    while w.pending:
        fields, loss_value, measured = w.pending[0]
        if any(d is None for _, d in measured.intervals):  # cannot happen after backward; be safe
            w.pending.popleft()
            r.count_drop()
            continue
        while not _gpu_done(measured, loss_value):
            if not wait or time.monotonic() > deadline:
                return
            time.sleep(0.001)
        w.pending.popleft()
        exposed = allreduce = 0.0  # a step without buckets (under no_sync) reduced nothing
        if measured.intervals:
            anchor = measured.intervals[0][0]
            intervals = [(anchor.elapsed_time(s) / 1e3, anchor.elapsed_time(d) / 1e3) for s, d in measured.intervals]
            exposed = max(0.0, max(d for _, d in intervals) - max(s for s, _ in intervals))
            allreduce = _union_length(intervals)
        if measured.collectives is not None:
            totals, spans, gpu_spans, _ = measured.collectives
            _collectives.add_gpu(totals, spans, gpu_spans)
        ddp = (len(measured.intervals), allreduce, exposed, w.bytes_per_sync, []) if measured.intervals else None
        exposed = _with_collectives(fields, w, measured, ddp, exposed if w.timed else None)
        _close_split(fields, exposed, allreduce if measured.intervals else None)
        _send(r, fields, loss_value)


def _flush_all():
    r, w = _report.reporter(), _watcher
    if r is not None and w is not None:
        _flush_gpu(r, w, wait=True)


_MAX_PHASES_PER_SECOND = 20  # the agent's bound per rank (agent/src/stream/rank_inbox.cpp)
_MAX_PHASE_NAME_BYTES = 64
_phase_budget = [0, 0]  # [the second, phases reported in it]
_phase_warned = False
_open = threading.local()  # .stack: this thread's phases entered and not yet left, as (phase, began, saved)


def _phase_stack():
    stack = getattr(_open, "stack", None)
    if stack is None:
        stack = _open.stack = []
    return stack


def _phase_depth():
    return len(getattr(_open, "stack", ()))


def _phase_name(name):
    """The name as a PhaseReport carries it: no control characters, at most 64 bytes of UTF-8."""
    text = "".join(c if c >= " " and c != "\x7f" else " " for c in str(name)).strip()
    data = text.encode("utf-8", "replace")[:_MAX_PHASE_NAME_BYTES]
    return data.decode("utf-8", "ignore")


_perf_to_wall_us = [None]  # the wall clock's µs at perf_counter 0, while the two clocks agree


def _perf_to_wall(now_us):
    """The wall clock's µs at perf_counter 0: one offset between the two clocks for all of the
    process's phases, so that phases nested in one another keep their order and their durations
    their sizes, to the microsecond. `now_us` is the wall clock read just now; the offset is taken
    again only when the wall clock has been set more than a millisecond away."""
    offset = now_us - int(round(time.perf_counter() * 1e6))
    if _perf_to_wall_us[0] is None or abs(offset - _perf_to_wall_us[0]) > 1000:
        _perf_to_wall_us[0] = offset
    return _perf_to_wall_us[0]


def _report_phase(name, began, ended):
    """Reports a phase that ran from `began` to `ended` (perf_counter seconds), at most
    _MAX_PHASES_PER_SECOND a second. Its start and end on the wall clock go through one offset
    between the clocks (_perf_to_wall), so that phases nested in one another keep their order (two
    readings of both clocks would differ by a microsecond or more, and shift one against another)."""
    global _phase_warned
    r = _report.reporter()
    if r is None:
        return
    now_us = time.time_ns() // 1000
    offset = _perf_to_wall(now_us)
    begin_us, end_us = offset + int(round(began * 1e6)), offset + int(round(ended * 1e6))
    second = now_us // 1000000
    if _phase_budget[0] != second:
        _phase_budget[0], _phase_budget[1] = second, 0
    _phase_budget[1] += 1
    if _phase_budget[1] > _MAX_PHASES_PER_SECOND:
        if not _phase_warned:
            _phase_warned = True
            _report._warn("phase(%r) ends more than %d times a second: only that many are reported (phase() is for "
                          "long phases: a checkpoint, an evaluation)" % (name, _MAX_PHASES_PER_SECOND))
        return
    text = _phase_name(name)
    if not text:
        return
    r.send({"name": text, "time_unix_us": end_us, "duration_us": max(0, end_us - begin_us), "step": _last_step},
           kind="phase")


def _count_out_of_step(began, ended):
    """An outermost named phase of the training loop ran from `began` to `ended`: its time in the
    step now running is the phase's, not the step's (nor its data's, nor its optimizer's). One on
    another thread (an async checkpoint) ran beside the step and leaves it alone."""
    watcher = _watcher
    if watcher is None or watcher.thread != threading.get_ident():
        return
    measured = watcher.current
    in_step = max(0.0, ended - max(began, watcher.step_start))
    measured.in_phases += in_step
    if measured.forward_start is None:
        measured.excluded += in_step
    if measured.optimizer_start is not None:
        measured.after_optimizer += max(0.0, ended - max(began, measured.optimizer_start))


class phase:
    """Announces a phase the program names itself, for as long as a ``with`` block (or a function
    it decorates) runs::

        with lockstep.phase("checkpoint"):
            torch.save(state, path)

    The rank's progress record says it is in that phase, so a long checkpoint or evaluation is
    judged against that phase's own history, not the step's, and a stuck one is named. On exit the
    phase that was current before comes back, and the phase is reported: Lockstep's timeline draws
    it as a box of its own. Outside Lockstep it does nothing. Never raises.
    """

    __slots__ = ("name",)

    def __init__(self, name):
        self.name = name

    def __enter__(self):
        w = _progress.writer()
        saved = None
        if w is not None:
            saved = w.current()
            w.phase(self.name, announced=True)
        # On this thread's stack: one phase object may be entered on several threads at once.
        _phase_stack().append((self, time.perf_counter(), saved))
        return self

    def __exit__(self, *exc):
        stack = _phase_stack()
        index = next((i for i in range(len(stack) - 1, -1, -1) if stack[i][0] is self), None)
        if index is None:
            return False
        _, began, saved = stack.pop(index)
        w = _progress.writer()
        if w is not None and saved is not None:
            w.restore(saved)
        ended = time.perf_counter()
        if not stack:
            _count_out_of_step(began, ended)
        try:
            _report_phase(self.name, began, ended)
        except Exception as e:  # never raises into the program
            _report._warn("phase not reported: %s" % e)
        return False

    def __call__(self, function):
        import functools

        name = self.name

        @functools.wraps(function)
        def in_phase(*args, **kwargs):
            with phase(name):
                return function(*args, **kwargs)

        return in_phase
