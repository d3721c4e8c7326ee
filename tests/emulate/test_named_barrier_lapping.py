"""Named barriers count every arrival, and a role that arrives twice before the others
reach the barrier laps them. The ping-pong turns before 2be99ba did: each warpgroup
arrived on the other's turn barrier, then synced on its own, every iteration, so
warpgroup 1 could pass its sync and arrive again while warpgroup 0 was still in its
softmax; two arrivals of 128 completed the 256-thread barrier alone, and warpgroup 0's
sync waited forever (the D=64 forward hung on the H100). The emulator never found it:
its fixed orders switch roles only where one blocks. Under `role_order="stall"` a role
that arrives is held while the others run ahead (`roles.stall_point`), and a second
arrival in one generation is reported (`async_ops._check_lapping`)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.emulate.roles import check_role_order
from tegula.lower import warp_roles
from tegula.lower.async_ir import NamedBarrier, Role, Roles
from tegula.lower.thread_ir import (TID, Assign, Binary, Const, For, GlobalStore, If, Literal,
                                    RegArray, Reg, RegRead, TensorParam, ThreadKernel, Var)

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "kernels"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_kernels import run_with_deadline  # noqa: E402

TURN = 8  # warpgroup g syncs on TURN + g and arrives on the other's
_R = Reg(RegArray("x", tg.f32, 1), Const(0))


def _turn_kernel(trips: int, order: str) -> ThreadKernel:
    """Two warpgroup roles taking `trips` turns each; a turn adds 1 to every thread's
    register three times (the softmax), which each thread stores to `out` at the end.
    "old": each iteration arrives on the other's barrier, does its work, syncs on its own
    (the order before 2be99ba). "strict": warpgroup 1 opens warpgroup 0's first turn,
    each syncs on its own before its work and hands over after it, and warpgroup 1 skips
    its last hand-over (the order since)."""
    work = [Assign(_R, Binary("add", RegRead(_R), Literal(1.0, tg.f32), tg.f32))] * 3
    bodies = []
    for g in (0, 1):
        mine, other = NamedBarrier(TURN + g, 256), NamedBarrier(TURN + 1 - g, 256, arrive=True)
        j = Var("j")
        if order == "old":
            loop, before = [other] + work + [mine], []
        elif g == 0:
            loop, before = [mine] + work + [other], []
        else:
            loop = [mine] + work + [If(j.lt(Const(trips - 1)), [other])]
            before = [NamedBarrier(TURN, 256, arrive=True)] if trips else []
        bodies.append(before + [For(j, Const(0), Const(trips), 1, loop),
                                GlobalStore("out", TID, _R, 1)])
    roles = Roles([Role("warpgroup 0", TID.lt(128), bodies[0], loc="turns: warpgroup 0"),
                   Role("warpgroup 1", TID.ge(128), bodies[1], loc="turns: warpgroup 1")])
    return ThreadKernel("turns", 256, [TensorParam("out", tg.f32, 1, writes=True)],
                        [_R.array], [], [Assign(_R, Literal(0.0, tg.f32)), roles])


def _run(kernel: ThreadKernel, order: str) -> np.ndarray:
    out = np.full(256, np.nan, dtype=np.float32)
    run_with_deadline(lambda: run_thread_kernel(kernel, 1, {"out": out}, role_order=order),
                      seconds=60)
    return out


@pytest.mark.parametrize("trips", [0, 1, 2, 5])
@pytest.mark.parametrize("order", ["listed", "reversed", "stall", "stall-reversed", "random:3"])
def test_strict_turns_run_under_every_order(trips, order):
    assert (_run(_turn_kernel(trips, "strict"), order) == 3 * trips).all()


@pytest.mark.parametrize("order", ["listed", "reversed"])
def test_the_old_order_passes_the_orders_that_switch_only_where_a_role_blocks(order):
    """Why the hang went unseen: run until it blocks, neither warpgroup ever arrives twice."""
    assert (_run(_turn_kernel(3, "old"), order) == 9).all()


@pytest.mark.parametrize("order", ["stall", "stall-reversed"])
def test_the_old_order_laps_when_a_role_is_held_after_its_arrive(order):
    """Held right after its arrive, one warpgroup sees the other pass its sync, work,
    and arrive again on the same barrier: reported at that second arrival."""
    with pytest.raises(EmulationError) as info:
        _run(_turn_kernel(3, "old"), order)
    msg = str(info.value)
    assert "a second time before it completed (128 of 256 threads counted)" in msg
    lapper = "128..255" if order == "stall" else "0..127"
    assert f"threads {lapper} arrive at named barrier" in msg and "lapping" in msg
    assert "turns: warpgroup" in msg and "j=1" in msg  # where: the role and its iteration


def test_the_new_orders_are_accepted_and_others_named():
    for order in ("stall", "stall-reversed"):
        check_role_order(order)
    with pytest.raises(EmulationError, match="'stall', 'stall-reversed' or 'random:SEED'"):
        check_role_order("stalled")


def _old_turns_across_the_back_edge(loop, sync_at, arrive_at, opener):
    """The plain attention loop's turns as lowered before 2be99ba, built by hand: each
    iteration arrives on the other's barrier after its scores' gemm, then syncs on its own
    before p @ v; no opener, no skipped hand-over, no closer."""
    body = loop.body
    after = warp_roles._turn_operands(body[sync_at:] + body[:arrive_at])
    new = (body[:arrive_at] + [warp_roles._turn(arrive=True)] + body[arrive_at:sync_at]
           + [warp_roles._turn(arrive=False, after=after)] + body[sync_at:])
    return [For(loop.var, loop.start, loop.stop, loop.step, new, loop.unroll)]


def _attention(order: str, monkeypatch, old: bool) -> None:
    """The D=64 ping-pong forward (128-row query block, 64-key blocks, 2 of them) in the
    emulator under `order`, lowered with the old turns or today's; checked element by
    element against float64 (outputs start poisoned)."""
    from tegula.kernels.attention import attention_emulated, attention_kernel
    from test_attention_forward import check, inputs, reference
    if old:
        monkeypatch.setattr(warp_roles, "_turns_across_the_back_edge",
                            _old_turns_across_the_back_edge)
    monkeypatch.setattr(attention_kernel(tg.f16), "_builds", {}, raising=False)  # afresh
    q, k, v = inputs(3, 1, 1, 1, 64, 100, 64)
    o, lse = run_with_deadline(lambda: attention_emulated(
        q, k, v, False, return_lse=True, BN=64, OVERLAP=False, BM=128, threads=256,
        consumers="pingpong", role_order=order), seconds=120)
    check(o, lse, *reference(q, k, v, False))


def test_the_old_attention_turns_are_reported_as_lapping(monkeypatch):
    """The emulator's regression test of 2be99ba: the old turn order, lowered into the
    real ping-pong attention kernel, gives a right answer under the listed order (all the
    emulator saw then) and is reported under the stall order."""
    _attention("listed", monkeypatch, old=True)
    with pytest.raises(EmulationError, match="arrive at named barrier 8 a second time"):
        _attention("stall", monkeypatch, old=True)


@pytest.mark.parametrize("order", ["stall", "stall-reversed"])
def test_the_attention_turns_as_lowered_now_never_lap(order, monkeypatch):
    _attention(order, monkeypatch, old=False)
