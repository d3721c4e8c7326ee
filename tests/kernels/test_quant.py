"""W4A16 (4-bit weights in groups, f16/bf16 activations) in the emulator against a float64
numpy reference: both kernels (the CUDA-core rows kernel for M ≤ 8, dequantize-to-shared
GEMM beyond), every group size, with and without zero points, both targets, shapes that
divide no tile; the host-side quantization and packing; NaN; and the argument checks."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tegula.dtypes import bf16, f16
from tegula.kernels.common import random_input
from tegula.kernels.quant import (GROUP_SIZES, MAX_ROWS_KERNEL_M, SYMMETRIC_ZERO,
                                  dequantize_w4, prepack, quantize_w4, unpack_w4,
                                  w4a16_config, w4a16_gemm_emulated)

sys.path.insert(0, os.path.dirname(__file__))
from w4a16_checks import check_w4a16, random_w4  # noqa: E402,F401 — used here and imported from here


def rounds_weights(m: int, tiles: dict = {}) -> bool:  # noqa: B006 — read only
    """Whether the kernel chosen for m rows rounds the dequantized weights to the MMA's
    operand type (the GEMM and swapped kernels) or keeps them in f32 (the rows kernel)."""
    return m > MAX_ROWS_KERNEL_M or "BM" in tiles or "BT" in tiles


CASES = [  # m, n, k, group, zero_point
    (1, 37, 256, 128, True), (3, 50, 192, 64, False), (16, 20, 96, 32, True),
    (1, 5, 32, 32, False), (70, 40, 128, 32, True), (65, 70, 256, 128, False),
    (17, 9, 64, 64, True), (8, 29, 384, 128, True), (9, 13, 128, 64, False),
    (2, 300, 1152, 128, False), (129, 21, 128, 64, True),
]


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("m,n,k,group,zero_point", CASES)
def test_w4a16_matches_numpy(m, n, k, group, zero_point, target):
    rng = np.random.default_rng(m * 7919 + n * 31 + k + group)
    a = random_input(rng, (m, k), f16)
    w_q, scales, zeros = random_w4(rng, n, k, group, f16, zero_point)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, group, target=target)
    assert c.shape == (m, n) and c.dtype == np.float16
    check_w4a16(c, a, w_q, scales, zeros, group, f16, dequant_rounded=rounds_weights(m))


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("stages", [1, 2, 4])
def test_w4a16_gemm_pipeline_depths(stages, target):
    """The GEMM kernel's K loop: plain (1), and 2 or 4 stages of activation tiles copied
    ahead (TMA + a producer warpgroup on sm_90a) while the weights are dequantized into
    the same stage's shared tile; 7 k-steps so the ring wraps."""
    rng = np.random.default_rng(40 + stages)
    a = random_input(rng, (33, 224), f16)
    w_q, scales, zeros = random_w4(rng, 70, 224, 32, f16)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 32, target=target, STAGES=stages)
    check_w4a16(c, a, w_q, scales, zeros, 32, f16, dequant_rounded=True)


@pytest.mark.parametrize("m", [2, 40])
def test_w4a16_bf16(m):
    rng = np.random.default_rng(m)
    a = random_input(rng, (m, 128), bf16)
    w_q, scales, zeros = random_w4(rng, 33, 128, 64, bf16)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 64, dtype=bf16)
    check_w4a16(c, a, w_q, scales, zeros, 64, bf16, dequant_rounded=rounds_weights(m))


@pytest.mark.parametrize("tiles,m", [
    (dict(BN=1, S=2, R=1, UNROLL=2), 3),    # 4 threads of 128 per weight tile, 3 chunks
    (dict(BN=3, S=1, R=2, UNROLL=4), 1),    # odd BN, UNROLL past the last chunk
    (dict(BN=5, S=3, R=3, UNROLL=1, threads=32), 4),  # S not dividing K/G = 2
    (dict(BM=16, BN=32, BK=32), 20), (dict(BM=32, BN=32, BK=64), 5)])
def test_w4a16_tiles_smaller_than_the_block(tiles, m):
    """Rows-kernel weight tiles smaller than the block (threads past the tile hold
    copies), odd tile rows, R tiles per block past N, group blocks past K; 16x32 GEMM
    tiles; a BM sends even M = 5 to the GEMM kernel."""
    rng = np.random.default_rng(len(tiles) + m)
    a = random_input(rng, (m, 128), f16)
    w_q, scales, zeros = random_w4(rng, 21, 128, 64, f16)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 64, **tiles)
    check_w4a16(c, a, w_q, scales, zeros, 64, f16, dequant_rounded=rounds_weights(m, tiles))


@pytest.mark.parametrize("tiles", [dict(BM=16, BK=32), dict(S=2, R=2)])
def test_w4a16_scales_follow_their_group(tiles):
    """GEMM: BK = 32 inside groups of 128, chunks 0-3 share group 0's scale, 4-7 group 1's;
    rows kernel: tiles of S = 2 groups, group 3 in the second chunk."""
    rng = np.random.default_rng(4)
    a = random_input(rng, (2, 512), f16)
    w_q, scales, zeros = random_w4(rng, 6, 512, 128, f16)
    scales[:, 1] *= 4  # a scale mix-up cannot hide behind similar values
    scales[:, 3] *= 16
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 128, **tiles)
    check_w4a16(c, a, w_q, scales, zeros, 128, f16, dequant_rounded=rounds_weights(2, tiles))


