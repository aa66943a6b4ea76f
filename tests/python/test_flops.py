"""Issue 46: MFU's inputs from the lockstep package: each step report's flops, their basis and the
precision, against a real ZeroMQ socket and real PyTorch (test_lockstep.py's harness; it runs these
cases as part of python_package). Every expected count is worked out by hand from the models' shapes.
"""

import unittest

from lockstep.v1 import lockstep_pb2
from test_lockstep import Receiver, ddp_program, run

DECLARED, TOKENS, LAYERS = 1, 2, 3
FP32, TF32, BF16, FP16, FP8 = 1, 2, 3, 4, 5

# A Linear and a Conv2d, each a leaf; a ReLU between them has no FLOPs counted.
CONV_AND_LINEAR = """
import torch, lockstep


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, kernel_size=3, padding=1)   # 8x8 in, 8x8 out
        self.act = torch.nn.ReLU()
        self.fc = torch.nn.Linear(4 * 8 * 8, 5)

    def forward(self, x):
        return self.fc(self.act(self.conv(x)).flatten(1))
"""


def conv_and_linear_flops(batch):
    """Forward FLOPs of Net on `batch` images: 2 x output elements x (in_channels / groups) x kernel
    for the convolution, 2 x in x out per row for the linear layer."""
    conv = 2 * (batch * 4 * 8 * 8) * 3 * (3 * 3)
    fc = 2 * (4 * 8 * 8) * 5 * batch
    return conv + fc


