"""The warp-specialized form of the sm_90a GEMM pipeline (`synth/roles.py`,
`lower/hopper.py: lower_specialized_pipeline`), checked on the thread IR: the block splits
into a consumer role over the user's threads (every tile's layout) and one extra producer
warpgroup that holds no tile; the producer waits on `empty`, arms `full` and issues the
boxes of every iteration; the consumer waits on `full`, multiplies and releases; register
budgets fit the block's register file; and the decision says why when it does not apply."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

from tegula.arch.tma import register_share
from tegula.build import build
from tegula.dtypes import f16
from tegula.errors import SynthesisError, TegulaError
from tegula.ir.ops import ForLoop, walk_ops
from tegula.lower.async_ir import (Elect, MBarrierArrive, MBarrierInit, MBarrierWait,
                                   NamedBarrier, Roles, TmaLoad, Wgmma, WgmmaWait)
from tegula.lower.thread_ir import (_FOLD, Barrier, BinOp, Const, For, If, Let, Reg, RegArray,
                                    Var, walk)
from tegula.synth.facts import TensorFacts
from tegula.synth.roles import PRODUCER_REGISTERS, register_budgets

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))
from examples.gemm import gemm as readme_gemm  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from gemm_fixtures import readme_gemm as gemm_fixture  # noqa: E402


def value(expr, env: dict) -> int:
    if isinstance(expr, Elect):  # elect.sync over a whole warp: its lane 0
        return int(env["tid"] % 32 == 0)
    if isinstance(expr, Const):
        return expr.value
    if isinstance(expr, Var):
        return env[expr.name]
    if isinstance(expr, BinOp):
        return _FOLD[expr.op](value(expr.lhs, env), value(expr.rhs, env))
    raise TypeError(expr)


def per_thread(expr, env: dict, threads, lets=()) -> np.ndarray:
    """`expr` for each thread index in `threads` (the other variables from `env`, and the
    `Let`s in `lets` bound first, in order)."""
    out = []
    for t in threads:
        scope = dict(env, tid=int(t))
        for let in lets:
            scope[let.var.name] = value(let.value, scope)
        out.append(value(expr, scope))
    return np.array(out)


def roles_of(tk) -> Roles:
    found = [s for s in tk.body if isinstance(s, Roles)]
    assert len(found) == 1, "one Roles statement at the top of the kernel body"
    return found[0]


def pipeline_loop(result) -> ForLoop:
    return next(op for op in walk_ops(result.traced.body) if isinstance(op, ForLoop))


@pytest.fixture(scope="module", params=[128, 256], ids=["1wg", "2wg"])
def specialized(request):
    threads = request.param
    tiles = dict(BM=64 * threads // 128, BN=64, BK=32, STAGES=3)
    # Forced: at these tiles the cost model's default is one role (two blocks per SM).
    return threads, build(readme_gemm, dict(tiles, threads=threads, warp_specialize=True),
                          None, "sm_90a")


def test_block_is_the_users_threads_plus_a_producer_warpgroup(specialized):
    threads, result = specialized
    tk = result.thread_kernel
    assert tk.threads == threads + 128
    roles = roles_of(tk)
    assert [r.name for r in roles.roles] == ["consumer", "producer"]
    tid = np.arange(tk.threads)
    consumer, producer = (per_thread(r.cond, {}, tid) for r in roles.roles)
    assert np.array_equal(np.flatnonzero(consumer), np.arange(threads))
    assert np.array_equal(np.flatnonzero(producer), np.arange(threads, threads + 128))
    # Every layout still spans the user's threads (the producer holds no tile).
    for tile in result.traced.register_tiles:
        assert tile.layout[0].size == threads
    # The mbarrier init, its fence and a block barrier come before the split.
    before = tk.body[:tk.body.index(roles)]
    assert any(isinstance(s, Barrier) for s in before)
    assert any(isinstance(s, If) and any(isinstance(t, MBarrierInit) for t in s.then)
               for s in before)


def _registers_in(node) -> bool:
    """Whether any register (array) appears anywhere in a statement tree."""
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, (Reg, RegArray)):
            return True
        if isinstance(x, (list, tuple)):
            stack.extend(x)
        elif hasattr(x, "__dataclass_fields__"):
            stack.extend(getattr(x, f) for f in x.__dataclass_fields__)
    return False


def test_producer_holds_no_tile_and_issues_every_iteration(specialized):
    threads, result = specialized
    consumer, producer = roles_of(result.thread_kernel).roles
    assert not _registers_in(producer.body)
    assert producer.max_registers == PRODUCER_REGISTERS
    kinds = {type(s) for s in walk(producer.body)}
    assert Wgmma not in kinds and NamedBarrier not in kinds and Barrier not in kinds
    # One elected lane of the first producer warp (tid == threads) runs the whole loop.
    (guard,) = [s for s in producer.body if isinstance(s, If)]
    assert value(guard.cond, {"tid": threads}) and not value(guard.cond, {"tid": threads + 1})
    (loop,) = guard.then
    stages = 3
    for k in range(8):
        env = {loop.var.name: k, "bid_x": 1, "bid_y": 0}
        wait, arrive, *boxes = loop.body
        assert isinstance(wait, MBarrierWait) and wait.barrier.startswith("empty")
        # The stage's previous use must be released: a fresh barrier (first round) passes
        # with parity 1, round r waits for the phase r-1 completed.
        assert (value(wait.index, env), value(wait.parity, env)) == (k % 3, (k // 3 + 1) % 2)
        assert isinstance(arrive, MBarrierArrive) and arrive.barrier.startswith("full")
        assert value(arrive.index, env) == k % stages
        assert arrive.tx_bytes == sum(b.box_bytes for b in result.thread_kernel.params
                                      if hasattr(b, "box_bytes"))
        assert [type(b) for b in boxes] == [TmaLoad, TmaLoad]
        assert {value(b.coords[0], env) for b in boxes} == {32 * k}
        assert {value(b.barrier_index, env) for b in boxes} == {k % stages}


def test_consumer_waits_multiplies_and_releases_each_stage_once(specialized):
    threads, result = specialized
    tk = result.thread_kernel
    consumer, _ = roles_of(tk).roles
    kinds = [type(s) for s in walk(consumer.body)]
    assert Barrier not in kinds and TmaLoad not in kinds
    assert {(s.id, s.threads) for s in walk(consumer.body)
            if isinstance(s, NamedBarrier)} == {(1, threads)}
    (loop,) = [s for s in consumer.body if isinstance(s, For)]
    wait = loop.body[0]
    assert isinstance(wait, MBarrierWait) and wait.barrier.startswith("full")
    # One elected lane of each warp arrives: a branch around the arrive.
    (branch,) = [s for s in loop.body if isinstance(s, If)]
    (release,) = branch.then
    assert isinstance(release, MBarrierArrive) and release.pred is None
    assert release.barrier.startswith("empty") and release.tx_bytes == 0
    # The release follows the wait_group that retired the previous iteration's wgmmas.
    waits = [i for i, s in enumerate(loop.body) if isinstance(s, WgmmaWait)]
    assert waits and loop.body[waits[-1]].pending == 1 and loop.body.index(branch) > waits[-1]
    empty = next(m for m in tk.mbarriers if m.name == release.barrier)
    inits = [s for s in walk(tk.body) if isinstance(s, MBarrierInit) and s.barrier == empty.name]
    assert {s.count for s in inits} == {threads // 32}
    tid = np.arange(threads)
    for k in range(6):
        env = {loop.var.name: k}
        assert (value(wait.index, env), value(wait.parity, env)) == (k % 3, (k // 3) % 2)
        lets = [x for x in tk.body + consumer.body if isinstance(x, Let)]
        arriving = per_thread(branch.cond, env, tid, lets)
        # lane 0 of every warp, for stage (k-1) % 3 — none in the first iteration
        assert np.array_equal(np.flatnonzero(arriving), tid[::32] if k else [])
        if k:
            assert value(release.index, env) == (k - 1) % 3
    after = consumer.body[consumer.body.index(loop) + 1]
    assert isinstance(after, WgmmaWait) and after.pending == 0


@pytest.mark.parametrize("threads", [128, 256, 384, 512, 640, 768, 896])
def test_register_budgets_fit_the_block_register_file(threads):
    """setmaxnreg moves registers inside the block's allocation (one block per SM under
    __launch_bounds__(threads, 1)): 128 x producer + threads x consumer must fit in
    (threads + 128) x the per-thread share ptxas allocated; the consumer asks for more
    only where it gains."""
    producer, consumer = register_budgets(threads)
    total = threads + 128
    share = min(255, 65536 // total) // 8 * 8
    assert register_share(total) == share
    assert producer == 40
    if consumer is None:
        # not more than the share fits (or 240, the cap)
        assert min(240, (total * share - 128 * 40) // threads // 8 * 8) <= share
        return
    assert consumer % 8 == 0 and share < consumer <= 240
    assert 128 * producer + threads * consumer <= total * share
    assert 128 * producer + threads * (consumer + 8) > total * share or consumer == 240


def test_budget_is_on_the_roles_and_shown_by_explain():
    result = build(readme_gemm, dict(BM=128, BN=64, threads=256, warp_specialize=True), None,
                   "sm_90a")
    consumer, producer = roles_of(result.thread_kernel).roles
    assert (consumer.max_registers, producer.max_registers) == register_budgets(256)[::-1]
    text = result.explain()
    assert "384 threads per block (12 warps): 256 for the tiles + a 128-thread producer" in text
    assert "setmaxnreg.dec 40" in text and f"setmaxnreg.inc {consumer.max_registers}" in text
    assert "cp.async.bulk.tensor" in result.cuda_source()
    assert f"setmaxnreg.inc.sync.aligned.u32 {consumer.max_registers}" in result.cuda_source()


def test_warp_specialize_false_keeps_one_role_and_says_so():
    result = build(readme_gemm, dict(BM=64, BN=64, warp_specialize=False), None, "sm_90a")
    tk = result.thread_kernel
    assert tk.threads == 128 and not any(isinstance(s, Roles) for s in walk(tk.body))
    assert TmaLoad in {type(s) for s in walk(tk.body)}
    assert pipeline_loop(result).choices["roles_skipped"] == "warp_specialize=False"
    assert "not warp-specialized: warp_specialize=False" in result.explain()


def test_the_kernel_option_chooses_and_a_build_keyword_overrides_it():
    import tegula as tg

    gemm = gemm_fixture(BM=64, BN=64, BK=32, STAGES=2, warp_specialize=False)

    assert build(gemm, {}, None, "sm_90a").thread_kernel.threads == 128
    assert build(gemm, dict(warp_specialize=True), None, "sm_90a").thread_kernel.threads == 256
    with pytest.raises(TegulaError, match="warp_specialize='yes'"):
        build(gemm, dict(warp_specialize="yes"), None, "sm_90a")
    with pytest.raises(TegulaError, match="warp_specialize=1"):
        tg.kernel(threads=128, warp_specialize=1)(gemm.fn)


def test_no_room_for_the_producer_warpgroup_is_the_reason():
    result = build(readme_gemm, dict(BM=256, BN=128, threads=1024), None, "sm_90a")
    assert result.thread_kernel.threads == 1024
    why = pipeline_loop(result).choices["roles_skipped"]
    assert "1152 threads, over 1024" in why
    with pytest.raises(SynthesisError, match="1152 threads"):
        build(readme_gemm, dict(BM=256, BN=128, threads=1024, warp_specialize=True), None,
              "sm_90a")


def test_warp_specialize_true_without_a_tma_pipeline_is_an_error_saying_why():
    with pytest.raises(SynthesisError, match="no tg.pipeline whose copies run on TMA"):
        build(readme_gemm, dict(warp_specialize=True), None, "sm_80")
    facts = {n: TensorFacts.assume_row_major(2) for n in "abc"}
    facts["a"] = TensorFacts(2, 1, (16, 4), (4, 1), 16, 32)     # 8-byte rows: no TMA
    with pytest.raises(SynthesisError) as info:
        build(readme_gemm, dict(BM=64, BN=64, warp_specialize=True), facts, "sm_90a")
    assert "its copies are not TMA boxes" in str(info.value)
    assert info.value.loc is not None and "tg.pipeline" in info.value.loc.line
    # Without the requirement, the same kernel simply keeps one role (cp.async + wgmma).
    tk = build(readme_gemm, dict(BM=64, BN=64), facts, "sm_90a").thread_kernel
    assert tk.threads == 128 and not any(isinstance(s, Roles) for s in walk(tk.body))


def test_a_pipeline_buffer_used_after_the_loop_keeps_one_role():
    """The producer would run ahead into a buffer the consumer also uses outside the
    loop; the decision names it."""
    import tegula as tg

    @tg.kernel(threads=128)
    def reuse(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16], d: tg.Tensor[f16]):
        m, n = tg.block_id(0), tg.block_id(1)
        ga, gb = a.tile((64, 32), (m, None)), b.tile((64, 32), (n, None))
        acc = tg.zeros((64, 64), tg.f32)
        sa, sb = tg.shared((64, 32), f16, stages=2), tg.shared((64, 32), f16, stages=2)
        for k in tg.pipeline(ga.shape[2], stages=2):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        tg.copy(acc.to(f16), c.tile((64, 64), (m, n)))
        tg.copy(sa[0], d.tile((64, 32), (m, 0)))

    result = build(reuse, {}, None, "sm_90a")
    assert result.thread_kernel.threads == 128
    why = pipeline_loop(result).choices["roles_skipped"]
    assert "also used outside the pipeline" in why and "line" in why


def test_cost_model_counts_the_launched_block_and_its_register_budget():
    """The warp-specialized README kernel launches 256 threads compiled for one block per
    SM (setmaxnreg under __launch_bounds__(256, 1)); the model counted 128 threads and
    ~216 registers each, 2 blocks per SM."""
    from tegula.synth.cost import estimate
    specialized = estimate(build(readme_gemm, dict(warp_specialize=True), None, "sm_90a"))
    assert (specialized.threads, specialized.blocks_per_sm) == (256, 1)
    single = estimate(build(readme_gemm, dict(warp_specialize=False), None, "sm_90a"))
    assert single.threads == 128


def test_warp_specialize_is_a_launch_keyword_not_a_constexpr():
    from tegula.build import split_arguments
    _, _, options = split_arguments(readme_gemm, ("a", "b", "c"),
                                    dict(BM=64, warp_specialize=False, threads=256))
    assert options == dict(BM=64, warp_specialize=False, threads=256)
    result = build(readme_gemm, options, None, "sm_90a")
    assert result.constexprs["warp_specialize"] is False and result.thread_kernel.threads == 256
