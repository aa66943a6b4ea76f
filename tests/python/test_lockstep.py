"""Issue 13: the lockstep Python package against a real ZeroMQ socket, real PyTorch and Gloo.
Issue 32: the progress record it keeps, lockstep.phase(), and the stacks of an unmodified script.

Each case runs a small program in its own process (the package keeps one reporter per process)
and reads what it sent on a PULL socket bound here, decoded with the package's own protobuf module.
Run with the build tree's python/ on PYTHONPATH (ctest does).
"""

import os
import signal
import struct
import subprocess
import sys
import tempfile
import textwrap
import time
import unittest

import zmq
from lockstep.v1 import lockstep_pb2

PYTHON = "/usr/bin/python3"


def run(program, env=None, timeout=60):
    full = dict(os.environ)
    for name in ("LOCKSTEP_REPORT", "LOCKSTEP_JOB_ID", "RANK", "WORLD_SIZE", "LOCKSTEP_ATTEMPT", "LOCKSTEP_PROGRESS",
                 "LOCKSTEP_STACKS", "LOCKSTEP_PYTHON_TRANSPORT"):
        full.pop(name, None)
    full.update(env or {})
    return subprocess.run([PYTHON, "-c", textwrap.dedent(program)], env=full, capture_output=True, text=True,
                          timeout=timeout)


# The start of the programs that time a DDP step: a one-rank Gloo process group (on a free port),
# and a layer whose evaluations (forwards without autograd) take 0.2 s.
DDP_PRELUDE = """
import threading, time, torch, torch.distributed as dist, lockstep
from torch.nn.parallel import DistributedDataParallel
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)


class Slow(torch.nn.Linear):
    def forward(self, x):
        if not torch.is_grad_enabled():
            time.sleep(0.2)
        return super().forward(x)
"""


def ddp_program(body):
    """DDP_PRELUDE, then `body` (as indented in the test)."""
    return DDP_PRELUDE % _free_port() + textwrap.dedent(body)


class Receiver:
    def __init__(self):
        self.dir = tempfile.TemporaryDirectory()
        self.endpoint = "ipc://" + os.path.join(self.dir.name, "report.sock")
        self.context = zmq.Context()
        self.socket = self.context.socket(zmq.PULL)
        self.socket.bind(self.endpoint)

    def env(self, rank=0, world=1):
        return {"LOCKSTEP_REPORT": self.endpoint, "LOCKSTEP_JOB_ID": "py-test", "RANK": str(rank),
                "WORLD_SIZE": str(world), "LOCKSTEP_ATTEMPT": "2"}

    def messages(self, count, timeout_s=10):
        out, deadline = [], time.time() + timeout_s
        while len(out) < count and time.time() < deadline:
            if self.socket.poll(100):
                m = lockstep_pb2.StreamMessage()
                m.ParseFromString(self.socket.recv())
                out.append(m)
        return out

    def close(self):
        self.socket.close(0)
        self.context.term()
        self.dir.cleanup()


class OutsideLockstep(unittest.TestCase):
    def test_watch_and_step_are_no_ops(self):
        r = run("""
            import time, torch, lockstep
            model = torch.nn.Linear(4, 2)
            assert lockstep.watch(model) is model
            assert not lockstep.active()
            began = time.perf_counter()
            for i in range(10000):
                lockstep.step(samples=8, loss=0.5)
            print("%.1f us per call" % ((time.perf_counter() - began) / 10000 * 1e6))
            assert lockstep.dropped() == 0
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertLess(float(r.stdout.split()[0]), 100.0, r.stdout)  # a no-op, even on a busy machine


class ShouldStop(unittest.TestCase):
    """Issue 43: an alert's checkpoint,stop asks the program through lockstep.should_stop()."""

    def run_program(self, code):
        env = dict(os.environ)
        return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                              timeout=60)

    def test_a_program_that_asks_notes_sigterm_and_goes_on(self):
        r = self.run_program("""
            import os, signal, time, lockstep
            print(lockstep.should_stop(), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            print(lockstep.should_stop(), flush=True)
            os.kill(os.getpid(), signal.SIGTERM)  # asked again: still noted, the grace's SIGKILL ends it
            time.sleep(0.2)
            print("still here", flush=True)
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["False", "True", "still", "here"])

    def test_a_program_that_never_asks_is_stopped_by_sigterm_as_before(self):
        r = self.run_program("""
            import os, signal, time, lockstep
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
            print("still here", flush=True)
        """)
        self.assertEqual(r.returncode, -signal.SIGTERM)
        self.assertEqual(r.stdout, "")

    def test_the_programs_own_handler_still_runs(self):
        r = self.run_program("""
            import os, signal, time, lockstep
            signal.signal(signal.SIGTERM, lambda *_: print("own handler", flush=True))
            lockstep.should_stop()
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
            print(lockstep.should_stop(), flush=True)
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split("\n")[:2], ["own handler", "True"])


