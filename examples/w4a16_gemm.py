"""W4A16 GEMM: f16 activations times 4-bit weights with per-group scales and zero points,
`c = a @ ((w_q - zeros) * scales).T`, written as "dequantize, then gemm".

    python examples/w4a16_gemm.py

Each k-step loads a (BN, BK) tile of packed 4-bit weights (tegula's u4: two a byte, the
low nibble first), dequantizes it in registers with its group's scale and zero point
(one multiply-add per weight: w·s − z·s), stores it to a shared f16 tile and multiplies
it with the activation tile on the tensor cores; the activation tiles are copied ahead in
a 3-stage pipeline. `tg.gemm` takes operands of one type, so the kernel dequantizes first.
The library's version (`tegula.kernels.matmul_w4a16` on torch tensors,
`w4a16_gemm_emulated` on numpy ones) loads each k-step's weights one step early, adds a
CUDA-core kernel for decode (M ≤ 8) that streams the weights once with 16-byte loads, and
from 9 rows a swapped kernel (`w4a16_swapped_kernel`: cᵀ = dequant(w)·aᵀ, the weights as
the MMA's A operand and up to 128 tokens as its N):

    packed, scales, zeros = tegula.kernels.quantize_w4(w, group_size=128)
    c = tegula.kernels.matmul_w4a16(a, packed, scales, zeros, 128)
"""
from __future__ import annotations

import numpy as np

import tegula as tg
from tegula import f16, f32, u4


@tg.kernel(threads=128)
def w4a16_gemm(a: tg.Tensor[f16], w: tg.Tensor[u4], scales: tg.Tensor[f16],
               zeros: tg.Tensor[f16], c: tg.Tensor[f16], G: tg.constexpr = 128,
               BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 64,
               STAGES: tg.constexpr = 3):
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))                 # (BM, BK, K/BK)
    gw = w.tile((BN, BK), (n, None))                 # 4-bit weights, (N, K) elements
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sw = tg.shared((BN, BK), f16, stages=STAGES)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        group = k // (G // BK)                       # BK divides the group size
        scale = tg.load(scales.tile((BN, 1), (n, group))).to(f32)   # one per row
        zero = tg.load(zeros.tile((BN, 1), (n, group))).to(f32)
        weights = tg.load(gw[:, :, k]).to(f32) * scale - zero * scale
        tg.copy(weights.to(f16), sw[k])
        tg.gemm(acc, sa[k], sw[k])                   # acc += sa @ sw.T
    tg.copy(acc.to(f16), c.tile((BM, BN), (m, n)))


def main(m: int = 70, n: int = 100, k: int = 256, group: int = 64) -> None:
    from tegula.kernels import prepack, quantize_w4, unpack_w4, w4a16_gemm_emulated
    from tegula.kernels.quant import dequantize_w4

    rng = np.random.default_rng(0)
    a = rng.standard_normal((m, k)).astype(np.float16)
    w = (rng.standard_normal((n, k)) * 0.1).astype(np.float16)
    packed, scales, zeros = quantize_w4(w, group)    # (N, K/2) bytes, (N, K/G) f16 twice
    w_q = unpack_w4(packed)
    w_dequant = dequantize_w4(w_q, scales, zeros, group)
    ref = a.astype(np.float64) @ w_dequant.T
    scale = np.abs(a.astype(np.float64)) @ np.abs(w_dequant).T

    for target in ("sm_90a", "sm_80"):
        c = np.full((m, n), np.nan, np.float16)     # poisoned: unwritten elements fail
        tg.emulate(w4a16_gemm, (tg.cdiv(m, 64), tg.cdiv(n, 64)), a, prepack(w_q), scales,
                   zeros, c, G=group, target=target)
        # f16 rounding of each dequantized weight and of the output
        err = np.abs(c - ref)
        assert np.all(err <= 2.0 ** -10 * (np.abs(ref) + scale)), f"max error {err.max()}"
        print(f"w4a16 GEMM {m}x{n}x{k}, group {group}, {target}: ok, max error {err.max():.2e}")
    decode = w4a16_gemm_emulated(a[:1], w_q, scales, zeros, group)  # the rows kernel
    err = np.abs(decode - ref[:1])
    assert np.all(err <= 2.0 ** -10 * np.abs(ref[:1]) + 2.0 ** -16 * scale[:1])
    print(f"w4a16 decode 1x{n}x{k} (library): ok, max error {err.max():.2e}")


if __name__ == "__main__":
    main()
