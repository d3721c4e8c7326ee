"""The attention forward with its two consumer warpgroups taking turns at the tensor cores
(`consumers="pingpong"` on a 128-row query block: FlashAttention-3's inter-warpgroup
ping-pong, `lower/warp_roles.py` `take_turns_in_loop`): every element against the float64
reference under every role order, where the turn barriers sit, one copy of the consumer
code, and the emulator's report of a turn left open at exit."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tegula as tg
from tegula.emulate.errors import EmulationError
from tegula.kernels.attention import attention_emulated, attention_kernel, qk_scale
from tegula.lower import warp_roles
from tegula.lower.async_ir import NamedBarrier, Roles, Wgmma, WgmmaCommit, WgmmaFence
from tegula.lower.thread_ir import Assign, Const, For, If, Reg, RegArray, RegRead, Var, walk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_attention_forward import check, inputs, reference  # noqa: E402

TURNS = dict(target="sm_90a", BM=128, threads=256, consumers="pingpong")
_R = Reg(RegArray("x", tg.f32, 1), Const(0))  # a register for synthetic loop bodies


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("order", ["listed", "reversed", "random:1", "random:2", "stall",
                                   "stall-reversed"])
def test_turns_give_every_element_under_every_role_order(overlap, order):
    """Causal, Sq < Sk (odd lengths, a last key block cut short), GQA 2:1: the same answer
    whichever role the emulator runs first or switches to at each asynchronous step."""
    q, k, v = inputs(23, 1, 2, 1, 150, 201, 64)
    o, lse = attention_emulated(q, k, v, True, return_lse=True, BN=64, OVERLAP=overlap,
                                role_order=order, **TURNS)
    check(o, lse, *reference(q, k, v, True))


@pytest.mark.parametrize("order", ["stall"])
def test_turns_in_a_persistent_kernel_are_balanced_per_tile(order, monkeypatch):
    """PERSISTENT on 2 blocks walking 2 x 2 x 2 tiles, the ring running across them, with
    in-loop turns (synthesis allows them only for a ring of its own: allowed here, as
    `benchmarks/attention_variants.py` ringturns=1 does): each tile's key loop opens and
    closes its turns, so no arrive is left over between tiles."""
    from tegula.ir.ops import Gemm
    from tegula.kernels.common import launch_emulated, poisoned
    from tegula.synth import roles
    monkeypatch.setattr(roles, "takes_turns_in_loop", lambda kernel, loop: sum(
        isinstance(op, Gemm) for op in loop.body) >= 2 and kernel.threads == 256)
    q, k, v = inputs(25, 2, 2, 1, 150, 201, 64)
    o, lse = poisoned(q.shape, tg.f16), poisoned((2, 2, 150), tg.f32)
    launch_emulated(attention_kernel.__wrapped__(tg.f16), (2,), q, k, v, o, lse, D=64,
                    QK_SCALE=qk_scale(None, 64), BN=64, PERSISTENT=True, role_order=order,
                    **TURNS)
    check(o, lse, *reference(q, k, v, False))


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("sq,sk,causal", [(130, 65, True), (1, 77, False), (200, 129, False)])
def test_turns_with_rows_that_see_nothing_and_one_query(overlap, sq, sk, causal):
    """Sq > Sk causal (rows that see no key: o = 0, lse = -inf), a single query, a key
    count one past the block: the turns stay balanced whatever the loop's trip count."""
    q, k, v = inputs(5, 1, 2, 2, sq, sk, 64)
    o, lse = attention_emulated(q, k, v, causal, return_lse=True, BN=64, OVERLAP=overlap,
                                **TURNS)
    check(o, lse, *reference(q, k, v, causal))


def _consumer_roles(overlap):
    from tegula.build import build
    kernel = build(attention_kernel(tg.f16), dict(D=128, QK_SCALE=qk_scale(None, 128),
                                                  CAUSAL=False, BM=128, BN=128,
                                                  OVERLAP=overlap, threads=256,
                                                  consumers="pingpong"), None, "sm_90a")
    roles, = [s for s in walk(kernel.thread_kernel.body) if isinstance(s, Roles)]
    return kernel, roles.roles


