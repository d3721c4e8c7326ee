"""Split-K (`kernels.gemm.gemm_split_k_kernel` + `split_k_reduce_kernel`, the tuner's
choice for few rows and long K) in the emulator against float64 numpy, every element:
M = 1, K shorter than one k-tile (splits with no k-tile at all add zeros), K not a
multiple of the tile, NaN and ±inf reaching the epilogue, which runs once after the
reduction; wgmma tiles (BM = 64) and mma.sync tiles (BM = 16) on sm_90a, and sm_80."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tegula.dtypes import bf16, f16
from tegula.kernels.gemm import gemm_emulated

sys.path.insert(0, os.path.dirname(__file__))
from test_matmul_epilogue import check_epilogue, operands  # noqa: E402

TILES = {"wgmma": dict(BM=64, BN=32, BK=16, STAGES=2),
         "mma": dict(BM=16, BN=64, BK=32, STAGES=3)}


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("tiles", sorted(TILES))
@pytest.mark.parametrize("m,n,k,split", [(1, 70, 200, 4), (37, 50, 9, 3), (20, 33, 100, 8),
                                         (65, 40, 64, 2)])
def test_split_k_with_the_epilogue_after_the_reduction(m, n, k, split, tiles, target):
    rng = np.random.default_rng(m * k + split)
    a, b, bias = operands(rng, m, n, k, f16)
    c = gemm_emulated(a, b, f16, split=split, bias=bias, activation="gelu", target=target,
                      **TILES[tiles])
    check_epilogue(c, a, b, bias, "gelu", f16)


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_split_k_nonfinite_values_and_bf16(target):
    """A NaN row of a is NaN in every column (in whichever split holds it); ±inf bias
    columns go through silu once (silu(-inf) is NaN in f64 as on the GPU: -inf · 0)."""
    rng = np.random.default_rng(2)
    m, n, k = 19, 40, 150
    a, b, bias = operands(rng, m, n, k, bf16, nonfinite=True)
    c = gemm_emulated(a, b, bf16, split=4, bias=bias, activation="silu", target=target,
                      **TILES["wgmma"])
    assert np.isnan(c[3, :]).all()
    check_epilogue(c, a, b, bias, "silu", bf16)
