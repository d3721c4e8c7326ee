"""W4A16 with the weights pre-packed in the MMA fragment's order (`quant_fragment`): the
packing round trip, then the kernel in the emulator against a float64 numpy reference at
N and K that are not multiples of 64 (and K of the group), every group size (two groups
a k-step at 32), zero points or symmetric, the weights through registers or a cp.async
ring, split K, both targets, bf16, NaN and inf; and that the layouts synthesis derives
make each thread's weights one 16-byte load and the dequantization 16-bit arithmetic."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import bf16, f16
from tegula.kernels.common import random_input
from tegula.kernels.quant import (dequantize_w4, prepack, w4a16_config,
                                  w4a16_gemm_emulated)
from tegula.kernels.quant_fragment import (fragment_shape, pack_fragments,
                                           unpack_fragments, w4a16_fragment_kernel)

sys.path.insert(0, os.path.dirname(__file__))
from w4a16_checks import check_w4a16, random_w4  # noqa: E402


@pytest.mark.parametrize("n,k", [(64, 64), (70, 192), (1, 32), (130, 96)])
def test_pack_fragments_round_trips_and_puts_each_weight_where_the_kernel_reads_it(n, k):
    rng = np.random.default_rng(n + k)
    w_q = rng.integers(0, 16, (n, k), dtype=np.uint8)
    stored = pack_fragments(prepack(w_q))
    assert stored.shape == fragment_shape(n, k)[:5] + (16,) and stored.dtype == np.uint8
    assert np.array_equal(unpack_fragments(stored, n, k), prepack(w_q))
    # spot-check the documented order: run (w, r, c), word s, nibble 4j + 2h + i
    nibbles = np.stack([stored & 15, stored >> 4], axis=-1).reshape(stored.shape[:5] + (32,))
    for (nb, kb, w, r, c, v) in [(0, 0, 1, 2, 3, 5), (0, 0, 3, 7, 0, 31), (0, 0, 0, 0, 1, 16)]:
        s, j, h, i = v // 8, v // 4 % 2, v // 2 % 2, v % 2
        row, col = 64 * nb + 16 * w + 8 * i + r, 64 * kb + 16 * s + 8 * h + 2 * c + j
        expected = w_q[row, col] if row < n and col < k else 0   # padding is zero
        assert nibbles[nb, kb, w, r, c, v] == expected


CASES = [  # m, n, k, group, zero_point, tiles
    (1, 37, 256, 128, True, {}),
    (13, 70, 192, 64, False, {}),                      # N, K not multiples of 64
    (16, 20, 96, 32, True, {}),                        # K = 1.5 k-steps, two groups a step
    (33, 130, 224, 32, True, dict(BT=16)),             # 3 token tiles, the last ragged
    (5, 64, 256, 128, True, dict(WSMEM=0)),            # weights one k-step ahead in registers
    (20, 70, 320, 64, False, dict(SPLIT=3)),           # slices of 2, 2, 1 k-steps
    (9, 64, 96, 32, True, dict(SPLIT=4, STAGES=2)),    # two slices run no step
    (100, 77, 192, 32, True, dict(BT=128, STAGES=4)),
    # two stored blocks a k-step (KS=2): 128 k, groups of 32 give four scales a step
    (13, 70, 192, 64, True, dict(KS=2)),                # 1.5 steps: the second half masked
    (20, 130, 224, 32, False, dict(KS=2, SPLIT=2)),
    (5, 64, 384, 128, True, dict(KS=2, WSMEM=0)),
    (16, 66, 320, 64, True, dict(KS=4, SPLIT=2)),       # 1.25 steps of 256 k: the last
                                                        # step's blocks 2-4 masked
    # WG warpgroups of 64 weight rows a block (threads = 128·WG)
    (100, 77, 192, 32, True, dict(BT=128, STAGES=4, WG=2)),  # rows 77-127 past N
    (9, 200, 96, 32, True, dict(SPLIT=4, STAGES=2, WG=4)),   # 2 blocks, the second ragged
    (5, 130, 384, 128, True, dict(KS=2, WSMEM=0, WG=2)),
    # split K read from the grid: 3 slices of one 256-k step (the last one masked)
    (5, 64, 576, 64, True, dict(KS=4, SPLIT=3)),
    # the scale applied to each step's f32 sums (one group a step)
    (20, 200, 384, 128, False, dict(KS=2, SPLIT=3, SCALE_AFTER=1)),
    (13, 70, 192, 64, True, dict(SCALE_AFTER=1, BT=16)),
    # several groups a step, each its own gemm and f32 sum (SCALE_AFTER with KS·64 > G):
    # 320 k = 1.25 steps of 256 (the last step's second group past K), N ragged
    (16, 70, 320, 64, True, dict(KS=4, SCALE_AFTER=1, INTEGER_ZEROS=1)),
    (5, 130, 384, 128, True, dict(KS=4, SCALE_AFTER=1, SPLIT=2, INTEGER_ZEROS=1)),
    (9, 64, 256, 128, False, dict(KS=4, SCALE_AFTER=1, STAGES=6)),
    (7, 130, 512, 128, True, dict(KS=4, SCALE_AFTER=1, WG=2, SPLIT=2, INTEGER_ZEROS=1)),
    # integer zeros (what quantize_w4 writes): no residue step
    (16, 70, 320, 64, True, dict(KS=4, INTEGER_ZEROS=1)),
    (33, 130, 224, 32, True, dict(BT=16, INTEGER_ZEROS=1)),
]


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("m,n,k,group,zero_point,tiles", CASES)
def test_fragment_kernel_matches_numpy(m, n, k, group, zero_point, tiles, target):
    rng = np.random.default_rng(m * 7919 + n * 31 + k + group)
    a = random_input(rng, (m, k), f16)
    w_q, scales, zeros = random_w4(rng, n, k, group, f16, zero_point)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, group, target=target, FRAGMENT=1,
                            warp_specialize=False, **tiles)
    assert c.shape == (m, n) and c.dtype == np.float16
    check_w4a16(c, a, w_q, scales, zeros, group, f16, dequant_rounded=True)


def test_fragment_kernel_bf16():
    rng = np.random.default_rng(8)
    a = random_input(rng, (20, 192), bf16)
    w_q, scales, zeros = random_w4(rng, 66, 192, 64, bf16)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 64, dtype=bf16, FRAGMENT=1,
                            warp_specialize=False)
    check_w4a16(c, a, w_q, scales, zeros, 64, bf16, dequant_rounded=True)


FRACTIONAL_CASES = [  # dtype, m, n, k, group, tiles
    (f16, 5, 70, 256, 64, {}),                            # one 16-byte block a k-step
    (f16, 16, 130, 320, 32, dict(KS=2, SPLIT=2)),         # two groups a stored block
    (f16, 13, 70, 192, 64, dict(SCALE_AFTER=1, BT=16)),   # w - zero into the MMA
    (f16, 9, 64, 384, 128, dict(KS=2, WSMEM=0)),          # weights through registers
    (bf16, 20, 66, 192, 64, {}),
    (f16, 16, 70, 512, 128, dict(KS=4, SCALE_AFTER=1)),   # two groups a step, in parts
]


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("dtype,m,n,k,group,tiles", FRACTIONAL_CASES)
def test_fragment_kernel_fractional_zero_points(dtype, m, n, k, group, tiles, target):
    """Zero points with fractions (HQQ-style, or any float a user passes): magic + zero
    rounds a zero to an integer (f16: 1024 + z), so the kernel must subtract the residue
    too; it once dropped it, silently, by up to half a scale a weight."""
    rng = np.random.default_rng(m * 7 + n + k + group)
    a = random_input(rng, (m, k), dtype)
    w_q, scales, zeros = random_w4(rng, n, k, group, dtype, fractional=True)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, group, dtype=dtype, target=target,
                            FRAGMENT=1, warp_specialize=False, **tiles)
    # w − round(zero) − residue rounds once, then the product (SCALE_AFTER: once only)
    check_w4a16(c, a, w_q, scales, zeros, group, dtype, dequant_rounded=2)
    # the check fails the old answer (the zeros rounded to integers): it can tell
    rounded = np.round(zeros).astype(zeros.dtype)
    wrong = a.astype(np.float64) @ dequantize_w4(w_q, scales, rounded, group).T
    with pytest.raises(AssertionError, match="max error"):
        check_w4a16(wrong.astype(c.dtype), a, w_q, scales, zeros, group, dtype,
                    dequant_rounded=True)


def test_integer_zeros_flag_is_refused_for_fractional_zeros():
    """INTEGER_ZEROS=1 skips the residue step: the entry sets it from the zeros and
    refuses it where they have fractions (it would round them silently)."""
    rng = np.random.default_rng(12)
    a = random_input(rng, (5, 128), f16)
    w_q, scales, zeros = random_w4(rng, 64, 128, 64, f16, fractional=True)
    with pytest.raises(ValueError, match="INTEGER_ZEROS=1 needs integer zero points"):
        w4a16_gemm_emulated(a, w_q, scales, zeros, 64, FRAGMENT=1, warp_specialize=False,
                            INTEGER_ZEROS=1)


def test_zeros_are_integers_follows_in_place_writes():
    """The torch entry's integer-zeros answer is kept per tensor and version: an in-place
    write (through a view too) asks again; NaN and inference tensors answer False."""
    torch = pytest.importorskip("torch")
    from tegula.kernels.quant_fragment import zeros_are_integers
    z = torch.tensor([[3.0, 7.0], [0.0, 15.0]], dtype=torch.float16)
    assert zeros_are_integers(z) and zeros_are_integers(z)
    z[1].add_(0.5)
    assert not zeros_are_integers(z)
    z.round_()
    assert zeros_are_integers(z)
    assert not zeros_are_integers(torch.tensor([[float("nan")]]))
    with torch.inference_mode():
        untracked = torch.zeros(2, 2)
    assert not zeros_are_integers(untracked)


def test_fragment_kernel_scales_follow_their_group():
    """Groups of 32 (two a k-step) with scales far apart: a mix-up cannot hide."""
    rng = np.random.default_rng(4)
    a = random_input(rng, (18, 256), f16)
    w_q, scales, zeros = random_w4(rng, 70, 256, 32, f16)
    scales[:, 1::2] *= 16
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 32, FRAGMENT=1, warp_specialize=False)
    check_w4a16(c, a, w_q, scales, zeros, 32, f16, dequant_rounded=True)


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("scale_after", [0, 1])
def test_fragment_kernel_nan_and_inf_reach_only_their_outputs(target, scale_after):
    m, n = 20, 70
    rng = np.random.default_rng(12)
    a = random_input(rng, (m, 128), f16)
    w_q, scales, zeros = random_w4(rng, n, 128, 64, f16)
    scales[66, 1] = np.nan     # column 66 of c
    a[17, 5] = np.nan          # row 17 of c
    a[4, 70] = np.inf          # row 4: infinities (and NaN where a weight dequantizes to 0)
    w_q[3, 70] = zeros[3, 1]
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, 64, target=target, FRAGMENT=1,
                            warp_specialize=False, SCALE_AFTER=scale_after)
    w = dequantize_w4(w_q, scales, zeros, 64)
    with np.errstate(invalid="ignore"):
        ref = a.astype(np.float64) @ w.T
    for check in (np.isposinf, np.isneginf, np.isnan):
        assert np.array_equal(check(c), check(ref))
    rows, cols = ~np.isin(np.arange(m), [4, 17]), np.arange(n) != 66
    check_w4a16(c[rows][:, cols], a[rows], w_q[cols], scales[cols], zeros[cols], 64, f16,
                dequant_rounded=True)


def test_fragment_config():
    kind, grid, c = w4a16_config(100, 4096, 4096, 128, FRAGMENT=1, SPLIT=2)
    assert kind == "fragment" and grid == (64, 1, 2)
    assert c == dict(G=128, BT=128, STAGES=3, SPLIT=2)
    assert w4a16_config(3, 100, 256, 32, FRAGMENT=1)[1:] == ((2, 1), dict(
        G=32, BT=16, STAGES=3, SPLIT=1))


def test_fragment_config_sets_the_threads_of_wg_warpgroups():
    kind, grid, c = w4a16_config(100, 4096, 4096, 128, FRAGMENT=1, WG=2, SPLIT=2)
    assert grid == (32, 1, 2) and c["threads"] == 256
    with pytest.raises(ValueError, match=r"SCALE_AFTER=1 needs groups of whole stored "
                                         r"blocks \(group_size = 32 ≥ 64"):
        w4a16_config(16, 4096, 4096, 32, FRAGMENT=1, KS=2, SCALE_AFTER=1)
    with pytest.raises(ValueError, match=r"WG=4 warpgroups of weight rows need "
                                         r"threads=512, got threads=256"):
        w4a16_config(100, 4096, 4096, 128, FRAGMENT=1, WG=4, threads=256)


def test_split_sum_has_its_own_small_tile():
    """The split sum of 16 x 14336 in 4 slices ran as 224 blocks of the producer's tile
    (5 µs in ncu for 3.7 MB); its own (32, 16) tile gives 448, and its rows must divide a
    slice's (a 64-row tile's workspace at 32, a 16-row one's at 16)."""
    from tegula.kernels.quant import launch_split_sum
    launched = []
    record = lambda kernel, grid, args, cx: launched.append((grid, cx))  # noqa: E731
    launch_split_sum(f16, 4, np.empty((4 * 14336, 16), np.float32),
                     np.empty((16, 14336), np.float16), record)
    launch_split_sum(f16, 2, np.empty((2 * 48, 100), np.float32),
                     np.empty((100, 40), np.float16), record)
    assert launched == [((448, 1), dict(SPLIT=4, BN=32, BT=16)),
                        ((3, 7), dict(SPLIT=2, BN=16, BT=16))]


