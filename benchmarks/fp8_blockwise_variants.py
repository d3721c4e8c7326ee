"""Measurement-only variants of the blockwise FP8 persistent kernel (session 11, issue 10),
to find what keeps it below the per-tensor kernel. Each variant is `kernels/fp8.py`'s
`blockwise_product` with one thing changed (MODE):

* "base": the library's product (scales loaded from global memory in the K block that uses
  them, right after its stage lands);
* "noscale": no scale loads, the promotion is `acc += part` -- an ablation, right only for
  unit scales (the benchmark runs it with all scales 1 and checks it against that
  reference): what the scale loads cost;
* "tilescale": the promotion `acc += part * s` with one scale loaded per output tile (no
  loads in the K loop) -- the same ablation of the loads that keeps the multiply-adds
  ("noscale" lets ptxas accumulate straight into `acc`: the per-tensor kernel's code);
* "ahead": a K block's scales loaded one iteration earlier and carried.

Used by `benchmarks/fp8_blockwise.py --variants`; nothing here is a library kernel.
"""
from __future__ import annotations

from functools import lru_cache

import tegula as tg
from tegula import f32
from tegula.dtypes import DType, f8e4m3
from tegula.kernels.fp8 import SCALE_BLOCK, blockwise_buffers
from tegula.kernels.gemm import persistent_tiles

MODES = ("base", "noscale", "tilescale", "ahead")


def variant_product(a, b, scale_a, scale_b, m, n, BM: int, BN: int, STAGES: int,
                    buffers: tuple, mode: str):
    """`kernels.fp8.blockwise_product` with `mode`'s change (module docstring)."""
    sa, sb = buffers
    ga = a.tile((BM, SCALE_BLOCK), (m, None))
    gb = b.tile((BN, SCALE_BLOCK), (n, None))
    row_scales = scale_a.tile((BM, 1), (m, None))
    block_scales = scale_b.tile((1, 1), ((n * BN) // SCALE_BLOCK, None))

    def scales_of(k):
        return tg.load(row_scales[:, :, k]) * tg.load(block_scales[:, :, k])

    acc = tg.zeros((BM, BN), f32)
    ahead = scales_of(0) if mode == "ahead" else None
    if mode == "tilescale":
        scale = scales_of(0)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        if mode == "ahead":     # the last iteration reloads its own block's (clamped)
            scale, ahead = ahead, scales_of(tg.minimum(k + 1, ga.shape[2] - 1))
        elif mode == "base":
            scale = scales_of(k)
        part = tg.zeros((BM, BN), f32)
        tg.gemm(part, sa[k], sb[k])
        if mode == "noscale":
            acc += part
        else:
            acc += part * scale
    return acc


@lru_cache(maxsize=None)
def variant_kernel(out_t: DType, mode: str) -> tg.Kernel:
    """The persistent blockwise kernel (`fp8_blockwise_persistent_kernel`'s walk) around
    `variant_product` in `mode`."""
    if mode not in MODES:
        raise ValueError(f"fp8_blockwise_variants: mode {mode!r}, one of {MODES}")

    @tg.kernel(threads=128)
    def fp8_blockwise_variant(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3],
                              scale_a: tg.Tensor[f32], scale_b: tg.Tensor[f32],
                              c: tg.Tensor[out_t], BM: tg.constexpr = 128,
                              BN: tg.constexpr = 128, STAGES: tg.constexpr = 4,
                              GROUP: tg.constexpr = 8, CLUSTER: tg.constexpr = 1):
        def make_product():
            buffers = blockwise_buffers(BM, BN, STAGES)
            return lambda m, n: variant_product(a, b, scale_a, scale_b, m, n, BM, BN,
                                                STAGES, buffers, mode)

        def finish(acc, m, n):
            tg.copy(acc.to(out_t), c.tile((BM, BN), (m, n)))
        persistent_tiles(a, b, f8e4m3, BM, BN, SCALE_BLOCK, STAGES, GROUP, finish, CLUSTER,
                         make_product)

    return fp8_blockwise_variant
