"""wgmma operands beyond one K-major swizzle span (issue 9 §2): MN-major (transposed) shared
operands of f16/bf16, and K extents of any multiple of the instruction's K (rows over
several swizzle spans). Every case is planned on wgmma (no fallback), its descriptors read
exactly the block each instruction multiplies (element by element, through the arch's one
definition, `smem_matrix.descriptor_element_addresses`, which the emulator reads too), and
the emulated GEMM matches numpy at shapes that do not divide the tiles."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula.arch.smem_matrix import (MatrixDescriptor, canonical_byte_addresses,
                                     descriptor_element_addresses)
from tegula.arch.wgmma import get_wgmma
from tegula.build import build
from tegula.dtypes import bf16, f8e4m3, f16, f32
from tegula.errors import SynthesisError
from tegula.ir.ops import Copy, Gemm, walk_ops
from tegula.kernels.common import random_input
from tegula.lower.async_ir import Elect, TmaLoad, Wgmma
from tegula.lower.thread_ir import walk
from tegula.synth.gemm import GemmPlan, WgmmaPlan, block_width, operand_layout
from tegula.synth.shared import evaluate_offsets


def gemm_kernel(dtype, acc_dtype=f32, threads=128):
    """c = op(a) @ op(b)ᵀ with op = transpose where TA / TB: a is (K, M) when TA, else (M, K);
    b is (K, N) when TB, else (N, K). The transposed operands are `.T` views of buffers
    loaded in the tensor's own orientation."""

    @tg.kernel(threads=threads)
    def wgmma_operands(a: tg.Tensor[dtype], b: tg.Tensor[dtype], c: tg.Tensor[f32],
                       BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 64,
                       TA: tg.constexpr = False, TB: tg.constexpr = False,
                       STAGES: tg.constexpr = 2):
        m, n = tg.block_id(0), tg.block_id(1)
        # (rows, cols, K/BK) views either way: the K blocks are the last view dim.
        ga = a.tile((BK, BM), (None, m)) if TA else a.tile((BM, BK), (m, None))
        gb = b.tile((BK, BN), (None, n)) if TB else b.tile((BN, BK), (n, None))
        acc = tg.zeros((BM, BN), acc_dtype)
        sa = tg.shared((BK, BM) if TA else (BM, BK), dtype, stages=STAGES)
        sb = tg.shared((BK, BN) if TB else (BN, BK), dtype, stages=STAGES)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k].T if TA else sa[k], sb[k].T if TB else sb[k])
        tg.copy(acc.to(f32), c.tile((BM, BN), (m, n)))

    return wgmma_operands


F16_GEMM = gemm_kernel(f16)
BF16_GEMM = gemm_kernel(bf16)
KERNELS = {f16: F16_GEMM, bf16: BF16_GEMM}


def plan_of(result):
    return next(op for op in walk_ops(result.traced.body) if isinstance(op, Gemm)).choices["plan"]


def random_operands(rng, dtype, m, n, k, ta, tb):
    """Random normal operands in the tensors' orientation, as the emulator stores `dtype`
    (float32 holding bf16 values for bf16)."""
    return (random_input(rng, (k, m) if ta else (m, k), dtype),
            random_input(rng, (k, n) if tb else (n, k), dtype))


def reference(a, b, ta, tb):
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    return (a64.T if ta else a64) @ (b64 if tb else b64.T)


def check_gemm(dtype, m, n, k, ta, tb, target="sm_90a", seed=0, **tiles):
    rng = np.random.default_rng(seed)
    a, b = random_operands(rng, dtype, m, n, k, ta, tb)
    c = np.full((m, n), np.nan, np.float32)
    bm, bn = tiles.get("BM", 64), tiles.get("BN", 64)
    tg.emulate(KERNELS[dtype], (tg.cdiv(m, bm), tg.cdiv(n, bn)), a, b, c, TA=ta, TB=tb,
               target=target, **tiles)
    ref = reference(a, b, ta, tb)
    bound = 8 * 2.0 ** -24 * (np.abs(a).astype(np.float64).T if ta else np.abs(a)) @ \
        (np.abs(b) if tb else np.abs(b).T) * k / 16 + 1e-30
    assert np.all(np.isfinite(c))
    assert np.all(np.abs(c - ref) <= bound), np.abs(c - ref).max()
    return c


# --------------------------------------------------------------------------------------
# The decision: wgmma, with the operands' major-ness and swizzle
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
@pytest.mark.parametrize("ta,tb", [(False, True), (True, False), (True, True)],
                         ids=["B-MN", "A-MN", "both-MN"])