def test_fragment_weights_are_one_16_byte_load_and_dequantized_in_16_bits():
    """The point of the layout: each thread's weights of a k-step arrive in one 16-byte
    access (a TMA box of the block's words into the ring, or cp.async where TMA is off,
    then shared memory into registers) with no layout conversion, and the CUDA
    dequantizes with paired 16-bit instructions."""
    from tegula.build import build
    kernel = w4a16_fragment_kernel(f16, True)
    text = tg.explain(kernel, G=128, BT=16, STAGES=4, warp_specialize=False)
    assert "layout conversions: none" in text
    assert "TMA box 4x128x1x1 of w" in text and "tma.load.4d" in text
    assert "ld.shared.v4.b32" in text and "cp.async" not in text
    text = tg.explain(kernel, G=128, BT=16, STAGES=4, warp_specialize=False,
                      load_path="cp.async")
    assert "layout conversions: none" in text
    assert "cp.async.cg.shared.global.16" in text and "ld.shared.v4.b32" in text
    result = build(kernel, dict(G=128, BT=16, STAGES=4, warp_specialize=False))
    source = result.cuda_source()
    assert "tg_f16x2_sub(" in source and "tg_f16x2_mul(" in source
    assert "8388608.0f" not in source    # no f32 magic-number conversion left