def _turns(stmts):
    """(index, arrive) of each turn (an If on the warpgroup holding named barriers 8/9)."""
    found = []
    for i, s in enumerate(stmts):
        if isinstance(s, If):
            ids = {x.id for x in walk([s]) if isinstance(x, NamedBarrier)}
            if ids == {8, 9}:
                found.append((i, next(x.arrive for x in walk([s])
                                      if isinstance(x, NamedBarrier))))
    return found


def test_the_plain_loop_hands_over_after_the_scores_and_waits_before_p_v():
    """The plain loop's turn crosses the back edge: acc += p_j @ v_j, then s_{j+1}. So each
    warpgroup arrives on the other's barrier right after issuing the scores' gemm and syncs
    on its own before p @ v: the softmax between them runs during the other's gemms."""
    _, (c0, c1, producer) = _consumer_roles(False)
    assert c0.body == c1.body and producer.name == "producer"
    loop, = [s for s in walk(c0.body) if isinstance(s, For)
             and any(isinstance(x, WgmmaCommit) for x in s.body)]
    commits = [i for i, s in enumerate(loop.body) if isinstance(s, WgmmaCommit)]
    fences = [i for i, s in enumerate(loop.body) if isinstance(s, WgmmaFence)]
    assert _turns(loop.body) == [(commits[0] + 1, True), (fences[1] - 1, False)]


def _syncs(stmts):
    """The turn syncs (named barriers 8/9 that wait) among `stmts`, each If's two."""
    return [x for x in walk(stmts) if isinstance(x, NamedBarrier) and x.id in (8, 9)
            and not x.arrive]


@pytest.mark.parametrize("overlap", [False, True])
def test_the_turn_sync_waits_for_p_s_fragment(overlap):
    """Each turn's sync names the register A fragment of the gemms it opens (p's f16
    fragment, read by acc += p @ v): ptxas moves register work across a bar.sync that names
    no register, and sank the whole softmax below it. The arrive names nothing."""
    _, (c0, _, _) = _consumer_roles(overlap)
    loop, = [s for s in walk(c0.body) if isinstance(s, For)
             and any(isinstance(x, WgmmaCommit) for x in s.body)]
    p_v = [r for x in walk(loop.body) if isinstance(x, Wgmma) and isinstance(x.a, list)
           for r in x.a]                                  # its 8 k-steps' A registers
    syncs = _syncs(loop.body)
    assert len(syncs) == 2 and all(x.after == tuple(p_v) for x in syncs)
    assert len({r.array.name for r in p_v}) == 1 and len(set(p_v)) == 64  # 64x128 f16
    assert all(not x.after for x in walk(loop.body) if isinstance(x, NamedBarrier)
               and x.arrive)


@pytest.mark.parametrize("d", [64, 128])
def test_every_exponential_runs_before_the_turn_sync_in_the_sass(d):
    """The compiled plain loop (nvcc/NVRTC and cuobjdump on the CPU): every MUFU.EX2 of
    the loop comes before the turn's BAR.SYNC, the wgmmas of p @ v after it (before the
    sync named p's fragment, all 64 + 2 exponentials of a thread were sunk below it)."""
    from tegula.runtime.compiler import available_compilers, compile_cuda, disassemble
    if not available_compilers():
        pytest.skip("neither NVRTC nor nvcc found")
    from tegula.build import build
    kernel = build(attention_kernel(tg.f16), dict(D=d, QK_SCALE=qk_scale(None, d),
                                                  CAUSAL=False, BM=128, BN=128,
                                                  threads=256, consumers="pingpong"),
                   None, "sm_90a")
    sass = disassemble(compile_cuda(kernel.cuda_source(), kernel.thread_kernel.name,
                                    "sm_90a"))
    if sass is None:
        pytest.skip("cuobjdump/nvdisasm not available")
    ops = [op for line in sass.splitlines() for op in ("BAR.SYNC", "MUFU.EX2", "HGMMA")
           if op in line]
    # the key loop: from the scores' first HGMMA to the last of p @ v
    hgmma = [i for i, op in enumerate(ops) if op == "HGMMA"]
    loop = ops[hgmma[0]:hgmma[-1] + 1]
    sync = loop.index("BAR.SYNC")
    assert loop[:sync].count("HGMMA") == d // 16          # s = q @ k.T, k-steps of 16
    assert loop[:sync].count("MUFU.EX2") == 66            # 64 scores and 2 rescales a thread
    assert loop[sync:].count("HGMMA") == 128 // 16 and "MUFU.EX2" not in loop[sync:]


