"""One pipelining transformation (`synth/pipeline.py` the decision, `lower/pipeline.py` the
ring, schedule and protocols): every `tg.pipeline` with a load stage, cp.async or TMA,
goes through `run_ahead` / the same `Ring`, and is right in the emulator against numpy
at ragged shapes, every stage count, one role and warp-specialized under listed,
reversed and random role orders. The decision is visible (`choices["pipeline"]`, or why
there is none); a schedule that refills a slot before its release is refused, and the
same schedule forced through is reported by the emulator (the tests can fail)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.build import build
from tegula.emulate import EmulationError
from tegula.errors import SynthesisError
from tegula.kernels.common import poisoned, random_input
from tegula.lower import pipeline as lowering_pipeline
from tegula.lower.thread_ir import Barrier, CpAsyncCommit, CpAsyncWait, For, walk
sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gemm_fixtures import readme_gemm  # noqa: E402


gemm = readme_gemm(BM=64, BN=64)


@tg.kernel(threads=128)
def gemm_scaled(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                BM: tg.constexpr = 64, BN: tg.constexpr = 64, BK: tg.constexpr = 32,
                STAGES: tg.constexpr = 3):
    """A body of more than the gemm (each k-step's product halved into the sum): the
    TMA ring's 'release, refill, acquire, compute' order, and every consumer thread
    releasing when warp-specialized."""
    m, n = tg.block_id(0), tg.block_id(1)
    ga = a.tile((BM, BK), (m, None))
    gb = b.tile((BN, BK), (n, None))
    acc = tg.zeros((BM, BN), f32)
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    for k in tg.pipeline(ga.shape[2], stages=STAGES):
        tg.copy(ga[:, :, k], sa[k])
        tg.copy(gb[:, :, k], sb[k])
        part = tg.zeros((BM, BN), f32)
        tg.gemm(part, sa[k], sb[k])
        acc += part * 0.5
    tg.copy(acc, c.tile((BM, BN), (m, n)))


@tg.kernel(threads=64)
def staged_sum(x: tg.Tensor[f32], out: tg.Tensor[f32], BM: tg.constexpr = 16,
               BK: tg.constexpr = 8, STAGES: tg.constexpr = 3):
    """No gemm at all: a cp.async pipeline of a row sum over staged chunks, on 64 threads
    (a 16x8 chunk is two elements per thread)."""
    m = tg.block_id(0)
    gx = x.tile((BM, BK), (m, None))
    sx = tg.shared((BM, BK), f32, stages=STAGES)
    acc = tg.zeros((BM, BK), f32)
    for k in tg.pipeline(gx.shape[2], stages=STAGES):
        tg.copy(gx[:, :, k], sx[k])
        acc += tg.load(sx[k])
    tg.copy(tg.sum(acc, 1), out.tile((BM, 1), (m, 0)))


def _gemm_inputs(m, n, k, seed):
    rng = np.random.default_rng(seed)
    return random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)


def _check(c, a, b, scale=1.0):
    ref = scale * (a.astype(np.float64) @ b.astype(np.float64).T)
    k = a.shape[1]
    bound = 2.0 ** -10 * np.abs(ref) + (k + 1) * 2.0 ** -24 * scale * (
        np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T)
    err = np.abs(c.astype(np.float64) - ref)
    assert not np.isnan(c).any()
    assert np.all(err <= bound), f"max error {err.max()}"


@pytest.fixture
def fresh_builds():
    """Builds made while lowering is patched must not serve later tests (nor earlier
    ones serve these): the kernels' build caches are emptied before and after."""
    for kernel in (gemm, gemm_scaled):
        kernel.__dict__.pop("_builds", None)
    yield
    for kernel in (gemm, gemm_scaled):
        kernel.__dict__.pop("_builds", None)


def _plan(kernel, target, **options):
    traced = build(kernel, options, target=target).traced
    loops = [op for op in traced.body if getattr(op, "stages", 1) > 1]
    assert len(loops) == 1
    return loops[0]


# ------------------------------------------------------------------ the decision


@pytest.mark.parametrize("target,options,protocol", [
    ("sm_80", {}, "cp.async"),
    ("sm_90a", {}, "mbarrier"),
    ("sm_90a", {"warp_specialize": False}, "mbarrier"),
    ("sm_90a", {"load_path": "cp.async"}, "cp.async"),
])
def test_one_plan_names_the_load_stage_and_the_protocol(target, options, protocol):
    loop = _plan(gemm, target, **options)
    plan = loop.choices["pipeline"]
    assert plan.protocol == protocol and plan.stages == 3 and plan.lookahead == 2
    assert len(plan.producers) == 2 and all(p is op for p, op in zip(plan.producers, loop.body))
    assert "pipeline_skipped" not in loop.choices
    text = plan.describe()
    assert "2 iterations ahead into a ring of 3 stages" in text
    assert ("mbarrier" in text) == (protocol == "mbarrier")
    assert f"load stage: {text}" in tg.explain(gemm, target=target, **options)


def test_a_loop_without_asynchronous_loads_says_why():
    """A 2-byte vector cannot be a cp.async: the staged copy is a synchronous ld+st, the
    loop runs every iteration on its own stage, and the reason is on the loop."""
    @tg.kernel(threads=32)
    def narrow(x: tg.Tensor[f16], out: tg.Tensor[f16], BK: tg.constexpr = 1):
        gx = x.tile((32, BK), (0, None))
        sx = tg.shared((32, BK), f16, stages=2)
        acc = tg.zeros((32, BK), f16)
        for k in tg.pipeline(gx.shape[2], stages=2):
            tg.copy(gx[:, :, k], sx[k])
            acc += tg.load(sx[k])
        tg.copy(acc, out.tile((32, BK), (0, 0)))

    loop = _plan(narrow, "sm_80")
    assert "pipeline" not in loop.choices
    assert "synchronous load" in loop.choices["pipeline_skipped"]
    assert "not pipelined: the copy into" in tg.explain(narrow, target="sm_80")
    rng = np.random.default_rng(3)
    x = random_input(rng, (32, 5), f16)
    out = poisoned((32, 1), f16)
    tg.emulate(narrow, (1,), x, out, target="sm_80")
    ref = np.zeros((32, 1), np.float16)
    for j in range(5):  # f16 adds, in order
        ref = (ref + x[:, j:j + 1]).astype(np.float16)
    assert np.array_equal(out, ref)


def test_a_pipeline_with_a_step_other_than_one_is_refused_at_its_line():
    @tg.kernel(threads=128)
    def stepped(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16]):
        ga = a.tile((64, 32), (0, None))
        gb = b.tile((64, 32), (0, None))
        acc = tg.zeros((64, 64), f32)
        sa = tg.shared((64, 32), f16, stages=2)
        sb = tg.shared((64, 32), f16, stages=2)
        for k in tg.pipeline(0, ga.shape[2], 2, stages=2):  # the refused line
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc.to(f16), c.tile((64, 64), (0, 0)))

    line = next(i for i, text in enumerate(open(__file__), 1) if "# the refused line" in text)
    for target in ("sm_80", "sm_90a"):
        with pytest.raises(SynthesisError, match="step 2") as info:
            build(stepped, target=target)
        assert info.value.loc.lineno == line