def test_transposed_operands_are_planned_on_wgmma_mn_major(dtype, ta, tb):
    plan = plan_of(build(KERNELS[dtype], dict(TA=ta, TB=tb), None, "sm_90a"))
    assert isinstance(plan, WgmmaPlan), plan.describe()
    assert (plan.trans_a, plan.trans_b) == (int(ta), int(tb))
    assert plan.swizzle_a == plan.swizzle_b == 128
    assert f"A{' (MN-major)' if ta else ''} and B{' (MN-major)' if tb else ''} read" \
        in plan.describe()


@pytest.mark.parametrize("bk,rk,swizzle", [(16, 1, 32), (48, 3, 32), (96, 6, 64),
                                           (128, 8, 128), (256, 16, 128)])
def test_k_rows_of_several_swizzle_spans_are_planned_on_wgmma(bk, rk, swizzle):
    plan = plan_of(build(F16_GEMM, dict(BK=bk), None, "sm_90a"))
    assert isinstance(plan, WgmmaPlan) and plan.repeats[2] == rk, plan.describe()
    assert plan.swizzle_a == plan.swizzle_b == swizzle


@tg.kernel(threads=128)
def transposed_f8_gemm(a: tg.Tensor[f8e4m3], b: tg.Tensor[f8e4m3], c: tg.Tensor[f32]):
    acc = tg.zeros((64, 64), f32)
    sa = tg.shared((64, 64), f8e4m3)
    sb = tg.shared((64, 64), f8e4m3)                # K x N: B is the transposed view
    tg.copy(a.tile((64, 64), (0, 0)), sa)
    tg.copy(b.tile((64, 64), (0, 0)), sb)
    tg.gemm(acc, sa, sb.T)
    tg.copy(acc, c.tile((64, 64), (0, 0)))


@tg.kernel(threads=128)
def transposed_f32_gemm(a: tg.Tensor[f32], b: tg.Tensor[f32], c: tg.Tensor[f32]):
    acc = tg.zeros((64, 64), f32)
    sa = tg.shared((32, 64), f32)                   # K x M: A is the transposed view
    sb = tg.shared((64, 32), f32)
    tg.copy(a.tile((32, 64), (0, 0)), sa)
    tg.copy(b.tile((64, 32), (0, 0)), sb)
    tg.gemm(acc, sa.T, sb)
    tg.copy(acc, c.tile((64, 64), (0, 0)))


def test_a_transposed_8_bit_operand_stays_k_major_and_falls_back_with_the_reason():
    plan = plan_of(build(transposed_f8_gemm, {}, None, "sm_90a"))
    assert isinstance(plan, GemmPlan)
    assert "is a transposed view of f8e4m3 (MN-major wgmma operands exist for f16/bf16 " \
           "only" in plan.wgmma_skipped, plan.wgmma_skipped


def test_a_transposed_f32_operand_is_a_clear_error_naming_the_reason():
    """f32 multiplies only as tf32 on wgmma, K-major: a transposed f32 operand has no
    instruction at all, which the error says (not 'no MMA')."""
    with pytest.raises(SynthesisError, match=r"transposed view of f32 \(MN-major wgmma "
                                             r"operands exist for f16/bf16 only"):
        build(transposed_f32_gemm, {}, None, "sm_90a")


def test_an_mn_major_b_narrower_than_its_swizzle_block_uses_a_narrower_n():
    """An MN-major descriptor starts on a block of W = 64 columns (128 B swizzle of f16), so
    two warpgroups along N with 64 columns each are fine, but 32 each are not: the search
    keeps the grids whose N is a multiple of W."""
    plan = plan_of(build(gemm_kernel(f16, threads=256), dict(BM=64, BN=128, TB=True), None,
                         "sm_90a"))
    assert isinstance(plan, WgmmaPlan) and plan.trans_b == 1
    assert plan.atom.n % block_width(f16, plan.swizzle_b) == 0


@pytest.mark.parametrize("bn,swizzle", [(8, 0), (24, 0), (16, 32), (32, 64), (64, 128)])
def test_narrow_mn_major_b_takes_the_swizzle_its_width_allows(bn, swizzle):
    plan = plan_of(build(F16_GEMM, dict(BN=bn, BK=32, TB=True), None, "sm_90a"))
    assert isinstance(plan, WgmmaPlan) and plan.swizzle_b == swizzle, plan.describe()


# --------------------------------------------------------------------------------------
# The buffer layout is the arch's canonical buffer, for both majors
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
@pytest.mark.parametrize("rows,cols,swizzle,k_major", [
    (rows, cols, swizzle, k_major)
    for rows, cols, swizzle in [(64, 128, 128), (64, 256, 128), (16, 96, 32), (32, 192, 64),
                                (64, 64, 128), (16, 8, 0), (32, 24, 0)]
    for k_major in (True, False)
    if not k_major or cols * 2 >= 32])  # a K-major row holds at least one 32-byte k-step
