"""Launch the example GEMM once at 4096^3 (for `ncu` to profile)."""
from __future__ import annotations

import sys

import torch

sys.path.insert(0, "examples")
import tegula as tg  # noqa: E402
from gemm import gemm  # noqa: E402

size = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
cfg = dict(BM=128, BN=128, BK=32, STAGES=4)
a = torch.randn(size, size, device="cuda", dtype=torch.float16)
b = torch.randn(size, size, device="cuda", dtype=torch.float16)
c = torch.empty(size, size, device="cuda", dtype=torch.float16)
grid = (tg.cdiv(size, 128), tg.cdiv(size, 128))
for _ in range(3):
    gemm[grid](a, b, c, **cfg)
torch.cuda.synchronize()
