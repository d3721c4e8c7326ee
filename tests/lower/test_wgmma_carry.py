"""`lower/wgmma_waits.py` `carry_wgmma_groups`: a pipeline body's last wgmma groups (the
attention forward's p @ v) stay in flight into the next iteration, which retires them
where it first needs their registers, and the stage they read is released only after
that retirement (`lower/hopper.py` `_carried_consumer_loop`; one role: the release
barrier ends the iteration). The emulator keeps a wgmma's registers and shared operand
bytes busy until its wait: a read of them, or a TMA refill of the stage, before it is
reported. Bodies whose groups all retire before their end are left as they were."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.build import build
from tegula.dtypes import f16
from tegula.emulate import EmulationError
from tegula.kernels.common import poisoned, random_input
from tegula.lower.async_ir import MBarrierArrive, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait
from tegula.lower.thread_ir import (Assign, Barrier, Const, For, If, Reg, RegArray, RegRead,
                                    walk)
from tegula.lower.wgmma_waits import carry_wgmma_groups

S, ACC, P = (RegArray(name, f32, 4) for name in ("s", "acc", "p"))


def _gemm(d):
    return [WgmmaFence(), Wgmma("wgmma.m64n8k16.f32.f16.f16", [Reg(d, Const(i)) for i in range(4)],
                                None, None, scale_d=Const(1)), WgmmaCommit(), WgmmaWait(0)]


def _assign(dst, src):
    return Assign(Reg(dst, Const(0)), RegRead(Reg(src, Const(0))))


def _kinds(out):
    return [type(s).__name__ + (str(s.pending) if isinstance(s, WgmmaWait) else "")
            for s in out]


def test_the_last_gemm_is_carried_and_retired_where_the_next_iteration_needs_it():
    """s = q k^T; softmax reads s; acc += p v. Carried: p v. Next iteration: the s gemm
    issues with p v in flight, the read of s retires both (wait_group 0), and that is
    where the previous stage may be released (`at`)."""
    body = _gemm(S) + [_assign(P, S), _assign(ACC, ACC)] + _gemm(ACC) + [_assign(P, P)]
    out, at = carry_wgmma_groups(body)
    assert _kinds(out) == ["WgmmaFence", "Wgmma", "WgmmaCommit", "WgmmaWait0", "Assign",
                           "Assign", "WgmmaFence", "Wgmma", "WgmmaCommit", "Assign"]
    assert at == 4          # right after the wait retiring the carried p v


def test_a_body_retiring_every_group_before_its_end_carries_nothing():
    assert carry_wgmma_groups(_gemm(S) + [_assign(P, S)]) is None
    assert carry_wgmma_groups(_gemm(S) + [Barrier()]) is None


def test_carried_groups_untouched_by_the_body_are_retired_at_its_end():
    """The next iteration never touches the carried registers: they are retired at its
    end at the latest (wait_group 1: its own group stays in flight), so no more than one
    iteration's groups are ever in flight."""
    out, at = carry_wgmma_groups(_gemm(ACC) + [_assign(P, P)])
    assert _kinds(out) == ["WgmmaFence", "Wgmma", "WgmmaCommit", "Assign", "WgmmaWait1"]
    assert at == len(out)


def test_memory_retires_the_carried_groups_and_nothing_is_carried_where_nothing_overlaps():
    """A barrier retires every group before it; where that comes before the next
    iteration issued a gemm of its own, carrying would overlap nothing: not carried."""
    out, at = carry_wgmma_groups(_gemm(S) + [Barrier()] + _gemm(ACC))
    assert _kinds(out) == ["WgmmaFence", "Wgmma", "WgmmaCommit", "WgmmaWait0", "Barrier",
                           "WgmmaFence", "Wgmma", "WgmmaCommit"] and at == 4
    assert carry_wgmma_groups([Barrier()] + _gemm(ACC)) is None


def test_nothing_is_carried_past_two_thirds_of_the_register_budget():
    """Carrying p v into the next s raises the registers in flight at once from 4 (one
    4-register accumulator at a time) to 8 (both): allowed with 12 registers a thread
    (two thirds: 8), not with 11 (7)."""
    body = _gemm(S) + [_assign(P, S), _assign(ACC, ACC)] + _gemm(ACC) + [_assign(P, P)]
    assert carry_wgmma_groups(body, registers=12) is not None
    assert carry_wgmma_groups(body, registers=11) is None


def test_the_three_warpgroup_forward_at_160_registers_is_not_carried():
    """BM=192 on three consumer warpgroups at 160 registers: carrying p @ v (160 in flight)
    made ptxas serialize the wgmmas (C7511); at 240 (BM=128, two) it is carried."""
    from tegula.kernels.attention import attention_kernel
    for tiles, carried in ((dict(BM=192, BN=128, threads=384, REGS=160), False),
                           (dict(BM=128, BN=128, threads=256, REGS=240), True)):
        body = build(attention_kernel(f16), dict(tiles, D=128, QK_SCALE=0.1), None,
                     "sm_90a").thread_kernel.body
        kinds = _kinds(_consumer_loop(body).body)
        assert (kinds[-1] != "WgmmaWait0" and "WgmmaWait0" not in kinds[-3:]) == carried, kinds


