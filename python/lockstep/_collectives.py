"""Every collective a rank issues through torch.distributed, timed: its kind, its bytes, how long it
took from issue to completion, and how much of that the rank waited on it, computing nothing (its
exposed time). What the step report's collectives and exposed communication say
(docs/own-program.md, "Every collective").

The module-level functions of torch.distributed (and of torch.distributed.distributed_c10d, where
they are defined and where the library's own helpers look them up) are replaced by wrappers, once:
the program's own calls, FSDP's, ZeroRedundancyOptimizer's and DDP's comm hooks go through them.
A call made inside another wrapped call (an alias that calls the new name) is the outer call's,
counted once; helpers that are not wrapped (broadcast_object_list) count the collectives they make.

- A blocking collective (async_op=False) on CPU tensors: its wall time, all of it exposed.
- An asynchronous one (async_op=True): issue to completion (its future's callback, on Gloo's
  thread), and exposed the time spent in its Work's wait(). The Work handed back is a Work (a
  subclass, so isinstance checks hold) whose wait() is timed; everything else goes to the real one.
- On CUDA tensors the host's clock says nothing of the GPU's: CUDA events on the calling thread's
  current stream, recorded before the call, after a blocking call (the stream waits for NCCL's
  there), around an asynchronous one's wait(), and when its future completes. They are read once
  they completed (steps later), never waited for (add_gpu). A blocking call made on another stream
  than the training loop's (FSDP's all-gather and reduce-scatter streams) is timed, but the loop's
  wait for that stream is not seen: its exposed part is counted 0, not all of it. Nothing is
  recorded while a CUDA graph is being captured.
- Only collectives of the default group, not send/recv, enter the progress record: ranks of a
  subgroup run more collectives than the others, and the stall wavefront compares counts.

Bytes are nccl-tests' sizes (lockstep.proto, CollectiveTimes.bytes). The rank's progress record
counts each collective entered, so that a stall names the ranks that did not reach it.
"""

import threading
import time

from lockstep import _progress

# CollectiveKind (lockstep.proto)
ALL_REDUCE, REDUCE_SCATTER, ALL_GATHER, BROADCAST, ALL_TO_ALL, BARRIER, REDUCE, GATHER, SCATTER, SEND_RECV = range(1, 11)
MAX_SPANS = 64  # per step (kMaxCollectiveSpans)
GPU_SPAN_DEADLINE_S = 10.0  # a GPU collective's future that has not completed by then: its time is unknown


def _nbytes(t):
    return t.numel() * t.element_size() if t is not None and hasattr(t, "element_size") else 0


def _list_bytes(ts):
    return sum(_nbytes(t) for t in ts) if ts else 0


def _group_size(dist, group):
    try:
        return dist.get_world_size(group) if group is not None else dist.get_world_size()
    except Exception:
        return 1


# name -> (kind, the argument its bytes come from (position, keyword), how: "one" tensor, a "list"
# of them, or "n" (one tensor times the group's size))
_WRAPPED = {
    "all_reduce": (ALL_REDUCE, 0, "tensor", "one"),
    "all_reduce_coalesced": (ALL_REDUCE, 0, "tensors", "list"),
    "reduce_scatter": (REDUCE_SCATTER, 1, "input_list", "list"),
    "reduce_scatter_tensor": (REDUCE_SCATTER, 1, "input", "one"),
    "_reduce_scatter_base": (REDUCE_SCATTER, 1, "input", "one"),
    "all_gather": (ALL_GATHER, 0, "tensor_list", "list"),
    "all_gather_into_tensor": (ALL_GATHER, 0, "output_tensor", "one"),
    "_all_gather_base": (ALL_GATHER, 0, "output_tensor", "one"),
    "broadcast": (BROADCAST, 0, "tensor", "one"),
    "all_to_all": (ALL_TO_ALL, 1, "input_tensor_list", "list"),
    "all_to_all_single": (ALL_TO_ALL, 1, "input", "one"),
    "barrier": (BARRIER, None, None, None),
    "monitored_barrier": (BARRIER, None, None, None),
    "reduce": (REDUCE, 0, "tensor", "one"),
    "gather": (GATHER, 0, "tensor", "n"),
    "scatter": (SCATTER, 0, "tensor", "n"),
    "send": (SEND_RECV, 0, "tensor", "one"),
    "recv": (SEND_RECV, 0, "tensor", "one"),
    "isend": (SEND_RECV, 0, "tensor", "one"),
    "irecv": (SEND_RECV, 0, "tensor", "one"),
}
_ALWAYS_ASYNC = ("isend", "irecv")  # they hand back a Work without async_op