# ------------------------------------------------------------------ one schedule


def test_the_schedule_refuses_a_refill_before_its_release():
    for steps in [("refill", "release", "acquire", "compute"),
                  ("acquire", "compute", "refill", "release"),
                  ("compute", "acquire", "release", "refill"),
                  ("acquire", "refill", "compute"),
                  ("acquire", "release", "refill", "compute", "compute")]:
        with pytest.raises(AssertionError):
            lowering_pipeline._check_order(steps)


def test_both_protocols_go_through_run_ahead(monkeypatch, fresh_builds):
    """Every pipelined loop of the README GEMM, on each path that has a one-role schedule,
    is made by `run_ahead` (counted), with its protocol's order."""
    seen = []
    original = lowering_pipeline.run_ahead

    def counting(ring, protocol, steps, compute):
        result = original(ring, protocol, steps, compute)
        # (a body may decide its order once lowered: `steps` is then a callable)
        seen.append((type(protocol).__name__, steps() if callable(steps) else steps))
        return result

    monkeypatch.setattr(lowering_pipeline, "run_ahead", counting)
    for target, options in [("sm_80", {}), ("sm_90a", {"warp_specialize": False}),
                            ("sm_90a", {"load_path": "cp.async"})]:
        build(gemm, dict(options, STAGES=4), target=target)
    build(gemm_scaled, {"warp_specialize": False}, target="sm_90a")
    assert seen == [
        ("CpAsyncGroups", ("acquire", "release", "refill", "compute")),
        ("MBarrierRing", ("acquire", "compute", "release", "refill")),
        ("CpAsyncGroups", ("acquire", "release", "refill", "compute")),
        ("MBarrierRing", ("release", "refill", "acquire", "compute")),
    ]


