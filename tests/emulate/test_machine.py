"""The interpreter on hand-written thread IR: copies, predication, shared memory, barriers,
races, cp.async pipelines, control-flow checks, bank-conflict counts."""
from __future__ import annotations

import random

import numpy as np
import pytest

from tegula.dtypes import f32, i32
from tegula.emulate import EmulationError, bank_wavefronts, run_thread_kernel
from tegula.lower.thread_ir import (TID, Assign, Barrier, Binary, BLOCK_IDS, Comment, Const,
                                    CpAsync, CpAsyncCommit, CpAsyncWait, For, GlobalLoad,
                                    GlobalStore, If, IndexValue, Literal, Reg, RegArray, RegRead,
                                    SharedBuffer, SharedLoad, SharedStore, TensorParam,
                                    ThreadKernel, Var, all_of)

BX, BY, _ = BLOCK_IDS
RNG = np.random.default_rng(7)


def copy2d(vec: int = 4, predicated: bool = True) -> ThreadKernel:
    """y = x for a 2-D f32 tensor, 4-element vectors along rows; block = 8 rows x 64 cols."""
    r = RegArray("v", f32, vec)
    row = BY * 8 + TID // (64 // vec)
    col = BX * 64 + (TID % (64 // vec)) * vec
    pred = all_of([row.lt(Var("x_shape0")), col.lt(Var("x_shape1"))]) if predicated else None
    return ThreadKernel(
        "copy2d", 8 * 64 // vec, [TensorParam("x", f32, 2), TensorParam("y", f32, 2, True)],
        [r], [],
        [Comment("copy(x, y)"),
         GlobalLoad(Reg(r, Const(0)), "x", row * Var("x_stride0") + col * Var("x_stride1"), vec,
                    pred=pred),
         GlobalStore("y", row * Var("y_stride0") + col * Var("y_stride1"), Reg(r, Const(0)), vec,
                     pred=pred)])


def test_predicated_vector_copy_odd_shape():
    x = RNG.standard_normal((37, 132)).astype(np.float32)
    y = np.zeros_like(x)
    rep = run_thread_kernel(copy2d(), (3, 5), {"x": x, "y": y})
    assert np.array_equal(x, y)
    assert rep.blocks == 15 and rep.kind("GlobalLoad").bytes == x.nbytes
    assert rep.kind("GlobalLoad").count == 15 * 4
    assert "GlobalLoad" in str(rep)


def test_strided_view_tensor():
    base = RNG.standard_normal((40, 140)).astype(np.float32)
    x = base[1:38, 4:136]  # a view with a row stride of 140 elements
    y = np.zeros((37, 132), np.float32)
    run_thread_kernel(copy2d(), (3, 5), {"x": x, "y": y})
    assert np.array_equal(x, y)


def test_unpredicated_out_of_bounds_is_an_error():
    x = RNG.standard_normal((37, 132)).astype(np.float32)
    with pytest.raises(EmulationError, match="out-of-bounds access to tensor 'x'") as e:
        run_thread_kernel(copy2d(predicated=False), (3, 5), {"x": x, "y": np.zeros_like(x)})
    assert "GlobalLoad" in str(e.value) and "block" in str(e.value)


def test_misaligned_vector_access():
    r = RegArray("v", f32, 4)
    k = ThreadKernel("mis", 32, [TensorParam("x", f32, 1)], [r], [],
                     [GlobalLoad(Reg(r, Const(0)), "x", TID * 4 + 2, 4)])
    with pytest.raises(EmulationError, match="misaligned 16-byte"):
        run_thread_kernel(k, 1, {"x": np.zeros(200, np.float32)})


def transpose_kernel(barrier: bool = True, pad: int = 17) -> ThreadKernel:
    """y = x.T through a 16 x `pad` shared tile, 256 threads, one element each."""
    v = RegArray("v", f32, 1)
    buf = SharedBuffer("t", f32, 16 * pad, 0)
    r, c = TID // 16, TID % 16
    row, col = BY * 16 + r, BX * 16 + c
    orow, ocol = BX * 16 + r, BY * 16 + c
    body = [GlobalLoad(Reg(v, Const(0)), "x", row * Var("x_stride0") + col,
                       1, pred=all_of([row.lt(Var("x_shape0")), col.lt(Var("x_shape1"))])),
            SharedStore("t", r * pad + c, Reg(v, Const(0)), 1)]
    if barrier:
        body.append(Barrier())
    body += [SharedLoad(Reg(v, Const(0)), "t", c * pad + r, 1),
             GlobalStore("y", orow * Var("y_stride0") + ocol, Reg(v, Const(0)), 1,
                         pred=all_of([orow.lt(Var("y_shape0")), ocol.lt(Var("y_shape1"))]))]
    params = [TensorParam("x", f32, 2), TensorParam("y", f32, 2, True)]
    return ThreadKernel("transpose", 256, params, [v], [buf], body)


@pytest.mark.parametrize("pad,ways,store_ways", [(17, 2, 2), (16, 8, 1), (18, 1, 2)])
def test_transpose_through_shared(pad, ways, store_ways):
    x = RNG.standard_normal((33, 50)).astype(np.float32)
    y = np.zeros((50, 33), np.float32)
    rep = run_thread_kernel(transpose_kernel(pad=pad), (4, 3), {"x": x, "y": y})
    assert np.array_equal(y, x.T)
    # A warp reads words c*pad + {0, 1}, c < 16: pad 17 puts lanes 0 and 31 in bank 0
    # (2 ways), pad 16 folds them onto banks {0, 1, 16, 17} (8 ways), pad 18 spreads them.
    # It writes words {0, pad} + c: conflict-free only for pad 16.
    load = rep.kind("SharedLoad")
    assert load.count == 12 * 8 and load.wavefronts == 12 * 8 * ways
    assert rep.kind("SharedStore").wavefronts == 12 * 8 * store_ways


def test_missing_barrier_is_a_race():
    x = RNG.standard_normal((33, 50)).astype(np.float32)
    with pytest.raises(EmulationError, match="race.*read after write"):
        run_thread_kernel(transpose_kernel(barrier=False), (4, 3),
                          {"x": x, "y": np.zeros((50, 33), np.float32)})
    # without race checking the (wrong-on-GPU) kernel runs
    run_thread_kernel(transpose_kernel(barrier=False), (4, 3),
                      {"x": x, "y": np.zeros((50, 33), np.float32)}, check_races=False)


def test_write_after_read_race():
    """Reusing a buffer for the next tile without a barrier after the reads."""
    v = RegArray("v", f32, 1)
    buf = SharedBuffer("t", f32, 64, 0)
    body = [Assign(Reg(v, Const(0)), Literal(1.0, f32)),
            SharedStore("t", TID, Reg(v, Const(0)), 1), Barrier(),
            SharedLoad(Reg(v, Const(0)), "t", 63 - TID, 1),
            SharedStore("t", TID, Reg(v, Const(0)), 1)]
    k = ThreadKernel("war", 64, [], [v], [buf], body)
    with pytest.raises(EmulationError, match="write after read"):
        run_thread_kernel(k, 1, {})
    k.body.insert(4, Barrier())
    run_thread_kernel(k, 1, {})


def pipeline_kernel(wait: bool = True, barrier_after_wait: bool = True,
                    barrier_before_reuse: bool = True) -> ThreadKernel:
    """y[r, c] = sum over column tiles t of x[r, t*32 + c] for x (32, 32*T) f32, through a
    2-stage cp.async pipeline; one block of 64 threads, 16-byte copies."""
    stages = [SharedBuffer(f"s{s}", f32, 32 * 32, s * 32 * 32 * 4) for s in range(2)]
    acc, tmp = RegArray("acc", f32, 16), RegArray("tmp", f32, 4)
    j, e, kt = Var("j"), Var("e"), Var("kt")
    chunk = TID + j * 64
    r, c = chunk // 8, (chunk % 8) * 4
    # Threads consume chunks copied by their neighbour, so the stages really are shared.
    cchunk = (TID + 1) % 64 + j * 64
    rc, cc = cchunk // 8, (cchunk % 8) * 4
    ntiles = Var("x_shape1") // 32

    def issue(stage, tile):
        col = tile * 32 + c
        return [For(j, Const(0), Const(4), 1, [
            CpAsync(stages[stage].name, r * 32 + c, "x", r * Var("x_stride0") + col, 4,
                    pred=col.lt(Var("x_shape1")))], unroll=True), CpAsyncCommit()]

    def consume(stage):
        return [For(j, Const(0), Const(4), 1, [
            SharedLoad(Reg(tmp, Const(0)), stages[stage].name, rc * 32 + cc, 4),
            For(e, Const(0), Const(4), 1, [Assign(Reg(acc, j * 4 + e), Binary(
                "add", RegRead(Reg(acc, j * 4 + e)), RegRead(Reg(tmp, e)), f32))], unroll=True)],
            unroll=True)]

    body = [For(j, Const(0), Const(16), 1, [Assign(Reg(acc, j), Literal(0.0, f32))], unroll=True)]
    body += issue(0, Const(0))
    loop = []
    for s in range(2):
        tile = kt + s
        inner = issue((s + 1) % 2, tile + 1)
        if wait:
            inner.append(CpAsyncWait(1))
        if barrier_after_wait:
            inner.append(Barrier())
        inner += consume(s)
        if barrier_before_reuse:
            inner.append(Barrier())
        loop.append(If(tile.lt(ntiles), inner))
    body.append(For(kt, Const(0), ntiles, 2, loop))
    body += [CpAsyncWait(0), For(j, Const(0), Const(4), 1, [
        GlobalStore("y", rc * Var("y_stride0") + cc, Reg(acc, j * 4), 4)], unroll=True)]
    return ThreadKernel("pipeline", 64, [TensorParam("x", f32, 2), TensorParam("y", f32, 2, True)],
                        [acc, tmp], stages, body)


@pytest.mark.parametrize("tiles", [1, 4, 5])
def test_cp_async_pipeline(tiles):
    x = RNG.standard_normal((32, 32 * tiles)).astype(np.float32)
    y = np.zeros((32, 32), np.float32)
    rep = run_thread_kernel(pipeline_kernel(), 1, {"x": x, "y": y})
    np.testing.assert_allclose(y, x.reshape(32, tiles, 32).sum(1), rtol=1e-5, atol=1e-5)
    assert rep.kind("CpAsync").bytes == x.nbytes
    assert rep.kind("CpAsync").bank_conflicts == 0


def test_missing_cp_async_wait_is_a_race():
    x = RNG.standard_normal((32, 128)).astype(np.float32)
    with pytest.raises(EmulationError, match="not waited for"):
        run_thread_kernel(pipeline_kernel(wait=False), 1,
                          {"x": x, "y": np.zeros((32, 32), np.float32)})


def test_missing_barrier_after_wait_is_a_race():
    x = RNG.standard_normal((32, 128)).astype(np.float32)
    with pytest.raises(EmulationError, match="no barrier followed"):
        run_thread_kernel(pipeline_kernel(barrier_after_wait=False), 1,
                          {"x": x, "y": np.zeros((32, 32), np.float32)})


def test_missing_barrier_before_stage_reuse_is_a_race():
    x = RNG.standard_normal((32, 128)).astype(np.float32)
    with pytest.raises(EmulationError, match="write after read"):
        run_thread_kernel(pipeline_kernel(barrier_before_reuse=False), 1,
                          {"x": x, "y": np.zeros((32, 32), np.float32)})


def test_if_masks_and_divergent_barrier():
    v = RegArray("v", i32, 1)
    body = [Assign(Reg(v, Const(0)), IndexValue(TID, i32)),
            If((TID % 3).eq(0), [Assign(Reg(v, Const(0)), Literal(-1, i32))],
               [Assign(Reg(v, Const(0)), Binary("mul", RegRead(Reg(v, Const(0))),
                                                Literal(2, i32), i32))]),
            GlobalStore("y", TID, Reg(v, Const(0)), 1)]
    k = ThreadKernel("ifs", 96, [TensorParam("y", i32, 1, True)], [v], [], body)
    y = np.zeros(96, np.int32)
    run_thread_kernel(k, 1, {"y": y})
    t = np.arange(96)
    assert np.array_equal(y, np.where(t % 3 == 0, -1, 2 * t))
    bad = ThreadKernel("div", 64, [], [v], [], [If(TID.lt(32), [Barrier()])])
    with pytest.raises(EmulationError, match="divergent"):
        run_thread_kernel(bad, 1, {})
    ok = ThreadKernel("uni", 64, [], [v], [], [If(BX.lt(1), [Barrier()])])
    run_thread_kernel(ok, 2, {})


def test_loop_bounds_must_be_uniform():
    v = RegArray("v", i32, 1)
    k = ThreadKernel("loop", 64, [], [v], [],
                     [For(Var("i"), Const(0), TID % 2 + 1, 1,
                          [Assign(Reg(v, Const(0)), Literal(0, i32))])])
    with pytest.raises(EmulationError, match="block-uniform"):
        run_thread_kernel(k, 1, {})


def test_missing_tensor_and_wrong_dtype():
    with pytest.raises(EmulationError, match="not given"):
        run_thread_kernel(copy2d(), 1, {"x": np.zeros((8, 64), np.float32)})
    with pytest.raises(EmulationError, match="f32 but the array is float64"):
        run_thread_kernel(copy2d(), 1, {"x": np.zeros((8, 64)), "y": np.zeros((8, 64))})


# ---------------------------------------------------------------- bank conflicts

def _stride_kernel(stride_words: int, vec: int = 1) -> ThreadKernel:
    v = RegArray("v", f32, vec)
    buf = SharedBuffer("s", f32, 32 * 32 * 4 + 64, 0)
    return ThreadKernel("banks", 32, [], [v], [buf],
                        [For(Var("j"), Const(0), Const(vec), 1,
                             [Assign(Reg(v, Var("j")), Literal(1.0, f32))], unroll=True),
                         SharedStore("s", TID * stride_words, Reg(v, Const(0)), vec)])


@pytest.mark.parametrize("stride,vec,wavefronts", [(1, 1, 1), (32, 1, 32), (33, 1, 1),
                                                   (2, 1, 2), (4, 4, 4), (8, 4, 8), (2, 2, 2)])
def test_bank_conflict_counts(stride, vec, wavefronts):
    rep = run_thread_kernel(_stride_kernel(stride * vec if vec > 1 and stride < vec else stride,
                                           vec), 1, {})
    st = rep.kind("SharedStore")
    assert st.wavefronts == wavefronts, (stride, vec, st)
    ideal = {1: 1, 2: 2, 4: 4}[vec]
    assert st.ideal_wavefronts == ideal and st.bank_conflicts == wavefronts - ideal


def test_bank_wavefronts_broadcast_and_inactive():
    addr = np.zeros((1, 32), np.int64)  # everyone reads the same word: a broadcast
    assert bank_wavefronts(addr, np.ones((1, 32), bool), 4) == (1, 1)
    col = (np.arange(32) * 128)[None, :]
    assert bank_wavefronts(col, np.ones((1, 32), bool), 4) == (32, 1)
    half = np.arange(32) < 16
    assert bank_wavefronts(col, half[None, :], 4) == (16, 1)


@pytest.mark.parametrize("seed", range(12))
def test_bank_model_matches_layout_banks(seed):
    """Random F2 lane layouts: our byte-level count equals tegula.layout.banks'."""
    banks = pytest.importorskip("tegula.layout.banks")
    from tegula.layout.linear import LinearLayout

    rng = random.Random(seed)
    vec = rng.choice([1, 2, 4])  # f32 elements per vector: 4, 8, 16 bytes
    vbits = vec.bit_length() - 1
    outs = [("col", 32), ("row", 32)]
    nbits = 10
    free = [1 << i for i in range(vbits, nbits)]
    rng.shuffle(free)
    lane_cols = free[:5]
    reg_cols = [1 << i for i in range(vbits)] + free[5:]
    d = LinearLayout.from_packed({"register": reg_cols, "lane": lane_cols, "warp": []}, outs)
    s = LinearLayout.from_packed({"offset": [1 << i for i in range(nbits)]}, outs)
    want = banks.bank_conflicts(s, d, 4, vec_elems=vec)
    lane_off = np.zeros(32, np.int64)
    for lane in range(32):
        o = 0
        for b in range(5):
            if lane >> b & 1:
                o ^= lane_cols[b]
        lane_off[lane] = o
    got, _ = bank_wavefronts((lane_off * 4)[None, :], np.ones((1, 32), bool), vec * 4)
    assert got == want


def test_packed_int4_copy():
    """u4 tensors are uint8 arrays of nibble pairs; 8 nibbles (4 bytes) per thread."""
    from tegula.dtypes import u4

    r = RegArray("q", u4, 8)
    col = TID * 8
    k = ThreadKernel("copy_u4", 32, [TensorParam("x", u4, 2), TensorParam("y", u4, 2, True)],
                     [r], [SharedBuffer("s", u4, 3 * 256, 0)],
                     [For(Var("i"), Const(0), Var("x_shape0"), 1, [
                         GlobalLoad(Reg(r, Const(0)), "x", Var("i") * Var("x_stride0") + col, 8,
                                    pred=col.lt(Var("x_shape1"))),
                         SharedStore("s", Var("i") * 256 + col, Reg(r, Const(0)), 8),
                         SharedLoad(Reg(r, Const(0)), "s", Var("i") * 256 + col, 8),
                         GlobalStore("y", Var("i") * Var("y_stride0") + col, Reg(r, Const(0)), 8,
                                     pred=col.lt(Var("y_shape1")))])])
    x = RNG.integers(0, 256, (3, 100), dtype=np.uint8)
    y = np.zeros_like(x)
    run_thread_kernel(k, 1, {"x": x, "y": y})
    assert np.array_equal(x, y)