def _position_of(function, parameter):
    """Where `parameter` comes among `function`'s positional arguments (None: keyword only, or none)."""
    import inspect

    try:
        names = list(inspect.signature(function).parameters)
    except (TypeError, ValueError):
        return None
    return names.index(parameter) if parameter in names else None


def _argument(args, kwargs, position, keyword):
    if keyword in kwargs:
        return kwargs[keyword]
    return args[position] if position is not None and len(args) > position else None


class _Span:
    """One collective on its way: host times (perf_counter seconds) or CUDA events."""

    __slots__ = ("kind", "nbytes", "issued", "exposed", "events", "counted", "entry", "ended")

    def __init__(self, kind, nbytes, issued):
        self.kind, self.nbytes, self.issued = kind, nbytes, issued
        self.exposed = 0.0     # host seconds waited on it so far (CUDA: None for a blocking one)
        self.events = None     # CUDA: [before, done, wait_before, wait_after, ...]
        self.counted = False   # its completion is in a step's record
        self.entry = None      # its entry in that record's spans, if it has one
        self.ended = None      # host time its counted duration ends at


class Steps:
    """The collectives of the step now running, by kind, and its first MAX_SPANS one by one.
    Completions come from other threads (Gloo's callbacks): a lock guards the step's record.

    A collective counts in the step it completed in; the time waited on an asynchronous one counts
    as exposed in the step it was waited in (normally the same)."""

    def __init__(self, clock_offset):
        self._lock = threading.Lock()
        self._offset = clock_offset  # perf_counter seconds -> Unix seconds
        self._reset()

    def _reset(self):
        self._waited = 0.0  # exposed seconds so far, every kind (host-timed ones)
        self.totals = {}   # kind -> [count, time s, exposed s, bytes]
        self.spans = []    # at most MAX_SPANS: (kind, start s, duration s, exposed s, bytes)
        self.gpu = []      # _Spans with CUDA events, not read yet
        self.elsewhere = set()  # kinds issued by DDP's reducer: during its backward, or off the loop's thread

    def completed(self, span, now, exposed):
        """`span` completed at `now`; `exposed`: the seconds of it waited on not counted yet."""
        with self._lock:
            if span.counted:
                if exposed:
                    self._add(span.kind, 0, 0.0, exposed, 0, None)
                return
            span.counted = True
            span.ended = now
            span.entry = self._add(span.kind, 1, now - span.issued, exposed, span.nbytes, span)

    def waited(self, span, seconds, now):
        """The rank waited `seconds` on an asynchronous `span`, until `now` (its wait() returned):
        counted as it completes, or now when it had completed already. For the rank it ended when
        the wait returned: a wait that returns after the completion callback ran (the waiting
        thread woken late on a busy core) makes it that much longer."""
        span.exposed += seconds
        with self._lock:
            if span.counted:
                longer = max(0.0, now - span.ended)
                span.ended += longer
                self._add(span.kind, 0, longer, seconds, 0, None)
                if span.entry is not None:
                    span.entry[2] += longer
                    span.entry[3] = min(span.entry[3] + seconds, span.entry[2])

    def waited_so_far(self):
        return self._waited

    def issued_elsewhere(self, kind):
        self.elsewhere.add(kind)

    def gpu_issued(self, span):
        with self._lock:
            self.gpu.append(span)

    def _add(self, kind, count, duration, exposed, nbytes, span):
        self._waited += exposed
        entry = add_to(self.totals, self.spans, kind, count, duration, exposed, nbytes,
                       span.issued if span is not None else None)
        if entry is not None:
            entry[3] = min(span.exposed, duration)  # what it was waited on so far, not only now
        return entry

    def close(self):
        """The step's record: (totals, spans, CUDA spans, kinds issued off the training loop's
        thread); a new one begins. The clocks' offset is taken again: NTP moves the Unix clock."""
        with self._lock:
            record = (self.totals, self.spans, self.gpu, self.elsewhere)
            self._reset()
        self._offset = time.time() - time.perf_counter()
        return record

    def unix_us(self, seconds):
        return int(round((seconds + self._offset) * 1e6))