def test_cp_async_keeps_stages_minus_two_groups_in_flight():
    for stages in (2, 3, 5):
        kernel = build(gemm, {"STAGES": stages}, target="sm_80").thread_kernel
        loop = next(s for s in walk(kernel.body) if isinstance(s, For))
        assert loop.body[:2] == [CpAsyncWait(stages - 2), Barrier()]


def test_cp_async_groups_count_the_rings_uses():
    """Why the cp.async protocol needs no phase parity (docs/compiler.md, "Counting
    groups is the ring's phase"): S-1 unconditional commits before the loop and exactly
    one unconditional commit per iteration, after its wait, make a thread's g-th group the
    ring's fill number g; at acquire(k) it has committed count(k) + S - 1 groups, so
    `wait_group S-2` completes exactly the fills up to count(k)."""
    for stages in (2, 3, 5):
        body = build(gemm, {"STAGES": stages}, target="sm_80").thread_kernel.body
        at = next(i for i, s in enumerate(body) if isinstance(s, For))
        loop = body[at]

        def commits(stmts, top_level: bool) -> int:
            found = stmts if top_level else list(walk(stmts))
            return sum(isinstance(s, CpAsyncCommit) for s in found)
        assert commits(body[:at], True) == commits(body[:at], False) == stages - 1
        assert commits(loop.body, True) == commits(loop.body, False) == 1
        commit = next(i for i, s in enumerate(loop.body) if isinstance(s, CpAsyncCommit))
        assert loop.body[0] == CpAsyncWait(stages - 2) and commit > 0


# ------------------------------------------------------------------ right in the emulator

SHAPES = [(97, 130, 72), (33, 65, 8), (64, 64, 160), (70, 40, 0)]
PATHS = [("sm_80", {}), ("sm_90a", {"load_path": "cp.async"}),
         ("sm_90a", {"warp_specialize": False}), ("sm_90a", {})]


@pytest.mark.parametrize("target,options", PATHS, ids=["sm80", "sm90a-cp.async", "tma-one-role",
                                                       "tma-specialized"])
@pytest.mark.parametrize("stages", [2, 3, 4])
def test_every_path_and_stage_count_is_right(target, options, stages):
    results = []
    for i, (m, n, k) in enumerate(SHAPES):
        a, b = _gemm_inputs(m, n, k, seed=10 * stages + i)
        c = poisoned((m, n), f16)
        order = "random:%d" % (stages + i) if target == "sm_90a" else "listed"
        tg.emulate(gemm, (tg.cdiv(m, 64), tg.cdiv(n, 64)), a, b, c, target=target,
                   role_order=order, STAGES=stages, **options)
        if k == 0:
            assert np.array_equal(c, np.zeros((m, n), np.float16))
        else:
            _check(c, a, b)
        results.append(c)
    # Each path rounds the f32 accumulator after every k16 step in the same order.
    reference = [r.copy() for r in results]
    a, b = _gemm_inputs(97, 130, 72, seed=10 * stages)
    c = poisoned((97, 130), f16)
    tg.emulate(gemm, (2, 3), a, b, c, target="sm_80", STAGES=stages)
    assert np.array_equal(reference[0].view(np.uint16), c.view(np.uint16))


@pytest.mark.parametrize("options", [{"warp_specialize": False}, {}], ids=["one-role",
                                                                            "specialized"])
@pytest.mark.parametrize("order", ["listed", "reversed", "random:1", "random:2"])
def test_a_body_of_more_than_the_gemm_under_every_role_order(options, order):
    m, n, k = 97, 70, 136
    a, b = _gemm_inputs(m, n, k, seed=5)
    c = poisoned((m, n), f32)
    tg.emulate(gemm_scaled, (2, 2), a, b, c, target="sm_90a", role_order=order, STAGES=3,
               **options)
    _check(c, a, b, scale=0.5)
    c80 = poisoned((m, n), f32)
    tg.emulate(gemm_scaled, (2, 2), a, b, c80, target="sm_80", STAGES=3)
    assert np.array_equal(c, c80)


