"""The emulator's ordering model between threads (`emulate/order.py`) and its scheduling
units (`emulate/roles.py` `scheduling_units`), shown by injected bugs each caught only
since the model changed:

- under the reversed and random orders each warpgroup of a role is a coroutine of its own:
  a stage released by one of two cooperative consumer warpgroups (the other still to read
  it) passes the listed order (warpgroups in lockstep) and is reported under the others;
- `bar.arrive` releases but does not acquire: the arriving warpgroup reading what the
  waiting one wrote is a race (a `bar.sync` in its place is not);
- a completed mbarrier phase orders its arrivals before its waiters only, not every
  thread of the block: the consumer loop that wrote, then read, a scratch tile with no
  barrier before the next iteration's write (a lowering bug fixed with this model) is
  reported.
Correct kernels stay right and bit-identical under every order."""
from __future__ import annotations

import copy
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import f16, f32
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.kernels.common import poisoned, random_input
from tegula.lower.async_ir import MBarrierArrive, MBarrierInit, NamedBarrier, Role, Roles
from tegula.lower.thread_ir import (TID, Const, GlobalLoad, GlobalStore, If, Reg, RegArray,
                                    SharedBuffer, SharedLoad, SharedStore, TensorParam,
                                    ThreadKernel, _bin, walk)

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "emulate"))
sys.path.insert(0, str(ROOT / "tests" / "lower"))
sys.path.insert(0, str(ROOT))
from async_kernels import run_with_deadline  # noqa: E402
from examples.gemm import gemm as readme_gemm  # noqa: E402

SPLIT_ORDERS = ["reversed", "random:0", "random:1", "random:2"]


# -- two cooperative consumer warpgroups --------------------------------------------------
TWO_CONSUMERS = dict(BM=128, BN=64, BK=32, STAGES=2, threads=256, warp_specialize=True)


def _two_consumer_gemm():
    return copy.deepcopy(build(readme_gemm, TWO_CONSUMERS, None, "sm_90a").thread_kernel)


def _run(tk, order, m=200, n=70, k=160):
    rng = np.random.default_rng(3)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    c = poisoned((m, n), f16)
    grid = (tg.cdiv(m, 128), tg.cdiv(n, 64))
    run_with_deadline(lambda: run_thread_kernel(tk, grid, {"a": a, "b": b, "c": c},
                                                role_order=order))
    return a, b, c


def _outcome(tk, order) -> str:
    try:
        a, b, c = _run(tk, order)
    except EmulationError as e:
        return str(e)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    bound = 2.0 ** -9 * np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T + 1e-3
    assert np.all(np.abs(c.astype(np.float64) - ref) <= bound), order
    return "ok"


@pytest.mark.parametrize("order", ["listed"] + SPLIT_ORDERS)
def test_two_consumer_warpgroups_are_right_and_identical_under_every_order(order):
    tk = _two_consumer_gemm()
    assert _outcome(tk, order) == "ok"
    _, _, c = _run(tk, order)
    _, _, listed = _run(tk, "listed")
    assert np.array_equal(c.view(np.uint16), listed.view(np.uint16))


def _released_by_warpgroup_0_only():
    """The empty barriers count half the consumer's arrivals, and only warpgroup 0's
    lanes arrive: warpgroup 1 may still be to read a stage the producer refills."""
    tk = _two_consumer_gemm()
    stmts = list(walk(tk.body))
    inits = [s for s in stmts if isinstance(s, MBarrierInit) and "empty" in s.barrier]
    arrives = [s for s in stmts if isinstance(s, MBarrierArrive) and "empty" in s.barrier]
    assert inits and arrives
    for s in inits:
        s.count //= 2
    for s in arrives:
        s.pred = TID.lt(128) if s.pred is None else _bin("and", s.pred, TID.lt(128))
    return tk


def test_a_stage_released_by_one_of_two_warpgroups_passes_lockstep_and_is_found_split():
    tk = _released_by_warpgroup_0_only()
    assert _outcome(tk, "listed") == "ok"  # the warpgroups read in lockstep
    found = [o for o in SPLIT_ORDERS if _outcome(tk, o) != "ok"]
    assert found, "no order with warpgroups of their own exposed the early release"
    stage_races = ("while a wgmma or TMA store still reads it",
                   "overwrite (by another TMA copy)", "a TMA copy may still be writing")
    assert any(race in _outcome(tk, found[0]) for race in stage_races)


def test_scheduling_units_split_a_role_into_its_warpgroups_except_when_listed():
    from tegula.emulate.roles import scheduling_units
    mask = np.zeros(384, dtype=bool)
    mask[:256] = True
    assert [label for _, label in scheduling_units(mask, "listed", "consumer")] == ["consumer"]
    units = scheduling_units(mask, "random:4", "consumer")
    assert [label for _, label in units] == ["consumer, warpgroup 0", "consumer, warpgroup 1"]
    assert np.array_equal(units[0][0] | units[1][0], mask)
    assert not (units[0][0] & units[1][0]).any()


