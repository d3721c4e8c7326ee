"""A grouped (MoE-style) GEMM whose row segments come from scalar loads: expert e
multiplies rows bounds[e, 0] … bounds[e, 1]-1 of `a` by its own weight `b[e]`. The segment
lengths do not divide the tile, one is empty, and the segments are laid out in reverse
order of the experts, so a tile that wrote past its segment's end would overwrite rows of
an expert that ran before it in the emulator — the check of every element would see it."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import f16, f32, i32


@tg.kernel(threads=128)
def grouped_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16, 3], c: tg.Tensor[f16],
                 bounds: tg.Tensor[i32], BM: tg.constexpr = 32, BN: tg.constexpr = 32,
                 BK: tg.constexpr = 32):
    e, n = tg.block_id(0), tg.block_id(1)
    start, end = bounds[e, 0], bounds[e, 1]
    rows_a, rows_c = a[start:end, :], c[start:end, :]   # views of run-time extent
    sa = tg.shared((BM, BK), f16, stages=2)
    sb = tg.shared((BN, BK), f16, stages=2)
    gb = b[e, :, :].tile((BN, BK), (n, None))
    for m in tg.range(tg.cdiv(end - start, BM)):
        ga = rows_a.tile((BM, BK), (m, None))
        acc = tg.zeros((BM, BN), f32)
        for k in tg.pipeline(ga.shape[2], stages=2):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc.to(f16), rows_c.tile((BM, BN), (m, n)))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_grouped_gemm_segments_from_scalar_loads(target):
    rng = np.random.default_rng(4)
    k, n = 40, 50
    bounds = np.array([[63, 100], [37, 63], [37, 37], [0, 37]], np.int32)
    a = rng.standard_normal((104, k)).astype(np.float16)    # rows 100-103: no expert
    b = rng.standard_normal((4, n, k)).astype(np.float16)
    c = np.full((104, n), 7.0, np.float16)
    tg.emulate(grouped_gemm, (4, 2), a, b, c, bounds, target=target, check_coverage=False)
    expect = np.full((104, n), 7.0)
    bound = np.zeros((104, n))
    for e, (lo, hi) in enumerate(bounds):
        ref = a[lo:hi].astype(np.float64) @ b[e].astype(np.float64).T
        expect[lo:hi] = ref
        bound[lo:hi] = 2.0 ** -10 * np.abs(ref) + k * 2.0 ** -24 * (
            np.abs(a[lo:hi]).astype(np.float64) @ np.abs(b[e]).astype(np.float64).T)
    assert np.all(np.abs(c - expect) <= bound)
