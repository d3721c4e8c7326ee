"""Chained gemms (one gemm's accumulator, element by element, is the next one's A operand
in registers) get their warp grids chosen together, so the tile between them stays in
registers (synth/chains.py)."""
import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.arch.targets import get_target
from tegula.ir.ops import Gemm, walk_ops
from tegula.synth.chains import conversion_cycles, gemm_chains

sys.path.insert(0, os.path.dirname(__file__))
from chain_kernels import attention_block  # noqa: E402


def test_p_stays_in_registers_between_the_two_mma_sync_gemms():
    text = tg.explain(attention_block, target="sm_80")
    assert "layout conversions: none" in text, text
    import re
    joint = set(re.findall(r"mma\.m16n8k16\.f32\.f16\.f16\.f32 on a 4x1 warp grid, 1x8x4 MMAs per "
                           r"warp per gemm; warp grid chosen with the gemm at line (\d+)", text))
    assert len(joint) == 2  # each gemm names the other
    assert "by register renaming" in text


def test_p_is_the_register_a_operand_of_the_second_wgmma():
    """sm_90a: the second gemm takes P from registers (wgmma's A fragment is the
    accumulator's rows, per warp as mma.sync's), B through its descriptor."""
    from tegula.build import build
    from tegula.lower.async_ir import SmemDesc, Wgmma
    from tegula.lower.thread_ir import walk
    text = tg.explain(attention_block, target="sm_90a")
    assert "layout conversions: none" in text, text
    assert "A from registers, B read from shared memory" in text
    body = build(attention_block, {}, None, "sm_90a").thread_kernel.body
    wgmmas = [s for s in walk(body) if isinstance(s, Wgmma)]
    assert {isinstance(s.a, SmemDesc) for s in wgmmas} == {True, False}
    assert all(len(s.a) == 64 * 16 // 128 for s in wgmmas if not isinstance(s.a, SmemDesc))


def test_the_chain_is_found_through_casts_and_broadcast_operands():
    kernel = attention_block.trace_fresh()
    gemms = [op for op in walk_ops(kernel.body) if isinstance(op, Gemm)]
    chains = gemm_chains(gemms, kernel.body)
    assert [(first.loc.lineno, second.loc.lineno) for first, second in chains] == \
        [(gemms[0].loc.lineno, gemms[1].loc.lineno)]


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("keys", [1, 50, 128])
def test_chained_kernel_is_right_in_the_emulator(target, keys):
    rng = np.random.default_rng(keys)
    q = rng.standard_normal((64, 64)).astype(np.float16)
    k = rng.standard_normal((keys, 64)).astype(np.float16)
    v = rng.standard_normal((keys, 64)).astype(np.float16)
    s = q.astype(np.float64) @ k.astype(np.float64).T
    p = np.exp(s - s.max(1, keepdims=True))
    ref = (p / p.sum(1, keepdims=True)) @ v.astype(np.float64)
    o = np.full((64, 64), np.nan, np.float16)
    tg.emulate(attention_block, (1,), q, k, v, o, target=target)
    # f16 P and output: a few f16 ulps of values below ~4
    np.testing.assert_allclose(o.astype(np.float64), ref, atol=4e-3, rtol=0)


def test_a_renaming_costs_nothing_and_a_round_trip_costs_cycles():
    from tegula.synth.gemm import mma_sync_plans
    target = get_target("sm_80")
    kernel = attention_block.trace_fresh()
    first, second = [op for op in walk_ops(kernel.body) if isinstance(op, Gemm)]
    by_grid = {(p.grid.wm, p.grid.wn): p for p in mma_sync_plans(first, 128, target)
               if p.atom.name.endswith("k16.f32.f16.f16.f32")}
    second_plans = {(p.grid.wm, p.grid.wn): p for p in mma_sync_plans(second, 128, target)
                    if p.atom.name.endswith("k16.f32.f16.f16.f32")}
    rows = conversion_cycles(by_grid[4, 1].c_tv, second_plans[4, 1].a_tv, (64, 64), 2, 128, target)
    square = conversion_cycles(by_grid[2, 2].c_tv, second_plans[2, 2].a_tv, (64, 64), 2, 128, target)
    assert rows == 0 and square > 100


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("bn", [64, 128])
def test_gemms_sharing_the_chained_accumulator_move_together(target, bn):
    """Two gemms accumulate s; s feeds the next gemm: all three agree (was: 'the accumulator
    already has the layout' on sm_80 once the chain moved one of the two)."""
    from chain_kernels import two_chunk_chain
    text = tg.explain(two_chunk_chain, target=target, BN=bn)
    assert "layout conversions: none" in text, text
    rng = np.random.default_rng(bn)
    a = (rng.standard_normal((64, 128)) / 4).astype(np.float16)
    b = (rng.standard_normal((bn, 128)) / 4).astype(np.float16)
    c = rng.standard_normal((64, bn)).astype(np.float16)
    o = np.full((64, 64), np.nan, np.float32)
    tg.emulate(two_chunk_chain, (1,), a, b, c, o, target=target, BN=bn)
    s = (a.astype(np.float64) @ b.astype(np.float64).T).astype(np.float32).astype(np.float16)
    ref = s.astype(np.float64) @ c.astype(np.float64).T
    # s is rounded to f16 from an f32 sum that may differ from ours in the last f32 bit
    bound = 2.0 ** -10 * (np.abs(s.astype(np.float64)) @ np.abs(c.astype(np.float64)).T) + 1e-3
    assert np.all(np.abs(o - ref) <= bound)