@pytest.mark.parametrize("m", [1, 100])
def test_every_fragment_candidate_runs(m):
    """Each config the torch entry point's tuner may pick for pre-packed weights, emulated
    at a shape that divides no tile: the fixed list, and what a shape adds (on one SM
    the two row tiles fill it: the unsplit 6-stage ring). (16 tokens have 1 token's
    configs, in a full token tile: 1 is the ragged one.)"""
    from tegula.kernels.quant import fragment_candidates
    rng = np.random.default_rng(m)
    for group, k in ((32, 160), (128, 384)):
        a = random_input(rng, (m, k), f16)
        w_q, scales, zeros = random_w4(rng, 70, k, group, f16)
        candidates = fragment_candidates(m, group_size=group)
        candidates += [c for c in fragment_candidates(m, 70, k, sms=1, group_size=group)
                       if c not in candidates]
        for tiles in candidates:
            c = w4a16_gemm_emulated(a, w_q, scales, zeros, group, **tiles)
            check_w4a16(c, a, w_q, scales, zeros, group, f16, dequant_rounded=True)


def test_matmul_w4a16_names_a_mismatched_prepacked_weight():
    torch = pytest.importorskip("torch")
    import tegula.kernels as tk
    w = torch.randn(70, 192) * 0.1
    packed, scales, zeros = tk.quantize_w4(w.half(), 64)
    stored = tk.pack_fragments(packed)
    assert tuple(stored.shape) == (2, 3, 4, 8, 4, 16)
    a = torch.randn(5, 128).half()                   # K = 128, the weights' 192
    with pytest.raises(ValueError, match=r"pre-packed weights .* have shape "
                                         r"\(2, 2, 4, 8, 4, 16\), got \(2, 3, 4, 8, 4, 16\)"):
        tk.matmul_w4a16(a, stored, scales, zeros, 64)


