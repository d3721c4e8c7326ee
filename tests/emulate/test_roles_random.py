"""Random interleavings of warp roles (`role_order="random:SEED"`, `emulate/roles.py`).

The fixed orders ("listed", "reversed") run a role until it blocks, so a role that releases
a stage too early keeps the baton until its next wait, by which time its reads are done:
no report, and the right answer — while on the GPU the producer may refill the stage under
the reads. With a seed, every asynchronous statement is a scheduling point. Shown here:
- correct kernels (the Hopper sample, the persistent README GEMM with and without a
  2-CTA cluster and with two consumer warpgroups) are right, bit for bit equal to the
  listed order, under several seeds;
- injected early releases (a consumer's empty arrive moved before its wgmma issue or
  before its wgmma wait; a clustered consumer's remote release moved before its wait)
  pass both fixed orders silently and are reported under some seed;
- a run is deterministic per seed; deadlock reports are the fixed orders' reports.
"""
from __future__ import annotations

import copy
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import f16
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.kernels.common import poisoned, random_input
from tegula.lower.async_ir import MBarrierArrive, WgmmaFence, WgmmaWait
from tegula.lower.thread_ir import If

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "emulate"))
from async_kernels import (gemm_inputs, gemm_kernel, gemm_reference, loop_body,  # noqa: E402
                           remove, role_body, run_gemm, run_with_deadline)

FIXED = ["listed", "reversed"]
SEEDS = [f"random:{seed}" for seed in range(6)]
STAGE_STILL_READ = "while a wgmma or TMA store still reads it"


def _run_sample(kernel, role_order, m=97, n=70, k=330):
    a, b, c = gemm_inputs(m, n, k)
    run_gemm(kernel, a, b, c, role_order=role_order)
    return a, b, c


def _outcome(kernel_factory, role_order) -> str:
    """'ok', or the first line of the emulator's report."""
    try:
        _run_sample(kernel_factory(), role_order)
    except EmulationError as e:
        return str(e).splitlines()[0]
    return "ok"


# ------------------------------------------------------------------ the option


@pytest.mark.parametrize("bad", ["random", "random:", "random:x", "shuffled", 3])
def test_an_unknown_role_order_is_refused_naming_the_forms(bad):
    a, b, c = gemm_inputs(64, 64, 64)
    with pytest.raises(EmulationError, match=r"role_order must be one of 'listed', 'reversed', "
                                             r"'stall', 'stall-reversed' or 'random:SEED'"):
        run_gemm(gemm_kernel(), a, b, c, role_order=bad)


# ------------------------------------------------------------------ correct kernels


@pytest.mark.parametrize("role_order", SEEDS[:3])
def test_the_warp_specialized_sample_is_right_and_identical_under_random_orders(role_order):
    _, _, listed = _run_sample(gemm_kernel(), "listed")
    a, b, c = _run_sample(gemm_kernel(), role_order)
    assert np.abs(c - gemm_reference(a, b)).max() < 1e-3
    assert np.array_equal(c, listed)