@pytest.mark.parametrize("stages", [2, 3, 4])
def test_a_pipeline_without_a_gemm(stages):
    rng = np.random.default_rng(stages)
    for m, k in [(37, 21), (16, 8), (5, 3)]:
        x = random_input(rng, (m, k), f32)
        x[0, 0] = np.inf
        out = poisoned((m, 1), f32)
        tg.emulate(staged_sum, (tg.cdiv(m, 16),), x, out, target="sm_80", STAGES=stages)
        padded = np.zeros((tg.cdiv(m, 16) * 16, tg.cdiv(k, 8) * 8), np.float32)
        padded[:m, :k] = x
        # The emulator's order: chunk by chunk into (BM, BK) partial sums, then the row.
        acc = np.zeros((padded.shape[0], 8), np.float32)
        for j in range(0, padded.shape[1], 8):
            acc = acc + padded[:, j:j + 8]
        expected = acc.astype(np.float64).sum(axis=1)[:m]
        # The row's 8 partial sums meet in the reduction's order, not numpy's.
        bound = 8 * 2.0 ** -24 * np.abs(acc).astype(np.float64).sum(axis=1)[:m]
        assert out[0, 0] == np.inf
        assert np.all(np.abs(out[1:, 0] - expected[1:]) <= bound[1:])


# ------------------------------------------------------------------ the tests can fail


@pytest.mark.parametrize("target,options", [("sm_80", {}), ("sm_90a", {"warp_specialize": False})],
                         ids=["cp.async", "tma-one-role"])
def test_a_refill_before_the_release_is_reported(monkeypatch, fresh_builds, target, options):
    """Forced past `_check_order`: refilling slot(k-1) before the block barrier that says
    every thread finished iteration k-1 overwrites a stage other threads still read; the
    emulator reports the race rather than returning a (here: plausible) result."""
    original = lowering_pipeline.run_ahead

    def refill_first(ring, protocol, steps, compute):
        wrong = ("refill",) + tuple(s for s in steps if s != "refill")
        return original(ring, protocol, wrong, compute)

    monkeypatch.setattr(lowering_pipeline, "_check_order", lambda steps: None)
    monkeypatch.setattr(lowering_pipeline, "run_ahead", refill_first)
    a, b = _gemm_inputs(64, 64, 160, seed=1)
    c = poisoned((64, 64), f16)
    with pytest.raises(EmulationError):
        tg.emulate(gemm, (1, 1), a, b, c, target=target, STAGES=2, **options)


# ------------------------------------------------------------------ the ring's arithmetic


def _ring_of(kernel, target, **options):
    from tegula.ir.ops import ForLoop, walk_ops
    traced = build(kernel, options, target=target).traced
    loop = next(op for op in walk_ops(traced.body) if isinstance(op, ForLoop) and op.stages > 1)
    return loop, lowering_pipeline.Ring(loop)


def _value(expr, **names):
    """A thread-IR expression folded to an int with `names` bound (constants fold)."""
    from tegula.lower.lower import substitute
    from tegula.lower.thread_ir import Const
    folded = substitute(expr, {name: Const(v) for name, v in names.items()})
    assert isinstance(folded, Const), folded
    return folded.value


def test_a_top_level_ring_counts_from_the_loop_start():
    for stages in (2, 3, 5):
        loop, ring = _ring_of(gemm, "sm_80", STAGES=stages)
        k = ring.var
        assert not ring.nested
        for it in range(4 * stages):
            assert _value(ring.slot(k), **{k.name: it}) == it % stages
            assert _value(ring.parity(k), **{k.name: it}) == (it // stages) % 2


def test_a_nested_ring_continues_its_count_across_the_tiles():
    """The persistent GEMM's K loop: the J-th tile's iteration k is use J * trips + k of the
    ring (trips = cdiv(K, BK), the same for every tile), whatever K divides."""
    import importlib.util
    import os
    path = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "persistent_gemm.py")
    spec = importlib.util.spec_from_file_location("persistent_gemm_example", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for stages in (2, 3, 4):
        loop, ring = _ring_of(module.persistent_gemm, "sm_90a", BM=64, BN=64, BK=32,
                              STAGES=stages)
        assert ring.nested
        tile = loop.choices["ring"].enclosing[0].var.name
        k = ring.var.name
        for K in (32, 70, 200):
            trips = -(-K // 32)
            for J in range(3):
                for it in range(trips):
                    count = J * trips + it
                    names = {tile: J, k: it, "a_shape1": K}
                    assert _value(ring.slot(ring.var), **names) == count % stages
                    assert _value(ring.parity(ring.var), **names) == (count // stages) % 2
