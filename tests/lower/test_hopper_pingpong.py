"""Ping-pong consumers for the persistent sm_90a GEMM (`consumers="pingpong"`,
`synth/roles.py` `choose_consumers`, `lower/hopper.py` `take_turn` / `consumer_group`):
two consumer warpgroups each run whole tiles of the block's tile loop (iterations g, g+2,
…) with their own accumulator, their K loops taking turns through named barriers, the
producer filling one ring in that order.

Emulated against numpy and bit-identical to the cooperative schedule: ragged M/N/K, tile
counts per block odd and even, a block with one tile (the second warpgroup idle), K of
one tile and of none, stages 2-5, listed / reversed / random role orders. Injected bugs:
no turn barriers, tiles split the wrong way round (the consumers' order no longer the
ring's), a missing hand-off — each reported or wrong, never silently right by luck.
The rules that refuse ping-pong say why; `tegula explain` shows the schedule."""
from __future__ import annotations

import copy
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import f16
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.errors import SynthesisError, TegulaError
from tegula.kernels.common import poisoned, random_input
from tegula.lower.async_ir import BulkWait, NamedBarrier, Roles, StMatrix, TmaStore
from tegula.lower.warp_roles import TURN_BARRIER
from tegula.lower.lower import substitute
from tegula.lower.thread_ir import For, Var, walk

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, os.path.join(ROOT, "tests", "emulate"))
sys.path.insert(0, os.path.join(ROOT, "tests", "kernels"))
from async_kernels import remove, role_body, run_with_deadline  # noqa: E402
from test_gemm import check_gemm  # noqa: E402


