"""The W4A16 MoE grouped GEMM (4-bit weights per group, f16/bf16 activations) in the emulator
against a float64 loop over experts: with and without zero points, every group size, empty
experts, one expert with every row, ragged rows and N, both targets; the torch entry point
through the emulator; the per-expert quantization; and the argument checks."""
from __future__ import annotations

import numpy as np
import pytest

from tegula.dtypes import bf16, f16
from tegula.kernels import moe_w4
from tegula.kernels.common import random_input
from tegula.kernels.quant import dequantize_w4, prepack, unpack_w4


def random_w4(rng, experts, n, k, group, dtype, zero_point=True):
    w_q = rng.integers(0, 16, (experts, n, k), dtype=np.uint8)
    storage = np.float16 if dtype == f16 else np.float32
    scales = (np.abs(random_input(rng, (experts, n, k // group), dtype, 0.05))
              + np.float32(2 ** -8)).astype(storage)
    zeros = rng.integers(0, 16, (experts, n, k // group)).astype(storage) if zero_point \
        else None
    return w_q, scales, zeros


def check(out, x, w_q, scales, zeros, group, offsets, dtype):
    """Every routed row within the output's rounding plus, as the W4A16 GEMM rounds each
    dequantized weight to the activations' type for the tensor cores, half an ulp of every
    |x·w| (`tests/kernels/test_quant.py`'s bound), expert by expert."""
    ulp = 2.0 ** -dtype.mantissa_bits
    for e in range(w_q.shape[0]):
        a, b = offsets[e], offsets[e + 1]
        w = dequantize_w4(w_q[e], scales[e], None if zeros is None else zeros[e], group)
        ref = x[a:b].astype(np.float64) @ w.T
        bound = ulp * np.abs(ref) + ulp * (np.abs(x[a:b].astype(np.float64)) @ np.abs(w).T)
        got = out[a:b].astype(np.float64)
        assert not np.isnan(got).any(), f"expert {e}: rows left unwritten"
        assert np.all(np.abs(got - ref) <= bound), f"expert {e}: {np.abs(got - ref).max()}"
    assert np.isnan(out[offsets[-1]:].astype(np.float64)).all()


@pytest.mark.parametrize("counts, n, k, group, zero_point, dtype, target", [
    ([20, 0, 37, 9], 40, 128, 32, True, f16, "sm_90a"),
    ([0, 0, 45], 33, 128, 64, False, bf16, "sm_90a"),
    ([3, 17, 0, 30, 1], 24, 128, 128, True, bf16, "sm_80"),
])
def test_w4a16_grouped_gemm(counts, n, k, group, zero_point, dtype, target):
    rng = np.random.default_rng(n + group)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    x = random_input(rng, (offsets[-1] + 3, k), dtype)
    w_q, scales, zeros = random_w4(rng, len(counts), n, k, group, dtype, zero_point)
    out = moe_w4.moe_gemm_w4a16_emulated(x, w_q, scales, zeros, group, offsets, dtype=dtype,
                                         target=target, BM=16, BN=32, BK=32, STAGES=2)
    check(out, x, w_q, scales, zeros, group, offsets, dtype)


@pytest.mark.parametrize("counts, n, k, group, zero_point, dtype, target, tiles", [
    ([20, 0, 37, 9], 40, 128, 32, True, f16, "sm_90a", dict(BM=16, BN=64, BK=32)),
    ([0, 0, 45], 72, 256, 64, False, bf16, "sm_90a",
     dict(BM=32, BN=64, BK=32, PERSISTENT=False)),
    ([3, 17, 0, 30, 1], 24, 128, 128, True, bf16, "sm_80", dict(BM=16, BN=32, BK=32)),
    ([3, 17, 0, 30, 1], 24, 128, 32, True, bf16, "sm_90a",         # scales loaded where used
     dict(BM=16, BN=32, BK=32, AHEAD=0)),
    ([20, 0, 37, 9], 140, 128, 32, True, f16, "sm_90a",            # two consumer warpgroups
     dict(BM=16, BN=128, BK=32, threads=256)),
])
def test_swapped_grouped_gemm(counts, n, k, group, zero_point, dtype, target, tiles):
    """The swapped kernel (session 12: outᵀ tiles, the dequantized weights the MMA's
    register operand), persistent on 3 SMs (blocks walk several items, the sm_90a TMA ring
    across them) or one block an item, the scales loaded a k-step ahead (AHEAD, default)
    or where used: ragged N, empty experts, every group size (K = 128 in groups of 32 is
    four groups, so a step's scales differ from the last's)."""
    rng = np.random.default_rng(n + group + 1)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    x = random_input(rng, (offsets[-1] + 3, k), dtype)
    w_q, scales, zeros = random_w4(rng, len(counts), n, k, group, dtype, zero_point)
    out = moe_w4.moe_gemm_w4a16_emulated(x, w_q, scales, zeros, group, offsets, dtype=dtype,
                                         target=target, num_sms=3, SWAPPED=True, STAGES=2,
                                         **tiles)
    check(out, x, w_q, scales, zeros, group, offsets, dtype)


@pytest.mark.parametrize("counts, n, k, group, zero_point, dtype, target, tiles", [
    ([20, 0, 37, 9], 40, 128, 32, True, f16, "sm_90a", dict(BM=16, WG=1)),
    ([0, 0, 45], 72, 128, 64, False, bf16, "sm_90a",
     dict(BM=32, WG=1, STAGES=2, PERSISTENT=False)),
    ([3, 17, 0, 30, 1], 24, 256, 128, True, bf16, "sm_80", dict(BM=16, WG=1, STAGES=2)),
    ([9, 0, 13, 5], 72, 256, 32, True, f16, "sm_90a",              # two warpgroups, 128-k
     dict(BM=16, WG=2, KS=2, STAGES=2)),                           # steps of four groups
    ([9, 0, 13, 5], 72, 256, 64, True, bf16, "sm_90a",             # words into registers,
     dict(BM=16, WG=1, STAGES=2, WSMEM=0, PAIRS=0)),               # dequantized a step early
    ([5, 0, 3, 1], 40, 192, 64, True, bf16, "sm_90a",              # two steps an iteration,
     dict(BM=16, WG=1, STAGES=2, WSMEM=0, PAIRS=1)),               # three steps: a half pair
    ([6, 1, 0, 4], 72, 384, 128, True, f16, "sm_90a",              # pairs of 128-k steps
     dict(BM=16, WG=2, KS=2, STAGES=3, WSMEM=0, PAIRS=1, PERSISTENT=False)),
    ([9, 0, 13, 1], 200, 384, 128, True, bf16, "sm_90a",            # the default's three
     dict(BM=16, STAGES=2)),                                        # warpgroups, AHEAD=1
    ([9, 0, 13, 1], 200, 256, 128, True, bf16, "sm_90a",            # AHEAD=0: each item's
     dict(BM=16, STAGES=2, AHEAD=0)),                               # head at its start
    ([0, 4, 0, 0], 40, 256, 64, False, f16, "sm_90a",               # one item, idle blocks:
     dict(BM=16, WG=1, STAGES=2, WSMEM=0, PAIRS=1, AHEAD=1)),       # clamped heads unused
])
def test_fragment_grouped_gemm(counts, n, k, group, zero_point, dtype, target, tiles):
    """The fragment kernel (session 12: `moe_w4_fragment`, weights pre-packed in the MMA
    fragment's order, dequantized in paired 16-bit registers; their words through a
    shared ring or, WSMEM=0, into registers two steps ahead; PAIRS=1, two steps an
    iteration, two register operands; AHEAD=1, each item's first weights loaded during
    the previous item's epilogue), persistent on 3 SMs or one block an item: N and K
    not multiples of the 64-row blocks' padding, empty experts, an odd step count, every
    group size."""
    rng = np.random.default_rng(n + group + 2)
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    x = random_input(rng, (offsets[-1] + 3, k), dtype)
    w_q, scales, zeros = random_w4(rng, len(counts), n, k, group, dtype, zero_point)
    out = moe_w4.moe_gemm_w4a16_emulated(x, w_q, scales, zeros, group, offsets, dtype=dtype,
                                         target=target, num_sms=3, FRAGMENT=True, **tiles)
    check(out, x, w_q, scales, zeros, group, offsets, dtype)


def test_fragment_entry_point_takes_pre_packed_experts(on_cpu):
    """moe_gemm_w4a16 with (E, N/64, K/64, 4, 8, 4, 16) pre-packed weights runs the
    fragment kernel (fractional zeros: the residue step); a wrong block count is named."""
    torch = on_cpu
    from tegula.kernels.moe_w4_fragment import pack_experts_fragments
    rng = np.random.default_rng(6)
    counts, n, k, group = [11, 0, 26], 80, 128, 64
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    w_q, scales, _ = random_w4(rng, 3, n, k, group, f16)
    zeros = (rng.integers(0, 16, scales.shape) + 0.25).astype(np.float16)
    stored = pack_experts_fragments(torch.from_numpy(prepack(w_q)))
    assert stored.shape == (3, 2, 2, 4, 8, 4, 16)
    x = random_input(rng, (offsets[-1], k), f16)
    out = moe_w4.moe_gemm_w4a16(torch.from_numpy(x), stored, torch.from_numpy(scales),
                                torch.from_numpy(zeros), group, torch.from_numpy(offsets),
                                config=dict(BM=16, WG=1, STAGES=2))
    check(out.numpy(), x, w_q, scales, zeros, group, offsets, f16)
    with pytest.raises(ValueError, match=r"fragment-ordered packed must be .*\(3, 2, 2, 4, "
                                         r"8, 4, 16\) for N = 80"):
        moe_w4.moe_gemm_w4a16(torch.from_numpy(x), stored[:, :1], torch.from_numpy(scales),
                              None, group, torch.from_numpy(offsets))


def test_quantize_experts_and_the_torch_entry_point(on_cpu):
    torch = on_cpu
    rng = np.random.default_rng(4)
    counts, n, k, group = [11, 0, 26], 40, 64, 32
    offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)
    w = torch.from_numpy(random_input(rng, (3, n, k), f16))
    packed, scales, zeros = moe_w4.quantize_experts_w4(w, group)
    assert packed.shape == (3, n, k // 2) and scales.shape == zeros.shape == (3, n, k // group)
    x = random_input(rng, (offsets[-1], k), f16)
    out = moe_w4.moe_gemm_w4a16(torch.from_numpy(x), packed, scales, zeros, group,
                                torch.from_numpy(offsets), config=dict(BM=16, BN=32, BK=32))
    check(out.numpy(), x, unpack_w4(packed.numpy()), scales.numpy(), zeros.numpy(), group,
          offsets, f16)
    given = torch.full((offsets[-1], n), float("nan"), dtype=torch.float16)
    swapped = moe_w4.moe_gemm_w4a16(torch.from_numpy(x), packed, scales, zeros, group,
                                    torch.from_numpy(offsets), out=given,
                                    config=dict(SWAPPED=True, BM=16, BN=64, BK=32,
                                                STAGES=2))
    assert swapped is given
    check(swapped.numpy(), x, unpack_w4(packed.numpy()), scales.numpy(), zeros.numpy(),
          group, offsets, f16)


def test_bad_arguments_are_named():
    rng = np.random.default_rng(0)
    offsets = np.int32([0, 5, 9])
    x = random_input(rng, (9, 64), f16)
    w_q, scales, zeros = random_w4(rng, 2, 16, 64, 32, f16)
    run = moe_w4.moe_gemm_w4a16_emulated
    with pytest.raises(ValueError, match="group_size must be one of"):
        run(x, w_q, scales, zeros, 48, offsets)
    with pytest.raises(ValueError, match=r"scales must be \(experts, N, K / group_size\)"):
        run(x, w_q, scales[:, :, :1], zeros, 32, offsets)
    with pytest.raises(ValueError, match="uint8 values 0..15"):
        run(x, w_q + 16, scales, zeros, 32, offsets)
    with pytest.raises(ValueError, match="BK = 64 must divide group_size = 32"):
        run(x, w_q, scales, zeros, 32, offsets, BK=64)
    with pytest.raises(ValueError, match="not a multiple of group_size"):
        run(x[:, :48], w_q[:, :, :48], scales, zeros, 32, offsets)