class Reporting(unittest.TestCase):
    def setUp(self):
        self.receiver = Receiver()

    def tearDown(self):
        self.receiver.close()

    def test_steps_without_watch_carry_no_split(self):
        r = run("""
            import lockstep
            for i in range(3):
                lockstep.step(samples=8, loss=0.5 - 0.1 * i, tokens=64, lr=0.1, epoch=1)
            lockstep.step(samples=8)  # no loss: NaN, unknown
        """, self.receiver.env(rank=1, world=2))
        self.assertEqual(r.returncode, 0, r.stderr)
        got = self.receiver.messages(4)
        self.assertEqual([m.seq for m in got], [1, 2, 3, 4])
        reports = [m.step_report for m in got]
        self.assertEqual([s.step for s in reports], [1, 2, 3, 4])
        first = reports[0]
        self.assertEqual((first.job_id, first.rank, first.world_size, first.attempt), ("py-test", 1, 2, 2))
        self.assertEqual((first.samples, first.tokens, first.epoch), (8, 64, 1))
        self.assertAlmostEqual(first.loss, 0.5, places=6)
        self.assertAlmostEqual(first.lr, 0.1)
        for field in ("data_time_us", "compute_time_us", "exposed_comm_time_us", "allreduce_time_us", "bytes_reduced"):
            self.assertFalse(first.HasField(field), field)  # unknown, not 0
        self.assertFalse(reports[3].HasField("tokens"))
        self.assertNotEqual(reports[3].loss, reports[3].loss)  # NaN
        self.assertGreater(first.time_unix_us, 0)

    def test_without_pyzmq_reports_go_through_liblockstep_reporter(self):
        # A Python without python3-zmq and python3-protobuf (a venv) reports through the C library.
        r = run("""
            import lockstep, lockstep._report
            for i in range(3):
                lockstep.step(samples=8, loss=0.25, tokens=80, lr=0.5)
            print(type(lockstep._report.reporter()).__name__)
        """, dict(self.receiver.env(rank=1, world=2), LOCKSTEP_PYTHON_TRANSPORT="native"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.strip(), "NativeReporter")
        reports = [m.step_report for m in self.receiver.messages(3)]
        self.assertEqual([s.step for s in reports], [1, 2, 3])
        first = reports[0]
        self.assertEqual((first.job_id, first.rank, first.world_size, first.attempt), ("py-test", 1, 2, 2))
        self.assertEqual((first.samples, first.tokens), (8, 80))
        self.assertAlmostEqual(first.loss, 0.25)
        self.assertFalse(first.HasField("compute_time_us"))
        self.assertLess(abs(first.time_unix_us - time.time_ns() // 1000), 60 * 10**6)

    def test_watch_times_a_ddp_step_with_gloo(self):
        r = run(ddp_program("""
            model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Linear(64, 3)))
            lockstep.watch(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for i in range(5):
                x = torch.randn(32, 16)
                loss = model(x).square().mean()
                opt.zero_grad(); loss.backward(); opt.step()
                lockstep.step(samples=32, loss=loss)
            dist.destroy_process_group()
        """), self.receiver.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        reports = [m.step_report for m in self.receiver.messages(5)]
        self.assertEqual(len(reports), 5)
        for s in reports:
            for field in ("data_time_us", "compute_time_us", "exposed_comm_time_us", "bytes_reduced"):
                self.assertTrue(s.HasField(field), field)
            # On CPUs DDP's own all-reduce is left alone: its total (hidden) time is not known.
            self.assertFalse(s.HasField("allreduce_time_us"))
            self.assertEqual(s.data_time_us + s.compute_time_us + s.exposed_comm_time_us, s.step_time_us)
            self.assertEqual(s.bytes_reduced, (16 * 64 + 64 + 64 * 3 + 3) * 4)
            self.assertGreater(s.compute_time_us, 0)

    def test_no_sync_steps_reduce_nothing_and_an_evaluation_is_not_a_step(self):
        r = run(ddp_program("""
            # Slow: its evaluations take 0.2 s (DDP_PRELUDE)
            model = DistributedDataParallel(Slow(8, 2))
            lockstep.watch(model)
            x = torch.randn(4, 8)
            with model.no_sync():
                model(x).sum().backward()
            lockstep.step(samples=4)          # accumulated only: nothing all-reduced
            with torch.no_grad():
                model(x)                      # an evaluation: not where the next step began,
            model(x).sum().backward()         # nor time spent waiting for data
            lockstep.step(samples=4)
            dist.destroy_process_group()
        """), self.receiver.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        first, second = [m.step_report for m in self.receiver.messages(2)]
        self.assertEqual(first.bytes_reduced, 0)
        self.assertLess(first.exposed_comm_time_us, 1000)  # microseconds of bookkeeping, no waiting
        self.assertEqual(second.bytes_reduced, (8 * 2 + 2) * 4)
        self.assertLess(second.data_time_us, 100000)  # the 0.2 s went to the evaluation
        self.assertGreaterEqual(second.step_time_us, 200000)

    def test_a_phase_is_reported_when_it_ends_through_either_transport(self):
        # Issue 35: the timeline draws each phase a program names as a box of its own.
        program = """
            import time, lockstep
            lockstep.step(samples=8)
            lockstep.step(samples=8)
            with lockstep.phase("checkpoint"):
                time.sleep(0.2)
            with lockstep.phase("eval"):
                with lockstep.phase("eval/bleu"):
                    time.sleep(0.05)
            with lockstep.phase("line\\nbreak " + "\u00e9" * 40):
                pass
            lockstep.step(samples=8)
        """
        for transport in ("zmq", "native"):
            with self.subTest(transport=transport):
                before = time.time_ns() // 1000
                r = run(program, dict(self.receiver.env(rank=1, world=2), LOCKSTEP_PYTHON_TRANSPORT=transport))
                self.assertEqual(r.returncode, 0, r.stderr)
                got = self.receiver.messages(7)
                kinds = [m.WhichOneof("payload") for m in got]
                self.assertEqual(kinds, ["step_report"] * 2 + ["phase_report"] * 4 + ["step_report"], kinds)
                checkpoint, inner, outer, odd = [m.phase_report for m in got[2:6]]
                self.assertEqual((checkpoint.job_id, checkpoint.rank, checkpoint.world_size, checkpoint.attempt),
                                 ("py-test", 1, 2, 2))
                self.assertEqual((checkpoint.name, checkpoint.step), ("checkpoint", 2))
                self.assertGreaterEqual(checkpoint.duration_us, 200000)
                self.assertLess(checkpoint.duration_us, 5 * 10**6)
                self.assertGreater(checkpoint.time_unix_us, before + 200000)
                self.assertEqual([inner.name, outer.name], ["eval/bleu", "eval"])  # the inner one ends first
                self.assertGreaterEqual(outer.duration_us, inner.duration_us)
                self.assertLessEqual(outer.time_unix_us - outer.duration_us, inner.time_unix_us - inner.duration_us)
                # No control character, and at most 64 bytes of whole UTF-8 characters.
                self.assertTrue(odd.name.startswith("line break \u00e9"), odd.name)
                self.assertLessEqual(len(odd.name.encode("utf-8")), 64)
                self.assertEqual(len(odd.name.encode("utf-8")), 11 + 2 * 26)

    def test_the_c_library_refuses_a_phase_it_cannot_send_and_says_why(self):
        r = run("""
            import ctypes, lockstep._report
            native = lockstep._report.reporter()
            lib, handle = native._lib, native._handle
            print(lib.lockstep_report_phase(handle, b"ok", -1, 5),
                  lib.lockstep_report_phase(handle, b"\\xff\\xfe", -1, 5),
                  lib.lockstep_report_phase(handle, b"", -1, 5),
                  lib.lockstep_report_phase(handle, b"eval", -1, -3),
                  lib.lockstep_report_phase(handle, b"eval", 1700000000000000000, 5))
        """, dict(self.receiver.env(), LOCKSTEP_PYTHON_TRANSPORT="native"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["0", "-1", "-1", "-1", "-1"], r.stderr)
        for why in ("name is not UTF-8", "name is required", "duration is negative",
                    "time 1700000000000000000 is not microseconds since 1970"):
            self.assertIn("phase not reported: phase report " + why, r.stderr)
        self.assertEqual([m.phase_report.name for m in self.receiver.messages(1)], ["ok"])

    def test_a_phase_reported_through_the_c_library_is_not_the_next_steps_time(self):
        r = run("""
            import ctypes, time, lockstep._native as native, lockstep._report
            rep = lockstep._report.reporter()
            lib, handle = rep._lib, rep._handle
            info = native._StepInfo()
            lib.lockstep_step_init.argtypes = [ctypes.POINTER(native._StepInfo)]
            lib.lockstep_step_init(ctypes.byref(info)); info.samples = 8
            lib.lockstep_report(handle, ctypes.byref(info))          # step 1
            began = time.perf_counter(); time.sleep(0.3)
            lib.lockstep_report_phase(handle, b"checkpoint", -1, int((time.perf_counter() - began) * 1e6))
            time.sleep(0.05)
            lib.lockstep_step_init(ctypes.byref(info)); info.samples = 8
            lib.lockstep_report(handle, ctypes.byref(info))          # step 2: 0.05 s, not 0.35 s
        """, dict(self.receiver.env(), LOCKSTEP_PYTHON_TRANSPORT="native"))
        self.assertEqual(r.returncode, 0, r.stderr)
        got = self.receiver.messages(3)
        self.assertEqual([m.WhichOneof("payload") for m in got], ["step_report", "phase_report", "step_report"])
        second = got[2].step_report
        self.assertGreaterEqual(second.step_time_us, 50000)
        self.assertLess(second.step_time_us, 250000, "the 0.3 s checkpoint is the phase's, not the step's")

    def test_the_native_transport_passes_a_steps_collectives_through_the_c_library(self):
        # Issue 42: the fields' collectives by kind and one by one reach the agent as the zmq
        # transport sends them: the spans through lockstep_collective_timed, the rest of each kind's
        # totals through lockstep_collective_totals, and the exposed time the fields hold, not twice.
        r = run("""
            import time, lockstep._native as native
            rep = native.NativeReporter()
            now = time.time_ns() // 1000
            spans = [dict(kind=1, start_unix_us=1700000000000000 + i, duration_us=100, exposed_us=40, bytes=4096)
                     for i in range(64)]
            totals = [dict(kind=1, count=70, time_us=7600, exposed_us=2800, bytes=70 * 4096),
                      dict(kind=3, count=2, time_us=900, exposed_us=0, bytes=2 << 20)]
            step = dict(samples=8, step_time_us=50000, time_unix_us=now)
            rep.send(dict(step, step=1, exposed_comm_time_us=3000, collectives=totals, collective_spans=spans))
            rep.send(dict(step, step=2))
            rep.send(dict(step, step=3, collectives=[dict(kind=42, count=1, time_us=5, exposed_us=5, bytes=8)]))
            rep.flush()
            rep.close()
        """, dict(self.receiver.env(), LOCKSTEP_PYTHON_TRANSPORT="native"))
        self.assertEqual(r.returncode, 0, r.stderr)
        first, second, third = [m.step_report for m in self.receiver.messages(3)]
        self.assertEqual([(c.kind, c.count, c.time_us, c.exposed_us, c.bytes) for c in first.collectives],
                         [(1, 70, 7600, 2800, 70 * 4096), (3, 2, 900, 0, 2 << 20)])
        self.assertEqual([(s.kind, s.start_unix_us, s.duration_us, s.exposed_us, s.bytes) for s in first.collective_spans],
                         [(1, 1700000000000000 + i, 100, 40, 4096) for i in range(64)])
        self.assertEqual(first.exposed_comm_time_us, 3000)
        self.assertEqual((len(second.collectives), len(second.collective_spans)), (0, 0))
        self.assertFalse(second.HasField("exposed_comm_time_us"))
        self.assertEqual(third.step, 3, "a kind the library does not know costs the collective, not the step")
        self.assertEqual(len(third.collectives), 0)
        self.assertIn("lockstep: collective not counted: collective kind 42 is unknown", r.stderr)

    def test_a_phase_and_an_evaluation_on_another_thread_leave_the_loops_split_alone(self):
        # An async checkpoint beside the training loop ran beside it: the loop's own time, here
        # 0.1 s after the optimizer's step, stays the optimizer's (what else the loop did is not known).
        r = run(ddp_program("""
            model = DistributedDataParallel(torch.nn.Linear(16, 4))
            lockstep.watch(model)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            x = torch.randn(8, 16)

            def beside():
                with lockstep.phase("async checkpoint"):
                    with torch.no_grad():
                        model(x)
                    time.sleep(0.05)

            for i in range(2):
                model(x).sum().backward(); opt.step()
                if i == 1:
                    t = threading.Thread(target=beside)
                    t.start()
                    time.sleep(0.1)
                    t.join()
                lockstep.step(samples=8)
            dist.destroy_process_group()
        """), self.receiver.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        got = self.receiver.messages(3)
        phases = [m.phase_report.name for m in got if m.WhichOneof("payload") == "phase_report"]
        self.assertEqual(phases, ["async checkpoint"])
        second = [m.step_report for m in got if m.WhichOneof("payload") == "step_report"][1]
        self.assertGreaterEqual(second.optimizer_time_us, 90000, second)

    def test_phases_closed_in_a_tight_loop_are_bounded_and_said_once(self):
        r = run("""
            import lockstep
            for i in range(100):
                with lockstep.phase("tiny"):
                    pass
        """, self.receiver.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        phases = [m for m in self.receiver.messages(100, timeout_s=3) if m.WhichOneof("payload") == "phase_report"]
        self.assertGreaterEqual(len(phases), 20)
        self.assertLessEqual(len(phases), 40)  # 20 a second; the loop may straddle two seconds
        self.assertEqual(r.stderr.count("ends more than 20 times a second"), 1, r.stderr)

    def test_the_optimizer_is_timed_and_an_evaluation_before_step_is_not_the_optimizers(self):
        r = run(ddp_program("""
            # Slow: its evaluations take 0.2 s (DDP_PRELUDE)
            model = DistributedDataParallel(Slow(64, 64))
            lockstep.watch(model)
            opt = torch.optim.Adam(model.parameters(), lr=0.01)
            x = torch.randn(32, 64)
            for i in range(4):
                loss = model(x).square().mean()
                opt.zero_grad(); loss.backward(); opt.step()
                if i == 1:
                    with torch.no_grad():
                        model(x)              # an evaluation after the optimizer, before step()
                if i == 2:
                    with lockstep.phase("checkpoint"):
                        time.sleep(0.2)
                lockstep.step(samples=32, loss=loss)
            dist.destroy_process_group()
        """), self.receiver.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        reports = [m.step_report for m in self.receiver.messages(5) if m.WhichOneof("payload") == "step_report"]
        self.assertEqual(len(reports), 4)
        for s in reports:
            self.assertTrue(s.HasField("optimizer_time_us"), s)
            self.assertGreater(s.optimizer_time_us, 0)
            self.assertLessEqual(s.optimizer_time_us, s.compute_time_us)
            self.assertLess(s.optimizer_time_us, 100000, "the 0.2 s evaluation and checkpoint are not the optimizer's")
        self.assertGreaterEqual(reports[1].step_time_us, 200000)  # an evaluation: in the step, as compute
        self.assertLess(reports[2].step_time_us, 100000, "the checkpoint, a named phase, is not the step's")
        for s in reports:
            self.assertEqual(s.data_time_us + s.compute_time_us + s.exposed_comm_time_us, s.step_time_us)

    def test_an_agent_that_does_not_read_costs_drops_not_time(self):
        # Nobody binds this endpoint: reports queue up to the (here lowered) limit, then drop.
        r = run("""
            import time, lockstep, lockstep._report
            lockstep._report._Reporter.QUEUE = 100
            lockstep._report._Reporter.LINGER_MS = 100
            began = time.perf_counter()
            for i in range(2000):
                lockstep.step(samples=8, loss=1.0)
            print("%.3f %d" % (time.perf_counter() - began, lockstep.dropped()))
        """, dict(self.receiver.env(), LOCKSTEP_REPORT="ipc://" + os.path.join(self.receiver.dir.name, "nobody.sock")))
        self.assertEqual(r.returncode, 0, r.stderr)
        seconds, dropped = r.stdout.split()
        self.assertLess(float(seconds), 10.0)  # 2000 steps: a wait on the absent agent would take far longer
        self.assertGreaterEqual(int(dropped), 2000 - 100 - 64)  # a burst of up to 64 may still be held
        # It says so, rather than seem to report (found by running the examples with a relative
        # state directory), and exits without waiting for an agent that never came.
        self.assertIn("2000 step reports never reached the agent", r.stderr)

    def test_bad_values_and_a_malformed_environment_never_raise(self):
        r = run("""
            import lockstep
            lockstep.step(samples=-1)
            lockstep.step(samples="many")
            lockstep.step(samples=8, loss=float("nan"))
        """, self.receiver.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("step not reported", r.stderr)
        self.assertEqual(len(self.receiver.messages(1)), 1)  # the good one
        r = run("""
            import lockstep
            lockstep.step(samples=8)
            assert not lockstep.active()
        """, dict(self.receiver.env(), RANK="three"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("the rank's environment is malformed", r.stderr)


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PackageLayout(unittest.TestCase):
    """Issue 31: the package's modules import one another in one direction (no cycle), so any of
    them imports first, alone."""

    def test_its_modules_import_without_a_cycle(self):
        import ast
        import lockstep
        here = os.path.dirname(lockstep.__file__)
        graph = {}
        for name in os.listdir(here):
            if not name.endswith(".py"):
                continue
            module = "lockstep." + name[:-3] if name != "__init__.py" else "lockstep"
            tree = ast.parse(open(os.path.join(here, name)).read())
            deps = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lockstep"):
                    deps.add(node.module if node.module != "lockstep" else None)
                    if node.module == "lockstep":
                        deps.update("lockstep." + a.name for a in node.names)
            graph[module] = {d for d in deps if d and d != module and not d.startswith("lockstep.v1")}
        state = {}

        def visit(module, path):
            if state.get(module) == "done":
                return
            self.assertNotEqual(state.get(module), "open", "an import cycle: " + " -> ".join(path + [module]))
            state[module] = "open"
            for dep in graph.get(module, ()):
                visit(dep, path + [module])
            state[module] = "done"

        for module in graph:
            visit(module, [])
        self.assertIn("lockstep._bursts", graph["lockstep._native"])

    def test_each_module_imports_first_alone(self):
        for module in ("lockstep._native", "lockstep._report", "lockstep._api", "lockstep._bursts", "lockstep._progress",
                       "lockstep._collectives", "lockstep._flops",
                       "lockstep"):
            r = run("import %s" % module, env={"PYTHONPATH": os.environ.get("PYTHONPATH", "")})
            self.assertEqual(r.returncode, 0, module + ": " + r.stderr)


# ---- Issue 32: the progress record (common/base/include/lockstep/common/progress.h's layout) ----

ANNOUNCED, IN_COLLECTIVE, REPORTS_STEPS = 1, 2, 4
STACK_SIGNAL = signal.SIGRTMIN + 5
SNAPSHOT = """
def snapshot(label):  # the record's bytes as they are now, for the test to parse
    import os
    with open(os.environ["LOCKSTEP_PROGRESS"], "rb") as f:
        print("SNAPSHOT", label, f.read().hex(), flush=True)
"""


def parse_record(data):
    """The record by the offsets of the layout, read here independently of the package."""
    assert len(data) == 128, len(data)

    def field(fmt, offset):
        return struct.unpack_from("<" + fmt, data, offset)[0]

    return {"magic": field("I", 0), "version": field("I", 4), "sequence": field("Q", 8), "step": field("q", 16),
            "step_began": field("q", 24), "phase_began": field("q", 32), "collectives": field("Q", 40),
            "collective_began": field("q", 48), "bucket": field("I", 56), "buckets": field("I", 60),
            "stack_signal": field("I", 64), "flags": field("I", 68), "phase_bytes": data[72:104],
            "phase": data[72:104].rstrip(b"\0").decode("ascii"), "pid": field("i", 104),
            "collective_kind": field("I", 108), "reserved": data[112:128]}


def snapshots(stdout):
    return {line.split()[1]: parse_record(bytes.fromhex(line.split()[2]))
            for line in stdout.splitlines() if line.startswith("SNAPSHOT ")}


def boot_dir():
    import lockstep
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(lockstep.__file__))), "boot")


class ProgressRecord(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.TemporaryDirectory()
        self.record = os.path.join(self.dir.name, "progress")
        self.stacks = os.path.join(self.dir.name, "stacks")
        with open(self.record, "wb") as f:  # as the agent creates it: 128 zero bytes
            f.write(bytes(128))
        open(self.stacks, "w").close()

    def tearDown(self):
        self.dir.cleanup()

    def env(self, **more):
        return dict({"LOCKSTEP_PROGRESS": self.record, "LOCKSTEP_STACKS": self.stacks}, **more)

    def read(self):
        with open(self.record, "rb") as f:
            return parse_record(f.read())

    def test_the_record_has_the_layout_the_agent_reads(self):
        # Both writers: the native one (python/native/record.c), which the build makes and a rank
        # uses, and the Python one, which serves where it cannot load.
        for writer in ("native", "python"):
            with self.subTest(writer=writer):
                self.record_layout(writer)

    def record_layout(self, writer):
        with open(self.record, "wb") as f:
            f.write(bytes(128))
        r = run(SNAPSHOT + """
import os, lockstep
from lockstep import _progress
print("NATIVE", _progress.NATIVE)
snapshot("imported")
lockstep.step(samples=8)
lockstep.step(samples=8, step=41)         # without watch() or an agent: the step, no phase
snapshot("stepped")
w = _progress.writer()
w.collective_begin(3, 7, kind=3)
snapshot("collective")
w.collective_end()
with lockstep.phase("checkpoint"):
    snapshot("checkpoint")
    with lockstep.phase("x" * 40):
        snapshot("long")
    with lockstep.phase("\u00e9valuation"):
        snapshot("accented")
    snapshot("back")
snapshot("after")
with lockstep.phase(os.fsdecode(b"ckpt-\\xff")):   # a lone surrogate: no UTF-8 of its own
    snapshot("undecodable")
class Named(str):
    def __str__(self):
        return "named"
w.phase("raw")                            # cached by the Python writer: the subclass is not it
w.phase(Named("raw"))
snapshot("str_subclass")
if _progress.NATIVE:                      # a Record without its buffer refuses, never crashes
    try:
        _progress.Writer.__new__(_progress.Writer).phase("x")
    except ValueError as e:
        print("REFUSED", e)
w.step_done(3, None)
snapshot("step_none")
w.step_done(41, "")
with lockstep.phase("eval"):
    lockstep.step(samples=8)              # a step ends any announced phase
    snapshot("step_in_phase")
snapshot("end")
print("PID", os.getpid())
""", self.env(**({"LOCKSTEP_RECORD_WRITER": "python"} if writer == "python" else {})))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertIn("NATIVE %s" % (writer == "native"), r.stdout)
        got = snapshots(r.stdout)
        pid = int(r.stdout.split("PID ")[1])
        began = got["imported"]
        self.assertEqual((began["magic"], began["version"]), (0x5250534C, 1))
        self.assertEqual(began["pid"], pid)
        self.assertEqual(began["phase"], "start-up")
        self.assertEqual(began["stack_signal"], STACK_SIGNAL)
        self.assertEqual((began["step"], began["flags"], began["collectives"]), (0, 0, 0))
        self.assertLess(abs(began["step_began"] - time.time_ns() // 1000), 60 * 10**6)
        self.assertEqual(began["phase_began"], began["step_began"])
        for snapshot in got.values():
            self.assertEqual(snapshot["sequence"] % 2, 0)  # never caught while writing: it was not
            self.assertEqual(snapshot["reserved"], bytes(16))
            self.assertEqual(snapshot["magic"], 0x5250534C)
        stepped = got["stepped"]
        self.assertGreater(stepped["sequence"], began["sequence"])
        self.assertEqual((stepped["step"], stepped["phase"], stepped["flags"]), (41, "", REPORTS_STEPS))
        self.assertGreaterEqual(stepped["step_began"], began["step_began"])
        self.assertEqual(stepped["phase_began"], stepped["step_began"])
        inside = got["collective"]
        self.assertEqual((inside["collectives"], inside["bucket"], inside["buckets"]), (1, 3, 7))
        self.assertEqual(inside["collective_kind"], 3)  # an all-gather (issue 42)
        self.assertEqual(inside["flags"], REPORTS_STEPS | IN_COLLECTIVE)
        self.assertGreaterEqual(inside["collective_began"], stepped["step_began"])
        checkpoint = got["checkpoint"]
        self.assertEqual(checkpoint["phase_bytes"], b"checkpoint".ljust(32, b"\0"))
        self.assertEqual(checkpoint["flags"], REPORTS_STEPS | ANNOUNCED)  # the collective ended
        self.assertEqual((checkpoint["collective_began"], checkpoint["collectives"]), (0, 1))
        self.assertEqual(got["long"]["phase_bytes"], b"x" * 31 + b"\0")  # 31 bytes at most, NUL-ended
        self.assertEqual(got["accented"]["phase"], "?valuation")  # ASCII, a character outside it '?'
        self.assertEqual(got["undecodable"]["phase"], "ckpt-?")
        self.assertEqual(got["str_subclass"]["phase"], "named")  # str(name), as the phase reports say
        self.assertEqual("REFUSED a Record without its buffer" in r.stdout, writer == "native")
        self.assertEqual((got["step_none"]["step"], got["step_none"]["phase"]), (3, "None"))
        # Each phase() restores the phase that was current before it, announced or not.
        self.assertEqual((got["back"]["phase"], got["back"]["flags"]), ("checkpoint", REPORTS_STEPS | ANNOUNCED))
        self.assertEqual((got["after"]["phase"], got["after"]["flags"]), ("", REPORTS_STEPS))
        self.assertEqual(got["after"]["step"], 41)
        inside = got["step_in_phase"]
        self.assertEqual((inside["step"], inside["phase"], inside["flags"]), (42, "", REPORTS_STEPS))
        self.assertEqual((got["end"]["phase"], got["end"]["flags"]), ("", REPORTS_STEPS))
        self.assertEqual(self.read(), got["end"])  # nothing was written at exit

    def test_a_watched_ddp_step_says_where_it_is(self):
        receiver = Receiver()
        self.addCleanup(receiver.close)
        r = run(SNAPSHOT + ddp_program("""
model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)))
lockstep.watch(model)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x = torch.randn(4, 8)
for i in range(3):
    loss = model(x).square().mean()
    snapshot("forward%d" % i)
    opt.zero_grad(); loss.backward()
    snapshot("backward%d" % i)
    opt.step()
    lockstep.step(samples=4, loss=loss)
    snapshot("step%d" % i)
with model.no_sync():                     # accumulates: no all-reduce
    model(x).sum().backward()
snapshot("no_sync")
with torch.no_grad():                     # an evaluation: not the step's forward
    model(x)
snapshot("eval")
with lockstep.phase("eval"):
    snapshot("announced")
dist.destroy_process_group()
"""), self.env(**receiver.env()))
        self.assertEqual(r.returncode, 0, r.stderr)
        got = snapshots(r.stdout)
        for i in range(3):
            self.assertEqual(got["forward%d" % i]["phase"], "forward")
            self.assertEqual(got["forward%d" % i]["collectives"], i)
            after = got["backward%d" % i]  # DDP's all-reduce entered and left: the optimizer is next
            self.assertEqual((after["phase"], after["collectives"], after["flags"] & IN_COLLECTIVE), ("optimizer", i + 1, 0))
            self.assertEqual(after["collective_began"], 0)
            stepped = got["step%d" % i]
            self.assertEqual((stepped["phase"], stepped["step"], stepped["flags"]), ("data", i + 1, REPORTS_STEPS))
            self.assertGreaterEqual(after["phase_began"], got["forward%d" % i]["phase_began"])
        self.assertEqual((got["no_sync"]["collectives"], got["no_sync"]["phase"]), (3, "data"))
        self.assertEqual(got["eval"]["phase"], "data")
        self.assertEqual((got["announced"]["phase"], got["announced"]["flags"]), ("eval", REPORTS_STEPS | ANNOUNCED))
        self.assertEqual(len(receiver.messages(3)), 3)  # and the reports still go

    def test_outside_lockstep_nothing_is_written_or_registered(self):
        r = run("""
            import time, lockstep
            from lockstep import _progress
            began = time.perf_counter()
            for i in range(10000):
                with lockstep.phase("eval"):
                    pass
            print("%.1f us per phase" % ((time.perf_counter() - began) / 10000 * 1e6))

            @lockstep.phase("checkpoint")
            def save(x):
                return x + 1
            assert save(1) == 2 and save.__name__ == "save"
            lockstep.step(samples=8)
            assert _progress.writer() is None and _progress._stacks_fd is None
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        self.assertLess(float(r.stdout.split()[0]), 100.0, r.stdout)

    def test_a_bad_record_is_said_once_and_never_raised(self):
        with open(self.record, "wb") as f:
            f.write(bytes(64))  # not the agent's 128 bytes
        r = run("""
            import lockstep
            from lockstep import _progress
            with lockstep.phase("eval"):
                lockstep.step(samples=8)
            assert _progress.writer() is None
        """, self.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("no progress record"), 1, r.stderr)
        with open(self.record, "rb") as f:
            self.assertEqual(f.read(), bytes(64))  # neither grown nor written
        r = run("import lockstep; lockstep.step(samples=1)", self.env(LOCKSTEP_PROGRESS=self.record + ".absent"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("no progress record", r.stderr)
        self.assertFalse(os.path.exists(self.record + ".absent"))
        # Stacks that cannot be registered leave the record as it is, without a signal to send.
        with open(self.record, "wb") as f:
            f.write(bytes(128))
        r = run("import lockstep; lockstep.step(samples=1)", self.env(LOCKSTEP_STACKS=self.stacks + ".absent"))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr.count("no stacks on request"), 1, r.stderr)
        record = self.read()
        self.assertEqual((record["magic"], record["step"], record["stack_signal"]), (0x5250534C, 1, 0))

    def test_an_unmodified_script_dumps_its_stacks_on_the_records_signal(self):
        script = os.path.join(self.dir.name, "train.py")
        with open(script, "w") as f:
            f.write(textwrap.dedent("""
                import sys, time

                def stuck_in_my_loader():
                    print(sys.modules["sitecustomize"].__file__, "lockstep" in sys.modules, flush=True)
                    time.sleep(60)

                stuck_in_my_loader()
            """))
        debians = run("import sys; print(getattr(sys.modules.get('sitecustomize'), '__file__', None))")
        self.assertEqual(debians.returncode, 0, debians.stderr)
        env = dict(os.environ, **self.env())
        env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "") + os.pathsep + boot_dir()
        rank = subprocess.Popen([PYTHON, script], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            line = rank.stdout.readline().split()
            self.assertEqual(len(line), 2, rank.stderr.read() if rank.poll() is not None else line)
            # The sitecustomize the boot directory hides still ran (Debian's), and lockstep itself
            # was not imported: the script runs as it would without Lockstep.
            self.assertEqual(line, [debians.stdout.strip(), "False"])
            record = self.read()
            self.assertEqual((record["magic"], record["pid"], record["phase"]), (0x5250534C, rank.pid, "start-up"))
            self.assertEqual(record["flags"], 0)  # it reports no steps
            self.assertEqual(record["stack_signal"], STACK_SIGNAL)
            os.kill(record["pid"], record["stack_signal"])
            deadline, text = time.time() + 10, ""
            while "stuck_in_my_loader" not in text and time.time() < deadline:
                time.sleep(0.05)
                with open(self.stacks) as f:
                    text = f.read()
            self.assertIn("stuck_in_my_loader", text)
            self.assertIn("train.py", text)
            self.assertIsNone(rank.poll())  # the signal dumped the stacks and did not end it
        finally:
            rank.kill()
            rank.communicate()

    def test_the_boot_directory_runs_the_sitecustomize_it_hides(self):
        other = os.path.join(self.dir.name, "other")
        os.mkdir(other)
        with open(os.path.join(other, "sitecustomize.py"), "w") as f:
            f.write("import builtins\nbuiltins.CHAINED = __name__\n")
        path = os.pathsep.join([os.environ.get("PYTHONPATH", ""), boot_dir(), other])
        for env in ({}, self.env()):
            r = run("""
                import builtins, sys
                print(builtins.CHAINED, sys.modules["sitecustomize"].__file__, "lockstep._progress" in sys.modules)
            """, dict(env, PYTHONPATH=path))
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertEqual(r.stdout.split(), ["sitecustomize", os.path.join(other, "sitecustomize.py"), str(bool(env))])
        self.assertEqual(self.read()["phase"], "start-up")

    def test_only_the_ranks_own_process_writes_the_record(self):
        for writer in ("native", "python"):
            with self.subTest(writer=writer):
                with open(self.record, "wb") as f:
                    f.write(bytes(128))
                self.only_the_ranks_own_process_writes(writer)

    def only_the_ranks_own_process_writes(self, writer):
        path = os.pathsep.join([os.environ.get("PYTHONPATH", ""), boot_dir()])
        env = dict(self.env(), PYTHONPATH=path, **({"LOCKSTEP_RECORD_WRITER": "python"} if writer == "python" else {}))
        # A Python process the rank starts (a spawned worker) leaves the rank's record alone, and
        # so does a forked one.
        r = run("""
            import os, subprocess, sys, lockstep
            lockstep.step(samples=1, step=5)
            child = "import lockstep, sys; lockstep.step(samples=1, step=99); print(lockstep._progress.writer())"
            print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
            pid = os.fork()
            if pid == 0:
                lockstep.step(samples=1, step=77)
                with lockstep.phase("forked"):
                    os._exit(0)
            os.waitpid(pid, 0)
            print(os.getpid())
        """, env)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stderr, "")
        none, pid = r.stdout.split()
        self.assertEqual(none, "None")
        record = self.read()
        self.assertEqual((record["pid"], record["step"], record["phase"]), (int(pid), 5, ""))
        # A launcher in Python that reports no steps hands the record to the child that does.
        with open(self.record, "wb") as f:
            f.write(bytes(128))
        r = run("""
            import subprocess, sys
            child = "import lockstep, os, sys; lockstep.step(samples=1, step=7); " \\
                    "assert lockstep._progress is sys.modules['lockstep._progress']; print(os.getpid())"
            print(subprocess.run([sys.executable, "-c", child], capture_output=True, text=True).stdout.strip())
        """, env)
        self.assertEqual(r.returncode, 0, r.stderr)
        record = self.read()
        self.assertEqual((record["pid"], record["step"], record["flags"]), (int(r.stdout), 7, REPORTS_STEPS))
        self.assertEqual(record["stack_signal"], STACK_SIGNAL)


if __name__ == "__main__":
    from test_flops import Flops  # noqa: F401 (issue 46: the step's FLOPs and precision, in a file of their own)
    from test_phase_clock import PhaseClock  # noqa: F401 (a phase's place on the wall clock)
    unittest.main()
