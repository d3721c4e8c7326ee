"""The README's GEMM as a test fixture: one definition for the test files that build,
explain, emulate or launch it (they each held a copy with their own tiles and types).

`readme_gemm(...)` returns a *fresh* `tg.Kernel` on every call (nothing cached between
builds of two calls), so a test may make its own. Import it from a test file with

    sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
    from gemm_fixtures import readme_gemm  # noqa: E402

(the suite imports test files with `--import-mode=importlib`, which puts no test folder
on `sys.path`).
"""
import tegula as tg
from tegula import f16, f32


def readme_gemm(dtype=f16, acc_dtype=f32, out_dtype=None, *, b_dtype=None, BM=128, BN=128,
                BK=32, STAGES=3, threads=128, warp_specialize=None, bm_choices=None,
                bn_choices=None, name="gemm"):
    """The README GEMM: c = a @ b.T over a `tg.pipeline` K loop of STAGES shared stages.

    `dtype` is a's (and its shared buffer's) type, `b_dtype` b's (default: `dtype`),
    `acc_dtype` the accumulator's and `out_dtype` c's (default: `dtype`; the accumulator
    is rounded to it with `.to` where the two differ). The keywords are the constexprs' defaults (`bm_choices` /
    `bn_choices`: `tg.constexpr(choices=...)` for BM / BN, their first value the default),
    the block's threads, `@tg.kernel`'s `warp_specialize` and the kernel's name."""
    out_dtype = dtype if out_dtype is None else out_dtype
    b_dtype = dtype if b_dtype is None else b_dtype
    bm_type = tg.constexpr(choices=bm_choices) if bm_choices else tg.constexpr
    bn_type = tg.constexpr(choices=bn_choices) if bn_choices else tg.constexpr
    BM = bm_choices[0] if bm_choices else BM
    BN = bn_choices[0] if bn_choices else BN

    def gemm(a: tg.Tensor[dtype], b: tg.Tensor[b_dtype], c: tg.Tensor[out_dtype],
             BM: bm_type = BM, BN: bn_type = BN, BK: tg.constexpr = BK,
             STAGES: tg.constexpr = STAGES):
        m, n = tg.block_id(0), tg.block_id(1)
        ga = a.tile((BM, BK), (m, None))            # (BM, BK, K/BK) view of a's rows
        gb = b.tile((BN, BK), (n, None))            # b is N x K
        acc = tg.zeros((BM, BN), acc_dtype)
        sa = tg.shared((BM, BK), dtype, stages=STAGES)
        sb = tg.shared((BN, BK), b_dtype, stages=STAGES)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])              # acc += sa @ sb.T
        tg.copy(acc if acc_dtype == out_dtype else acc.to(out_dtype),
                c.tile((BM, BN), (m, n)))

    gemm.__name__ = gemm.__qualname__ = name
    return tg.kernel(threads=threads, warp_specialize=warp_specialize)(gemm)
