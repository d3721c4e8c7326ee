"""A GEMM with a fused epilogue: `c = silu(a @ b.T + bias)`, in one kernel.

The main loop is the README's pipelined GEMM; the epilogue runs on the f32 accumulator
while it is still in registers — the (1, BN) bias tile broadcasts over the block's rows,
and SiLU is elementwise — so the bias-add and the activation cost no extra pass over c.
Synthesis gives the bias the accumulator's layout projected to one row, so each thread
loads exactly the bias values its accumulator registers need.

    python examples/gemm_epilogue.py
    tegula explain examples/gemm_epilogue.py:gemm_bias_silu -D BM=64 -D BN=64
"""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula import f16, f32


@tg.kernel(threads=128)
def gemm_bias_silu(a: tg.Tensor[f16], b: tg.Tensor[f16], bias: tg.Tensor[f16],
                   c: tg.Tensor[f16], BM: tg.constexpr = 128, BN: tg.constexpr = 128,
                   BK: tg.constexpr = 32, STAGES: tg.constexpr = 3):
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))            # (BM, BK, K/BK)
    gb = b.tile((BN, BK), (n, None))            # b is N x K
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])              # acc += sa @ sb.T
    # Epilogue, in registers: + bias (one row, broadcast), then SiLU, then one f16 store.
    z = acc + tg.load(bias.tile((1, BN), (0, n))).to(f32)
    tg.copy((z * tg.sigmoid(z)).to(f16), c.tile((BM, BN), (m, n)))


def gemm_bias_silu_emulated(a: np.ndarray, b: np.ndarray, bias: np.ndarray,
                            BM: int = 64, BN: int = 64) -> np.ndarray:
    """Run the kernel in the emulator: a (M, K), b (N, K), bias (N,), all float16."""
    (m, _), n = a.shape, b.shape[0]
    c = np.full((m, n), np.nan, np.float16)     # poison: every element must be written
    tg.emulate(gemm_bias_silu, (tg.cdiv(m, BM), tg.cdiv(n, BN)), a, b, bias[None, :], c,
               BM=BM, BN=BN, BK=32, STAGES=2)
    return c


def main(m: int = 97, n: int = 130, k: int = 72) -> None:
    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    bias = (rng.standard_normal(n) * 4).astype(np.float16)
    c = gemm_bias_silu_emulated(a, b, bias).astype(np.float64)
    z = a.astype(np.float64) @ b.astype(np.float64).T + bias.astype(np.float64)
    ref = z / (1.0 + np.exp(-z))
    # f32 accumulation over K (k ulps of the |a|·|b| sum) moves z, SiLU's slope (< 1.1)
    # carries it through; then one f16 rounding of the result.
    dz = k * 2.0 ** -24 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T)
    bound = 1.1 * dz + 2.0 ** -11 * np.abs(ref) + 1e-6 + 2.0 ** -22 * np.abs(z)
    err = np.abs(c - ref)
    assert np.all(err <= bound), f"max error {err.max():.3g}"
    print(f"gemm + bias + silu {m}x{n}x{k} ok, max abs error {err.max():.3g}")


if __name__ == "__main__":
    main()
