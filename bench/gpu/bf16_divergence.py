"""How far bf16 training drifts from fp32 on the workload of tests/gpu_test.cpp's Bf16TracksFp32,
to justify its tolerances without a GPU: PyTorch's CPU autocast (bf16 GEMM inputs and activations,
fp32 accumulation and master weights, tanh GELU as cuBLASLt's epilogue computes it) against fp32
with the exact GELU, same model (64-128-128-10), SGD (lr 0.05, momentum 0.9), batch 256, 200
steps, unshuffled data of 3700 samples. Prints, per seed, the largest relative difference of
20-step loss means, of single steps, and of the final weights (relative L2).

    /usr/bin/python3 bench/gpu/bf16_divergence.py
"""
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(3)
n, d, c = 3700, 64, 10
means = torch.randn(c, d)
y = torch.randint(0, c, (n,))
x = means[y] * 0.35 + torch.randn(n, d)
def run(bf16, seed):
    torch.manual_seed(seed)
    m = nn.Sequential(nn.Linear(64,128), nn.GELU(approximate='tanh' if bf16 else 'none'), nn.Linear(128,128),
                      nn.GELU(approximate='tanh' if bf16 else 'none'), nn.Linear(128,10))
    opt = torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)
    losses = []
    per_epoch = -(-n // 256)
    for step in range(200):
        s = (step % per_epoch) * 256
        xb, yb = x[s:s+256], y[s:s+256]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            out = m(xb)
        loss = F.cross_entropy(out.float(), yb, reduction='sum')
        opt.zero_grad(); loss.backward()
        for p in m.parameters(): p.grad /= len(yb)
        opt.step()
        losses.append(loss.item() / len(yb))
    return losses, torch.cat([p.detach().flatten() for p in m.parameters()])
for seed in (7, 8, 9):
    a, wa = run(False, seed); b, wb = run(True, seed)
    win = [(sum(a[w:w+20])/20, sum(b[w:w+20])/20) for w in range(0, 200, 20)]
    rel = [abs(q-p)/p for p, q in win]
    print(f"seed {seed}: fp32 {a[0]:.3f}->{a[-1]:.3f}; window rel diffs max {max(rel):.4f} at {rel.index(max(rel))}; abs max {max(abs(q-p) for p,q in win):.4f}; weights rel L2 {((wa-wb).norm()/wa.norm()).item():.4f}; per-step max rel {max(abs(q-p)/p for p,q in zip(a,b)):.4f}")
