// lockstep._record: a rank's progress record written in C (python/lockstep/_progress.py is the
// owner of the record, its layout and its semantics; this is its Record, the writes alone).
//
// Why C: what a step pays for the record is its write path's first touch after the step's compute
// (docs/benchmarks.md, "Stalls: detection time and what the progress record costs"): the Python
// writes touch their bytecode, a lock, three memoryviews and the mapping, about 10 us at each of
// a step's five moments; these touch a few cache lines of this code and the record's.
//
// Every method runs holding the GIL and gives it up nowhere, so two threads' updates never
// interleave: the GIL is this writer's lock (Python's writer takes a lock of its own). The stable
// ABI of CPython 3.11, so that one build loads in any later CPython (not a free-threaded one,
// which the package's Python writer serves).

#define Py_LIMITED_API 0x030B0000
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

enum { kAnnounced = 1, kInCollective = 2, kReportsSteps = 4 };
enum { kPhaseAt = 72, kPhaseBytes = 32, kRecordBytes = 128 };
static const uint32_t kMagic = 0x5250534C, kVersion = 1;

typedef struct {
  PyObject_HEAD
  Py_buffer view;  // the mapping (or, in a forked child, a buffer of its own)
  int viewing;
  int64_t sequence, collectives;
  uint32_t flags;
  unsigned char phase[kPhaseBytes];  // the phase now, as stored
} Record;

// The record's 8-byte fields by offset / 8, its 4-byte ones by offset / 4 (_progress.py's layout).
static int64_t* q(Record* r, int index) { return (int64_t*)r->view.buf + index; }
static uint32_t* u32(Record* r, int index) { return (uint32_t*)r->view.buf + index; }

static int64_t unixMicros(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (int64_t)t.tv_sec * 1000000 + t.tv_nsec / 1000;
}

// A seqlock, as lockstep::progress::Writer's: the sequence odd while the fields change.
static void opened(Record* r) {
  __atomic_store_n(q(r, 1), ++r->sequence, __ATOMIC_RELAXED);
  __atomic_thread_fence(__ATOMIC_RELEASE);
}
static void closed(Record* r) {
  u32(r, 17)[0] = r->flags;
  __atomic_store_n(q(r, 1), ++r->sequence, __ATOMIC_RELEASE);
}
static void storePhase(Record* r, const unsigned char name[kPhaseBytes]) {
  memcpy((unsigned char*)r->view.buf + kPhaseAt, name, kPhaseBytes);
  memcpy(r->phase, name, kPhaseBytes);
}

// A phase name as the record holds it: str(name) in at most 31 bytes of ASCII (a character outside
// it is '?', as str.encode("ascii", "replace") makes it), NUL-padded.
static int encodePhase(PyObject* name, unsigned char out[kPhaseBytes]) {
  PyObject* text = PyUnicode_CheckExact(name) ? (Py_INCREF(name), name) : PyObject_Str(name);
  if (text == NULL) return -1;
  int k = 0;
  Py_ssize_t n = 0;
  const char* s = PyUnicode_AsUTF8AndSize(text, &n);
  if (s != NULL) {
    for (Py_ssize_t i = 0; i < n && k < kPhaseBytes - 1; ++i) {
      const unsigned char c = (unsigned char)s[i];
      if (c < 0x80) {
        out[k++] = c;
      } else if ((c & 0xC0) != 0x80) {  // a character's first byte
        out[k++] = '?';
      }
    }
  } else {  // a lone surrogate (os.fsdecode's of an undecodable byte) has no UTF-8: Python's way
    if (!PyErr_ExceptionMatches(PyExc_UnicodeEncodeError)) {
      Py_DECREF(text);
      return -1;
    }
    PyErr_Clear();
    PyObject* ascii = PyUnicode_AsEncodedString(text, "ascii", "replace");
    if (ascii == NULL) {
      Py_DECREF(text);
      return -1;
    }
    const Py_ssize_t length = PyBytes_Size(ascii);
    const char* bytes = PyBytes_AsString(ascii);
    for (; k < length && k < kPhaseBytes - 1; ++k) out[k] = (unsigned char)bytes[k];
    Py_DECREF(ascii);
  }
  memset(out + k, 0, kPhaseBytes - k);
  Py_DECREF(text);  // s lived in it
  return 0;
}

// Whether the record is there to write: a Record made without __init__ (copy.copy) has none.
static int ready(Record* r) {
  if (r->viewing) return 1;
  PyErr_SetString(PyExc_ValueError, "a Record without its buffer");
  return 0;
}

// Argument `name` at position `at` or by keyword; NULL where not given.
static PyObject* argument(PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames, Py_ssize_t at, const char* name) {
  if (at < nargs) return args[at];
  const Py_ssize_t given = kwnames ? PyTuple_Size(kwnames) : 0;
  for (Py_ssize_t i = 0; i < given; ++i) {
    if (PyUnicode_CompareWithASCIIString(PyTuple_GetItem(kwnames, i), name) == 0) return args[nargs + i];
  }
  return NULL;
}

