"""Ping-pong splits a persistent tile loop's iterations between two consumer warpgroups
that run in no order with each other: right only where no two iterations store to one
global element and none reads what another stored (`synth/tile_map.py`). Session 11:
a tile map sending two iterations to one tile (`t // 2`) and a read of the tile the
previous iteration stored (a running sum over tiles) were both split by default. Now
they keep one consumer role (explain says why), `consumers="pingpong"` is refused at the
user's loop, and the results match numpy on sm_90a and sm_80; forced through anyway,
the emulator's global race check reports the race. The library's persistent GEMM
(grouped tile order, clusters) keeps ping-pong."""
import importlib.util
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32, i32
from tegula.emulate import EmulationError
from tegula.errors import SynthesisError

BM = BN = 64


def row_tile_product(a, b, BK, STAGES):
    """(trace time) `product(t)`: row tile t of a @ b.T (b's first BN rows) through a
    TMA + wgmma ring made here, shared by every call (the tile loop's)."""
    sa = tg.shared((BM, BK), f16, stages=STAGES)
    sb = tg.shared((BN, BK), f16, stages=STAGES)
    gb = b.tile((BN, BK), (0, None))

    def product(t):
        ga = a.tile((BM, BK), (t, None))
        acc = tg.zeros((BM, BN), f32)
        for k in tg.pipeline(ga.shape[2], stages=STAGES):
            tg.copy(ga[:, :, k], sa[k])
            tg.copy(gb[:, :, k], sb[k])
            tg.gemm(acc, sa[k], sb[k])
        return acc
    return product


