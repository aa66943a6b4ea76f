"""A named phase's place on the wall clock (the lockstep package's _report_phase): phases nested in
one another keep their order to the microsecond, however the two clocks' readings jitter between
one report and the next. The clocks are stood in for here, because the order broke only when the
wall clock was read a microsecond or two later against perf_counter on one report than on another
(a CI run: the outer phase started 1 us after the inner one)."""

import unittest

import lockstep._api as api
import lockstep._report as report


class _Clocks:
    """perf_counter at a fixed reading; the wall clock reads `jitter_us` later on each call."""

    def __init__(self, perf, wall_us, jitter_us):
        self.perf, self.wall_us, self.jitter_us = perf, wall_us, jitter_us

    def perf_counter(self):
        return self.perf

    def time_ns(self):
        self.wall_us += self.jitter_us
        return self.wall_us * 1000


class _Sent:
    def __init__(self):
        self.phases = []

    def send(self, fields, kind):
        self.phases.append(fields)


class PhaseClock(unittest.TestCase):
    def setUp(self):
        self.saved = (api.time, report.reporter, api._perf_to_wall_us[0], list(api._phase_budget))
        self.sent = _Sent()
        report.reporter = lambda: self.sent
        api._perf_to_wall_us[0] = None

    def tearDown(self):
        api.time, report.reporter, api._perf_to_wall_us[0], api._phase_budget[:] = self.saved

    def report(self, clocks, name, began, ended):
        api.time = clocks
        api._report_phase(name, began, ended)
        return self.sent.phases[-1]

    def test_nested_phases_keep_their_order_when_the_clocks_readings_jitter(self):
        clocks = _Clocks(perf=1000.000020, wall_us=1_800_000_000_000_000, jitter_us=2)
        # The inner phase ends first and is reported first; the outer began 1 us before it.
        inner = self.report(clocks, "eval/bleu", began=1000.000002, ended=1000.000005)
        outer = self.report(clocks, "eval", began=1000.000001, ended=1000.000010)
        start = lambda p: p["time_unix_us"] - p["duration_us"]
        self.assertLess(start(outer), start(inner))
        self.assertGreater(outer["time_unix_us"], inner["time_unix_us"])
        self.assertEqual((inner["duration_us"], outer["duration_us"]), (3, 9))

    def test_a_wall_clock_set_away_is_followed(self):
        clocks = _Clocks(perf=50.0, wall_us=1_800_000_000_000_000, jitter_us=0)
        before = self.report(clocks, "checkpoint", began=49.0, ended=49.5)
        clocks.wall_us += 10_000_000  # the wall clock set 10 s ahead
        after = self.report(clocks, "checkpoint", began=49.0, ended=49.5)
        self.assertEqual(after["time_unix_us"] - before["time_unix_us"], 10_000_000)
        self.assertEqual(before["time_unix_us"], 1_800_000_000_000_000 - 500_000)


if __name__ == "__main__":
    unittest.main()
