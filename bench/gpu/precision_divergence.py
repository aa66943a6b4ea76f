"""How far lower precision drifts on the workloads of tests/gpu_test.cpp, to justify its
tolerances without a GPU (PyTorch on the CPU, similar synthetic data of 3700 samples, model
64-128-128-10, unshuffled):

1. fp32 against fp64: what rounding alone does, the scale of any difference in the order of
   additions between the GPU's fp32 and the CPU backend's (Fp32SgdMatchesTheCpuBackend: ReLU, SGD
   lr 0.05 momentum 0.9, batch 256, 20 steps; Fp32GeluAdamW...: GELU, AdamW lr 0.001 wd 0.01,
   batch 512, 16 steps). The tests allow 1e-4.
2. bf16 against fp32 (Bf16TracksFp32): autocast (bf16 GEMM inputs and activations, fp32
   accumulation and master weights, tanh GELU as cuBLASLt's epilogue computes it) against fp32 with
   the exact GELU; GELU, SGD lr 0.05 momentum 0.9, batch 256, 200 steps. Largest relative
   difference of 20-step loss means, of single steps, and of the final weights. The test allows 3%.

    /usr/bin/python3 bench/gpu/precision_divergence.py
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(3)
N = 3700
MEANS = torch.randn(10, 64)
Y = torch.randint(0, 10, (N,))
X = MEANS[Y] * 0.35 + torch.randn(N, 64)


def train(activation, optimizer, batch, steps, seed, dtype=torch.float32, bf16=False):
    torch.manual_seed(seed)
    act = {"relu": nn.ReLU(), "gelu": nn.GELU(), "gelu-tanh": nn.GELU(approximate="tanh")}[activation]
    m = nn.Sequential(nn.Linear(64, 128), act, nn.Linear(128, 128), act, nn.Linear(128, 10)).to(dtype)
    opt = (torch.optim.AdamW(m.parameters(), lr=0.001, weight_decay=0.01) if optimizer == "adamw"
           else torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9))
    losses, per_epoch = [], -(-N // batch)
    for step in range(steps):
        s = (step % per_epoch) * batch
        xb, yb = X[s:s + batch].to(dtype), Y[s:s + batch]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = m(xb)
        loss = F.cross_entropy(out.to(dtype), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, torch.cat([p.detach().double().flatten() for p in m.parameters()])


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


for name, activation, optimizer, batch, steps in (("sgd", "relu", "sgd", 256, 20), ("adamw", "gelu", "adamw", 512, 16)):
    for seed in (7, 8):
        a, wa = train(activation, optimizer, batch, steps, seed)
        b, wb = train(activation, optimizer, batch, steps, seed, dtype=torch.float64)
        print(f"fp32 vs fp64, {name}, seed {seed}: weights {rel(wa, wb):.1e}, "
              f"largest loss difference {max(abs(p - q) / q for p, q in zip(a, b)):.1e}")
for seed in (7, 8, 9):
    a, wa = train("gelu", "sgd", 256, 200, seed)
    b, wb = train("gelu-tanh", "sgd", 256, 200, seed, bf16=True)
    windows = [(sum(a[w:w + 20]) / 20, sum(b[w:w + 20]) / 20) for w in range(0, 200, 20)]
    print(f"bf16 vs fp32, seed {seed}: loss {a[0]:.3f} -> {a[-1]:.3f}; 20-step means within "
          f"{max(abs(q - p) / p for p, q in windows):.2%}, single steps within "
          f"{max(abs(q - p) / p for p, q in zip(a, b)):.2%}, weights {rel(wb, wa):.2%}")