PAIRED_CASES = [  # m, n, k, group, zero_point, tiles, target
    (5, 64, 384, 128, True, dict(KS=2), "sm_90a"),            # 3 steps: the last pair half past K
    (9, 70, 640, 64, True, dict(SPLIT=3), "sm_90a"),          # 10 steps: slices of 4, 4, 2
    (13, 70, 320, 64, False, dict(SPLIT=2, WG=2, threads=256), "sm_90a"),  # 5 steps: 4 + 1
    (20, 40, 320, 32, True, dict(KS=2, BT=64, SPLIT=2), "sm_90a"),  # 4 scales a step
    (7, 70, 320, 64, True, dict(SPLIT=2, warp_specialize=False), "sm_80"),  # one role
    (9, 70, 320, 64, True, dict(WG=2, threads=256, consumers="pingpong"), "sm_90a"),  # turns
]


@pytest.mark.parametrize("m,n,k,group,zero_point,tiles,target", PAIRED_CASES)
def test_paired_steps_match_numpy(m, n, k, group, zero_point, tiles, target):
    """PAIRS=1 (two k-steps an iteration, two register A operands, the words straight into
    registers): an odd step count (the last pair's second step past K: zero tokens, masked
    words), split K into slices of an even count of steps (a slice of an odd count would
    hand its last step to the next slice's first pair too: counted twice), two
    warpgroups of rows (also taking turns at the tensor cores), groups of 32-128."""
    rng = np.random.default_rng(m * 7919 + n * 31 + k + group)
    a = random_input(rng, (m, k), f16)
    w_q, scales, zeros = random_w4(rng, n, k, group, f16, zero_point)
    config = dict(dict(warp_specialize=True, STAGES=2), **tiles)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, group, target=target, FRAGMENT=1,
                            WSMEM=0, PAIRS=1, **config)
    check_w4a16(c, a, w_q, scales, zeros, group, f16, dequant_rounded=True)