@pytest.mark.parametrize("m", [1, 3, 30])
def test_w4a16_nan_reaches_only_its_outputs(m):
    rng = np.random.default_rng(12 + m)
    a = random_input(rng, (m, 64), f16)
    w_q, scales, zeros = random_w4(rng, 8, 64, 32, f16)
    scales[3, 1] = np.nan      # column 3 of c
    a[m - 1, 5] = np.nan       # the last row of c
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 32)
    assert np.isnan(c[:, 3]).all() and np.isnan(c[m - 1]).all()
    keep = np.arange(8) != 3
    if m > 1:
        check_w4a16(c[:m - 1][:, keep], a[:m - 1], w_q[keep], scales[keep], zeros[keep], 32,
                    f16, dequant_rounded=rounds_weights(m))


def test_w4a16_inf_activation_gives_inf_or_nan_only_in_its_row():
    """+inf times weights of both signs: inf or nan in that row (as numpy), finite elsewhere."""
    rng = np.random.default_rng(5)
    a = random_input(rng, (2, 128), f16)
    w_q, scales, zeros = random_w4(rng, 12, 128, 64, f16)
    a[0, 7] = np.inf
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 64)
    w = dequantize_w4(w_q, scales, zeros, 64)
    with np.errstate(invalid="ignore"):
        ref = a.astype(np.float64) @ w.T
    assert np.array_equal(np.isposinf(c[0]), np.isposinf(ref[0]))
    assert np.array_equal(np.isneginf(c[0]), np.isneginf(ref[0]))
    assert np.array_equal(np.isnan(c[0]), np.isnan(ref[0]))
    check_w4a16(c[1:], a[1:], w_q, scales, zeros, 64, f16, dequant_rounded=False)


# ------------------------------------------------------------------ quantization, packing

def test_prepack_puts_element_zero_in_the_low_nibble():
    w_q = np.array([[1, 2, 15, 0]], np.uint8)
    assert prepack(w_q).tolist() == [[0x21, 0x0F]]
    assert np.array_equal(unpack_w4(prepack(w_q)), w_q)


@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("zero_point", [True, False])
def test_quantize_w4_error_is_at_most_half_a_step(group, zero_point):
    rng = np.random.default_rng(group)
    w = random_input(rng, (6, 2 * group), f16, 0.3)
    w[0, :group] = 0.25  # a constant group: scale 1, exact
    packed, scales, zeros = quantize_w4(w, group, zero_point)
    assert packed.shape == (6, group) and packed.dtype == np.uint8
    assert scales.shape == (6, 2) and scales.dtype == np.float16
    assert (zeros is None) != zero_point
    w_q = unpack_w4(packed)
    back = dequantize_w4(w_q, scales, zeros, group)
    step = np.repeat(scales.astype(np.float64), group, axis=1)
    # half a step, plus the f16 rounding of the scale (relative 2^-11, times up to 15 steps)
    assert np.all(np.abs(back - w) <= step * (0.5 + 16 * 2.0 ** -11) + 1e-7)
    if not zero_point:
        assert w_q.min() >= SYMMETRIC_ZERO - 7


def test_quantize_w4_torch_and_numpy_agree():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    w = random_input(rng, (4, 128), f16)
    for zero_point in (True, False):
        ours = quantize_w4(w, 64, zero_point)
        theirs = quantize_w4(torch.from_numpy(w), 64, zero_point)
        assert np.array_equal(ours[0], theirs[0].numpy())
        assert np.array_equal(ours[1], theirs[1].numpy())
        assert (ours[2] is None and theirs[2] is None) or np.array_equal(ours[2],
                                                                         theirs[2].numpy())


def test_quantized_weights_through_the_kernel():
    rng = np.random.default_rng(2)
    a, w = random_input(rng, (4, 256), f16), random_input(rng, (24, 256), f16, 0.1)
    packed, scales, zeros = quantize_w4(w, 128)
    c = w4a16_gemm_emulated(a, unpack_w4(packed), scales, zeros, 128)
    check_w4a16(c, a, unpack_w4(packed), scales, zeros, 128, f16, dequant_rounded=False)


