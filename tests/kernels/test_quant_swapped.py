"""The swapped-orientation W4A16 kernel (cᵀ = dequant(w) @ aᵀ: the dequantized weight tile
is the MMA's A operand, the activations the shared B operand) in the emulator against a
float64 numpy reference: M = 1 … 128 tokens, ragged N and token tiles, every group size,
with and without zero points; weights straight into registers or through a shared ring
(WSMEM), the dequantized tile as a register or a shared A operand (ASMEM), split K
(SPLIT); both targets (wgmma with a TMA ring on sm_90a, in one role and warp-specialized;
mma.sync on sm_80), bf16, NaN and inf."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tegula.dtypes import bf16, f16
from tegula.errors import SynthesisError
from tegula.kernels.common import random_input
from tegula.kernels.quant import dequantize_w4, w4a16_config, w4a16_gemm_emulated

sys.path.insert(0, os.path.dirname(__file__))
from w4a16_checks import check_w4a16, random_w4  # noqa: E402

CASES = [  # m, n, k, group, zero_point, tiles
    (1, 37, 256, 128, True, dict(BT=16)),
    (5, 70, 192, 64, False, dict(BT=16, BK=32)),
    (16, 20, 96, 32, True, dict(BT=16, BK=32)),
    (33, 65, 256, 128, True, dict(BT=64, BK=128)),     # one token tile, 31 rows past M
    (33, 130, 256, 64, False, dict(BT=16)),            # 3 token tiles, the last ragged
    (128, 70, 128, 64, True, dict(BT=128)),
    (128, 64, 384, 128, False, dict(BT=64, BK=64, STAGES=2)),
    (17, 9, 64, 64, True, dict(BT=24, STAGES=1)),      # N < one weight tile, BT not 2^k
    # the packed weights through a shared ring (cp.async), read into the A fragment
    (16, 70, 512, 128, True, dict(BT=16, BK=128, STAGES=3, WSMEM=1)),
    (33, 130, 512, 64, False, dict(BT=32, STAGES=4, WSMEM=1)),
    (5, 64, 96, 32, True, dict(BT=16, BK=32, STAGES=8, WSMEM=1)),   # more stages than k-steps
    # the dequantized tile through shared memory (the MMA's A operand from there)
    (33, 130, 512, 64, True, dict(BT=64, STAGES=3, ASMEM=1)),
    (16, 20, 96, 32, False, dict(BT=16, BK=32, ASMEM=1)),
    # split K: f32 partial products in a workspace, then the sum kernel
    (33, 130, 512, 64, True, dict(BT=32, STAGES=4, SPLIT=3)),      # slices of 3, 3, 2 steps
    (16, 70, 256, 128, False, dict(BT=16, BK=128, STAGES=2, SPLIT=2, WSMEM=1)),
    (5, 64, 96, 32, True, dict(BT=16, BK=32, SPLIT=5)),            # two slices run no step
    (128, 70, 256, 128, True, dict(BT=128, ASMEM=1, SPLIT=2)),
]


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("m,n,k,group,zero_point,tiles", CASES)
def test_swapped_matches_numpy(m, n, k, group, zero_point, tiles, target):
    rng = np.random.default_rng(m * 7919 + n * 31 + k + group)
    a = random_input(rng, (m, k), f16)
    w_q, scales, zeros = random_w4(rng, n, k, group, f16, zero_point)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, group, target=target, **tiles)
    assert c.shape == (m, n) and c.dtype == np.float16
    check_w4a16(c, a, w_q, scales, zeros, group, f16, dequant_rounded=True)


@pytest.mark.parametrize("warp_specialize", [True, False])
@pytest.mark.parametrize("stages", [2, 4])
def test_swapped_tma_ring_in_one_role_and_with_a_producer(stages, warp_specialize):
    """sm_90a: the activation boxes in a ring of 2 or 4 stages over 7 k-steps (it wraps),
    issued by thread 0 between the wgmmas or by a producer warpgroup."""
    rng = np.random.default_rng(60 + stages)
    a = random_input(rng, (40, 224), f16)
    w_q, scales, zeros = random_w4(rng, 70, 224, 32, f16)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 32, target="sm_90a", BT=32, BK=32,
                            STAGES=stages, warp_specialize=warp_specialize)
    check_w4a16(c, a, w_q, scales, zeros, 32, f16, dequant_rounded=True)


def test_swapped_bf16():
    rng = np.random.default_rng(7)
    a = random_input(rng, (20, 128), bf16)
    w_q, scales, zeros = random_w4(rng, 66, 128, 64, bf16)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 64, dtype=bf16, BT=32)
    check_w4a16(c, a, w_q, scales, zeros, 64, bf16, dequant_rounded=True)


def test_swapped_scales_follow_their_group():
    """BK = 32 inside groups of 128: k-steps 0-3 take group 0's scale and zero, 4-7 group
    1's; scales far apart, so a mix-up cannot hide."""
    rng = np.random.default_rng(4)
    a = random_input(rng, (18, 512), f16)
    w_q, scales, zeros = random_w4(rng, 70, 512, 128, f16)
    scales[:, 1] *= 4
    scales[:, 3] *= 16
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 128, BT=32, BK=32)
    check_w4a16(c, a, w_q, scales, zeros, 128, f16, dequant_rounded=True)


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_swapped_nan_reaches_only_its_outputs(target):
    """A NaN scale poisons its weight row (a column of c), a NaN activation its token (a
    row of c); everything else stays right."""
    m, n = 20, 70
    rng = np.random.default_rng(12)
    a = random_input(rng, (m, 64), f16)
    w_q, scales, zeros = random_w4(rng, n, 64, 32, f16)
    scales[66, 1] = np.nan     # column 66 of c: in the second weight tile
    a[17, 5] = np.nan          # row 17 of c
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 32, target=target, BT=32)
    assert np.isnan(c[:, 66]).all() and np.isnan(c[17]).all()
    rows, cols = np.arange(m) != 17, np.arange(n) != 66
    check_w4a16(c[rows][:, cols], a[rows], w_q[cols], scales[cols], zeros[cols], 32, f16,
                dequant_rounded=True)