# -- bar.arrive releases, bar.sync also acquires -----------------------------------------
def _arrive_kernel(reader_arrives: bool) -> ThreadKernel:
    """Warpgroup 1 ("writer") stores x[t] at shared element 255 - t and meets named
    barrier 1; warpgroup 0 ("reader") meets it — with `bar.arrive` or `bar.sync` — and
    reads element t into y[t]."""
    r = RegArray("r", f32, 1)
    buf = SharedBuffer("buf", f32, 128, 0)
    writer = [GlobalLoad(Reg(r, Const(0)), "x", TID - 128, 1),
              SharedStore("buf", 255 - TID, Reg(r, Const(0)), 1),
              NamedBarrier(1, 256)]
    reader = [NamedBarrier(1, 256, arrive=reader_arrives),
              SharedLoad(Reg(r, Const(0)), "buf", TID, 1),
              GlobalStore("y", TID, Reg(r, Const(0)), 1)]
    roles = Roles([Role("reader", TID.lt(128), reader, loc="test: reader"),
                   Role("writer", TID.ge(128), writer, loc="test: writer")])
    return ThreadKernel("arrive", 256, [TensorParam("x", f32, 1),
                                        TensorParam("y", f32, 1, writes=True)],
                        [r], [buf], [roles])


@pytest.mark.parametrize("order", ["listed", "reversed"])
def test_a_warpgroup_that_only_arrives_does_not_see_the_waiters_writes(order):
    x = np.random.default_rng(0).standard_normal(128).astype(np.float32)
    y = np.full(128, np.nan, dtype=np.float32)
    run = lambda tk: run_with_deadline(  # noqa: E731
        lambda: run_thread_kernel(tk, 1, {"x": x, "y": y}, role_order=order))
    run(_arrive_kernel(reader_arrives=False))
    assert np.array_equal(y, x[::-1])
    # The reader reads before, or unordered after, the writer's store: a race either way
    # (before this model the completed barrier ordered the arriving side too).
    with pytest.raises(EmulationError, match="shared-memory race"):
        run(_arrive_kernel(reader_arrives=True))


# -- an mbarrier phase orders its arrivals before its waiters, nothing else ---------------
def test_the_consumer_scratch_race_is_reported_when_the_lowering_misses_its_barrier(
        monkeypatch):
    """The lowering bug this model found: a warp-specialized consumer loop writes a scratch
    tile, barrier, reads it, releases the stage; the next iteration writes it again. The
    stage release completes an mbarrier phase that used to count as a block barrier."""
    import sync_kernels as K
    from tegula.lower import lower as lowering
    monkeypatch.setattr(lowering.SharedSync, "carried_conflict",
                        lambda self, ignore=frozenset(): False)
    tk = build(K.consumer_scratch, dict(threads=128, BM=64, BN=64, BK=32, STAGES=3,
                                        warp_specialize=True), None, "sm_90a").thread_kernel
    a, b = K.consumer_scratch_inputs(64, 64, 96)
    c = np.full((64, 64), np.nan, np.float32)
    with pytest.raises(EmulationError, match="shared-memory race .write after read."):
        run_thread_kernel(tk, (1, 1), {"a": a, "b": b, "c": c})


# -- a warpgroup unit with no lane in a statement ------------------------------------------
@tg.kernel(threads=256)
def _column_sums(a: tg.Tensor[f16], b: tg.Tensor[f16], o: tg.Tensor[f32],
                 BM: tg.constexpr = 128, BN: tg.constexpr = 8):
    """python -m tegula.fuzz --seed 8301 --program 107, shrunk: the sum's single-owner store
    into shared memory has no lane in consumer warpgroup 1, which as a unit of its own ran
    the store with zero lanes (a numpy reshape error, where lockstep always had lanes)."""
    m, n = tg.block_id(0), tg.block_id(1)
    acc = tg.full((BM, BN), 0.0, f32)
    ga, gb = a.tile((BM, 16), (m, None)), b.tile((BN, 16), (n, None))
    sa, sb = tg.shared((BM, 16), f16, stages=2), tg.shared((BN, 16), f16, stages=2)
    for k in tg.pipeline(ga.shape[2], stages=2):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        tg.gemm(acc, sa[k], sb[k])
    sums = tg.shared((1, BN), f32)
    tg.copy(tg.sum(acc, 0), sums)
    tg.copy(sums, o.tile((1, BN), (m, n)))


@pytest.mark.parametrize("order", ["listed", "reversed", "random:1"])
def test_a_statement_with_no_lane_in_a_warpgroup_unit_does_nothing_there(order):
    rng = np.random.default_rng(0)
    a, b = random_input(rng, (100, 40), f16), random_input(rng, (8, 40), f16)
    o = np.full((1, 8), np.nan, np.float32)
    tg.emulate(_column_sums, (1, 1), a, b, o, target="sm_90a", role_order=order)
    ref = np.zeros((128, 8))
    ref[:100] = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(o[0], ref.sum(0), rtol=1e-3, atol=1e-2)


def test_bar_arrive_passes_its_observations_on_but_takes_none():
    """What threads observed of mbarrier phases (TMA data they may read) flows from every
    thread meeting at a barrier to those that wait there, not to one that only arrives."""
    from tegula.emulate.async_state import AsyncState
    from tegula.lower.async_ir import MBarrierArray
    a = AsyncState([MBarrierArray("full", 1, 0)], 256, 64, True, {})
    a.observed[0, :128] = 3      # warpgroup 0 waited for phase 3
    a.observed[0, 128:] = 1      # warpgroup 1 only for phase 1
    waiters, arrivers = np.arange(128), np.arange(128, 256)
    a.share_observations(np.arange(256), waiters)
    assert (a.observed[0, :128] == 3).all() and (a.observed[0, 128:] == 1).all()
    a.observed[0, 128:] = 5
    a.share_observations(np.arange(256), waiters)
    assert (a.observed[0, :128] == 5).all(), "the waiters learn what the arrivers observed"
    assert (a.observed[0, arrivers] == 5).all()
