"""The report channel: protobuf StreamMessages pushed to the agent over ZeroMQ, as the trainer's.

Through Debian's python3-zmq and python3-protobuf; in a Python without them, through
liblockstep-reporter, the trainer's own code (_native.py). Either way reports leave in bursts
(_bursts.py).
"""

import atexit
import os
import threading
import time

from lockstep import _native
from lockstep._bursts import _Bursts, warn as _warn

_lock = threading.Lock()
_reporter = None  # created on first use; None again after close()
_closed = False


class _Reporter(_Bursts):
    """One rank's PUSH socket to its agent. Sending never waits: a full queue counts a drop."""

    QUEUE = 100000     # reports held while the agent does not read (the trainer's figure)
    LINGER_MS = 2000   # how long exit waits for queued reports
    NOT_CONNECTED_WARNING_S = 10.0

    def __init__(self, endpoint, job_id, rank, world_size, attempt):
        import zmq  # Debian's python3-zmq
        from lockstep.v1 import lockstep_pb2  # generated from protocol/lockstep/v1/lockstep.proto

        self._zmq = zmq
        self._pb = lockstep_pb2
        self._context = zmq.Context(io_threads=1)
        self._socket = self._context.socket(zmq.PUSH)
        self._socket.setsockopt(zmq.SNDHWM, self.QUEUE)
        self._socket.setsockopt(zmq.LINGER, self.LINGER_MS)
        # Whether the agent ever took the connection: reports to an endpoint nobody listens on queue
        # silently, so the rank says so once rather than seem to report.
        self._monitor = self._socket.get_monitor_socket(zmq.EVENT_CONNECTED)
        self._socket.connect(endpoint)
        self.endpoint = endpoint
        self.connected = False
        self._first_send = None
        self._warned = False
        self.job_id = job_id
        self.rank = rank
        self.world_size = world_size
        self.attempt = attempt
        self.seq = 0      # reports handed to ZeroMQ, numbered
        super().__init__()

    def _deliver(self, held):
        self._check_connected()
        pb = self._pb
        for i, (kind, fields) in enumerate(held):
            self.seq += 1
            identity = dict(job_id=self.job_id, rank=self.rank, world_size=self.world_size, attempt=self.attempt)
            if kind == "phase":
                message = pb.StreamMessage(seq=self.seq, phase_report=pb.PhaseReport(**identity, **fields))
            else:
                message = pb.StreamMessage(seq=self.seq, step_report=pb.StepReport(**identity, **fields))
            try:
                self._socket.send(message.SerializeToString(), self._zmq.NOBLOCK)
            except self._zmq.ZMQError:  # Again: the queue is full; anything else: the socket is gone
                self.count_drop(len(held) - i)
                return

    def _check_connected(self):
        if self.connected:
            return
        try:
            while self._monitor.poll(0):
                self._monitor.recv_multipart(self._zmq.NOBLOCK)
                self.connected = True
        except self._zmq.ZMQError:
            pass
        now = time.monotonic()
        if self._first_send is None:
            self._first_send = now
        if not self.connected and not self._warned and now - self._first_send > self.NOT_CONNECTED_WARNING_S:
            self._warned = True
            _warn("step reports are not reaching the agent at LOCKSTEP_REPORT=%s (nothing listens there): they "
                  "queue, then drop; training goes on" % self.endpoint)

    def close(self):
        super().close()
        with self._flushing:
            self._check_connected()
            if not self.connected and self.made > 0 and self._monitor.poll(self.LINGER_MS):
                self._check_connected()  # the connection was still being made
            if not self.connected and self.made > 0:
                _warn("%d step reports never reached the agent at LOCKSTEP_REPORT=%s" % (self.made, self.endpoint))
                self._socket.setsockopt(self._zmq.LINGER, 0)  # nobody to wait for
            self._monitor.close(0)
            self._socket.close()  # lingers up to LINGER_MS for queued reports
            self._context.term()


def _from_environment():
    endpoint = os.environ.get("LOCKSTEP_REPORT", "")
    job_id = os.environ.get("LOCKSTEP_JOB_ID", "")
    if not endpoint or not job_id:
        return None  # not started by a Lockstep agent: every call is a no-op
    try:
        rank = int(os.environ.get("RANK", "0"))
        world_size = int(os.environ.get("WORLD_SIZE", "1"))
        attempt = int(os.environ.get("LOCKSTEP_ATTEMPT", "0"))
        if not 0 <= rank < world_size:
            raise ValueError("RANK %d is outside WORLD_SIZE %d" % (rank, world_size))
    except ValueError as e:
        _warn("not reporting steps: the rank's environment is malformed (%s)" % e)
        return None
    first = None
    try:
        if os.environ.get("LOCKSTEP_PYTHON_TRANSPORT", "") != "native":
            try:
                return _Reporter(endpoint, job_id, rank, world_size, attempt)
            except ImportError as missing:  # no python3-zmq or python3-protobuf in this Python
                first = missing
        try:
            return _native.NativeReporter()
        except ImportError as e:
            _warn("not reporting steps: %s; and %s (install python3-zmq and python3-protobuf, or the "
                  "lockstep-agent package's liblockstep-reporter)" % (first or "the native transport was asked for", e))
    except Exception as e:  # a malformed endpoint, say: the training goes on without reports
        _warn("not reporting steps: cannot connect to LOCKSTEP_REPORT=%r: %s" % (endpoint, e))
    return None


def reporter():
    """The rank's reporter, or None outside Lockstep (or after close())."""
    global _reporter
    with _lock:
        if _reporter is None and not _closed:
            _reporter = _from_environment() or False
            if _reporter:
                atexit.register(close)
        return _reporter or None


def active():
    """Whether this process reports to a Lockstep agent."""
    return reporter() is not None


def dropped():
    """Reports dropped so far because the agent did not take them."""
    r = reporter()
    return r.dropped if r else 0


_before_close = []  # callables run before the socket closes (the watcher's pending GPU steps)


def close():
    """Sends what is pending and closes the channel (also run at exit); later calls are no-ops."""
    global _reporter, _closed
    for flush in list(_before_close):
        flush()
    with _lock:
        r, _reporter, _closed = _reporter, None, True
    if r:
        r.close()