def test_the_overlapped_loop_takes_both_gemms_in_one_turn_and_is_opened_once():
    """OVERLAP issues s_{j+1} and acc += p_j @ v_j together: one turn holds both (sync
    before the first fence, arrive after the second commit); warpgroup 1 opens warpgroup
    0's first turn before the loop and skips its last hand-over (no arrive left at exit)."""
    _, (c0, _, _) = _consumer_roles(True)
    index, = [i for i, s in enumerate(c0.body) if isinstance(s, For)
              and any(isinstance(x, WgmmaCommit) for x in s.body)]
    loop = c0.body[index]
    commits = [i for i, s in enumerate(loop.body) if isinstance(s, WgmmaCommit)]
    fences = [i for i, s in enumerate(loop.body) if isinstance(s, WgmmaFence)]
    assert _turns(loop.body) == [(fences[0] - 1, False), (commits[1] + 1, True)]
    before = [x for x in walk(c0.body[:index]) if isinstance(x, NamedBarrier)]
    assert [(x.id, x.arrive) for x in before if x.id >= 8] == [(8, True)]


def test_the_gpu_runs_one_copy_of_the_consumer_code():
    """The two consumer roles share one body: CUDA has one branch for both warpgroups."""
    kernel, _ = _consumer_roles(False)
    source = kernel.cuda_source()
    assert source.count("// role consumer") == 1 and "if (tid < 128 || tid < 256)" in source
    # the hand-over in the loop (one per warpgroup), the opener and the closer
    assert source.count("bar.arrive") == 4 and source.count("wgmma.mma_async") == 16


def test_a_hand_over_left_at_exit_is_reported(monkeypatch):
    """Without warpgroup 1's skipped last hand-over, its final arrive meets no sync: the
    emulator reports the named barrier still arrived at the block's end."""
    real = warp_roles._turn
    monkeypatch.setattr(warp_roles, "_turn",
                        lambda arrive, iteration_guard=None, after=(): real(arrive, after=after))
    q, k, v = inputs(2, 1, 1, 1, 64, 130, 64)
    with pytest.raises(EmulationError, match="named barrier 8 ends with 128 of 256"):
        attention_emulated(q, k, v, False, BN=64, OVERLAP=True, **TURNS)


def test_the_tuner_times_the_turns_at_head_dims_64_and_128():
    """Measured on an H100 (session 13): the turns lead the 128-row blocks at D = 64 and
    128 (the overlapped loop with turns was slower), not at 256 (session 14: FlashAttention-
    3's 128 x 80 tile taking turns 0.93x / 0.98x cuDNN against the overlapped loop's 1.01x /
    1.07x); they need wgmma."""
    from tegula.kernels.attention import attention_candidates
    for d in (64, 128):
        for causal in (False, True):
            turns = [c for c in attention_candidates(d, True, causal)
                     if c.get("consumers") == "pingpong"]
            assert turns and all(c["BM"] == 128 and c["threads"] == 256 and
                                 not c.get("OVERLAP") for c in turns)
    for d, wgmma in ((256, True), (64, False)):
        assert not any("consumers" in c for c in attention_candidates(d, wgmma))