def test_operand_layout_is_the_arch_canonical_buffer_for_both_majors(dtype, rows, cols, swizzle,
                                                                     k_major):
    """The buffer's layout in its own (rows, contiguous cols) coordinates puts every element
    where `canonical_byte_addresses` does: K-major reads it as (rows, K = cols), MN-major
    as (MN = cols, K = rows)."""
    ours = operand_layout(rows, cols, dtype, swizzle)
    coords = np.stack(np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij"), -1)
    base = 4 * 1024
    addresses = base + 2 * evaluate_offsets(ours, coords)
    if k_major:
        theirs = canonical_byte_addresses(rows, cols, dtype, swizzle, base)
    else:
        theirs = canonical_byte_addresses(cols, rows, dtype, swizzle, base, k_major=False).T
    assert np.array_equal(addresses, theirs)


# --------------------------------------------------------------------------------------
# Lowering: every descriptor reads exactly its block; TMA boxes per swizzle block
# --------------------------------------------------------------------------------------

def _value(expr, env):
    from tegula.lower.thread_ir import _FOLD, BinOp, Const, Var
    if isinstance(expr, int):
        return expr
    if isinstance(expr, Elect):  # elect.sync over a whole warp: its lane 0
        return int(env["tid"] % 32 == 0)
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Var):
        return env[expr.name]
    if isinstance(expr, BinOp):
        return _FOLD[expr.op](_value(expr.lhs, env), _value(expr.rhs, env))
    raise TypeError(expr)


