"""A rank's progress record, and its stacks on a signal (docs/own-program.md, "When a job stops
moving").

The agent gives each rank LOCKSTEP_PROGRESS, a 128-byte file this process maps once and writes
with no system call (the clock is the vDSO's), and LOCKSTEP_STACKS, a file faulthandler appends
every thread's Python stack to when the agent sends the signal named in the record: the agent
reads both without the rank's help, also while it is stuck. The layout and its semantics are
lockstep::progress's (common/base/include/lockstep/common/progress.h), byte for byte:

    0 u32 magic "LSPR"            56 u32 bucket (1-based; 0: none)
    4 u32 version (1)             60 u32 buckets
    8 u64 sequence (odd: writing) 64 u32 stack signal (0: none)
   16 i64 last completed step     68 u32 flags (1 announced, 2 in collective, 4 reports steps)
   24 i64 step began (unix us)    72 char[32] phase, NUL-padded (at most 31 bytes)
   32 i64 phase began (unix us)  104 i32 pid
   40 u64 collectives entered    108 u32 collective kind (CollectiveKind; 0: not said)
   48 i64 collective began (unix us; 0 outside one)   112..127 reserved (0)

A seqlock: the sequence is made odd, the fields written, the sequence made even.

The writes are C's (lockstep/_record.abi3.so, python/native/record.c) where this Python loads it,
and Python's (_PythonRecord) elsewhere: what a step pays is their first touch after its compute,
about a quarter in C (docs/benchmarks.md).

One process of a rank owns the record: the first Python process that opens it (the rank's own,
normally). A Python process the rank starts later (a spawned DataLoader worker, a compile
worker) finds it owned by a live process and leaves it alone, unless the owner never reported a
step and this process does (a launcher in Python that runs the training script as a child): then
the record is the child's. A forked child stops writing.

This module imports nothing of the package: python/boot/sitecustomize.py loads it alone at
start-up, so that an unmodified script gets its record and stacks without importing lockstep.
"""

import os
import struct
import sys
import threading
import time

MAGIC = 0x5250534C  # "LSPR"
VERSION = 1
BYTES = 128
ANNOUNCED, IN_COLLECTIVE, REPORTS_STEPS = 1, 2, 4

# Writes go through views of the mapping as arrays of 8-byte and 4-byte fields, indexed by offset /
# size (literals below, named in the comments): an item stored costs tens of nanoseconds, where
# struct.pack_into parses a format every time. They are in the machine's order, as the C++
# writer's; the layout says little-endian. What a write costs is mostly the caches it misses, the
# training step having evicted everything: so each is a few stores in few objects.
#   8-byte: 1 sequence, 2 step, 3 step began, 4 phase began, 5 collectives, 6 collective began
#   4-byte: 0 magic, 1 version, 14 bucket, 15 buckets, 16 stack signal, 17 flags, 26 pid, 27 collective kind
#   bytes 72..104: the phase
_I64 = 2**63
_I64_MAX = _I64 - 1  # the sequence and the collectives, stored as signed: a wrap is 292 years away
_clock = time.time_ns


def _warn(text):  # as _bursts.warn; this module imports nothing of the package
    print("lockstep: " + text, file=sys.stderr, flush=True)


_names = {}  # phase name -> its 32 bytes: at most 31 of ASCII, NUL-padded (no allocation per call)


def _encoded(name):
    # str(name), as the phase reports say; only a str is cached (a subclass may equal one).
    exact = type(name) is str
    b = _names.get(name) if exact else None
    if b is None:
        b = str(name).encode("ascii", "replace")[:31].ljust(32, b"\0")
        if exact and len(_names) < 1024:
            _names[name] = b
    return b


def stack_signal():
    """The signal the agent sends for stacks: a real-time one, which kills a process that did not
    register it rather than interrupt anything it relies on."""
    import signal
    return signal.SIGRTMIN + 5


