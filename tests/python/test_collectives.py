"""Issue 42: every collective a rank issues through torch.distributed, timed by lockstep.watch():
real PyTorch and Gloo in real processes, reports read on a real PULL socket (test_lockstep.py's
Receiver). Run with the build tree's python/ on PYTHONPATH (ctest does)."""

import os
import subprocess
import textwrap
import unittest

from test_lockstep import PYTHON, Receiver, _free_port, run

ALL_REDUCE, ALL_GATHER, BROADCAST, BARRIER = 1, 3, 4, 6

# One Gloo rank (a free port), a model watched without DDP.
PRELUDE = """
import time, torch, torch.distributed as dist, lockstep
dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d", rank=0, world_size=1)
model = torch.nn.Linear(1000, 10)
lockstep.watch(model)
"""


def program(body):
    return PRELUDE % _free_port() + textwrap.dedent(body)


def by_kind(report):
    return {c.kind: c for c in report.collectives}


class EveryCollective(unittest.TestCase):
    def setUp(self):
        self.receiver = Receiver()

    def tearDown(self):
        self.receiver.close()

    def steps(self, body, count):
        r = run(program(body), self.receiver.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        return [m.step_report for m in self.receiver.messages(count)]

    def test_each_kind_is_counted_with_its_bytes_and_the_split_adds_up(self):
        reports = self.steps("""
            x = torch.ones(1000)                      # 4,000 bytes
            for step in range(3):
                model(torch.randn(4, 1000)).sum().backward()
                dist.all_reduce(x)
                dist.all_reduce(x, async_op=True).wait()
                parts = [torch.empty(1000)]
                dist.all_gather(parts, x)             # the whole output: 4,000 bytes
                dist.broadcast(x, src=0)
                dist.barrier()
                lockstep.step(samples=4)
        """, 3)
        self.assertEqual(len(reports), 3)
        for r in reports:
            kinds = by_kind(r)
            self.assertEqual(sorted(kinds), [ALL_REDUCE, ALL_GATHER, BROADCAST, BARRIER])
            self.assertEqual((kinds[ALL_REDUCE].count, kinds[ALL_REDUCE].bytes), (2, 8000))
            self.assertEqual((kinds[ALL_GATHER].count, kinds[ALL_GATHER].bytes), (1, 4000))
            self.assertEqual((kinds[BROADCAST].count, kinds[BROADCAST].bytes), (1, 4000))
            self.assertEqual((kinds[BARRIER].count, kinds[BARRIER].bytes), (1, 0))
            self.assertEqual(len(r.collective_spans), 5)
            self.assertEqual([s.kind for s in r.collective_spans], [ALL_REDUCE, ALL_REDUCE, ALL_GATHER, BROADCAST, BARRIER])
            starts = [s.start_unix_us for s in r.collective_spans]
            self.assertEqual(starts, sorted(starts))
            self.assertLessEqual(r.time_unix_us - r.step_time_us - 1000, starts[0])
            self.assertLessEqual(starts[-1], r.time_unix_us)
            exposed = sum(c.exposed_us for c in r.collectives)
            self.assertTrue(r.HasField("exposed_comm_time_us"), "a model without DDP is timed too")
            self.assertGreaterEqual(r.exposed_comm_time_us, exposed - 1)
            self.assertEqual(r.data_time_us + r.compute_time_us + r.exposed_comm_time_us, r.step_time_us)

    def test_an_async_collective_is_exposed_only_while_waited_on(self):
        reports = self.steps("""
            x = torch.ones(1000)
            for step in range(2):
                model(torch.randn(4, 1000)).sum().backward()
                work = dist.all_reduce(x, async_op=True)
                time.sleep(0.05)     # computing, say, while it runs: hidden
                work.wait()          # done by then: next to nothing exposed
                dist.barrier()       # blocking: all of it exposed
                lockstep.step(samples=4)
        """, 2)
        for r in reports:
            kinds = by_kind(r)
            self.assertLess(kinds[ALL_REDUCE].exposed_us, 5000, "the 50 ms of compute hid it")
            self.assertLessEqual(kinds[ALL_REDUCE].exposed_us, kinds[ALL_REDUCE].time_us)
            self.assertEqual(kinds[BARRIER].exposed_us, kinds[BARRIER].time_us)
            self.assertIsInstance(kinds[ALL_REDUCE].count, int)
            self.assertEqual(kinds[ALL_REDUCE].count, 1)

    def test_a_step_holds_at_most_64_spans_and_counts_them_all(self):
        reports = self.steps("""
            x = torch.ones(10)
            model(torch.randn(4, 1000)).sum().backward()
            for i in range(100):
                dist.all_reduce(x)
            lockstep.step(samples=4)
            lockstep.step(samples=4)  # nothing in this one: the counts start again
        """, 2)
        self.assertEqual(by_kind(reports[0])[ALL_REDUCE].count, 100)
        self.assertEqual(by_kind(reports[0])[ALL_REDUCE].bytes, 4000)
        self.assertEqual(len(reports[0].collective_spans), 64)
        self.assertEqual(len(reports[1].collectives), 0)
        self.assertEqual(reports[1].exposed_comm_time_us, 0)

    def test_a_collective_that_raises_still_raises_and_the_program_goes_on(self):
        r = run(program("""
            try:
                dist.all_reduce([1, 2, 3])  # not a tensor
            except Exception as e:
                print("raised", type(e).__name__)
            x = torch.ones(3)
            dist.all_reduce(x)
            print("wrapped", getattr(dist.all_reduce, "__wrapped__", None) is not None, dist.all_reduce.__name__)
            lockstep.step(samples=1)
        """), self.receiver.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("raised", r.stdout)
        self.assertIn("wrapped True all_reduce", r.stdout)
        reports = [m.step_report for m in self.receiver.messages(1)]
        self.assertEqual(by_kind(reports[0])[ALL_REDUCE].count, 1, "the call that raised is not counted")

    def test_an_async_collectives_work_is_still_a_work(self):
        r = run(program("""
            work = dist.all_reduce(torch.ones(3), async_op=True)
            print("work", isinstance(work, dist.Work), work.get_future().wait()[0].tolist(), end=" ")
            work.wait()
            print(work.is_completed())
            lockstep.step(samples=1)
        """), self.receiver.env())
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("work True [1.0, 1.0, 1.0] True", r.stdout)  # FSDP's copy-out checks isinstance

    def test_ddp_on_cpus_is_one_all_reduce_of_unknown_time_and_a_comm_hook_is_not_counted_twice(self):
        for hook in ("", "ddp.register_comm_hook(None, default_hooks.allreduce_hook)"):
            receiver = Receiver()
            try:
                r = run(program("""
                    from torch.nn.parallel import DistributedDataParallel
                    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
                    ddp = DistributedDataParallel(torch.nn.Linear(1000, 10))  # 10,010 parameters
                    %s
                    lockstep._api._watcher = None  # the prelude watched another model
                    lockstep.watch(ddp)
                    for step in range(3):
                        ddp(torch.randn(4, 1000)).sum().backward()
                        lockstep.step(samples=4)
                """ % hook), receiver.env())
                self.assertEqual(r.returncode, 0, r.stderr)
                reports = [m.step_report for m in receiver.messages(3)]
                self.assertEqual(len(reports), 3, hook)
                for report in reports:
                    kinds = by_kind(report)
                    self.assertEqual(kinds[ALL_REDUCE].bytes, 40040, hook or "DDP's own")
                    if not hook:  # only the wait is seen: no time, so no bandwidth from it
                        self.assertEqual(kinds[ALL_REDUCE].time_us, 0)
                    self.assertGreaterEqual(report.exposed_comm_time_us, kinds[ALL_REDUCE].exposed_us - 1)
            finally:
                receiver.close()

    def test_outside_lockstep_nothing_is_wrapped(self):
        r = run(program("""
            print("wrapped", hasattr(dist.all_reduce, "__wrapped__"))
        """))
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("wrapped False", r.stdout)

    def test_two_ranks_exposed_share_agrees_with_the_programs_own_clock(self):
        port = _free_port()
        code = textwrap.dedent("""
            import sys, time, torch, torch.distributed as dist, lockstep
            rank = int(sys.argv[1])
            dist.init_process_group("gloo", init_method="tcp://127.0.0.1:%d", rank=rank, world_size=2)
            model = torch.nn.Linear(256, 4096)
            lockstep.watch(model)
            own = 0.0
            for step in range(10):
                model(torch.randn(8, 256)).sum().backward()
                flat = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
                if rank == 1:
                    time.sleep(0.03)  # rank 0 waits for it in the all-reduce
                began = time.perf_counter()
                dist.all_reduce(flat)
                own += time.perf_counter() - began
                lockstep.step(samples=8)
            print("own %%.6f" %% own)
        """ % port)
        procs = []
        for rank in (0, 1):
            env = dict(os.environ, **self.receiver.env(rank=rank, world=2))
            procs.append(subprocess.Popen([PYTHON, "-c", code, str(rank)], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        outs = [p.communicate(timeout=120) for p in procs]
        for p, (out, err) in zip(procs, outs):
            self.assertEqual(p.returncode, 0, err)
        reports = [m.step_report for m in self.receiver.messages(20)]
        own0 = float(outs[0][0].split()[-1])
        exposed0 = sum(r.exposed_comm_time_us for r in reports if r.rank == 0) / 1e6
        self.assertGreater(own0, 0.2, "rank 0 waited 30 ms a step for rank 1")
        self.assertLess(abs(exposed0 - own0), 0.05 + 0.2 * own0, (exposed0, own0))


if __name__ == "__main__":
    unittest.main()
