"""The README's GEMM (see docs/design.md): a shared-memory pipelined f16 GEMM with f32
accumulation.

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


def main() -> None:
    """Emulate this kernel and the library's other GEMM dataflows on odd shapes."""
    import numpy as np

    from tegula.build import emulate
    from tegula.dtypes import i8
    from tegula.kernels.common import random_input
    from tegula.kernels.gemm import gemm_emulated

    rng = np.random.default_rng(0)
    a, b = random_input(rng, (97, 72), f16), random_input(rng, (130, 72), f16)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    # One f16 ulp of the result plus the worst f32 accumulation error over K = 72.
    bound = 2.0 ** -10 * np.abs(ref) + 72 * 2.0 ** -24 * (np.abs(a) @ np.abs(b).T)
    c = np.full((97, 130), np.nan, np.float16)
    emulate(gemm, (2, 3), a, b, c, BM=64, BN=64, BK=32)
    assert np.all(np.abs(c - ref) <= bound)
    print(f"README gemm (f16, shared pipeline):  max error {np.abs(c - ref).max():.3g}")
    c = gemm_emulated(a, b, shared=False)
    assert np.all(np.abs(c - ref) <= bound)
    print(f"register-only gemm (f16):            max error {np.abs(c - ref).max():.3g}")
    a, b = random_input(rng, (97, 72), i8), random_input(rng, (130, 72), i8)
    exact = a.astype(np.int64) @ b.astype(np.int64).T
    for shared in (True, False):
        assert np.array_equal(gemm_emulated(a, b, shared=shared), exact)
    print("i8 gemm -> i32 (both dataflows):    exact")


if __name__ == "__main__":
    main()