def _example():
    spec = importlib.util.spec_from_file_location("persistent_gemm_random_orders",
                                                  ROOT / "examples" / "persistent_gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PERSISTENT = _example()
SMALL = dict(BM=64, BN=64, BK=32, GROUP=2, STAGES=3)


def _persistent(m, n, k, sms, role_order, cluster=1, seed=0, **config):
    rng = np.random.default_rng(seed)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    c = poisoned((m, n), f16)
    config = {**SMALL, **config}
    grid = PERSISTENT.persistent_grid(m, n, sms, config["BM"], config["BN"], cluster)
    run_with_deadline(lambda: tg.emulate(PERSISTENT.persistent_gemm, grid, a, b, c,
                                         target="sm_90a", role_order=role_order, num_sms=sms,
                                         CLUSTER=cluster, **config))
    return a, b, c


def _assert_right(a, b, c):
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    bound = 2.0 ** -9 * np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T + 1e-3
    assert np.all(np.abs(c.astype(np.float64) - ref) <= bound)


# (M, N, K, SMs, cluster, config): ragged tiles, more tiles than blocks, a 2-CTA cluster
# with an odd number of row tiles, two consumer warpgroups.
PERSISTENT_CASES = [(150, 130, 72, 3, 1, {}), (150, 70, 200, 4, 2, {}),
                    (200, 140, 72, 2, 1, dict(BM=128, BN=64, threads=256))]


@pytest.mark.parametrize("role_order", SEEDS[:2])
@pytest.mark.parametrize("case", PERSISTENT_CASES, ids=["ring", "cluster", "two-consumers"])
def test_persistent_gemm_is_right_and_identical_under_random_orders(case, role_order):
    m, n, k, sms, cluster, config = case
    a, b, c = _persistent(m, n, k, sms, role_order, cluster, **config)
    _assert_right(a, b, c)
    _, _, listed = _persistent(m, n, k, sms, "listed", cluster, **config)
    assert np.array_equal(c.view(np.uint16), listed.view(np.uint16))


# ------------------------------------------------------------------ injected races


def _release_before(stmt_type):
    """The sample with the consumer's empty arrive moved up, before its `stmt_type`."""
    def factory():
        kernel = gemm_kernel()
        body = loop_body(role_body(kernel, "consumer"))
        arrive = next(s for s in body if isinstance(s, MBarrierArrive))
        body.remove(arrive)
        anchor = next(s for s in body if isinstance(s, stmt_type))
        body.insert(body.index(anchor), arrive)
        return kernel
    return factory


@pytest.mark.parametrize("moved_before", [WgmmaWait, WgmmaFence],
                         ids=["before-the-wgmma-wait", "before-the-wgmma-issue"])
def test_a_stage_released_early_is_missed_by_the_fixed_orders_and_found_by_random_ones(
        moved_before):
    """On the GPU the producer may refill the stage while the wgmma still reads it. Both
    fixed orders finish with the right answer; some seeds report the overwrite."""
    factory = _release_before(moved_before)
    for order in FIXED:
        assert _outcome(factory, order) == "ok", order
    found = [order for order in SEEDS if STAGE_STILL_READ in _outcome(factory, order)]
    assert found, "no random interleaving exposed the early release"


@pytest.mark.parametrize("moved_before,report", [
    (WgmmaWait, STAGE_STILL_READ),
    (WgmmaFence, "before a wait observed phase")], ids=["before-the-wgmma-wait",
                                                        "before-the-wgmma-issue"])
@pytest.mark.parametrize("order", ["stall", "stall-reversed"])
def test_a_stage_released_early_is_found_by_the_stall_orders(moved_before, report, order):
    """Held right after its release (an mbarrier arrive with no transaction bytes), the
    consumer lets the producer run ahead and refill the stage: under both stall orders,
    with no seed to find, the refill lands under the wgmma still reading the stage, or
    (released before the issue) the wgmma then reads the next copy's bytes unwaited."""
    assert report in _outcome(_release_before(moved_before), order)


def test_a_random_order_is_deterministic_per_seed():
    factory = _release_before(WgmmaWait)
    outcomes = [_outcome(factory, order) for order in SEEDS]
    assert outcomes == [_outcome(factory, order) for order in SEEDS]
    assert "ok" in outcomes and any(o != "ok" for o in outcomes)  # seeds differ


def _remote_arrives(s) -> bool:
    if isinstance(s, If):
        return bool(s.then) and all(map(_remote_arrives, s.then)) and not s.otherwise
    return isinstance(s, MBarrierArrive) and s.cta is not None


def _cluster_kernel_releasing_remotely_before_the_wait():
    tk = copy.deepcopy(build(PERSISTENT.persistent_gemm, dict(SMALL, CLUSTER=2), None,
                             "sm_90a").thread_kernel)
    consumer = role_body(tk, "consumer")

    def move_up(stmts) -> bool:
        for s in stmts:
            body = getattr(s, "body", None)
            if isinstance(body, list) and move_up(body):
                return True
        # A release is remote arrives, or one elected lane's branch around them.
        remote = [s for s in stmts if _remote_arrives(s)]
        waits = [s for s in stmts if isinstance(s, WgmmaWait)]
        if not remote or not waits:
            return False
        for s in remote:
            stmts.remove(s)
        at = stmts.index(waits[0])
        stmts[at:at] = remote
        return True
    assert move_up(consumer)
    return tk


def test_a_cluster_stage_released_early_is_found_by_random_orders():
    """A clustered consumer releasing its peers' stage (remote arrive) before its wgmma
    wait: a peer's producer may multicast into the stage under the reads."""
    tk = _cluster_kernel_releasing_remotely_before_the_wait()
    m, n, k, sms = 150, 70, 200, 4
    rng = np.random.default_rng(1)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    grid = PERSISTENT.persistent_grid(m, n, sms, 64, 64, 2)

    def outcome(order):
        c = poisoned((m, n), f16)
        try:
            run_with_deadline(lambda: run_thread_kernel(tk, grid, {"a": a, "b": b, "c": c},
                                                        num_sms=sms, role_order=order))
        except EmulationError as e:
            return str(e)
        _assert_right(a, b, c)
        return "ok"
    for order in FIXED:
        assert outcome(order) == "ok", order
    assert any(STAGE_STILL_READ in outcome(order) for order in SEEDS)
    # held after its remote release, the peers' producers multicast under the reads
    assert any(STAGE_STILL_READ in outcome(order) for order in ("stall", "stall-reversed"))


# ------------------------------------------------------------------ deadlocks


def test_deadlock_reports_are_the_same_under_a_random_order():
    def deadlocked():
        kernel = gemm_kernel()
        assert remove(loop_body(role_body(kernel, "consumer")),
                      lambda s: isinstance(s, MBarrierArrive)) == 1
        return kernel
    a, b, c = gemm_inputs(97, 70, 330)
    reports = []
    for order in ["listed", "random:0", "random:3"]:
        with pytest.raises(EmulationError) as info:
            run_gemm(deadlocked(), a, b, c, role_order=order)
        reports.append(str(info.value))
    assert "deadlock: every role is blocked" in reports[0]
    assert reports[1] == reports[0] and reports[2] == reports[0]


# ------------------------------------------------------------------ the caller's context


@pytest.mark.parametrize("errstate", ["ignore", "raise"])
def test_roles_and_clustered_blocks_run_under_the_callers_numpy_error_state(errstate):
    """Coroutines are threads, which start from an empty context: without carrying the
    caller's over, `np.errstate(all="ignore")` around `tg.emulate` (the fuzzer's) did not
    reach a warp-specialized or clustered kernel's arithmetic (warnings leaked), nor did
    `all="raise"`."""
    from tegula.emulate.roles import Scheduler

    def divide_by_zero(state):
        np.array([1.0]) / 0

    import warnings
    scheduler = Scheduler()
    scheduler.add("divider", "test", divide_by_zero, None)
    with warnings.catch_warnings(record=True) as caught, np.errstate(all=errstate):
        warnings.simplefilter("always")
        if errstate == "raise":
            with pytest.raises(FloatingPointError):
                scheduler.run(lambda: "test")
        else:
            scheduler.run(lambda: "test")
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]
