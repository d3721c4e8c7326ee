"""The sm_90a GEMM decisions: wgmma when the gemm fits it (else mma.sync with the reason),
the canonical swizzled operand buffers, and TMA for the copies a pipeline runs ahead when
the facts allow it (else the reason)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.arch.smem_matrix import canonical_byte_addresses, canonical_smem_layout
from tegula.build import build
from tegula.dtypes import bf16, f16, f32, i8, i32
from tegula.ir.ops import Copy, Gemm, walk_ops
from tegula.synth.facts import TensorFacts
from tegula.synth.gemm import GemmPlan, WgmmaPlan, operand_layout
from tegula.synth.shared import evaluate_offsets

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from examples.gemm import gemm as readme_gemm  # noqa: E402  (the unchanged README kernel)


def gemm_of(result) -> Gemm:
    return next(op for op in walk_ops(result.traced.body) if isinstance(op, Gemm))


def copies_of(result) -> list[Copy]:
    return [op for op in walk_ops(result.traced.body)
            if isinstance(op, Copy) and op.dst.scope == "shared"]


def plan_for(kernel, target="sm_90a", facts=None, **constexprs):
    return gemm_of(build(kernel, constexprs, facts, target)).choices["plan"]


def test_readme_gemm_on_sm90a_plans_wgmma_over_warpgroups():
    plan = plan_for(readme_gemm)                      # BM = BN = 128, BK = 32, 128 threads
    assert isinstance(plan, WgmmaPlan)
    assert plan.atom.name == "wgmma.m64n128k16.f32.f16.f16"
    assert (plan.grid.wm, plan.grid.wn) == (1, 1) and plan.repeats == (2, 1, 2)
    assert plan.swizzle_a == plan.swizzle_b == 64      # BK = 32 f16: 64-byte K rows
    two_groups = plan_for(readme_gemm, threads=256)
    assert two_groups.grid.wm * two_groups.grid.wn == 2
    assert two_groups.c_tv[0].size == 256


def test_readme_gemm_on_sm80_keeps_mma_sync_without_a_wgmma_note():
    plan = plan_for(readme_gemm, target="sm_80")
    assert isinstance(plan, GemmPlan) and plan.atom.name.startswith("mma.m16n8k16")
    assert plan.wgmma_skipped == "" and "wgmma" not in plan.describe()


@pytest.mark.parametrize("constexprs,reason", [
    (dict(threads=64, BM=64, BN=64), "not whole warpgroups"),
    (dict(BM=32, BN=64), "does not split into 64xN"),
    (dict(BM=64, BN=64, BK=8), "K = 8 (%s1[i0]: shared<64x8, f16>) is not a multiple of the "
                               "wgmma's K = 16"),
])
def test_wgmma_falls_back_to_mma_sync_with_the_reason(constexprs, reason):
    plan = plan_for(readme_gemm, **constexprs)
    assert isinstance(plan, GemmPlan) and plan.atom.name.startswith("mma.")
    assert reason in plan.wgmma_skipped, plan.wgmma_skipped
    assert f"wgmma not used: {plan.wgmma_skipped}" in plan.describe()


@tg.kernel(threads=128)
def i8_gemm(a: tg.Tensor[i8], b: tg.Tensor[i8], c: tg.Tensor[i32]):
    acc = tg.zeros((64, 64), i32)
    sa = tg.shared((64, 32), i8)
    sb = tg.shared((64, 32), i8)
    tg.copy(a.tile((64, 32), (0, 0)), sa)
    tg.copy(b.tile((64, 32), (0, 0)), sb)
    tg.gemm(acc, sa, sb)
    tg.copy(acc, c.tile((64, 64), (0, 0)))


@tg.kernel(threads=128)
def register_operand_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32]):
    acc = tg.zeros((64, 64), f32)
    ra = tg.load(a.tile((64, 16), (0, 0)))
    sb = tg.shared((64, 16), f16)
    tg.copy(b.tile((64, 16), (0, 0)), sb)
    tg.gemm(acc, ra, sb)
    tg.copy(acc, c.tile((64, 64), (0, 0)))


@tg.kernel(threads=128)
def register_b_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32]):
    acc = tg.zeros((64, 64), f32)
    sa = tg.shared((64, 16), f16)
    tg.copy(a.tile((64, 16), (0, 0)), sa)
    rb = tg.load(b.tile((64, 16), (0, 0)))
    tg.gemm(acc, sa, rb)
    tg.copy(acc, c.tile((64, 64), (0, 0)))


def test_a_register_operand_goes_to_wgmma_with_b_from_shared_memory():
    """wgmma reads A from registers (its A fragment: rows by warp, as the accumulator's),
    B through a descriptor; the result is the sm_80 mma.sync result, bit for bit."""
    plan = plan_for(register_operand_gemm)
    assert plan.kind == "wgmma" and plan.a_tv is not None, plan.describe()
    assert "A from registers" in plan.describe()
    rng = np.random.default_rng(5)
    a = rng.standard_normal((64, 16)).astype(np.float16)
    b = rng.standard_normal((64, 16)).astype(np.float16)
    results = []
    for target in ("sm_90a", "sm_80"):
        c = np.full((64, 64), np.nan, np.float32)
        tg.emulate(register_operand_gemm, (1,), a, b, c, target=target)
        results.append(c)
    exact = a.astype(np.float64) @ b.astype(np.float64).T
    assert np.all(np.abs(results[0] - exact) <= 16 * 2.0 ** -24 * (np.abs(a) @ np.abs(b).T + 1))
    assert np.array_equal(results[0], results[1])


@pytest.mark.parametrize("kernel,reason", [
    (i8_gemm, "operand A is i8"),
    (register_b_gemm, "operand B %r1: register<64x16, f16> is not a shared tile"),
], ids=["i8", "register-B"])
def test_operands_wgmma_cannot_read_fall_back_with_the_reason(kernel, reason):
    plan = plan_for(kernel)
    assert isinstance(plan, GemmPlan) and reason in plan.wgmma_skipped, plan.wgmma_skipped


@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
@pytest.mark.parametrize("rows,k", [(64, 64), (128, 32), (64, 16), (8, 32)])
def test_operand_layout_is_the_arch_canonical_buffer(dtype, rows, k):
    """The flat (rows, k):(k, 1) form synthesis uses reads the same element offsets as
    `smem_matrix.canonical_smem_layout` and the same bytes as `canonical_byte_addresses`."""
    swizzle = k * dtype.bits // 8
    ours = operand_layout(rows, k, dtype, swizzle)
    coords = np.stack(np.meshgrid(np.arange(rows), np.arange(k), indexing="ij"), -1)
    offsets = evaluate_offsets(ours, coords)
    theirs = canonical_smem_layout(rows, k, dtype, swizzle)
    assert np.array_equal(offsets, np.vectorize(lambda r, c: theirs((r, c)))(
        coords[..., 0], coords[..., 1]))
    base = 3 * 1024
    assert np.array_equal(base + 2 * offsets, canonical_byte_addresses(rows, k, dtype, swizzle, base))


def test_wgmma_buffers_are_pinned_canonical_and_atom_aligned():
    result = build(readme_gemm, dict(BM=128, BN=64, BK=64), None, "sm_90a")
    synthesis = result.synthesis
    for alloc in result.traced.shared_allocs:
        rows, k = alloc.shape
        assert str(alloc.layout) == str(operand_layout(rows, k, f16, 128))
        assert synthesis.shared_offsets[alloc.id] % 1024 == 0


def test_pipelined_copies_become_tma_boxes():
    copies = copies_of(build(readme_gemm, dict(BM=128, BN=64, BK=32), None, "sm_90a"))
    plans = [op.choices["tma"] for op in copies]
    assert all(op.choices["instr"] == "tma" for op in copies)
    assert [(p.dims, p.box, p.swizzle, p.box_bytes) for p in plans] == [
        ((1, 0), (32, 128), 64, 8192), ((1, 0), (32, 64), 64, 4096)]


def facts_with(**changes) -> dict:
    facts = {n: TensorFacts.assume_row_major(2) for n in "abc"}
    for name, fields in changes.items():
        facts[name] = TensorFacts(**{**facts[name].__dict__, **fields})
    return facts


@pytest.mark.parametrize("changes,reason", [
    (dict(a=dict(stride_divisors=(4, 16))), "stride along dim 0 is not known to be a multiple of 16"),
    (dict(b=dict(align_bytes=8)), "only known 8-byte aligned"),
    (dict(a=dict(contiguous_dim=0)), "not its contiguous dim"),
], ids=["row-stride", "pointer", "column-major"])
def test_copies_stay_cp_async_with_the_reason_when_tma_is_not_proven(changes, reason):
    """One mechanism per pipeline: a copy TMA cannot do keeps every copy of the loop on
    the thread path; the gemm still runs on wgmma."""
    result = build(readme_gemm, dict(BM=64, BN=64), facts_with(**changes), "sm_90a")
    assert isinstance(gemm_of(result).choices["plan"], WgmmaPlan)
    copies = copies_of(result)
    assert all(op.choices["instr"] != "tma" for op in copies)
    assert any(reason in op.choices["tma_skipped"] for op in copies), \
        [op.choices.get("tma_skipped") for op in copies]


@tg.kernel(threads=128)
def filled_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32]):
    acc = tg.zeros((64, 64), f32)
    sa = tg.shared((64, 32), f16, stages=2)
    sb = tg.shared((64, 32), f16, stages=2)
    for k in tg.pipeline(tg.cdiv(a.shape[1], 32), stages=2):
        tg.copy(a.tile((64, 32), (0, k)), sa[k], fill=1.0)
        tg.copy(b.tile((64, 32), (0, k)), sb[k])
        tg.gemm(acc, sa[k], sb[k])
    tg.copy(acc, c.tile((64, 64), (0, 0)))


def test_a_copy_with_a_nonzero_fill_is_not_tma():
    copies = copies_of(build(filled_gemm, {}, None, "sm_90a"))
    assert all(op.choices["instr"] != "tma" for op in copies)
    assert "fill 1.0 is not +0" in copies[0].choices["tma_skipped"]


def test_explain_shows_the_hopper_decisions():
    text = build(readme_gemm, dict(BM=128, BN=128, BK=32), None, "sm_90a").explain()
    assert "wgmma.m64n128k16.f32.f16.f16 on a 1x1 warpgroup grid, 2x1x2 wgmmas" in text
    assert "over: wgmma.m64n64k16.f32.f16.f16, 1x1 warpgroup grid" in text
    assert text.count("TMA box 32x128") == 2 and "64 B swizzle, 8192 B per stage" in text
    assert "TMA boxes into an mbarrier ring of 3" in text
    assert text.count("because: wgmma operand: the canonical buffer") == 2
    assert "G2S      tma.load.2d" in text


def test_explain_says_why_wgmma_or_tma_is_not_used():
    text = build(readme_gemm, dict(BM=32, BN=64), None, "sm_90a").explain()
    assert "wgmma not used: the 32x64 C tile does not split into 64xN" in text
    facts = facts_with(a=dict(stride_divisors=(4, 16)))
    text = build(readme_gemm, dict(BM=64, BN=64), facts, "sm_90a").explain()
    assert "TMA not used: a's stride along dim 0 is not known" in text


@tg.kernel(threads=128)
def mixed_gemms(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32]):
    """One accumulator updated by a gemm wgmma can run (shared operands) and by one it
    cannot (B in registers): both must agree on the accumulator's layout."""
    acc = tg.zeros((64, 64), f32)
    sa = tg.shared((64, 16), f16)
    sb = tg.shared((64, 16), f16)
    tg.copy(a.tile((64, 16), (0, 0)), sa)
    tg.copy(b.tile((64, 16), (0, 0)), sb)
    tg.gemm(acc, sa, sb)
    rb = tg.load(b.tile((64, 16), (0, 1)))
    tg.gemm(acc, sa, rb)
    tg.copy(acc, c.tile((64, 64), (0, 0)))


def test_gemms_sharing_an_accumulator_agree_on_mma_sync_when_one_cannot_use_wgmma():
    result = build(mixed_gemms, {}, None, "sm_90a")
    plans = [op.choices["plan"] for op in walk_ops(result.traced.body) if isinstance(op, Gemm)]
    assert all(isinstance(p, GemmPlan) for p in plans)
    assert "the accumulator is also updated by the gemm at line" in plans[0].wgmma_skipped
    rng = np.random.default_rng(7)
    from tegula.kernels.common import poisoned, random_input
    a, b = random_input(rng, (64, 32), f16), random_input(rng, (64, 32), f16)
    c = poisoned((64, 64), f32)
    tg.emulate(mixed_gemms, (1, 1), a, b, c, target="sm_90a")
    af, bf = a[:, :16].astype(np.float64), b.astype(np.float64)
    ref = af @ bf[:, :16].T + af @ bf[:, 16:].T
    bound = 64 * 2.0 ** -24 * (np.abs(af) @ np.abs(bf[:, :16]).T + np.abs(af) @ np.abs(bf[:, 16:]).T)
    assert np.all(np.abs(c - ref) <= bound)


@tg.kernel(threads=128)
def previous_stage_gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32]):
    acc = tg.zeros((64, 64), f32)
    sa = tg.shared((64, 32), f16, stages=3)
    sb = tg.shared((64, 32), f16, stages=3)
    for k in tg.pipeline(tg.cdiv(a.shape[1], 32), stages=3):
        tg.copy(a.tile((64, 32), (0, k)), sa[k])
        tg.copy(b.tile((64, 32), (0, k)), sb[k])
        tg.gemm(acc, sa[k + 2], sb[k])
    tg.copy(acc, c.tile((64, 64), (0, 0)))


def test_a_read_of_another_stage_keeps_the_copies_off_the_mbarrier_ring():
    copies = copies_of(build(previous_stage_gemm, {}, None, "sm_90a"))
    assert all(op.choices["instr"] != "tma" for op in copies)
    assert "is read at a stage other than the pipeline's index" in copies[0].choices["tma_skipped"]
