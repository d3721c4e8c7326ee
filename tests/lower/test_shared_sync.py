"""Barrier placement (`lower.py` `SharedSync`): every pair of shared-memory accesses that
may race gets a barrier between them — across loop iterations, after loops, in nested
loops with run-time trip counts (zero included), in branches, and in a warp-specialized
consumer loop — and a branch or loop that touches only registers gets none. Each kernel
runs in the emulator (race checks on) against numpy, for sm_80 and sm_90a, and the
emitted thread IR is read for where the barriers are."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.lower.async_ir import MBarrierArrive, NamedBarrier, Roles
from tegula.lower.thread_ir import Barrier, For, If, SharedLoad, SharedStore, walk

sys.path.insert(0, os.path.dirname(__file__))
import sync_kernels as K  # noqa: E402


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("name,kernel,ref,args", K.PLAIN_CASES, ids=[c[0] for c in K.PLAIN_CASES])
def test_plain_kernels_are_right_and_race_free(name, kernel, ref, args, target):
    x = K.plain_inputs()
    y = np.full((K.T, K.T), np.nan, np.float32)
    tg.emulate(kernel, (1,), x, y, *args, target=target)
    np.testing.assert_allclose(y, ref(x, *args), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_scans_back_to_back_are_right_and_race_free(target):
    x = K.scan_chain_inputs()
    y = np.full((2, x.shape[1]), np.nan, np.float32)
    tg.emulate(K.scan_chain, (2,), x, y, 3, target=target)
    assert np.array_equal(y, K.scan_chain_ref(x, 3))


def _body(kernel, target="sm_80", **constexprs):
    return build(kernel, constexprs, None, target).thread_kernel.body


def _is_barrier(s) -> bool:
    return isinstance(s, (Barrier, NamedBarrier))


def _loops(body):
    return [s for s in walk(body) if isinstance(s, For)]


def test_a_loop_that_only_reads_has_no_barrier_per_iteration():
    loop, = _loops(_body(K.write_after_loop))
    assert not any(_is_barrier(s) for s in walk(loop.body))


def test_a_write_read_at_the_next_iteration_ends_the_body_in_a_barrier():
    loop, = _loops(_body(K.carried))
    last_write = max(i for i, s in enumerate(loop.body)
                     if any(isinstance(x, SharedStore) for x in walk([s])))
    assert any(_is_barrier(s) for s in loop.body[last_write:])


def test_a_register_only_branch_gets_no_barrier_and_a_reading_one_does():
    body = _body(K.register_branch)
    branches = [i for i, s in enumerate(body) if isinstance(s, If)
                and not any(isinstance(x, SharedStore) for x in walk([s]))
                and i > 0]
    outer = [i for i, s in enumerate(body) if isinstance(s, If)
             and any(isinstance(x, (SharedLoad,)) for x in walk([s]))]
    register_only = [i for i in branches if i not in outer]
    assert register_only and outer
    # Nothing between the copy into the tile and the register branch is a barrier ...
    first_store = next(i for i, s in enumerate(body)
                       if any(isinstance(x, SharedStore) for x in walk([s]))
                       or type(s).__name__ == "CpAsync")
    assert not any(_is_barrier(s) for s in body[first_store:register_only[0]])
    # ... but one comes before the branch that reads it.
    assert any(_is_barrier(s) for s in body[register_only[0]:outer[0]])


# -- the warp-specialized consumer loop ----------------------------------------------------
def _consumer_loop(body):
    roles, = [s for s in body if isinstance(s, Roles)]
    consumer = roles.roles[0].body
    # The loop whose body releases a stage (the arrive may sit in a branch of one
    # elected lane per warp).
    def releases(x):
        return isinstance(x, MBarrierArrive) or (
            isinstance(x, If) and any(isinstance(y, MBarrierArrive) for y in x.then))
    return next(s for s in walk(consumer) if isinstance(s, For) and any(map(releases, s.body)))


@pytest.mark.parametrize("kernel", K.CONSUMER_KERNELS, ids=["write", "write-in-branch"])
def test_a_consumer_loop_reading_a_tile_it_wrote_ends_each_iteration_in_a_barrier(kernel):
    """The read of the scratch tile (after the barrier that follows its write) races the
    next iteration's write unless a barrier comes between: with no refill barrier at the
    top of a consumer iteration, it must end the body (before the stage release)."""
    loop = _consumer_loop(_body(kernel, "sm_90a", warp_specialize=True))
    last_read = max(i for i, s in enumerate(loop.body)
                    if any(isinstance(x, SharedLoad) and "s2" in x.buffer for x in walk([s])))
    assert any(_is_barrier(s) for s in loop.body[last_read:]), \
        "no barrier between the scratch tile's reads and the next iteration's write"


@pytest.mark.parametrize("kernel", K.CONSUMER_KERNELS, ids=["write", "write-in-branch"])
@pytest.mark.parametrize("shape", [(64, 64, 96), (50, 40, 70)], ids=["even", "ragged"])
@pytest.mark.parametrize("role_order", ["listed", "reversed", "random:3"])
def test_the_consumer_scratch_kernel_is_right_under_every_role_order(kernel, shape,
                                                                     role_order):
    M, N, K_ = shape
    a, b = K.consumer_scratch_inputs(M, N, K_)
    c = np.full((M, N), np.nan, np.float32)
    # The even shape's rows are TMA boxes, warp-specialized (forced: the cost model keeps
    # this small tile in one role); the ragged one's are not, one role.
    roles = dict(warp_specialize=True) if shape[2] % 8 == 0 else {}
    tg.emulate(kernel, (tg.cdiv(M, 64), tg.cdiv(N, 64)), a, b, c,
               target="sm_90a", role_order=role_order, **roles)
    np.testing.assert_allclose(c, K.consumer_scratch_ref(a, b), rtol=1e-4, atol=1e-3)


# -- a loop over the stages of one buffer (session 10: barriers per stage) ------------------
@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("step,ahead,barriers", [
    (1, 0, 1),   # the next iteration writes the other stage: no barrier ends the body
    (2, 0, 2),   # step 2 over 2 stages: the next iteration writes the stage just read
    (1, 1, 2),   # one ahead: iteration k+1 writes stage k+2, the one k read
])
def test_a_loop_over_stages_ends_in_a_barrier_only_where_the_next_write_meets_a_read(
        step, ahead, barriers, target):
    loop, = _loops(_body(K.stage_per_iteration, target, STEP=step, AHEAD=ahead))
    assert sum(map(_is_barrier, loop.body)) == barriers
    x = np.random.default_rng(step + 2 * ahead).standard_normal((32, 70)).astype(np.float32)
    y = np.full((16, 32), np.nan, np.float32)
    if ahead:  # the last iteration reads one tile past the end: zeros
        tg.emulate(K.stage_per_iteration, (2,), x, y, STEP=step, AHEAD=ahead, target=target)
    else:
        tg.emulate(K.stage_per_iteration, (2,), x, y, STEP=step, target=target)
    np.testing.assert_allclose(y, K.stage_reference(x, step), rtol=1e-5, atol=1e-5)


def test_without_the_stage_rule_the_emulator_reports_the_race(monkeypatch):
    import tegula.lower.lower as lowering
    monkeypatch.setattr(lowering, "_may_meet", lambda tail, head, advance: False)
    x = np.random.default_rng(0).standard_normal((32, 70)).astype(np.float32)
    fresh = tg.kernel(threads=64)(K.stage_per_iteration.fn)   # built anew, not cached
    loop, = _loops(_body(fresh, "sm_80", STEP=2))
    assert sum(map(_is_barrier, loop.body)) == 1
    with pytest.raises(Exception, match="race"):
        tg.emulate(fresh, (2,), x, np.zeros((16, 32), np.float32), STEP=2, target="sm_80")
