"""The report channel through liblockstep-reporter (lockstep/reporter.h), for Pythons without
python3-zmq and python3-protobuf (a virtual environment, another Python version). It sends the
same StreamMessages over the same code as lockstep-trainer; the library reads the rank's
environment itself."""

import ctypes
import ctypes.util
import math
import os

from lockstep._bursts import _Bursts

_UNKNOWN = -1
_U32, _U64 = 2**32 - 1, 2**64 - 1
_FIELDS = ("data_time_us", "compute_time_us", "exposed_comm_time_us", "allreduce_time_us", "bytes_reduced", "tokens")


class _StepInfo(ctypes.Structure):
    _fields_ = [("step", ctypes.c_uint64), ("epoch", ctypes.c_uint32), ("samples", ctypes.c_uint32),
                ("loss", ctypes.c_double), ("global_loss", ctypes.c_double), ("lr", ctypes.c_double),
                ("tokens", ctypes.c_int64), ("data_time_us", ctypes.c_int64), ("compute_time_us", ctypes.c_int64),
                ("exposed_comm_time_us", ctypes.c_int64), ("allreduce_time_us", ctypes.c_int64),
                ("bytes_reduced", ctypes.c_int64), ("step_time_us", ctypes.c_int64), ("time_unix_us", ctypes.c_int64)]


def _library():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("LOCKSTEP_REPORTER_LIB", ""),
                  os.path.join(here, "..", "..", "lib", "liblockstep-reporter.so.0"),  # the build tree
                  ctypes.util.find_library("lockstep-reporter") or "", "liblockstep-reporter.so.0"]
    last = None
    for path in candidates:
        if not path:
            continue
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            last = e
            continue
        lib.lockstep_open.restype = ctypes.c_void_p
        lib.lockstep_active.argtypes = [ctypes.c_void_p]
        lib.lockstep_report.argtypes = [ctypes.c_void_p, ctypes.POINTER(_StepInfo)]
        lib.lockstep_report_phase.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_int64, ctypes.c_int64]
        lib.lockstep_dropped.argtypes = [ctypes.c_void_p]
        lib.lockstep_dropped.restype = ctypes.c_uint64
        lib.lockstep_close.argtypes = [ctypes.c_void_p]
        if hasattr(lib, "lockstep_collective_timed"):  # a library older than issue 42 has none
            lib.lockstep_collective_timed.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint64, ctypes.c_int64,
                                                      ctypes.c_int64, ctypes.c_int64]
            lib.lockstep_collective_totals.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32, ctypes.c_int64,
                                                       ctypes.c_int64, ctypes.c_uint64]
        if hasattr(lib, "lockstep_step_flops"):  # a library older than issue 46 has none
            lib.lockstep_step_flops.argtypes = [ctypes.c_void_p, ctypes.c_double, ctypes.c_int, ctypes.c_int]
        return lib
    raise ImportError("liblockstep-reporter is not found (%s)" % last)


def _clamp(value, top):
    return min(max(int(value), 0), top)


def _pass_collectives(lib, handle, fields):
    """The step's collectives (the fields' "collectives" by kind and "collective_spans" one by one)
    to the library before its report: each span, then what each kind's totals hold beyond the spans
    the library took. Their exposed time is already in the fields' exposed_comm_time_us, which the
    library keeps: it is not added twice."""
    left = {}
    for c in fields.get("collectives") or ():
        left[int(c["kind"])] = [int(c.get("count", 0)), int(c.get("time_us", 0)), int(c.get("exposed_us", 0)),
                                int(c.get("bytes", 0))]
    for s in fields.get("collective_spans") or ():
        kind, duration_us, exposed_us = int(s["kind"]), int(s["duration_us"]), int(s.get("exposed_us", 0))
        nbytes = _clamp(s.get("bytes", 0), _U64)
        taken = lib.lockstep_collective_timed(handle, kind, nbytes, int(s.get("start_unix_us", _UNKNOWN)), duration_us,
                                              exposed_us) == 0
        if taken and kind in left:
            left[kind] = [total - part for total, part in zip(left[kind], (1, duration_us, exposed_us, nbytes))]
    for kind, (count, time_us, exposed_us, nbytes) in left.items():
        if count > 0:
            lib.lockstep_collective_totals(handle, kind, _clamp(count, _U32), max(time_us, 0), max(exposed_us, 0),
                                           _clamp(nbytes, _U64))


class NativeReporter(_Bursts):
    """The C API under _Bursts: the same reports, through lockstep-trainer's report code."""

    def __init__(self):
        self._lib = _library()
        self._handle = self._lib.lockstep_open()
        self._collectives = hasattr(self._lib, "lockstep_collective_totals")
        self._flops = hasattr(self._lib, "lockstep_step_flops")
        if not self._handle or not self._lib.lockstep_active(self._handle):
            raise ImportError("liblockstep-reporter does not report from this environment")
        super().__init__()

    @property
    def dropped(self):
        return super().dropped + (self._lib.lockstep_dropped(self._handle) if self._handle else 0)

    def _deliver(self, held):
        for kind, fields in held:
            if kind == "phase":
                if self._lib.lockstep_report_phase(self._handle, fields["name"].encode("utf-8"), fields["time_unix_us"],
                                                   fields["duration_us"]) == -1:
                    self.count_drop()
                continue
            info = _StepInfo(step=fields["step"], epoch=fields.get("epoch", 0), samples=fields["samples"],
                             loss=fields.get("loss", math.nan), global_loss=math.nan, lr=fields.get("lr", 0.0),
                             step_time_us=fields["step_time_us"], time_unix_us=fields["time_unix_us"])
            for name in _FIELDS:
                setattr(info, name, fields.get(name, _UNKNOWN))
            if self._collectives:
                try:
                    _pass_collectives(self._lib, self._handle, fields)
                except (KeyError, TypeError, ValueError):
                    pass  # a malformed entry costs the step its collectives, never the report
            if self._flops and ("flops" in fields or "precision" in fields):
                self._lib.lockstep_step_flops(self._handle, fields.get("flops", _UNKNOWN), fields.get("flops_basis", 0),
                                              fields.get("precision", 0))
            if self._lib.lockstep_report(self._handle, ctypes.byref(info)) == -1:
                self.count_drop()  # malformed: the library said why on stderr

    def close(self):
        super().close()
        with self._flushing:
            handle, self._handle = self._handle, None
            self._lib.lockstep_close(handle)