@pytest.mark.parametrize("m,n,k,group,zero_point,dtype,tiles", [
    (5, 64, 384, 128, True, f16, dict(KS=2)),                 # 3 steps: a half pair past K
    (9, 70, 640, 64, True, bf16, dict(SPLIT=3)),              # slices of 4, 4, 2 steps
    (13, 70, 448, 64, False, f16, dict(SPLIT=2, WG=2, threads=256))])
def test_paired_steps_with_the_scale_after_are_exact(m, n, k, group, zero_point, dtype,
                                                     tiles):
    """PAIRS=1 with SCALE_AFTER=1: w − zero (exact for integer zeros) into each step's
    fresh f32 sum, scaled as it is added: no weight rounded, so the bound is the f32 sums'
    (2^-16 of Σ|a·w|), not the rounded weights' half ulp."""
    rng = np.random.default_rng(m + n + k)
    a = random_input(rng, (m, k), dtype)
    w_q, scales, zeros = random_w4(rng, n, k, group, dtype, zero_point)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, group, dtype=dtype, target="sm_90a",
                            FRAGMENT=1, warp_specialize=True, WSMEM=0, PAIRS=1,
                            SCALE_AFTER=1, STAGES=2, **tiles)
    check_w4a16(c, a, w_q, scales, zeros, group, dtype, dequant_rounded=False)