def _example(name: str):
    spec = importlib.util.spec_from_file_location(f"{name}_pingpong_example",
                                                  ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


PERSISTENT = _example("persistent_gemm")
KERNEL = PERSISTENT.persistent_gemm
SMALL = dict(BM=64, BN=64, BK=32, STAGES=3, threads=128)


def emulate(m, n, k, blocks, seed=0, role_order="listed", consumers="pingpong", **config):
    """(a, b, c, report) of the persistent kernel on `blocks` blocks (num_sms = blocks)."""
    rng = np.random.default_rng(seed)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    c = poisoned((m, n), f16)
    config = {**SMALL, **config}
    report = run_with_deadline(lambda: tg.emulate(
        KERNEL, (blocks,), a, b, c, target="sm_90a", role_order=role_order, num_sms=blocks,
        consumers=consumers, **config))
    return a, b, c, report


def bits(x):
    return x.view(np.uint16)


# ------------------------------------------------------------------ right in the emulator

#: (M, N, K, blocks), tiles of 64x64: 2x3 tiles on 5 blocks (block 0 has 2, the others 1:
#: warpgroup 1 idle); 3x2 on 2 blocks (3 tiles: warpgroup 0 does one more) with 11 K
#: tiles; 1 tile on 1 block; 2x1 on 7 blocks (more blocks than tiles); 4x3 on 3 blocks (4
#: tiles each) with one partial K tile.
SHAPES = [(97, 130, 72, 5), (130, 72, 328, 2), (33, 65, 40, 1), (70, 40, 96, 7),
          (200, 136, 8, 3)]


@pytest.mark.parametrize("role_order", ["listed", "reversed", "random:1", "random:7"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_pingpong_is_right_and_equals_the_cooperative_schedule(shape, role_order):
    m, n, k, blocks = shape
    a, b, c, report = emulate(m, n, k, blocks, seed=m + k, role_order=role_order)
    assert report.threads == 3 * 128
    check_gemm(c, a, b, f16)
    _, _, cooperative, _ = emulate(m, n, k, blocks, seed=m + k, consumers="cooperative")
    assert np.array_equal(bits(c), bits(cooperative))


@pytest.mark.parametrize("stages", [2, 3, 4, 5])
@pytest.mark.parametrize("k", [32, 96, 160])
def test_every_stage_count_with_k_loops_shorter_and_longer_than_the_ring(stages, k):
    """K tiles 1, 3, 5 against S = 2 … 5, 9 tiles on one block (5 for warpgroup 0, 4 for
    warpgroup 1): a run whose length is not a multiple of S moves the ring's start stage
    from one warpgroup's tile to the other's."""
    a, b, c, _ = emulate(150, 190, k, 1, seed=stages * k, STAGES=stages,
                         role_order="reversed" if stages % 2 else "listed")
    check_gemm(c, a, b, f16)


@pytest.mark.parametrize("role_order", ["listed", "reversed", "random:5"])
@pytest.mark.parametrize("shape", [(97, 130, 72, 6), (330, 200, 40, 2)],
                         ids=lambda s: "x".join(map(str, s)))
def test_pingpong_in_2_cta_clusters_multicasting_b(shape, role_order):
    """Both blocks of a cluster walk the same tiles, so warpgroup g of each takes the same
    ones; b's boxes are multicast and a stage is free once the warpgroup that used it in
    every block released it (4 warps x 2 blocks). 6 SMs: 3 clusters over 2x3 tile units
    (97 rows: the second block of a unit lies past M and still loads and releases)."""
    m, n, k, sms = shape
    rng = np.random.default_rng(m)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    grid = PERSISTENT.persistent_grid(m, n, sms, 64, 64, 2)
    out = {}
    for consumers in ("pingpong", "cooperative"):
        out[consumers] = poisoned((m, n), f16)
        report = run_with_deadline(lambda: tg.emulate(
            KERNEL, grid, a, b, out[consumers], target="sm_90a", num_sms=sms, CLUSTER=2,
            GROUP=2, consumers=consumers, role_order=role_order, **SMALL))
        if consumers == "pingpong":
            assert report.threads == 384
    check_gemm(out["pingpong"], a, b, f16)
    assert np.array_equal(bits(out["pingpong"]), bits(out["cooperative"]))


def test_larger_tiles_two_m_repeats_per_warpgroup():
    """128x64 tiles: each warpgroup's accumulator is two m64 wgmma rows (BM = 128 over one
    warpgroup), 4 stages."""
    a, b, c, _ = emulate(300, 150, 200, 2, seed=5, BM=128, BN=64, BK=64, STAGES=4)
    check_gemm(c, a, b, f16)


def test_empty_k_loop_does_not_deadlock_and_writes_zeros():
    """K = 0: no box, no release; both warpgroups still take and hand over their turns."""
    tk = build(KERNEL, dict(SMALL, consumers="pingpong"), None, "sm_90a").thread_kernel
    a, b = np.zeros((130, 0), np.float16), np.zeros((130, 0), np.float16)
    c = poisoned((130, 130), f16)
    run_with_deadline(lambda: run_thread_kernel(tk, (2,), {"a": a, "b": b, "c": c},
                                                num_sms=2))
    assert np.array_equal(c, np.zeros((130, 130), np.float16))


def test_a_fused_bias_and_gelu_epilogue_runs_in_each_warpgroup():
    from tegula.kernels.gemm import gemm_emulated
    rng = np.random.default_rng(4)
    a, b = random_input(rng, (150, 96), f16), random_input(rng, (70, 96), f16)
    bias = random_input(rng, (70,), f16)
    ping = gemm_emulated(a, b, bias=bias, activation="gelu", persistent=2, consumers="pingpong",
                         **SMALL)
    coop = gemm_emulated(a, b, bias=bias, activation="gelu", persistent=2, **SMALL)
    assert not np.isnan(ping).any() and np.array_equal(bits(ping), bits(coop))


def test_the_per_tensor_fp8_persistent_kernel_runs_ping_pong_too():
    """The library's FP8 persistent kernel is the same tile loop (gemm.persistent_tiles):
    e4m3 operands (k32 wgmmas), scales read in the epilogue, bf16 out."""
    from tegula.kernels.fp8 import matmul_fp8_emulated
    rng = np.random.default_rng(6)
    a = rng.standard_normal((150, 320)).astype(np.float32)
    b = rng.standard_normal((200, 320)).astype(np.float32)
    tiles = dict(BM=64, BN=64, BK=128, STAGES=3, threads=128)
    ping = matmul_fp8_emulated(a, b, 0.5, 2.0, persistent=2, consumers="pingpong", **tiles)
    coop = matmul_fp8_emulated(a, b, 0.5, 2.0, persistent=2, consumers="cooperative", **tiles)
    assert not np.isnan(ping).any() and np.array_equal(ping.view(np.uint32),
                                                       coop.view(np.uint32))


# ------------------------------------------------------------------ structure


def thread_kernel(**config):
    return build(KERNEL, {**SMALL, "consumers": "pingpong", **config}, None,
                 "sm_90a").thread_kernel


def _turns(stmts: list) -> list:
    return [(s.id, s.threads, s.arrive) for s in walk(stmts)
            if isinstance(s, NamedBarrier) and s.threads == 256]


def test_two_consumer_warpgroups_split_the_tile_loop_and_take_turns():
    tk = thread_kernel()
    assert tk.threads == 384
    roles = next(s for s in tk.body if isinstance(s, Roles))
    assert [r.name for r in roles.roles] == ["consumer0", "consumer1", "producer"]
    assert [r.max_registers for r in roles.roles] == [232, 232, 40]
    for g, role in enumerate(roles.roles[:2]):
        tile_loop = next(s for s in role.body if isinstance(s, For))
        assert tile_loop.step == 2 and str(tile_loop.start) == str(g)
        # sync on its own turn, hand the next warpgroup its turn; warpgroup 1 opens
        # warpgroup 0's first turn
        own, other = TURN_BARRIER + g, TURN_BARRIER + 1 - g
        opening = [(TURN_BARRIER, 256, True)] if g == 1 else []
        assert _turns(role.body) == opening + [(own, 256, False), (other, 256, True)]
        own_barriers = {s.id for s in walk(role.body)
                        if isinstance(s, NamedBarrier) and s.threads == 128}
        assert own_barriers == {1 + g}
    # the producer walks every tile, in order
    producer_loop = next(s for s in walk(role_body(tk, "producer")) if isinstance(s, For))
    assert producer_loop.step == 1


def test_explain_shows_the_schedule_and_why():
    text = tg.explain(KERNEL, target="sm_90a", BM=128, BN=128, BK=64, STAGES=4, threads=128,
                      consumers="pingpong")
    assert ("384 threads per block (12 warps): 2 consumer warpgroups of 128 threads, each "
            "running whole tiles, + a 128-thread producer warpgroup") in text
    assert ("consumers: pingpong (consumers='pingpong') — 2 consumer warpgroups (threads "
            "0..127, 128..255, setmaxnreg.inc 232 registers each), each computing whole "
            "tiles of the tile loop in turn") in text
    assert ("epilogue through shared memory: 2 swizzled 128x64 boxes (128 B swizzle) staged 2 "
            "at a time in 32768 B per consumer warpgroup (2 buffers) from byte 131072") in text
    default = tg.explain(KERNEL, target="sm_90a", BM=128, BN=256, BK=64, STAGES=4,
                         threads=256)
    assert ("consumers: cooperative (not pingpong: the kernel's tiles span 256 threads; each "
            "ping-pong consumer is one warpgroup (launch with threads=128))") in default


def test_the_default_is_pingpong_for_a_one_warpgroup_tile_and_cooperative_otherwise():
    """At threads=128 the alternative is one consumer warpgroup idling the tensor cores
    through each epilogue (measured slower on an H100); wider tiles stay cooperative."""
    one = build(KERNEL, dict(SMALL), None, "sm_90a")
    assert one.thread_kernel.threads == 384
    assert ("consumers: pingpong (the default for a tile of one warpgroup in a tile loop)"
            in one.explain())
    clustered = build(KERNEL, dict(SMALL, CLUSTER=2), None, "sm_90a")     # not measured
    assert clustered.thread_kernel.threads == 256
    assert "pingpong applies but is not the default in clusters" in clustered.explain()
    two = build(KERNEL, dict(SMALL, BM=128, threads=256), None, "sm_90a")
    assert two.thread_kernel.threads == 384 and "consumers: cooperative" in two.explain()
    readme = build(_example("gemm").gemm, dict(BM=64, BN=64, BK=32, STAGES=3,
                                               warp_specialize=True), None, "sm_90a")
    assert readme.thread_kernel.threads == 256
    assert "consumers: cooperative (not pingpong: the pipeline is not inside a tile loop" \
        in readme.explain()


# ------------------------------------------------------------------ rules


def test_pingpong_needs_one_warpgroup_per_tile():
    with pytest.raises(SynthesisError, match=r"consumers='pingpong': the kernel's tiles span "
                                             r"256 threads.*threads=128"):
        build(KERNEL, dict(SMALL, threads=256, consumers="pingpong"), None, "sm_90a")


def test_pingpong_needs_a_tile_loop():
    readme = _example("gemm").gemm
    with pytest.raises(SynthesisError, match="not inside a tile loop"):
        build(readme, dict(BM=64, BN=64, BK=32, STAGES=3, consumers="pingpong"), None,
              "sm_90a")


def test_pingpong_without_roles_is_refused():
    with pytest.raises(SynthesisError, match="warp_specialize=False"):
        build(KERNEL, dict(SMALL, warp_specialize=False, consumers="pingpong"), None,
              "sm_90a")
    with pytest.raises(SynthesisError, match="no tg.pipeline whose copies run on TMA"):
        build(KERNEL, dict(SMALL, consumers="pingpong"), None, "sm_80")


def test_an_unknown_schedule_is_a_clear_error():
    with pytest.raises(TegulaError, match=r"consumers='pingpng' must be one of None, "
                                          r"'cooperative', 'pingpong'"):
        build(KERNEL, dict(SMALL, consumers="pingpng"), None, "sm_90a")


# ------------------------------------------------------------------ injected bugs


def _run(tk, role_order="listed", m=130, n=130, k=328, blocks=1, seed=2):
    """Run thread kernel `tk`: its output, or the EmulationError it raised."""
    rng = np.random.default_rng(seed)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    c = poisoned((m, n), f16)
    run_with_deadline(lambda: run_thread_kernel(tk, (blocks,), {"a": a, "b": b, "c": c},
                                                role_order=role_order, num_sms=blocks))
    return a, b, c


def _is_turn(s) -> bool:
    return isinstance(s, NamedBarrier) and s.threads == 256


@pytest.mark.parametrize("role_order", ["listed", "reversed", "random:3"])
def test_without_turn_barriers_a_consumer_reads_a_stage_ahead_of_its_phase(role_order):
    """Without turns, warpgroup 1 waits on tile 1's stages while the ring still holds tile
    0's: its parity waits pass a whole round early (two phases apart look alike), so it
    reads a stage not yet loaded, or releases stages out of order until the ring
    deadlocks — whichever the interleaving meets first, never a silent result."""
    tk = copy.deepcopy(thread_kernel())
    assert sum(remove(role_body(tk, f"consumer{g}"), _is_turn) for g in range(2)) == 5
    with pytest.raises(EmulationError, match="TMA copy may still be writing|a round behind|"
                                             "nothing has written|deadlock"):
        _run(tk, role_order)


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
def test_tiles_split_the_wrong_way_round_are_reported(role_order):
    """Warpgroup 0 takes the odd tiles and 1 the even ones while warpgroup 0 still goes
    first: the consumers' order is no longer the ring's, and the ring deadlocks (as it
    would hang on the GPU)."""
    tk = copy.deepcopy(thread_kernel())
    for g in range(2):
        loop = next(s for s in role_body(tk, f"consumer{g}") if isinstance(s, For))
        loop.start = loop.start + (1 - 2 * g)
    with pytest.raises(EmulationError, match="deadlock: every role is blocked"):
        _run(tk, role_order)


def test_a_missing_hand_off_is_a_deadlock_report_naming_both_warpgroups():
    tk = copy.deepcopy(thread_kernel())
    assert remove(role_body(tk, "consumer0"), lambda s: _is_turn(s) and s.arrive) == 1
    with pytest.raises(EmulationError, match="(?i)deadlock") as info:
        _run(tk)
    assert "consumer warpgroup 1" in str(info.value)


def _staging_kernel():
    """A ping-pong build whose epilogue goes through TMA stores (c's rows are 16-byte
    multiples): warpgroup 1 stages in the second half of the staging buffer."""
    built = build(KERNEL, {**SMALL, "consumers": "pingpong"}, None, "sm_90a")
    plan = next(op.choices["tma_store"] for op in tg.ir.ops.walk_ops(built.traced.body)
                if "tma_store" in op.choices)
    assert plan.copies == 2
    return copy.deepcopy(built.thread_kernel), plan


def test_each_warpgroup_stages_its_tiles_in_its_own_buffer():
    tk, plan = _staging_kernel()
    share = plan.bytes // plan.elem_bytes
    first, second = ([s for s in walk(role_body(tk, f"consumer{g}"))
                      if isinstance(s, (StMatrix, TmaStore))] for g in range(2))
    assert len(first) == len(second) > 0
    for s0, s1 in zip(first, second):  # the same store by thread tid-128, `share` further
        moved = substitute(s0.offset, {"tid": Var("tid") - 128}) + share
        assert str(s1.offset) == str(moved), (s0, s1)
    a, b, c = _run(tk, m=150, n=136, k=96, blocks=2)
    check_gemm(c, a, b, f16)


@pytest.mark.parametrize("role_order", ["listed", "reversed", "random:5"])
def test_warpgroups_sharing_one_staging_buffer_are_reported(role_order):
    """Warpgroup 1 staging where warpgroup 0 does: its stores overwrite bytes warpgroup 0's
    TMA stores may still be reading (each waits only for its own bulk groups)."""
    tk, plan = _staging_kernel()
    share = plan.bytes // plan.elem_bytes
    body = role_body(tk, "consumer1")

    def back_to_the_first(stmts):
        for i, s in enumerate(stmts):
            if isinstance(s, (StMatrix, TmaStore)):
                stmts[i] = type(s)(**{**s.__dict__, "offset": s.offset - share})
            for inner in (getattr(s, "body", None), getattr(s, "then", None)):
                if isinstance(inner, list):
                    back_to_the_first(inner)
    back_to_the_first(body)
    with pytest.raises(EmulationError, match="TMA store|bulk|written"):
        _run(tk, role_order, m=150, n=136, k=96, blocks=1)


def _walk_bulk_waits(stmts: list):
    """Every `BulkWait` in `stmts`, loops and branches too, in program order."""
    for s in stmts:
        if isinstance(s, BulkWait):
            yield s
        for inner in (getattr(s, "body", None), getattr(s, "then", None),
                      getattr(s, "otherwise", None)):
            if isinstance(inner, list):
                yield from _walk_bulk_waits(inner)


def test_a_warpgroup_missing_its_staging_wait_is_reported():
    tk, _ = _staging_kernel()
    # Its staging waits: the `.read` ones and the first round's full one (the end-of-block
    # wait stays, so what is reported is the buffer rewritten while stores still read it).
    body = role_body(tk, "consumer1")
    last = [s for s in _walk_bulk_waits(body)][-1]
    assert remove(body, lambda s: isinstance(s, BulkWait) and s is not last) >= 1
    with pytest.raises(EmulationError):
        _run(tk, m=150, n=136, k=96, blocks=1)