// A named phase (not None) into `out`: 1; none: 0; a bad one: -1 with the exception set.
static int optionalPhase(PyObject* phase, unsigned char out[kPhaseBytes]) {
  if (phase == NULL || phase == Py_None) return 0;
  return encodePhase(phase, out) < 0 ? -1 : 1;
}

static uint32_t low32(PyObject* value) { return value ? (uint32_t)PyLong_AsUnsignedLongLongMask(value) : 0; }

static int Record_init(Record* self, PyObject* args, PyObject* kwargs) {
  PyObject* buffer = NULL;
  if (!PyArg_ParseTuple(args, "O", &buffer)) return -1;
  Py_buffer view;
  if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return -1;
  if (view.len < kRecordBytes) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "a progress record is 128 bytes");
    return -1;
  }
  if (self->viewing) PyBuffer_Release(&self->view);
  self->view = view;
  self->viewing = 1;
  self->sequence = *q(self, 1) + (*q(self, 1) & 1);
  self->collectives = *q(self, 5);
  self->flags = *u32(self, 17);
  memcpy(self->phase, (unsigned char*)view.buf + kPhaseAt, kPhaseBytes);
  return 0;
}

static void Record_dealloc(Record* self) {
  PyTypeObject* type = Py_TYPE((PyObject*)self);
  if (self->viewing) PyBuffer_Release(&self->view);
  freefunc free = (freefunc)PyType_GetSlot(type, Py_tp_free);
  free(self);
  Py_DECREF(type);
}

// rebind(buffer): writes go to `buffer` from now on, the state kept (a forked child's own memory).
static PyObject* Record_rebind(Record* self, PyObject* buffer) {
  Py_buffer view;
  if (PyObject_GetBuffer(buffer, &view, PyBUF_WRITABLE | PyBUF_C_CONTIGUOUS) < 0) return NULL;
  if (view.len < kRecordBytes) {
    PyBuffer_Release(&view);
    PyErr_SetString(PyExc_ValueError, "a progress record is 128 bytes");
    return NULL;
  }
  if (self->viewing) PyBuffer_Release(&self->view);
  self->view = view;
  self->viewing = 1;
  Py_RETURN_NONE;
}

// claim(signal, pid): the record made this process's, as lockstep::progress::Writer's constructor does.
static PyObject* Record_claim(Record* r, PyObject* args) {
  unsigned int signal = 0;
  int pid = 0;
  if (!ready(r) || !PyArg_ParseTuple(args, "Ii", &signal, &pid)) return NULL;
  static const unsigned char kStartUp[kPhaseBytes] = "start-up";
  const int64_t now = unixMicros();
  opened(r);
  *u32(r, 0) = kMagic;
  *u32(r, 1) = kVersion;
  *u32(r, 16) = signal;
  *(int32_t*)u32(r, 26) = pid;
  *q(r, 3) = *q(r, 4) = now;
  storePhase(r, kStartUp);
  closed(r);
  Py_RETURN_NONE;
}

// step_done(step, phase=""): a step completed; the next one begins now, in `phase`.
static PyObject* Record_step_done(Record* r, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* step = argument(args, nargs, kwnames, 0, "step");
  PyObject* phase = argument(args, nargs, kwnames, 1, "phase");
  unsigned char name[kPhaseBytes] = {0};
  if (!ready(r)) return NULL;
  if (step == NULL) {
    PyErr_SetString(PyExc_TypeError, "step_done() needs the step");
    return NULL;
  }
  int overflow = 0;
  const long long number = PyLong_AsLongLongAndOverflow(step, &overflow);
  if (overflow != 0) Py_RETURN_NONE;  // beyond 64 bits: not recorded, as the Python writer does
  if (number == -1 && PyErr_Occurred()) return NULL;
  if (phase != NULL && encodePhase(phase, name) < 0) return NULL;  // None too: "None", as str(None)
  const int64_t now = unixMicros();
  opened(r);
  *q(r, 2) = number;
  *q(r, 3) = *q(r, 4) = now;
  r->flags = (r->flags | kReportsSteps) & ~kAnnounced;
  storePhase(r, name);
  closed(r);
  Py_RETURN_NONE;
}

static void setPhase(Record* r, const unsigned char name[kPhaseBytes], int announced) {
  const int64_t now = unixMicros();
  opened(r);
  *q(r, 4) = now;
  r->flags = announced ? (r->flags | kAnnounced) : (r->flags & ~kAnnounced);
  storePhase(r, name);
  closed(r);
}

// phase(name, announced=False): the rank is now in phase `name`.
static PyObject* Record_phase(Record* r, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  PyObject* name = argument(args, nargs, kwnames, 0, "name");
  PyObject* announced = argument(args, nargs, kwnames, 1, "announced");
  unsigned char encoded[kPhaseBytes];
  if (!ready(r)) return NULL;
  if (name == NULL) {
    PyErr_SetString(PyExc_TypeError, "phase() needs the phase's name");
    return NULL;
  }
  if (encodePhase(name, encoded) < 0) return NULL;
  const int truth = announced ? PyObject_IsTrue(announced) : 0;
  if (truth < 0) return NULL;
  setPhase(r, encoded, truth);
  Py_RETURN_NONE;
}