@tg.kernel(threads=128)
def folded_tiles(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                 BK: tg.constexpr = 32, STAGES: tg.constexpr = 2):
    """Row tile t of a @ b.T into row tile t // 2 of c: the odd iteration's is left."""
    product = row_tile_product(a, b, BK, STAGES)
    for t in tg.range(tg.cdiv(a.shape[0], BM)):
        acc = product(t)
        tg.copy(acc, c.tile((BM, BN), (t // 2, 0)))


@tg.kernel(threads=128)
def running_tiles(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                  BK: tg.constexpr = 32, STAGES: tg.constexpr = 2):
    """c tile t = a_t @ b.T + c tile t - 1 (tile 0 adds c's own first tile): a running
    sum over row tiles, each iteration reading what the previous one stored."""
    product = row_tile_product(a, b, BK, STAGES)
    for t in tg.range(tg.cdiv(a.shape[0], BM)):
        acc = product(t)
        before = tg.load(c.tile((BM, BN), (tg.maximum(t - 1, 0), 0)))
        tg.copy(acc + before, c.tile((BM, BN), (t, 0)))


@tg.kernel(threads=128)
def table_tiles(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                order: tg.Tensor[i32, 1], BK: tg.constexpr = 32, STAGES: tg.constexpr = 2):
    """Row tile t of a @ b.T into row tile order[t] of c (a user's index table)."""
    product = row_tile_product(a, b, BK, STAGES)
    for t in tg.range(tg.cdiv(a.shape[0], BM)):
        acc = product(t)
        tg.copy(acc, c.tile((BM, BN), (order[t], 0)))


def operands(tiles=4, k=40, seed=0):
    """a (tiles * 64 - 3, k) and b (64, k): a ragged last row tile and K tile."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((tiles * BM - 3, k)).astype(np.float16)
    b = rng.standard_normal((BN, k)).astype(np.float16)
    return a, b


def row_tiles(a, b) -> list:
    """a @ b.T in float64 as a list of (64, 64) row tiles (the last zero-padded)."""
    ab = a.astype(np.float64) @ b.astype(np.float64).T
    ab = np.concatenate([ab, np.zeros((-len(ab) % BM, BN))])
    return [ab[i:i + BM] for i in range(0, len(ab), BM)]


def bound(a, b):
    return 1e-5 * (np.abs(a).astype(np.float64) @ np.abs(b).T.astype(np.float64)).max() + 1e-6


def consumers(kernel) -> str:
    # Roles forced: the cost model keeps these small tiles in one role by default.
    text = str(tg.explain(kernel, warp_specialize=True))
    line = next(x for x in text.splitlines() if "consumers:" in x)
    return line.split("consumers:")[1]


@pytest.mark.parametrize("kernel,why", [
    (folded_tiles, "the store to %c.* is not shown to reach a different tile"),
    (running_tiles, "the load of %.* reads c, which the tile loop stores to"),
    (table_tiles, "the store to %c.* is not shown to reach a different tile")])
def test_dependent_iterations_keep_one_consumer_and_say_why(kernel, why):
    import re
    said = consumers(kernel)
    assert said.startswith(" cooperative (not pingpong: "), said
    assert re.search(why, said), said


@pytest.mark.parametrize("kernel", [folded_tiles, running_tiles, table_tiles])
def test_asking_for_pingpong_is_refused_at_the_users_loop(kernel):
    a, b = operands()
    c = np.full((4 * BM, BN), np.nan, np.float32)
    extra = (np.arange(4, dtype=np.int32)[::-1].copy(),) if kernel is table_tiles else ()
    with pytest.raises(SynthesisError, match="consumers='pingpong': ") as e:
        tg.emulate(kernel, (1,), a, b, c, *extra, target="sm_90a", consumers="pingpong")
    assert "test_pingpong_tile_map.py" in str(e.value)   # the user's line, not ours


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_folded_tiles_keep_the_last_iterations_tile(target):
    a, b = operands()
    tiles = row_tiles(a, b)
    c = np.full((2 * BM, BN), np.nan, np.float32)
    tg.emulate(folded_tiles, (1,), a, b, c, target=target, role_order="reversed")
    ref = np.concatenate([tiles[1], tiles[3]])
    assert np.all(np.abs(c - ref) <= bound(a, b))


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_the_running_sum_reads_each_previous_tile(target):
    a, b = operands(seed=1)
    tiles = row_tiles(a, b)
    start = np.random.default_rng(2).standard_normal((4 * BM, BN)).astype(np.float32)
    c = start.copy()
    tg.emulate(running_tiles, (1,), a, b, c, target=target, role_order="reversed")
    ref, total = [], start[:BM].astype(np.float64)
    for t in range(4):
        total = total + tiles[t]
        ref.append(total)
    assert np.all(np.abs(c - np.concatenate(ref)) <= 4 * bound(a, b) + 1e-5 * np.abs(start).max())


@pytest.mark.parametrize("kernel,race,cols", [
    # c's rows 256 B: TMA stores, the other warpgroup's still in flight
    (folded_tiles, r"while a TMA store to it is in flight", 64),
    (folded_tiles, r"global-memory race \(write after write\)", 62),  # 248 B rows: st.global
    (running_tiles, r"global-memory race \(read after write\)", 64)])
def test_forced_through_the_emulator_reports_the_race(monkeypatch, kernel, race, cols):
    """What the rule prevents: with the proof skipped, ping-pong's two warpgroups store
    tile 0 (iterations 0 and 1) unordered, or iteration 1 reads tile 0 while the other
    warpgroup stores it: a global-memory race the emulator reports."""
    import tegula.synth.roles as roles
    monkeypatch.setattr(roles, "global_dependence", lambda *args: "")
    a, b = operands()
    c = np.random.default_rng(3).standard_normal((4 * BM, cols)).astype(np.float32)
    with pytest.raises(EmulationError, match=race):
        tg.emulate(kernel, (1,), a, b[:cols], c, target="sm_90a", consumers="pingpong",
                   STAGES=3)   # a build of its own (not a cached refusal)


def _persistent_gemm():
    path = Path(__file__).resolve().parents[2] / "examples" / "persistent_gemm.py"
    spec = importlib.util.spec_from_file_location("persistent_gemm_tile_map", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.persistent_gemm


@pytest.mark.parametrize("group,cluster", [(1, 1), (8, 1), (3, 2)])
def test_the_grouped_tile_order_is_proven_one_to_one(group, cluster):
    from tegula.build import build
    config = dict(BM=64, BN=64, BK=32, STAGES=3, GROUP=group, CLUSTER=cluster, threads=128,
                  consumers="pingpong")
    built = build(_persistent_gemm(), config, None, "sm_90a")
    assert "consumers: pingpong" in built.explain()


@tg.kernel(threads=128)
def self_indexed_tiles(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                       order: tg.Tensor[i32, 1], BK: tg.constexpr = 32,
                       STAGES: tg.constexpr = 2):
    """Row tile t (proven apart) of column tile order[0], and the loop writes order (each
    entry moved on by one): iteration 0 changes the column the later ones store to."""
    product = row_tile_product(a, b, BK, STAGES)
    for t in tg.range(tg.cdiv(a.shape[0], BM)):
        acc = product(t)
        tg.copy(acc, c.tile((BM, BN), (t, order[0])))
        tg.copy(tg.load(order.tile((1,), (t,))) + 1, order.tile((1,), (t,)))


def test_an_index_table_the_loop_writes_keeps_one_consumer():
    said = consumers(self_indexed_tiles)
    assert said.startswith(" cooperative (not pingpong: "), said
    assert "is addressed through order, which the tile loop also writes" in said, said