def test_swapped_inf_activation_gives_inf_or_nan_only_in_its_row():
    """+inf meets dequantized weights of both signs (and zero: (w - z) = 0 gives NaN, as
    in numpy): that token's row matches numpy's infinities and NaNs, the rest is finite."""
    rng = np.random.default_rng(5)
    a = random_input(rng, (9, 128), f16)
    w_q, scales, zeros = random_w4(rng, 12, 128, 64, f16)
    w_q[3, 7] = zeros[3, 0]    # a dequantized zero meets the inf: NaN in column 3
    a[4, 7] = np.inf
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 64, BT=16)
    w = dequantize_w4(w_q, scales, zeros, 64)
    with np.errstate(invalid="ignore"):
        ref = a.astype(np.float64) @ w.T
    assert np.isnan(ref[4, 3])
    for check in (np.isposinf, np.isneginf, np.isnan):
        assert np.array_equal(check(c[4]), check(ref[4]))
    keep = np.arange(9) != 4
    check_w4a16(c[keep], a[keep], w_q, scales, zeros, 64, f16, dequant_rounded=True)


def test_swapped_config_and_its_errors():
    kind, grid, c = w4a16_config(100, 4096, 4096, 128, BT=64)
    assert kind == "swapped" and grid == (64, 2) and c["BK"] == 64 and c["BN"] == 64
    assert w4a16_config(3, 100, 256, 32, BT=16)[1:] == ((2, 1), dict(
        G=32, BN=64, BT=16, BK=32, STAGES=3))
    with pytest.raises(ValueError, match="BK=128 must divide the group size 64"):
        w4a16_config(16, 64, 128, 64, BT=16, BK=128)
    with pytest.raises(ValueError, match="WSMEM=1 and ASMEM=1 together are not supported"):
        w4a16_config(16, 64, 128, 64, BT=16, WSMEM=1, ASMEM=1)
    rng = np.random.default_rng(2)
    a = random_input(rng, (5, 64), f16)
    w_q, scales, zeros = random_w4(rng, 8, 64, 32, f16)
    with pytest.raises(SynthesisError, match=r"64x12 C tile does not split"):
        w4a16_gemm_emulated(a, w_q, scales, zeros, 32, BT=12)


@pytest.mark.parametrize("m,group", [(16, 32), (100, 128)])
def test_every_swapped_candidate_runs(m, group):
    """Each swapped config the torch entry point's tuner may pick, emulated on sm_90a at a
    shape that divides no tile."""
    from tegula.kernels.quant import w4a16_candidates
    rng = np.random.default_rng(m + group)
    a = random_input(rng, (m, 2 * group), f16)
    w_q, scales, zeros = random_w4(rng, 70, 2 * group, group, f16)
    swapped = [t for t in w4a16_candidates(m, group) if "BT" in t]
    assert swapped
    for tiles in swapped:
        c = w4a16_gemm_emulated(a, w_q, scales, zeros, group, **tiles)
        check_w4a16(c, a, w_q, scales, zeros, group, f16, dequant_rounded=True)