def add_to(totals, spans, kind, count, duration, exposed, nbytes, start=None):
    """Adds to a step's record: its kind's totals [count, time s, exposed s, bytes] and, with a
    `start` and room left, a span [kind, start s, duration s, exposed s, bytes], which it returns."""
    t = totals.get(kind)
    if t is None:
        t = totals[kind] = [0, 0.0, 0.0, 0]
    t[0] += count
    t[1] += duration
    t[2] += exposed
    t[3] += nbytes
    if start is None or len(spans) >= MAX_SPANS:
        return None
    entry = [kind, start, duration, min(exposed, duration), nbytes]
    spans.append(entry)
    return entry


def gpu_ready(gpu_spans):
    """Whether every CUDA event of these collectives completed (none is waited for). An event that
    cannot say is taken as done: add_gpu then drops its collective. One whose future has not said it
    completed after GPU_SPAN_DEADLINE_S counts with no time, rather than hold back every later
    report."""
    try:
        for span in gpu_spans:
            events = span.events
            if events[1] is None and time.perf_counter() - span.issued > GPU_SPAN_DEADLINE_S:
                events[1] = events[0]
            if events[1] is None or not all(e.query() for e in events[1:]):
                return False
    except Exception:
        return True
    return True


def add_gpu(totals, spans, gpu_spans):
    """Adds collectives timed by CUDA events (all completed: gpu_ready) to a closed step's record,
    placed on the host's clock by their issue time. One whose events cannot be read is left out."""
    for span in gpu_spans:
        try:
            before, done, waits = span.events[0], span.events[1], span.events[2:]
            duration = max(0.0, before.elapsed_time(done) / 1e3)
            exposed = sum(max(0.0, a.elapsed_time(b) / 1e3) for a, b in zip(waits[0::2], waits[1::2]))
        except Exception as e:
            _progress._warn("a collective on the GPU was not timed: %r" % (e,))
            continue
        if span.exposed is None:  # blocking, on the training loop's stream: it waited for all of it
            exposed = duration
        add_to(totals, spans, span.kind, 1, duration, min(exposed, duration), span.nbytes, span.issued)


def fields_of(steps, totals, spans):
    """The step report's collectives and spans, by their proto names; and their exposed seconds."""
    collectives = [{"kind": kind, "count": t[0], "time_us": _us(t[1]), "exposed_us": _us(t[2]), "bytes": t[3]}
                   for kind, t in sorted(totals.items())]
    out_spans = [{"kind": kind, "start_unix_us": steps.unix_us(start), "duration_us": _us(duration),
                  "exposed_us": _us(exposed), "bytes": nbytes}
                 for kind, start, duration, exposed, nbytes in sorted(spans, key=lambda s: s[1])]
    # Their exposed time as the report's entries say it, in whole microseconds: the step's exposed
    # time, rounded once, is then never less than the sum of its kinds'.
    return collectives, out_spans, sum(c["exposed_us"] for c in collectives) / 1e6


def _us(seconds):
    return max(0, int(round(seconds * 1e6)))