class _PythonRecord:
    """The record's writes in Python, where the native ones (_native_record) cannot load. Each
    takes a lock: a loader's thread and DDP's hooks may update the record at once."""

    __slots__ = ("_lock", "_bytes", "_q", "_u32", "_sequence", "_collectives", "_flags", "_phase")

    def __init__(self, buffer):
        self._lock = threading.Lock()
        self._view(memoryview(buffer))
        self._sequence = self._q[1] + (self._q[1] & 1)
        self._collectives = self._q[5]
        self._flags = self._u32[17]
        self._phase = bytes(self._bytes[72:104])

    def _view(self, view):
        self._bytes, self._q, self._u32 = view, view.cast("q"), view.cast("I")

    def rebind(self, buffer):
        """Writes go to `buffer` from now on, the state kept."""
        self._view(memoryview(buffer))
        self._lock = threading.Lock()

    def claim(self, signal_number, pid):
        """Makes the record process `pid`'s, as lockstep::progress::Writer's constructor does."""
        now = _clock() // 1000
        with self._lock:
            q, u32 = self._q, self._u32
            s = self._sequence + 1
            q[1] = s
            u32[0], u32[1], u32[16] = MAGIC, VERSION, signal_number
            self._bytes.cast("i")[26] = pid
            q[3] = q[4] = now
            self._bytes[72:104] = self._phase = _encoded("start-up")
            self._sequence = s = s + 1
            q[1] = s

    # Each update: the sequence made odd, the fields stored, the sequence made even (a seqlock).

    def step_done(self, step, phase=""):
        """A step completed: the next one begins now, in `phase`."""
        if not -_I64 <= step < _I64:
            return
        name = _encoded(phase)
        now = _clock() // 1000
        with self._lock:
            q = self._q
            s = self._sequence + 1
            q[1] = s
            q[2] = step
            q[3] = q[4] = now
            self._u32[17] = self._flags = (self._flags | REPORTS_STEPS) & ~ANNOUNCED
            self._bytes[72:104] = self._phase = name
            self._sequence = s = s + 1
            q[1] = s

    def phase(self, name, announced=False):
        """The rank is now in phase `name` (announced: one the program named, judged by its own
        history)."""
        self._set_phase(_encoded(name), announced)

    def _set_phase(self, name, announced):
        now = _clock() // 1000
        with self._lock:
            q = self._q
            s = self._sequence + 1
            q[1] = s
            q[4] = now
            self._u32[17] = self._flags = (self._flags | ANNOUNCED) if announced else (self._flags & ~ANNOUNCED)
            self._bytes[72:104] = self._phase = name
            self._sequence = s = s + 1
            q[1] = s

    def collective_begin(self, bucket=0, buckets=0, phase=None, kind=0):
        """The rank entered a collective (bucket `bucket` of `buckets`, 1-based; 0: unknown) of
        `kind` (CollectiveKind; 0: not said), and, with `phase`, that phase (unannounced) too, in
        the same update."""
        name = None if phase is None else _encoded(phase)
        now = _clock() // 1000
        with self._lock:
            q, u32 = self._q, self._u32
            s = self._sequence + 1
            q[1] = s
            self._collectives = q[5] = (self._collectives + 1) & _I64_MAX
            q[6] = now
            u32[14] = bucket & 0xFFFFFFFF
            u32[15] = buckets & 0xFFFFFFFF
            u32[27] = kind
            if name is None:
                u32[17] = self._flags = self._flags | IN_COLLECTIVE
            else:
                u32[17] = self._flags = (self._flags | IN_COLLECTIVE) & ~ANNOUNCED
                q[4] = now
                self._bytes[72:104] = self._phase = name
            self._sequence = s = s + 1
            q[1] = s

    def collective_end(self, phase=None):
        """The collective ended; with `phase`, the rank is now in that phase (unannounced)."""
        name = None if phase is None else _encoded(phase)
        now = 0 if phase is None else _clock() // 1000
        with self._lock:
            q = self._q
            s = self._sequence + 1
            q[1] = s
            q[6] = 0
            if name is None:
                self._u32[17] = self._flags = self._flags & ~IN_COLLECTIVE
            else:
                self._u32[17] = self._flags = self._flags & ~(IN_COLLECTIVE | ANNOUNCED)
                q[4] = now
                self._bytes[72:104] = self._phase = name
            self._sequence = s = s + 1
            q[1] = s

    def current(self):
        """The phase now and whether it was announced: what lockstep.phase() restores."""
        return self._phase, bool(self._flags & ANNOUNCED)

    def restore(self, state):
        self._set_phase(*state)


def _native_record():
    """The Record of lockstep/_record.abi3.so (python/native/record.c: the same writes in C, a
    quarter of what the Python ones cost a step, docs/benchmarks.md), loaded alone from beside this
    file; None where it is not there or this Python does not take CPython 3.11's stable ABI (an
    older one, a free-threaded one), or with LOCKSTEP_RECORD_WRITER=python."""
    if os.environ.get("LOCKSTEP_RECORD_WRITER") == "python" or sys.version_info < (3, 11):
        return None
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_record.abi3.so")
    if not os.path.isfile(path):
        return None
    try:
        from importlib.machinery import EXTENSION_SUFFIXES, ExtensionFileLoader, ModuleSpec

        if ".abi3.so" not in EXTENSION_SUFFIXES:  # loaded by path, the import system's check is ours
            return None

        loader = ExtensionFileLoader("lockstep._record", path)
        spec = ModuleSpec("lockstep._record", loader, origin=path)
        module = loader.create_module(spec)
        loader.exec_module(module)
        return module.Record
    except Exception:  # the Python writes serve
        return None