@pytest.mark.parametrize("m,n,k,group,dtype,tiles", [
    (13, 70, 640, 128, f16, dict(KS=4, SCALE_AFTER=1, WG=2, threads=256, INTEGER_ZEROS=1,
                                 SPLIT=2)),
    (9, 130, 320, 64, bf16, dict(KS=2, WG=2, threads=256))])
def test_fragment_kernel_built_for_sm_90_runs_on_mma_sync(m, n, k, group, dtype, tiles):
    """Built for sm_90 without "a" (no wgmma), the same kernel source runs on mma.sync with
    the weights as its register A fragment: exact as on the other targets."""
    rng = np.random.default_rng(m + n + k)
    a = random_input(rng, (m, k), dtype)
    w_q, scales, zeros = random_w4(rng, n, k, group, dtype, True)
    c = w4a16_gemm_emulated(a, w_q, scales, zeros, group, dtype=dtype, target="sm_90",
                            FRAGMENT=1, warp_specialize=False, load_path="cp.async", BT=16,
                            STAGES=3, **tiles)
    check_w4a16(c, a, w_q, scales, zeros, group, dtype,
                dequant_rounded=not tiles.get("SCALE_AFTER"))


def test_paired_steps_need_the_register_path():
    with pytest.raises(ValueError, match="PAIRS=1 .* WSMEM=0"):
        w4a16_config(16, 256, 256, 128, FRAGMENT=1, PAIRS=1)
    with pytest.raises(ValueError, match="one group a k-step"):
        w4a16_config(16, 256, 256, 64, FRAGMENT=1, PAIRS=1, WSMEM=0, SCALE_AFTER=1, KS=2)


@pytest.mark.parametrize("tiles", [dict(KS=1), dict(KS=2), dict(KS=2, WSMEM=0),
                                   dict(KS=2, WSMEM=0, PAIRS=1, warp_specialize=True),
                                   dict(KS=2, WSMEM=0, PAIRS=1, SCALE_AFTER=1, WG=4,
                                        threads=512, warp_specialize=True),
                                   dict(KS=2, BT=128, STAGES=3),
                                   dict(KS=2, STAGES=3, SCALE_AFTER=1, blocks_per_sm=7)],
                         ids=str)
def test_fragment_kernel_compiles_without_serialized_wgmmas(tiles):
    """ptxas serializes a register-A wgmma whose input registers other instructions define
    inside its pipeline stage (C7513/C7514/C7519, e.g. when the next step's dequantization
    sits between the wgmma and its wait); the candidates keep the wgmmas pipelined."""
    from tegula.build import build
    from tegula.runtime.compiler import available_compilers, compile_cuda_report
    if not available_compilers():
        pytest.skip("needs NVRTC or nvcc")
    constexprs = dict(dict(G=128, BT=16, STAGES=4, warp_specialize=False), **tiles)
    result = build(w4a16_fragment_kernel(f16, True), constexprs, target="sm_90a")
    _, report = compile_cuda_report(result.cuda_source(), result.thread_kernel.name,
                                    result.target.sm)
    assert not report.spills
    assert not [w for w in report.warnings if "C75" in w], report.warnings