# ------------------------------------------------------------------ kernels, emulated

def _consumer_loop(body):
    from tegula.lower.async_ir import Roles
    roles = next(s for s in walk(body) if isinstance(s, Roles)).roles
    consumer = next(r.body for r in roles if r.name.startswith("consumer"))
    return next(s for s in consumer if isinstance(s, For)
                and any(isinstance(x, WgmmaCommit) for x in s.body))


def test_the_stated_attention_forward_releases_the_previous_stage_after_the_carried_wait():
    """REGS=240 (two consumer warpgroups, stated roles): the loop's release arrives on
    the previous iteration's stage, guarded by k > start, right after the wait that
    retired the carried p v, and the loop ends with p v's group in flight."""
    from tegula.kernels.attention import attention_kernel
    body = build(attention_kernel(f16), dict(D=64, QK_SCALE=0.1, BM=128, BN=64, threads=256,
                                             REGS=240), None, "sm_90a").thread_kernel.body
    loop = _consumer_loop(body)
    kinds = _kinds(loop.body)
    release = next(i for i, s in enumerate(loop.body) if isinstance(s, If)
                   and any(isinstance(x, MBarrierArrive) for x in walk(s.then)))
    assert kinds[release - 1] == "WgmmaWait0"
    assert kinds.index("WgmmaCommit") < release     # this iteration's s was issued first
    assert "WgmmaWait" not in "".join(kinds[release:])   # p v stays in flight
    assert [x for x in kinds if x.startswith("Wgmma")][-1] == "WgmmaCommit"


def _attention_reference(q, k, v, causal, scale):
    s = q[0, 0].astype(np.float64) @ k[0, 0].T.astype(np.float64) * scale
    if causal:
        sq, sk = s.shape
        s = np.where(np.arange(sk)[None, :] <= np.arange(sq)[:, None] + sk - sq, s, -np.inf)
    p = np.exp(s - s.max(axis=1, keepdims=True))
    return p @ v[0, 0].astype(np.float64) / p.sum(axis=1, keepdims=True)


@pytest.mark.parametrize("tiles,role_order", [
    (dict(BM=128, BN=64, threads=256, REGS=240), "stall"),
    (dict(BM=128, BN=64, threads=256, REGS=240, OVERLAP=True), "random:3"),
    (dict(BM=128, BN=64, threads=256, consumers="pingpong"), "listed"),
], ids=["stated", "stated-overlap", "pingpong"])
def test_carried_attention_forward_is_right_at_ragged_shapes(tiles, role_order):
    from tegula.kernels.attention import attention_kernel, default_tiles, qk_scale
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((1, 1, n, 64)).astype(np.float16) for n in (130, 200, 200))
    o, lse = poisoned(q.shape, f16), poisoned((1, 1, 130), f32)
    constexprs = {**default_tiles(64, "sm_90a"), **tiles}
    tg.emulate(attention_kernel(f16), (2, 1, 1), q, k, v, o, lse, D=64,
               QK_SCALE=qk_scale(0.11, 64), CAUSAL=True, target="sm_90a",
               role_order=role_order, **constexprs)
    np.testing.assert_allclose(o[0, 0].astype(np.float64), _attention_reference(
        q, k, v, True, 0.11), rtol=2e-3, atol=2e-3)


def test_a_release_before_the_carried_wait_is_reported(monkeypatch):
    """The previous stage released before the wait that retires its readers (the carried
    p v): the producer refills it while p v's wgmmas still read it, and the emulator
    (each role stalls at its arrivals, so the producer runs ahead) says so."""
    from tegula.kernels.attention import attention_kernel, default_tiles, qk_scale
    from tegula.lower import hopper
    real = hopper.carry_wgmma_groups

    def too_early(stmts, **limits):
        found = real(stmts, **limits)
        return None if found is None else (found[0], 0)
    monkeypatch.setattr(hopper, "carry_wgmma_groups", too_early)
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((1, 1, n, 64)).astype(np.float16) for n in (64, 256, 256))
    constexprs = {**default_tiles(64, "sm_90a"), **dict(BM=128, BN=64, threads=256,
                                                         REGS=240, STAGES=2)}
    with pytest.raises(EmulationError, match="while a wgmma or TMA store still reads it"):
        tg.emulate(attention_kernel.__wrapped__(f16), (1, 1, 1), q, k, v,
                   poisoned(q.shape, f16), poisoned((1, 1, 64), f32), D=64,
                   QK_SCALE=qk_scale(0.13, 64), CAUSAL=False, target="sm_90a",
                   role_order="stall", **constexprs)