def test_config_picks_the_kernel_by_rows():
    assert w4a16_config(MAX_ROWS_KERNEL_M, 4096, 4096, 128)[0] == "rows"
    kind, grid, c = w4a16_config(MAX_ROWS_KERNEL_M + 1, 4096, 4096, 128)
    assert kind == "gemm" and c["BM"] == 16 and grid == (1, 4096 // c["BN"])
    assert w4a16_config(17, 4096, 4096, 128)[2]["BM"] == 64
    # one 16-byte load per thread per weight tile: BN·S·G/32 = 128 threads
    for group in GROUP_SIZES:
        kind, grid, c = w4a16_config(1, 4096, 4096, group)
        assert kind == "rows" and c["BN"] * c["S"] * group // 32 == 128
        assert grid == (4096 // (c["BN"] * c["R"]),) and grid[0] > 3 * 132  # blocks for every SM, several each
    assert w4a16_config(1, 4096, 4096, 128, BM=16)[0] == "gemm"


@pytest.mark.parametrize("group", GROUP_SIZES)
@pytest.mark.parametrize("m", [1, 3, MAX_ROWS_KERNEL_M, MAX_ROWS_KERNEL_M + 1, 16, 17, 128])
def test_every_row_count_and_group_has_valid_candidates(m, group):
    """The torch entry point's tuner needs candidates (group 32 once had none beyond 16
    rows: every BK offered was wider than the group), each a valid config."""
    from tegula.kernels.quant import w4a16_candidates
    candidates = w4a16_candidates(m, group)
    assert candidates
    for tiles in candidates:
        kind, grid, c = w4a16_config(m, 4096, 4096, group, **tiles)
        expected = ("split" if tiles.get("SPLIT", 1) > 1 else "swapped") if "BT" in tiles \
            else "gemm" if "BM" in tiles or m > MAX_ROWS_KERNEL_M else "rows"
        assert kind == expected
        assert kind == "rows" or group % c["BK"] == 0
    # the swapped kernel competes from 9 rows on (it won 5 of 6 shapes measured at 16-128)
    assert any("BT" in t for t in candidates) == (m > MAX_ROWS_KERNEL_M)


# ------------------------------------------------------------------ argument checks

def _args(m=2, n=4, k=64, group=32, **over):
    args = dict(a=np.ones((m, k), np.float16), w_q=np.ones((n, k), np.uint8),
                scales=np.ones((n, k // group), np.float16),
                zeros=np.ones((n, k // group), np.float16), group_size=group)
    args.update(over)
    return args


@pytest.mark.parametrize("over,error,match", [
    (dict(group_size=48), ValueError, r"group_size must be one of \(32, 64, 128\), got 48"),
    (dict(group_size=True), ValueError, "group_size must be one of"),
    (dict(a=np.ones((2, 80), np.float16), w_q=np.ones((4, 80), np.uint8),
          scales=np.ones((4, 2), np.float16), zeros=np.ones((4, 2), np.float16)),
     ValueError, "K = 80 is not a multiple of group_size = 32"),
    (dict(scales=np.ones((4, 3), np.float16)), ValueError, r"scales must have shape .* \(4, 2\)"),
    (dict(zeros=np.ones((3, 2), np.float16)), ValueError, "zeros must have shape"),
    (dict(w_q=np.full((4, 64), 16, np.uint8)), ValueError, "0..15"),
    (dict(w_q=np.ones((4, 64), np.int32)), ValueError, "w_q must be uint8"),
    (dict(a=np.ones((2, 64), np.float32)), TypeError, "f16 or bf16"),
    (dict(a=np.ones((64,), np.float16)), ValueError, "a must be 2-D"),
    (dict(a=np.ones((2, 32), np.float16)), ValueError, "one K"),
    (dict(scales=[1.0]), TypeError, "scales must be a numpy array"),
])
def test_w4a16_emulated_bad_arguments(over, error, match):
    with pytest.raises(error, match=match):
        w4a16_gemm_emulated(**_args(**over))


def test_quantize_w4_bad_arguments():
    with pytest.raises(ValueError, match="group_size must be one of"):
        quantize_w4(np.ones((2, 64), np.float16), 16)
    with pytest.raises(ValueError, match="K = 96 is not a multiple of group_size = 64"):
        quantize_w4(np.ones((2, 96), np.float16), 64)
    with pytest.raises(ValueError, match="must be even"):
        prepack(np.ones((2, 3), np.uint8))


torch = pytest.importorskip("torch")


def _torch_args(**over):
    args = dict(a=torch.ones(2, 64, dtype=torch.float16),
                packed=torch.ones(4, 32, dtype=torch.uint8),
                scales=torch.ones(4, 2, dtype=torch.float16),
                zeros=torch.ones(4, 2, dtype=torch.float16), group_size=32)
    args.update(over)
    return args


@pytest.mark.parametrize("over,error,match", [
    (dict(a=torch.ones(2, 64)), TypeError, "a has dtype torch.float32"),
    (dict(packed=torch.ones(4, 32, dtype=torch.int8)), TypeError, "packed has dtype"),
    (dict(scales=torch.ones(4, 2, dtype=torch.bfloat16)), TypeError, "share one dtype"),
    (dict(group_size=100), ValueError, "group_size must be one of"),
    (dict(scales=torch.ones(4, 4, dtype=torch.float16)), ValueError, "scales must have shape"),
    (dict(packed=torch.ones(4, 16, dtype=torch.uint8)), ValueError, "one K"),
    (dict(), ValueError, "a is on cpu"),
    (dict(zeros=None), ValueError, "a is on cpu"),
])
def test_matmul_w4a16_bad_arguments(over, error, match):
    from tegula.kernels import matmul_w4a16
    with pytest.raises(error, match=match):
        matmul_w4a16(**_torch_args(**over))