def _timed_work_class(dist):
    """A Work (a subclass: code that checks isinstance(work, dist.Work), as FSDP's does, still
    waits on it) whose wait() is timed as exposed time; every other method is the real Work's."""

    def delegate(name):
        def method(self, *args, **kwargs):
            return getattr(self._work, name)(*args, **kwargs)

        method.__name__ = name
        return method

    members = {name: delegate(name) for name in dir(dist.Work)
               if not name.startswith("__") and name != "wait" and callable(getattr(dist.Work, name, None))}

    def __init__(self, work, span, steps, cuda):
        dist.Work.__init__(self)
        self._work, self._span, self._steps, self._cuda = work, span, steps, cuda

    def wait(self, *args, **kwargs):
        began = time.perf_counter()
        events = None
        if self._cuda is not None:
            events = _recorded(self._cuda)
        result = self._work.wait(*args, **kwargs)
        try:
            self._waited(began, events)
        except Exception as e:  # the timing's fault: the wait returns as without Lockstep
            _progress._warn("a collective's wait was not timed: %r" % (e,))
        return result

    def _waited(self, began, events):
        span = self._span
        if events is not None:
            after = _recorded(self._cuda)
            if after is not None:
                span.events += [events, after]
            return
        now = time.perf_counter()
        if span.counted:
            self._steps.waited(span, now - began, now)
        else:  # done, and its completion not seen (a Work without a future, or its callback to come)
            span.exposed += now - began
            self._steps.completed(span, now, now - began)

    def __getattr__(self, name):
        return getattr(self._work, name)

    members.update(__init__=__init__, wait=wait, _waited=_waited, __getattr__=__getattr__)
    return type("TimedWork", (dist.Work,), members)


def _recorded(cuda):
    """A timing event recorded now on the current stream; None while a CUDA graph is captured
    (recording would break the capture)."""
    if cuda.is_current_stream_capturing():
        return None
    event = cuda.Event(enable_timing=True)
    event.record()
    return event


