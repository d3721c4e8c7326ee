"""Launch the RMSNorm and copy entry points once each (for `ncu` to profile).

    PYTHONPATH=. ncu ... python3 benchmarks/memory_profile.py
"""
from __future__ import annotations

import torch

import tegula.kernels as tk

x = torch.randn(4096, 4096, device="cuda", dtype=torch.float16)
w = torch.randn(4096, device="cuda", dtype=torch.float16)
big = torch.randn(8192, 8192, device="cuda", dtype=torch.float16)
for _ in range(2):  # the first call tunes; the second is the one worth profiling
    tk.rms_norm(x, w)
    tk.copy(big)
    torch.nn.functional.rms_norm(x, (4096,), w)
torch.cuda.synchronize()