class Flops(unittest.TestCase):
    def setUp(self):
        self.receiver = Receiver()

    def tearDown(self):
        self.receiver.close()

    def steps(self, r, count):
        self.assertEqual(r.returncode, 0, r.stderr)
        got = [m.step_report for m in self.receiver.messages(count) if m.WhichOneof("payload") == "step_report"]
        self.assertEqual(len(got), count, r.stderr)
        return got

    def test_declared_flops_are_the_programs_and_win_over_any_estimate(self):
        r = run(CONV_AND_LINEAR + """
lockstep.step(samples=8, flops=1.5e12)          # no model watched: flops, no precision
model = lockstep.watch(Net())
model(torch.randn(2, 3, 8, 8)).sum().backward()
lockstep.step(samples=2, tokens=100, flops=7)   # its own count, over tokens' and the layers'
""", self.receiver.env())
        first, second = self.steps(r, 2)
        self.assertEqual((first.flops, first.flops_basis), (1.5e12, DECLARED))
        self.assertFalse(first.HasField("precision"))
        self.assertEqual((second.flops, second.flops_basis, second.precision), (7.0, DECLARED, FP32))
        self.assertFalse(second.HasField("peak_flops"), "the agent's to set")

    def test_tokens_give_four_times_all_parameters_and_two_times_trainable_ones_per_token(self):
        # Parameters counted once each (the tied weight is one), of the module DDP wraps: the
        # embedding's 10 x 8 (shared with the output layer), the output's bias 10, the hidden
        # layer's 8 x 8 + 8, all trainable; the frozen layer's 8 x 8 + 8 computed forward and for
        # its input's gradient (4 per token), not for its own (2 more per token).
        r = run(ddp_program("""
            class LM(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.embed = torch.nn.Embedding(10, 8)
                    self.hidden = torch.nn.Linear(8, 8)
                    self.frozen = torch.nn.Linear(8, 8)
                    self.frozen.requires_grad_(False)
                    self.out = torch.nn.Linear(8, 10)
                    self.out.weight = self.embed.weight      # tied

                def forward(self, ids):
                    return self.out(self.hidden(self.frozen(self.embed(ids))))

            model = DistributedDataParallel(LM())
            lockstep.watch(model)
            ids = torch.randint(0, 10, (4, 6))
            for tokens in (24, 48):
                model(ids).sum().backward()
                lockstep.step(samples=4, tokens=tokens)
            model(ids).sum().backward()
            lockstep.step(samples=4)   # the layer hooks went with the first step that gave tokens
            dist.destroy_process_group()
        """), self.receiver.env())
        first, second, third = self.steps(r, 3)
        trainable = 10 * 8 + 10 + (8 * 8 + 8)
        every = trainable + (8 * 8 + 8)
        self.assertEqual((first.flops, first.flops_basis), ((4 * every + 2 * trainable) * 24, TOKENS))
        self.assertEqual(first.flops, 1260 * 24)
        self.assertEqual((second.flops, second.flops_basis), (1260 * 48, TOKENS))
        self.assertFalse(third.HasField("flops"), third)
        self.assertEqual(third.precision, FP32)

    def test_tokens_whose_parameters_are_not_known_leave_the_layers_counting(self):
        # A lazy layer never run has no size: the count from tokens fails (said once), and every
        # step is still counted on the layers, the later ones too.
        r = run(CONV_AND_LINEAR + """
model = Net()
model.unused = torch.nn.LazyLinear(3)
model = lockstep.watch(model)
for batch in (2, 3, 4):
    model(torch.randn(batch, 3, 8, 8)).sum().backward()
    lockstep.step(samples=batch, tokens=100)
""", self.receiver.env())
        reports = self.steps(r, 3)
        for batch, report in zip((2, 3, 4), reports):
            self.assertEqual((report.flops, report.flops_basis), (3 * conv_and_linear_flops(batch), LAYERS))
        self.assertEqual(r.stderr.count("lockstep: not reporting flops from tokens: the model's parameters are "
                                        "not known (ValueError: Attempted to use an uninitialized parameter"), 1,
                         r.stderr)
        self.assertIn("counting them on its layers instead", r.stderr)

    def test_a_layer_whose_hook_fails_trains_as_ever_and_its_steps_are_reported_without_flops(self):
        r = run("""
            import torch, lockstep


            class Pair(torch.nn.Linear):   # a Linear whose output is not a tensor
                def forward(self, x):
                    y = super().forward(x)
                    return y, y


            class Net(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.pair = Pair(8, 4)

                def forward(self, x):
                    a, b = self.pair(x)
                    return a + b


            model = lockstep.watch(Net())
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            for _ in range(3):
                model(torch.randn(2, 8)).sum().backward()
                opt.step()
                lockstep.step(samples=2)
            print("trained")
        """, self.receiver.env())
        reports = self.steps(r, 3)
        self.assertIn("trained", r.stdout)
        for report in reports:
            self.assertFalse(report.HasField("flops"), report)
            self.assertEqual(report.precision, FP32)  # from the parameters once the probe went
        self.assertEqual(r.stderr.count("lockstep: not counting flops on the model's layers"), 1, r.stderr)
        self.assertIn("a hook failed (AttributeError: 'tuple' object has no attribute", r.stderr)

    def test_layers_are_counted_on_training_forwards_summed_over_micro_batches(self):
        r = run(CONV_AND_LINEAR + """
model = lockstep.watch(Net())
for batch in (2, 3):                            # two micro-batches, one step
    model(torch.randn(batch, 3, 8, 8)).sum().backward()
with torch.no_grad():
    model(torch.randn(16, 3, 8, 8))             # an evaluation: not the step's
model.eval()
model(torch.randn(16, 3, 8, 8))                 # nor a forward in eval mode
model.train()
lockstep.step(samples=5)
model(torch.randn(4, 3, 8, 8)).sum().backward()
lockstep.step(samples=4)                        # counted from none again
lockstep.step(samples=4)                        # no forward: no count, not 0
""", self.receiver.env())
        first, second, third = self.steps(r, 3)
        self.assertEqual(first.flops_basis, LAYERS)
        self.assertEqual(first.flops, 3 * (conv_and_linear_flops(2) + conv_and_linear_flops(3)))
        self.assertEqual(first.flops, 3 * (2 * 5 * 256 * 27 + 2 * 256 * 5 * 5))  # 3 x 81,920: 5 images
        self.assertEqual((second.flops, second.flops_basis), (3 * conv_and_linear_flops(4), LAYERS))
        self.assertFalse(third.HasField("flops"))

    def test_precision_is_detected_or_taken_from_watch(self):
        cases = {
            "fp32 on CPU": ("model = lockstep.watch(Net())", "model(x)", FP32),
            "a bf16 model": ("model = lockstep.watch(Net().to(torch.bfloat16))", "model(x.to(torch.bfloat16))", BF16),
            "moved to bf16 after watch": ("model = lockstep.watch(Net())\nmodel.to(torch.bfloat16)",
                                          "model(x.to(torch.bfloat16))", BF16),
            "CPU autocast": ("model = lockstep.watch(Net())",
                             "with torch.autocast('cpu', dtype=torch.bfloat16):\n    model(x)", BF16),
            "precision= wins": ("model = lockstep.watch(Net(), precision='fp16')",
                                "with torch.autocast('cpu', dtype=torch.bfloat16):\n    model(x)", FP16),
            "a dtype, bf16": ("model = lockstep.watch(Net(), precision=torch.bfloat16)", "model(x)", BF16),
            "a dtype, fp16": ("model = lockstep.watch(Net(), precision=torch.float16)", "model(x)", FP16),
            "a dtype, fp32": ("model = lockstep.watch(Net(), precision=torch.float32)", "model(x)", FP32),
            "a dtype, fp8": ("model = lockstep.watch(Net(), precision=getattr(torch, 'float8_e4m3fn', 'fp8'))",
                             "model(x)", FP8),
        }
        for name, (watch, forward, expected) in cases.items():
            with self.subTest(name):
                r = run(CONV_AND_LINEAR + "%s\nx = torch.randn(2, 3, 8, 8)\n%s\nlockstep.step(samples=2)\n"
                        % (watch, forward), self.receiver.env())
                (report,) = self.steps(r, 1)
                self.assertEqual(report.precision, expected, lockstep_pb2.Precision.Name(report.precision))
                self.assertEqual(report.flops_basis, LAYERS)

    def test_precision_is_what_the_first_layer_computed_in_not_the_parameters_dtype(self):
        # float32 parameters, bfloat16 math (as FSDP's MixedPrecision, or a model that casts):
        # bf16, step after step, after the counting hooks went too; and autocast after them.
        r = run("""
            import torch, lockstep


            class Cast(torch.nn.Module):
                def __init__(self):
                    super().__init__()
                    self.scale = torch.nn.Parameter(torch.ones(8))          # float32, the first
                    self.linear = torch.nn.Linear(8, 4).to(torch.bfloat16)

                def forward(self, x):
                    return self.linear((x * self.scale).to(torch.bfloat16)).float()


            model = lockstep.watch(Cast())
            for tokens in (None, 16, 16):
                model(torch.randn(2, 8)).sum().backward()
                lockstep.step(samples=2, tokens=tokens)
        """, self.receiver.env())
        layers, tokens, later = self.steps(r, 3)
        self.assertEqual((layers.flops_basis, tokens.flops_basis, later.flops_basis), (LAYERS, TOKENS, TOKENS))
        for report in (layers, tokens, later):
            self.assertEqual(report.precision, BF16, lockstep_pb2.Precision.Name(report.precision))
        r = run(CONV_AND_LINEAR + """
model = lockstep.watch(Net())
model(torch.randn(2, 3, 8, 8)).sum().backward()
lockstep.step(samples=2, tokens=8)              # the counting hooks go, the probe stays
with torch.autocast("cpu", dtype=torch.bfloat16):
    model(torch.randn(2, 3, 8, 8)).sum().backward()
lockstep.step(samples=2, tokens=8)
""", self.receiver.env())
        fp32, bf16 = self.steps(r, 2)
        self.assertEqual((fp32.precision, bf16.precision), (FP32, BF16))

    def test_the_tf32_setting_is_read_as_torch_has_it(self):
        r = run("""
            import torch
            from lockstep import _flops
            for allowed in (True, False, True):
                torch.backends.cuda.matmul.allow_tf32 = allowed
                print(_flops._tf32_allowed(torch) == allowed)
            torch.set_float32_matmul_precision("highest")
            print(_flops._tf32_allowed(torch) is False)
        """)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(r.stdout.split(), ["True"] * 4, r.stderr)

    def test_a_bad_precision_is_a_value_error_at_watch_inside_lockstep_or_not(self):
        for env in (self.receiver.env(), {}):
            r = run("""
                import torch, lockstep
                try:
                    lockstep.watch(torch.nn.Linear(2, 2), precision="fp17")
                except ValueError as e:
                    print(e)
            """, env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("lockstep.watch(precision='fp17'): give one of \"fp32\", \"tf32\", \"bf16\", \"fp16\", \"fp8\"",
                          r.stdout)
            r = run("""
                import torch, lockstep
                try:
                    lockstep.watch(torch.nn.Linear(2, 2), precision=torch.float64)
                except ValueError as e:
                    print(e)
            """, env)
            self.assertEqual(r.returncode, 0, r.stderr)
            self.assertIn("lockstep.watch(precision=torch.float64): give one of", r.stdout)

    def test_bad_flops_are_said_and_the_step_not_reported(self):
        r = run("""
            import lockstep
            for bad in (-1, float("nan"), float("inf"), "1e9", 1e30, True):
                lockstep.step(samples=8, flops=bad)
            lockstep.step(samples=8, flops=0)
        """, self.receiver.env())
        (good,) = self.steps(r, 1)
        self.assertEqual((good.step, good.flops, good.flops_basis), (1, 0.0, DECLARED))
        self.assertEqual(r.stderr.count("lockstep: step not reported: flops is "), 6, r.stderr)
        for said in ("flops is -1, not a finite number >= 0", "flops is nan", "flops is inf", "flops is '1e9', not a number",
                     "flops is 1e+30, over 6.05e+22", "flops is True, not a number"):
            self.assertIn(said, r.stderr)

    def test_the_native_transport_carries_flops_their_basis_and_precision(self):
        r = run(CONV_AND_LINEAR + """
model = lockstep.watch(Net().to(torch.bfloat16))
model(torch.randn(2, 3, 8, 8, dtype=torch.bfloat16)).sum().backward()
lockstep.step(samples=2)
lockstep.step(samples=2, flops=5e9)
""", dict(self.receiver.env(), LOCKSTEP_PYTHON_TRANSPORT="native"))
        layers, declared = self.steps(r, 2)
        self.assertEqual((layers.flops, layers.flops_basis, layers.precision), (3 * conv_and_linear_flops(2), LAYERS, BF16))
        self.assertEqual((declared.flops, declared.flops_basis, declared.precision), (5e9, DECLARED, BF16))


if __name__ == "__main__":
    unittest.main()
