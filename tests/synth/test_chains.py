"""Chained gemms (one gemm's accumulator, element by element, is the next one's A operand
in registers) get their warp grids chosen together, so the tile between them stays in
registers (synth/chains.py)."""
import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.arch.targets import get_target
from tegula.ir.ops import Gemm, walk_ops
from tegula.synth.chains import conversion_cycles, gemm_chains


@tg.kernel(threads=128)
def attention_block(q: tg.Tensor[f16], k: tg.Tensor[f16], v: tg.Tensor[f16], o: tg.Tensor[f16],
                    BM: tg.constexpr = 64, BN: tg.constexpr = 64, D: tg.constexpr = 64):
    m = tg.block_id(0)
    sq = tg.shared((BM, D), f16)
    tg.copy(q.tile((BM, D), (m, 0)), sq)
    sk = tg.shared((BN, D), f16)
    sv = tg.shared((D, BN), f16)
    acc = tg.zeros((BM, D), f32)
    m_i = tg.full((BM, 1), -float("inf"), f32)
    l_i = tg.zeros((BM, 1), f32)
    gk = k.tile((BN, D), (None, 0))
    gv = v.T.tile((D, BN), (0, None))
    for j in tg.range(gk.shape[2]):
        tg.copy(gk[:, :, j], sk, fill=0.0)
        tg.copy(gv[:, :, j], sv, fill=0.0)
        s = tg.zeros((BM, BN), f32)
        tg.gemm(s, sq, sk)
        keys = tg.arange(BN, offset=j * BN)
        s = tg.where(keys < k.shape[0], s, -float("inf"))
        m_new = tg.maximum(m_i, tg.max(s, 1))
        p = tg.exp(s - m_new)
        alpha = tg.exp(m_i - m_new)
        l_i = l_i * alpha + tg.sum(p, 1)
        acc = acc * alpha
        tg.gemm(acc, p.to(f16), sv)
        m_i = m_new
    tg.copy((acc / l_i).to(f16), o.tile((BM, D), (m, 0)))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_p_stays_in_registers_between_the_two_gemms(target):
    text = tg.explain(attention_block, target=target)
    assert "layout conversions: none" in text, text
    assert "4x1 warp grid" in text
    assert "by register renaming" in text


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