def test_fragment_kernel_factory_returns_one_kernel_per_variant():
    """Compiled builds and launch replays live on the kernel object: a factory that made a
    new one per call rebuilt the kernel at every launch (~0.3 s; session 10's first GPU
    round timed 330 ms a call). And the SCALE_AFTER step, called while tracing with tiles,
    must not be memoized on them."""
    from tegula.kernels import quant_fragment as qf
    for partial in (False, True):
        assert (qf.w4a16_fragment_kernel(f16, True, partial)
                is qf.w4a16_fragment_kernel(f16, True, partial))
    assert qf.w4a16_fragment_kernel(f16, True) is not qf.w4a16_fragment_kernel(bf16, True)
    assert not hasattr(qf._gemm_scaled_after, "cache_info")


def test_a_pinned_row_major_stage_is_a_tma_box_only_on_whole_128_byte_lines():
    """TMA writes a box at a 128-byte-aligned shared address: a pinned row-major stage
    of 48 bytes stays cp.async (its stages would start off a line), one of 2048 takes a
    box (the fragment kernel's words)."""
    from tegula.dtypes import i32
    from tegula.layout.cute import Layout

    def staged(rows):
        @tg.kernel(threads=128)
        def copy_stages(x: tg.Tensor[i32], out: tg.Tensor[i32]):
            acc = tg.zeros((rows, 4), i32)
            buf = tg.shared((rows, 4), i32, stages=3, layout=Layout((rows, 4), (4, 1)))
            for k in tg.pipeline(0, x.shape[0] // rows, stages=3):
                tg.copy(x.tile((rows, 4), (k, 0)), buf[k])
                acc = acc + tg.load(buf[k])
            tg.copy(acc, out.tile((rows, 4), (0, 0)))
        return copy_stages

    assert "tma.load" not in tg.explain(staged(3), warp_specialize=False)
    assert "tma.load.2d" in tg.explain(staged(128), warp_specialize=False)


@pytest.mark.parametrize("m,n,k,group,tiles,target", [
    (20, 70, 320, 64, dict(SPLIT=3), "sm_90a"),                       # a slice of 1 step
    (33, 130, 224, 32, dict(BT=16, SPLIT=2), "sm_90a"),               # 3 x 3 tiles' counters
    (7, 130, 512, 128, dict(KS=4, SCALE_AFTER=1, WG=2, SPLIT=2, INTEGER_ZEROS=1), "sm_80")])
def test_fused_split_is_summed_by_each_tiles_last_block(m, n, k, group, tiles, target):
    """FUSED=1: split K in one launch, the last block of each tile to arrive adding the
    slices in order (`tg.last_arrival`); the emulator reports a read of a slice no arrival
    orders. The counters are left at zero for the next launch."""
    from tegula.kernels.common import launch_emulated
    from tegula.kernels.quant_fragment import as_words, fragment_config, launch_w4a16_fragment
    rng = np.random.default_rng(m + n + k)
    a = random_input(rng, (m, k), f16)
    w_q, scales, zeros = random_w4(rng, n, k, group, f16)
    grid, constexprs = fragment_config(m, n, k, group, warp_specialize=False, FUSED=1,
                                       **tiles)
    operands = (a, as_words(pack_fragments(prepack(w_q))), scales, zeros)
    c, counters, launches = np.full((m, n), np.nan, np.float16), [], []

    def launch(kernel, grid, args, cx):
        launches.append(kernel.name)
        return launch_emulated(kernel, grid, *args, **cx, target=target)

    def zeroed(size):
        counters.append(np.zeros(size, np.int32))
        return counters[-1]

    empty = lambda shape: np.full(shape, np.nan, np.float32)  # noqa: E731
    launch_w4a16_fragment(grid, constexprs, f16, True, operands, c, launch, empty, zeroed)
    check_w4a16(c, a, w_q, scales, zeros, group, f16, dequant_rounded=True)
    assert launches == ["w4a16_fragment_fused"] and counters[0].shape == (grid[0] * grid[1],)
    assert not counters[0].any()
    with pytest.raises(ValueError, match="FUSED=1 needs zeroed counters"):
        launch_w4a16_fragment(grid, constexprs, f16, True, operands, c, launch, empty)
