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
from tegula.lower.thread_ir import For, If, walk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_attention_forward import check, inputs, reference  # noqa: E402

TURNS = dict(target="sm_90a", BM=128, threads=256, consumers="pingpong")


@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("order", ["listed", "reversed", "random:1", "random:2"])
def test_turns_give_every_element_under_every_role_order(overlap, order):
    """Causal, Sq < Sk (odd lengths, a last key block cut short), GQA 2:1: the same answer
    whichever role the emulator runs first or switches to at each asynchronous step."""
    q, k, v = inputs(23, 1, 2, 1, 150, 201, 64)
    o, lse = attention_emulated(q, k, v, True, return_lse=True, BN=64, OVERLAP=overlap,
                                role_order=order, **TURNS)
    check(o, lse, *reference(q, k, v, True))


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
    assert source.count("bar.arrive") == 2 and source.count("wgmma.mma_async") == 16


def test_a_hand_over_left_at_exit_is_reported(monkeypatch):
    """Without warpgroup 1's skipped last hand-over, its final arrive meets no sync: the
    emulator reports the named barrier still arrived at the block's end."""
    real = warp_roles._turn
    monkeypatch.setattr(warp_roles, "_turn",
                        lambda arrive, iteration_guard=None, after=(): real(arrive, after=after))
    q, k, v = inputs(2, 1, 1, 1, 64, 130, 64)
    with pytest.raises(EmulationError, match="named barrier 8 ends with 128 of 256"):
        attention_emulated(q, k, v, False, BN=64, OVERLAP=True, **TURNS)


def test_the_tuner_times_the_turns_at_head_dim_64_only():
    """Measured on an H100 (session 8): the turns pay at D = 64 (the softmax weighs most
    there), not at 128 or 256; they need wgmma (sm_90a)."""
    from tegula.kernels.attention import attention_candidates
    turns = [c for c in attention_candidates(64, True) if c.get("consumers") == "pingpong"]
    assert sorted(c["OVERLAP"] for c in turns) == [False, True]
    assert all(c["BM"] == 128 and c["threads"] == 256 and c["BN"] == 128 for c in turns)
    for d, wgmma in ((128, True), (256, True), (64, False)):
        assert not any("consumers" in c for c in attention_candidates(d, wgmma))


@pytest.mark.parametrize("overlap", [False, True])
def test_the_tuned_turn_candidates_give_every_element(overlap):
    """The D = 64 candidates as the tuner launches them (128-key blocks), causal with a
    ragged last block, under a random role order."""
    q, k, v = inputs(31, 1, 2, 2, 130, 300, 64)
    o, lse = attention_emulated(q, k, v, True, return_lse=True, BN=128, OVERLAP=overlap,
                                role_order="random:7", **TURNS)
    check(o, lse, *reference(q, k, v, True))
