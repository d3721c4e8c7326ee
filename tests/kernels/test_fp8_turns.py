"""The blockwise FP8 GEMM's two consumer warpgroups taking turns at the tensor cores in the
K loop (session 13): a one-gemm loop body (the K block's wgmmas, then the promotion)
under `warp_roles._loop_with_turns`, checked like the attention forward's turns — every
interleaving of the two warpgroups' barrier programs under counting named barriers, alone
and once per tile inside a persistent tile loop."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tegula.lower import warp_roles
from tegula.lower.async_ir import WgmmaCommit, WgmmaFence
from tegula.lower.thread_ir import Assign, Const, For, RegRead, Var

sys.path.insert(0, str(Path(__file__).resolve().parent))   # the turn checker, beside us
from test_attention_turns import _R, _barrier_ops, _deadlocks   # noqa: E402 (beside us)


def one_gemm_loop(var: str = "k") -> For:
    """A K loop of one gemm and its promotion: fence, wgmmas, commit, register work."""
    return For(Var(var), Const(0), Var("n"), 1,
               [WgmmaFence(), WgmmaCommit()] + [Assign(_R, RegRead(_R))] * 3)


@pytest.mark.parametrize("trips", [0, 1, 2, 3, 5])
def test_one_gemm_turns_never_deadlock_in_any_interleaving(trips):
    """Warpgroup 1 opens warpgroup 0's first turn; each syncs before its wgmmas and hands
    over after its commit, warpgroup 1's last hand-over skipped: no interleaving deadlocks
    or leaves arrivals, at any trip count."""
    stmts = warp_roles._loop_with_turns(one_gemm_loop())
    programs = [_barrier_ops(stmts, {"tid": tid, "n": trips}, []) for tid in (0, 128)]
    assert [len(p) for p in programs] == [2 * trips, 2 * trips]
    assert _deadlocks(programs) is None


@pytest.mark.parametrize("tiles, trips", [(3, 1), (2, 3), (3, 0)])
def test_one_gemm_turns_balance_per_tile_in_a_tile_loop(tiles, trips):
    """In the persistent kernel each tile's K loop opens and closes its own turns, so the
    tile loop around it adds no lapping: still no deadlock or arrival left."""
    inner = warp_roles._loop_with_turns(one_gemm_loop())
    outer = [For(Var("t"), Const(0), Const(tiles), 1, inner)]
    programs = [_barrier_ops(outer, {"tid": tid, "n": trips}, []) for tid in (0, 128)]
    assert _deadlocks(programs) is None


def test_the_checker_finds_a_hand_over_left_at_exit(monkeypatch):
    """Without the skipped last hand-over of warpgroup 1, its final arrive meets no sync:
    the interleaving check reports arrivals left (so the tests above can fail)."""
    real = warp_roles._turn
    monkeypatch.setattr(warp_roles, "_turn",
                        lambda arrive, iteration_guard=None, after=(): real(arrive, after=after))
    stmts = warp_roles._loop_with_turns(one_gemm_loop())
    programs = [_barrier_ops(stmts, {"tid": tid, "n": 2}, []) for tid in (0, 128)]
    assert _deadlocks(programs) is not None