class Instrumented:
    """The wrappers, installed once per process (install())."""

    def __init__(self, torch, dist):
        self.torch, self.dist = torch, dist
        self.steps = Steps(time.time() - time.perf_counter())
        self.originals = {}
        self._local = threading.local()  # .depth: wrapped calls this thread is inside
        self._warned = False
        self._work_class = _timed_work_class(dist)
        self.loop_thread = threading.get_ident()  # the training loop's (watch() says)
        self.compute_stream = None                # its CUDA stream, once a forward ran on a GPU
        self.in_ddp_backward = False              # a watched DDP's backward runs (its comm hook may call us)

    def original(self, name):
        return self.originals.get(name) or getattr(self.dist, name)

    def install(self):
        import torch.distributed.distributed_c10d as c10d

        for name, how in _WRAPPED.items():
            original = getattr(c10d, name, None) or getattr(self.dist, name, None)
            if original is None or getattr(original, "_lockstep_wrapped", False):
                continue
            wrapper = self._wrapper(name, original, how)
            self.originals[name] = original
            for module in (c10d, self.dist):
                if getattr(module, name, None) is original:
                    setattr(module, name, wrapper)

    def _wrapper(self, name, original, how):
        kind, position, keyword, shape = how
        always_async = name in _ALWAYS_ASYNC
        async_at = _position_of(original, "async_op")
        group_at = _position_of(original, "group")
        recorded = kind != SEND_RECV  # a pair's exchange is not a step of the whole job's wavefront

        def timed(*args, **kwargs):
            local = self._local
            if getattr(local, "depth", 0):
                return original(*args, **kwargs)  # inside another wrapped call: counted there
            local.depth = 1
            try:
                is_async = always_async or bool(_argument(args, kwargs, async_at, "async_op"))
                entered = recorded and self._in_default_group(_argument(args, kwargs, group_at, "group"))
                return self._call(original, kind, (position, keyword, shape), is_async, entered, args, kwargs)
            finally:
                local.depth = 0

        timed.__name__, timed.__qualname__, timed.__doc__ = original.__name__, original.__qualname__, original.__doc__
        timed.__wrapped__ = original
        timed._lockstep_wrapped = True
        return timed

    def _in_default_group(self, group):
        return group is None or group is getattr(self.dist.GroupMember, "WORLD", None)

    def _call(self, original, kind, where, is_async, entered, args, kwargs):
        """The collective, timed. What goes wrong in the timing is said once and leaves the call
        alone: the program's collective runs, and returns, as without Lockstep."""
        try:
            cuda = self._cuda_of(args, kwargs)
            span = _Span(kind, self._bytes(args, kwargs, *where), 0.0)
            if cuda is not None:
                before = _recorded(cuda)
                if before is None:  # a CUDA graph being captured: nothing to time it with
                    return original(*args, **kwargs)
                span.events = [before, None]
            if self.in_ddp_backward or threading.get_ident() != self.loop_thread:
                self.steps.issued_elsewhere(kind)  # by DDP's reducer (a comm hook of the program's)
        except Exception as e:
            self._failed(e)
            return original(*args, **kwargs)
        p = _progress.writer() if entered else None
        if p is not None:  # entered (on a GPU: launched; the host goes on)
            p.collective_begin(kind=kind)
        span.issued = time.perf_counter()
        try:
            result = original(*args, **kwargs)
        finally:
            if p is not None:
                p.collective_end()
        try:
            return self._issued(span, cuda, is_async, result)
        except Exception as e:
            self._failed(e)
            return result

    def _issued(self, span, cuda, is_async, result):
        """Counts a blocking collective that returned, or follows an asynchronous one to its end;
        returns what the program gets back."""
        steps = self.steps
        if cuda is not None:
            return self._issued_on_gpu(span, cuda, is_async, result)
        if not is_async or result is None:
            now = time.perf_counter()
            span.exposed = now - span.issued
            steps.completed(span, now, span.exposed)
            return result
        try:  # on Gloo's thread, as it completes
            result.get_future().add_done_callback(lambda _: steps.completed(span, time.perf_counter(), 0.0))
        except Exception:  # a Work without a future: its wait() says when it was done
            pass
        return self._work_class(result, span, steps, None)

    def _issued_on_gpu(self, span, cuda, is_async, result):
        if not is_async or result is None:
            span.events[1] = _recorded(cuda) or span.events[0]  # after the current stream's wait for it
            # The stream waited for all of it; on a stream of its own (FSDP's), the training loop's
            # stream waits later, unseen: none of it is counted exposed.
            on_loop_stream = self.compute_stream is None or cuda.current_stream() == self.compute_stream
            span.exposed = None if on_loop_stream else 0.0
            self.steps.gpu_issued(span)
            return result

        def completed(_):
            span.events[1] = _recorded(cuda) or span.events[0]  # on the stream the result is ready on

        try:
            result.get_future().add_done_callback(completed)
        except Exception:
            span.events[1] = span.events[0]  # no future: its time is unknown, its waits still count
        self.steps.gpu_issued(span)
        return self._work_class(result, span, self.steps, cuda)

    def _failed(self, error):
        if not self._warned:
            self._warned = True
            _progress._warn("a collective was not timed (and no more will say so): %r" % (error,))

    def _bytes(self, args, kwargs, position, keyword, shape):
        if shape is None:
            return 0
        value = _argument(args, kwargs, position, keyword)
        if shape == "list":
            return _list_bytes(value)
        if shape == "n":
            return _nbytes(value) * _group_size(self.dist, kwargs.get("group"))
        return _nbytes(value)

    def _cuda_of(self, args, kwargs):
        for value in list(args[:2]) + list(kwargs.values()):
            item = value[0] if isinstance(value, (list, tuple)) and value else value
            if getattr(item, "is_cuda", False):
                return self.torch.cuda
        return None


_instrumented = None
_install_lock = threading.Lock()


def install():
    """Wraps torch.distributed's collectives, once; returns the Instrumented, or None when torch is
    not there. Never raises."""
    global _instrumented
    with _install_lock:
        if _instrumented is None:
            try:
                import torch
                import torch.distributed as dist

                if not dist.is_available():
                    return None
                instrumented = Instrumented(torch, dist)
                instrumented.install()
                _instrumented = instrumented
            except Exception as e:
                _progress._warn("not timing torch.distributed's collectives: %s" % e)
                return None
    return _instrumented


def installed():
    return _instrumented
