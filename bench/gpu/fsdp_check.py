"""Issue 42 on the GPU machine: PyTorch FSDP's collectives (all-gather, reduce-scatter) and a
program's own NCCL all-reduce, seen by the lockstep package's wrappers with CUDA events (Debian's
PyTorch 1.13 cannot import FSDP: docs/own-program.md, Known issues).

One process, one GPU, world size 1 over NCCL (the GPU machine has one GPU). It runs the
instrumentation without an agent: each step's record is taken from the package's own accounting
(_collectives.Steps), read once its CUDA events completed, and held against the program's own CUDA
events around the same calls. Prints one JSON line; exits 1 when a check fails.

    $PY bench/gpu/fsdp_check.py          (device_check.sh runs it with the bundle's package)
"""

import json
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.environ.get("LOCKSTEP_PYTHON_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "python")))
from lockstep import _collectives  # noqa: E402

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29641")
dist.init_process_group("nccl", rank=0, world_size=1)
torch.cuda.set_device(0)
instrumented = _collectives.install()
NAMES = {v: k for k, v in vars(_collectives).items() if k.isupper() and isinstance(v, int) and 1 <= v <= 10}


def take_steps(body, steps):
    """Runs `body` `steps` times; returns each step's collectives by kind, read from its events."""
    records = []
    for _ in range(steps):
        body()
        records.append(instrumented.steps.close())
    torch.cuda.synchronize()
    out = []
    for totals, spans, gpu in records:
        assert _collectives.gpu_ready(gpu), "events not complete after synchronize"
        _collectives.add_gpu(totals, spans, gpu)
        out.append({NAMES[k]: {"count": t[0], "time_ms": t[1] * 1e3, "exposed_ms": t[2] * 1e3, "bytes": t[3]}
                    for k, t in totals.items()})
    return out


def own_all_reduce():
    """A program's own blocking all-reduce of 256 MiB, timed by its own events on the same stream."""
    x = torch.ones(64 << 20, device="cuda")
    own = []

    def body():
        began, ended = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        began.record()
        dist.all_reduce(x)
        ended.record()
        own.append((began, ended))

    seen = take_steps(body, 10)
    own_ms = [b.elapsed_time(e) for b, e in own]
    return seen, own_ms


def sharded_by_hand():
    """FSDP's two collectives called as FSDP2 calls them (world size 1 turns FSDP1's FULL_SHARD into
    NO_SHARD, which all-reduces): an all-gather on the training loop's stream, then a reduce-scatter
    on a stream of its own, which the wrappers time but count as hidden."""
    shard = torch.ones(16 << 20, device="cuda")
    full = torch.empty(16 << 20, device="cuda")
    side = torch.cuda.Stream()

    def body():
        dist.all_gather_into_tensor(full, shard)
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            dist.reduce_scatter_tensor(shard, full)
        torch.cuda.current_stream().wait_stream(side)

    return take_steps(body, 10)


def fsdp_steps():
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = torch.nn.Sequential(*[torch.nn.Linear(2048, 2048) for _ in range(8)]).cuda()
    model = FSDP(model, forward_prefetch=True, use_orig_params=True)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(512, 2048, device="cuda")

    def body():
        loss = model(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()

    return take_steps(body, 10)


failures = []
seen, own_ms = own_all_reduce()
for step, ms in zip(seen[2:], own_ms[2:]):
    got = step.get("ALL_REDUCE", {})
    if got.get("bytes") != (64 << 20) * 4 or abs(got.get("exposed_ms", 0) - ms) > 0.05 + 0.2 * ms:
        failures.append(("own all-reduce", got, ms))
by_hand = sharded_by_hand()
for step in by_hand[2:]:
    gather, scatter = step.get("ALL_GATHER", {}), step.get("REDUCE_SCATTER", {})
    if gather.get("bytes") != (16 << 20) * 4 or not gather.get("exposed_ms", 0) > 0:
        failures.append(("all-gather on the loop's stream: exposed", gather))
    if scatter.get("count") != 1 or scatter.get("exposed_ms") != 0 or not scatter.get("time_ms", 0) > 0:
        failures.append(("reduce-scatter on a side stream: timed, hidden", scatter))
fsdp = []
try:
    fsdp = fsdp_steps()
    if not any(fsdp[2:]):
        failures.append(("FSDP issued no collective that the wrappers saw", fsdp[-1]))
except Exception as e:  # reported, not a failure of ours: which FSDP the machine's PyTorch has differs
    fsdp = [{"error": repr(e)}]
print(json.dumps({"torch": torch.__version__, "own_all_reduce": {"seen": seen[-1], "own_ms": own_ms[-1]},
                  "sharded_by_hand": by_hand[-1], "fsdp_last_step (world size 1: NO_SHARD)": fsdp[-1] if fsdp else None,
                  "failures": [repr(f) for f in failures]}))
dist.destroy_process_group()
sys.exit(1 if failures else 0)
