"""The GEMM of DESIGN.md: a shared-memory pipelined f16 GEMM with f32 accumulation.

c = a @ b.T, with a (M, K) and b (N, K) both K-major. Every layout, swizzle and
instruction is synthesized: run `tegula explain examples/gemm.py:gemm` to see them.
"""
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