@pytest.mark.parametrize("tiles", [
    dict(TA=True, TB=True, BM=128, BN=128, BK=128, threads=256),
    dict(TA=False, TB=True, BM=128, BN=256, BK=32, threads=256),
    dict(TA=True, TB=False, BM=64, BN=64, BK=256),
    dict(TA=False, TB=True, BM=64, BN=24, BK=32),
], ids=["MN-MN-bk128-2wg", "K-MN-n256", "MN-K-bk256", "K-MN-interleave"])
def test_every_descriptor_reads_exactly_the_block_its_wgmma_multiplies(tiles):
    """For each warpgroup and each Wgmma of the gemm: the descriptor's element addresses
    (the arch's function, which the emulator reads through) are the synthesized buffer
    layout's addresses of the rows x 16 block at the instruction's rows and k-step."""
    result = build(KERNELS[f16], dict(tiles, warp_specialize=False), None, "sm_90a")
    plan = plan_of(result)
    assert isinstance(plan, WgmmaPlan)
    gemm = next(op for op in walk_ops(result.traced.body) if isinstance(op, Gemm))
    wgmmas = [s for s in walk(result.thread_kernel.body) if isinstance(s, Wgmma)]
    rm, rn, rk = plan.repeats
    assert len(wgmmas) == rm * rn * rk
    instr = get_wgmma(plan.atom.name)
    allocs = {f"smem_{a.name}": a for a in result.traced.shared_allocs}
    buffers = {b.name: b for b in result.thread_kernel.shared}
    for group in range(tiles.get("threads", 128) // 128):
        env = {"tid": 128 * group, "k": 0, "i0": 0}
        gm, gn = group % plan.grid.wm, group // plan.grid.wm
        order = [(k, m, n) for k in range(rk) for m in range(rm) for n in range(rn)]
        for s, (k, m, n) in zip(wgmmas, order):
            for desc, tile, trans, first, rows in (
                    (s.a, gemm.a, s.trans_a, (gm + plan.grid.wm * m) * 64, 64),
                    (s.b, gemm.b, s.trans_b, (gn + plan.grid.wn * n) * instr.n, instr.n)):
                alloc = allocs[desc.buffer]
                start = buffers[desc.buffer].byte_offset + 2 * _value(desc.offset, env)
                read = descriptor_element_addresses(
                    MatrixDescriptor(start, desc.leading_bytes, desc.stride_bytes, desc.swizzle),
                    rows, 16, f16, k_major=not trans)
                r, kk = np.meshgrid(np.arange(first, first + rows),
                                    np.arange(16 * k, 16 * k + 16), indexing="ij")
                coords = np.stack([kk, r] if trans else [r, kk], -1)
                want = buffers[desc.buffer].byte_offset + 2 * evaluate_offsets(alloc.layout, coords)
                assert trans == int(tile.permutation not in (None, (0, 1)) and
                                    tuple(tile.permutation) == (1, 0))
                assert np.array_equal(read, want), (desc, k, m, n, group)


def test_a_contiguous_dim_of_several_spans_is_one_tma_box_per_span():
    result = build(F16_GEMM, dict(BK=256, BM=64, BN=64), None, "sm_90a")
    copies = [op for op in walk_ops(result.traced.body) if isinstance(op, Copy)
              and op.choices.get("instr") == "tma"]
    assert len(copies) == 2
    for op in copies:
        plan = op.choices["tma"]
        assert (plan.box, plan.blocks, plan.box_bytes) == ((64, 64), 4, 64 * 256 * 2)
    loads = [s for s in walk(result.thread_kernel.body) if isinstance(s, TmaLoad)]
    assert len(loads) % 8 == 0 and loads


# --------------------------------------------------------------------------------------
# Emulated against numpy
# --------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
@pytest.mark.parametrize("ta,tb,tiles", [
    (False, True, dict()),
    (True, False, dict()),
    (True, True, dict(BK=32, BM=128)),
    (False, False, dict(BK=128)),
    (False, True, dict(BK=256, BN=128)),
    (True, True, dict(BK=128, BM=128, BN=128, threads=256)),
    (False, True, dict(BN=24, BK=48)),
], ids=["B-MN", "A-MN", "both-MN-bk32", "K-bk128", "B-MN-bk256-n128", "both-MN-2wg",
        "B-MN-interleave-bk48"])
def test_emulated_gemm_with_mn_major_and_wide_k_operands_matches_numpy(dtype, ta, tb, tiles):
    """Ragged M, N, K (not multiples of the tiles); every element checked against the exact
    product within the f32 accumulation bound."""
    check_gemm(dtype, 100, 70, 150, ta, tb, **tiles)


@pytest.mark.parametrize("dtype,bk", [(f8e4m3, 256), (f32, 64)], ids=["e4m3-bk256", "tf32-bk64"])
def test_k_major_8_bit_and_tf32_rows_of_two_spans_match_numpy(dtype, bk):
    """8-bit and tf32 operands stay K-major, and their K rows may span several swizzle
    blocks too (256 bytes: two 128-byte spans)."""
    kernel = gemm_kernel(dtype)
    plan = plan_of(build(kernel, dict(BK=bk), None, "sm_90a"))
    assert isinstance(plan, WgmmaPlan) and plan.swizzle_b == 128, plan.describe()
    rng = np.random.default_rng(11)
    m, n, k = 70, 90, bk + 40
    a, b = random_input(rng, (m, k), dtype), random_input(rng, (n, k), dtype)
    c = np.full((m, n), np.nan, np.float32)
    tg.emulate(kernel, (2, 2), a, b, c, BK=bk, target="sm_90a")
    if dtype == f32:  # the tensor cores read f32 as tf32: the low 13 mantissa bits dropped
        from tegula.arch.wgmma import truncate_to_tf32
        a, b = truncate_to_tf32(a), truncate_to_tf32(b)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    # the f32 accumulator is rounded once per k-step (32 bytes of K): at most that many
    # half-ulps of the running sum, bounded by the sum of |a·b|
    steps = -(-k // (256 // dtype.bits))
    bound = steps * 2.0 ** -24 * (np.abs(a).astype(np.float64) @ np.abs(b).astype(np.float64).T)
    assert np.all(np.abs(c - ref) <= bound + 1e-30), np.abs(c - ref).max()


@pytest.mark.parametrize("ta,tb", [(True, True), (False, True)])
def test_sm90a_results_equal_sm80_mma_sync_bit_for_bit(ta, tb):
    """wgmma (MN-major, descriptors) and mma.sync (ldmatrix.trans) sum each k16 step in the
    same order and round the f32 accumulator once per step: the same bits."""
    hopper = check_gemm(f16, 70, 72, 96, ta, tb, BK=96)
    ampere = check_gemm(f16, 70, 72, 96, ta, tb, target="sm_80", BK=96)
    assert np.array_equal(hopper, ampere)


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_warp_specialized_mn_major_gemm_is_right_under_both_role_orders(role_order):
    rng = np.random.default_rng(3)
    a, b = random_operands(rng, f16, 90, 130, 200, True, True)
    c = np.full((90, 130), np.nan, np.float32)
    tg.emulate(F16_GEMM, (2, 1), a, b, c, TA=True, TB=True, BM=64, BN=256, BK=128,
               target="sm_90a", role_order=role_order)
    ref = reference(a, b, True, True)
    assert np.allclose(c, ref, rtol=1e-5, atol=1e-4)


# --------------------------------------------------------------------------------------
# explain
# --------------------------------------------------------------------------------------

def test_explain_shows_mn_major_wgmma_with_no_fallback():
    text = build(F16_GEMM, dict(TA=True, TB=True, BK=128), None, "sm_90a").explain()
    assert ("wgmma.m64n64k16.f32.f16.f16 on a 1x1 warpgroup grid, 1x1x8 wgmmas per warpgroup "
            "per gemm; A (MN-major) and B (MN-major) read from shared memory through "
            "descriptors (128 B / 128 B swizzle)") in text
    assert text.count("layout Sw<3,3,3> o 0 o (128,64):(64,1)") == 2  # (K, MN) buffers
    assert "TMA box 64x128" in text
    assert "wgmma not used" not in text