def test_the_tuned_turn_candidate_gives_every_element():
    """The D = 64 turns as the tuner launches them (128-key blocks), causal with a ragged
    last block, under a random role order."""
    q, k, v = inputs(31, 1, 2, 2, 130, 300, 64)
    o, lse = attention_emulated(q, k, v, True, return_lse=True, BN=128,
                                role_order="random:7", **TURNS)
    check(o, lse, *reference(q, k, v, True))


def _barrier_ops(stmts, env, ops):
    """The named-barrier operations one thread runs through `stmts` (Ifs evaluated and For
    loops unrolled in `env`, which binds tid and the trip count n): ("arrive"|"sync", id)."""
    from tegula.emulate.exprs import compile_expr
    for s in stmts:
        if isinstance(s, NamedBarrier):
            ops.append(("arrive" if s.arrive else "sync", s.id))
        elif isinstance(s, If):
            taken = s.then if compile_expr(s.cond)(env) else s.otherwise
            _barrier_ops(taken, env, ops)
        elif isinstance(s, For):
            for j in range(compile_expr(s.start)(env), compile_expr(s.stop)(env), s.step):
                _barrier_ops(s.body, dict(env, **{s.var.name: j}), ops)
    return ops


def _deadlocks(programs):
    """Every interleaving of the warpgroups' barrier `programs` under the hardware's named
    barriers (bar.sync / bar.arrive add 128 threads; the 256th releases the waiters and
    resets the count): the first interleaving that deadlocks or leaves arrivals, or None."""
    seen = set()

    def explore(pcs, counts, waiting, trace):
        key = (pcs, counts, waiting)
        if key in seen:
            return None
        seen.add(key)
        moved = False
        for g, (pc, program) in enumerate(zip(pcs, programs)):
            if waiting[g] is not None or pc == len(program):
                continue
            moved = True
            kind, bar = program[pc]
            count = dict(counts)
            count[bar] = count.get(bar, 0) + 128
            wait = list(waiting)
            if kind == "sync":
                wait[g] = bar
            if count[bar] == 256:          # complete: release whoever waits on it
                count[bar] = 0
                wait = [None if w == bar else w for w in wait]
            step = tuple(p + (i == g) for i, p in enumerate(pcs))
            found = explore(step, tuple(sorted(count.items())), tuple(wait),
                            trace + [(g, kind, bar)])
            if found:
                return found
        if not moved and (any(w is not None for w in waiting) or any(c for _, c in counts)):
            return trace
        return None

    return explore(tuple(0 for _ in programs), (), tuple(None for _ in programs), [])


@pytest.mark.parametrize("trips", [0, 1, 2, 3, 5])
def test_the_turns_never_deadlock_in_any_interleaving(trips):
    """The plain loop's turn barriers, as each warpgroup runs them for `trips` key blocks,
    under every interleaving of the two warpgroups with the hardware's counting named
    barriers: none deadlocks or ends with arrivals. (The emulator switches roles only where
    one blocks, so it never let warpgroup 1 run ahead during warpgroup 0's softmax: the
    earlier arrive-then-sync order deadlocks here at 2 key blocks, and hung the H100.)"""
    loop = For(Var("j"), Const(0), Var("n"), 1,
               [WgmmaFence(), WgmmaCommit()] + [Assign(_R, RegRead(_R))] * 3
               + [WgmmaFence(), WgmmaCommit()])
    stmts = warp_roles._loop_with_turns(loop)
    programs = [_barrier_ops(stmts, {"tid": tid, "n": trips}, []) for tid in (0, 128)]
    assert [len(p) for p in programs] == [2 * trips] * 2
    assert _deadlocks(programs) is None


def test_the_model_finds_the_old_arrive_then_sync_deadlock():
    """The checker itself: each iteration arriving on the other's barrier, then syncing on
    its own (the order before), deadlocks at 3 trips."""
    def old(tid, trips):
        mine, other = (8, 9) if tid < 128 else (9, 8)
        return [op for _ in range(trips) for op in (("arrive", other), ("sync", mine))]
    assert _deadlocks([old(0, 3), old(128, 3)]) is not None
    assert _deadlocks([old(0, 1), old(128, 1)]) is None