_Record = _native_record() or _PythonRecord
NATIVE = _Record is not _PythonRecord  # which writes this process makes


class Writer(_Record):
    """This process's record (module docstring). Every method is cheap and never raises."""

    __slots__ = ("_map",)

    def __init__(self, mapped):
        if sys.byteorder != "little":
            raise ValueError("the record is little-endian, this machine is not")
        super().__init__(mapped)
        self._map = mapped

    @property
    def active(self):
        return self._map is not None

    def _claim(self, signal_number):
        self.claim(signal_number, os.getpid())

    def _forked(self):
        # The parent's record: a forked child writes to memory of its own, which nobody reads.
        self._map = None
        self.rebind(bytearray(BYTES))


_lock = threading.Lock()
_created = False
_writer = None      # this process's Writer while it owns the record, else None
_foreign = None     # (Writer, owner pid): the record another live process owns
_stacks_fd = None   # LOCKSTEP_STACKS, open for the life of the process
_stacks_signal = 0


def _alive(pid):
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _register_stacks():
    """faulthandler on the stack signal, appending every thread's stack to LOCKSTEP_STACKS (kept
    open for the life of the process). Returns the signal, or 0 (none, or it failed: said once)."""
    global _stacks_fd, _stacks_signal
    if _stacks_signal:
        return _stacks_signal
    path = os.environ.get("LOCKSTEP_STACKS", "")
    if not path:
        return 0
    fd = None
    try:
        import faulthandler
        import signal

        number = stack_signal()
        if signal.getsignal(number) not in (signal.SIG_DFL, None):
            raise ValueError("the program handles signal %d itself" % number)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC)
        faulthandler.register(number, file=fd, all_threads=True, chain=False)
    except Exception as e:
        if fd is not None:
            os.close(fd)
        _warn("no stacks on request (LOCKSTEP_STACKS=%s): %s" % (path, e))
        return 0
    _stacks_fd, _stacks_signal = fd, number
    return number


def _map(path):
    import mmap
    fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        size = os.fstat(fd).st_size
        if size < BYTES:
            raise ValueError("it is %d bytes, not %d" % (size, BYTES))
        return mmap.mmap(fd, BYTES, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)


def _create():
    global _created, _writer, _foreign
    _created = True
    path = os.environ.get("LOCKSTEP_PROGRESS", "")
    try:
        if not path:
            _register_stacks()
            return
        mapped = _map(path)
        magic, version = struct.unpack_from("<II", mapped, 0)
        if magic not in (0, MAGIC) or (magic == MAGIC and version != VERSION):
            raise ValueError("it is not a version %d progress record" % VERSION)
        w = Writer(mapped)
        owner = struct.unpack_from("<i", mapped, 104)[0]
        if magic == MAGIC and owner != os.getpid() and _alive(owner):
            _foreign = (w, owner)  # another process of this rank writes it (module docstring)
            return
        w._claim(_register_stacks())
        _writer = w
        os.register_at_fork(after_in_child=_forked)
    except Exception as e:  # the program goes on without a record
        _writer = _foreign = None
        _warn("no progress record (LOCKSTEP_PROGRESS=%s): %s" % (path, e))


def _forked():
    global _writer, _foreign
    if _writer is not None:
        _writer._forked()
    _writer = _foreign = None


def writer():
    """This process's record writer, or None (outside Lockstep, or another process owns it)."""
    if not _created:
        with _lock:
            if not _created:
                _create()
    return _writer


def install():
    """Creates the record and registers the stacks when the environment asks for them (the
    package's import and python/boot/sitecustomize.py call it). Never raises."""
    if not _created and ("LOCKSTEP_PROGRESS" in os.environ or "LOCKSTEP_STACKS" in os.environ):
        writer()


def stepping_writer():
    """writer(), for a process that reports steps: when the record is owned by a live process that
    never reported one (a launcher in Python), this process takes it over, once."""
    global _writer, _foreign
    w = writer()
    if w is not None or _foreign is None:
        return w
    with _lock:
        if _foreign is None:
            return _writer
        candidate, owner = _foreign
        _foreign = None
        try:
            flags, = struct.unpack_from("<I", candidate._map, 68)
            owner_now, = struct.unpack_from("<i", candidate._map, 104)
            if owner_now == owner and flags & REPORTS_STEPS and _alive(owner):
                return None  # it reports steps itself: this process is not the rank's trainer
            candidate.__init__(candidate._map)  # its values as they are now
            candidate._claim(_register_stacks())
            os.register_at_fork(after_in_child=_forked)
            _writer = candidate
        except Exception as e:
            _warn("no progress record: %s" % e)
        return _writer

