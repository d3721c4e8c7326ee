"""The cost model's tensor time is the block's multiply-accumulates at the SM's tensor
rate, for mma.sync (four sub-partitions' tensor cores) and for wgmma (one warpgroup
instruction drives all four): the wgmma issue cycles are already the whole SM's, and
dividing them by the sub-partitions again made sm_90a GEMMs look four times faster."""
from __future__ import annotations

import pytest

from tegula.build import build
from tegula.dtypes import f16
from tegula.kernels.gemm import gemm_kernel
from tegula.synth.cost import estimate

SHAPES = {"a": (1000, 968), "b": (744, 968), "c": (1000, 744)}  # K = 968: ragged k tiles


@pytest.mark.parametrize("target,rate", [("sm_80", "tensor_rate"), ("sm_90a", "wgmma_rate")])
def test_tensor_cycles_are_fmas_at_the_sm_rate(target, rate):
    bm, bn, bk = 128, 128, 32
    b = build(gemm_kernel(f16), {"BM": bm, "BN": bn, "BK": bk}, None, target)
    grid = (-(-1000 // bm), -(-744 // bn))
    cost = estimate(b, grid, SHAPES)
    k_steps = -(-968 // bk)
    fmas = bm * bn * bk * k_steps              # boundary tiles count as full tiles
    assert cost.flops == 2 * fmas
    assert cost.tensor_cycles == fmas / getattr(b.target, rate)("f16")