// collective_begin(bucket=0, buckets=0, phase=None, kind=0): the rank entered a collective.
static PyObject* Record_collective_begin(Record* r, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  if (!ready(r)) return NULL;
  const uint32_t bucket = low32(argument(args, nargs, kwnames, 0, "bucket"));
  if (PyErr_Occurred()) return NULL;
  const uint32_t buckets = low32(argument(args, nargs, kwnames, 1, "buckets"));
  if (PyErr_Occurred()) return NULL;
  const uint32_t kind = low32(argument(args, nargs, kwnames, 3, "kind"));
  if (PyErr_Occurred()) return NULL;
  unsigned char name[kPhaseBytes];
  const int named = optionalPhase(argument(args, nargs, kwnames, 2, "phase"), name);
  if (named < 0) return NULL;
  const int64_t now = unixMicros();
  opened(r);
  r->collectives = (r->collectives + 1) & INT64_MAX;
  *q(r, 5) = r->collectives;
  *q(r, 6) = now;
  *u32(r, 14) = bucket;
  *u32(r, 15) = buckets;
  *u32(r, 27) = kind;
  r->flags |= kInCollective;
  if (named) {
    r->flags &= ~kAnnounced;
    *q(r, 4) = now;
    storePhase(r, name);
  }
  closed(r);
  Py_RETURN_NONE;
}

// collective_end(phase=None): the collective ended; with `phase`, the rank is now in it.
static PyObject* Record_collective_end(Record* r, PyObject* const* args, Py_ssize_t nargs, PyObject* kwnames) {
  unsigned char name[kPhaseBytes];
  if (!ready(r)) return NULL;
  const int named = optionalPhase(argument(args, nargs, kwnames, 0, "phase"), name);
  if (named < 0) return NULL;
  const int64_t now = named ? unixMicros() : 0;
  opened(r);
  *q(r, 6) = 0;
  r->flags &= ~kInCollective;
  if (named) {
    r->flags &= ~kAnnounced;
    *q(r, 4) = now;
    storePhase(r, name);
  }
  closed(r);
  Py_RETURN_NONE;
}

// current(): the phase now (its 32 stored bytes) and whether it was announced.
static PyObject* Record_current(Record* r, PyObject* unused) {
  if (!ready(r)) return NULL;
  return Py_BuildValue("(y#O)", (const char*)r->phase, (Py_ssize_t)kPhaseBytes,
                       (r->flags & kAnnounced) ? Py_True : Py_False);
}

// restore(state): back to a phase current() gave.
static PyObject* Record_restore(Record* r, PyObject* state) {
  const char* bytes = NULL;
  Py_ssize_t length = 0;
  int announced = 0;
  if (!ready(r) || !PyArg_ParseTuple(state, "y#p", &bytes, &length, &announced)) return NULL;
  if (length != kPhaseBytes) {
    PyErr_SetString(PyExc_ValueError, "restore() takes what current() gave");
    return NULL;
  }
  setPhase(r, (const unsigned char*)bytes, announced);
  Py_RETURN_NONE;
}

#define FAST(f) (PyCFunction)(void (*)(void))(f), METH_FASTCALL | METH_KEYWORDS
static PyMethodDef kMethods[] = {
    {"step_done", FAST(Record_step_done), "A step completed: the next one begins now, in `phase`."},
    {"phase", FAST(Record_phase), "The rank is now in phase `name` (announced: one the program named)."},
    {"collective_begin", FAST(Record_collective_begin), "The rank entered a collective."},
    {"collective_end", FAST(Record_collective_end), "The collective ended; with `phase`, the rank is now in it."},
    {"current", (PyCFunction)Record_current, METH_NOARGS, "The phase now and whether it was announced."},
    {"restore", (PyCFunction)Record_restore, METH_O, "Back to a phase current() gave."},
    {"claim", (PyCFunction)Record_claim, METH_VARARGS, "claim(signal, pid): the record made this process's."},
    {"rebind", (PyCFunction)Record_rebind, METH_O, "Writes go to another buffer from now on."},
    {NULL, NULL, 0, NULL},
};

static PyType_Slot kSlots[] = {
    {Py_tp_init, Record_init},
    {Py_tp_dealloc, Record_dealloc},
    {Py_tp_methods, kMethods},
    {Py_tp_doc, "A rank's progress record, written in C (lockstep/_progress.py)."},
    {0, NULL},
};

static PyType_Spec kSpec = {"lockstep._record.Record", sizeof(Record), 0, Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
                            kSlots};

static int exec(PyObject* module) {
  PyObject* type = PyType_FromSpec(&kSpec);
  if (type == NULL) return -1;
  if (PyModule_AddObject(module, "Record", type) < 0) {
    Py_DECREF(type);
    return -1;
  }
  return 0;
}

static PyModuleDef_Slot kModuleSlots[] = {{Py_mod_exec, exec}, {0, NULL}};
static struct PyModuleDef kModule = {PyModuleDef_HEAD_INIT, "_record", NULL, 0, NULL, kModuleSlots, NULL, NULL, NULL};

PyMODINIT_FUNC PyInit__record(void) { return PyModuleDef_Init(&kModule); }
