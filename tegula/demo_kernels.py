"""Kernels `tegula demo` compiles: the GEMM of DESIGN.md, shipped inside the package so
the demo works from an installed tegula (examples/ is not installed).

c = a @ b.T with a (M, K) and b (N, K) both K-major, f16 in, f32 accumulation, f16 out;
a shared-memory pipelined mainloop whose every layout, swizzle and instruction is
synthesized. The same kernel as examples/gemm.py.
"""
from __future__ import annotations

import tegula as tg
from tegula import f16, f32


@tg.kernel(threads=128)
def gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
         BM: tg.constexpr = 128, BN: tg.constexpr = 128, BK: tg.constexpr = 32,
         STAGES: tg.constexpr = 3):
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))            # (BM, BK, K/BK) view of rows m*BM...
    gb = b.tile((BN, BK), (n, None))            # b is N x K (both operands K-major)
    acc = tg.zeros((BM, BN), f32)               # register tile; layout inferred
    sa = tg.shared((BM, BK), f16, stages=STAGES)   # shared tiles; layout + swizzle inferred
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])              # acc += sa @ sb.T
    tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


__all__ = ["gemm"]
