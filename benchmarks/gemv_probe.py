"""One launch each of a GEMV's yardsticks and kernels, for a profiler (ncu) to measure:
torch's `x @ w.T`, a clone of half of w (the same bytes moved), `w.sum()` (w read once) and
`gemv_kernel` at its default configuration for one row, N x K from argv (default 4096²).

    ncu --clock-control none --metrics gpu__time_duration.sum,dram__bytes_read.sum \
        python benchmarks/gemv_probe.py 4096x4096
"""
from __future__ import annotations

import sys

import torch

from tegula.dtypes import f16
from tegula.kernels.gemv import gemv_config, gemv_kernel

n, k = (int(s) for s in (sys.argv[1] if len(sys.argv) > 1 else "4096x4096").split("x"))
x = torch.randn(1, k, device="cuda", dtype=torch.float16)
w = torch.randn(n, k, device="cuda", dtype=torch.float16)
y = torch.empty(1, n, device="cuda", dtype=torch.float16)
grid, constexprs = gemv_config(1, n, k)
kernel = gemv_kernel(f16)
for _ in range(2):  # the second round runs warm (compiled, cuBLAS's handle made)
    x @ w.T
    w.view(-1)[: n * k // 2].clone()
    w.sum(dtype=torch.float32)
    kernel[grid](x, w, y, **constexprs)
torch.cuda.synchronize()
print("gemv_probe done", n, k, constexprs)
