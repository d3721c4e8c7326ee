"""Hand-written thread-IR kernels: the emitter's and the runtime's test subjects and demos.

Each function returns a `ThreadKernel` that exercises one family of statements, written the
way lowering would write it (explicit vector widths, predicates, fragment orders). They
are deliberately small, and each has a numpy reference in its docstring so GPU tests can
check every element.

`ALL_SAMPLES` compile for every target; `HOPPER_SAMPLES` use the asynchronous statements
(`lower/async_ir.py`: TMA, mbarriers, wgmma, warp roles) and compile for sm_90a only.
"""
from __future__ import annotations

from tegula.dtypes import DType, bf16, bool_, f16, f32, f8e4m3, i32
from tegula.lower.async_ir import (
    BulkCommit, BulkWait, FenceBarrierInit, FenceProxyAsync, MBarrierArray, MBarrierArrive,
    MBarrierInit, MBarrierWait, NamedBarrier, Role, Roles, SmemDesc, TensorMapParam, TmaLoad,
    TmaStore, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait,
)
from tegula.lower.thread_ir import (
    TID, Assign, Barrier, Binary, BLOCK_IDS, Cast, Comment, Const, CpAsync, CpAsyncCommit,
    CpAsyncWait, For, GlobalAtomicAdd, GlobalLoad, GlobalStore, If, IndexValue, LdMatrix,
    Literal, Mma, Reg, RegArray, RegRead, ScalarParam, SharedBuffer, SharedLoad, SharedStore,
    Shuffle, TensorParam, ThreadKernel, Unary, Var, Where, all_of,
)

BID_X, BID_Y, _ = BLOCK_IDS


def vector_copy(dtype: DType = f16, vec: int = 8, threads: int = 128) -> ThreadKernel:
    """`y[i] = x[i]` for a contiguous 1-D tensor whose length is a multiple of `vec`.

    Block b, thread t copies elements (b*threads + t)*vec … +vec-1 with one vector load and
    one vector store (16 bytes for f16 x 8). Grid: cdiv(n, threads*vec).
    """
    r = RegArray("x_frag", dtype, vec)
    start = (BID_X * threads + TID) * vec
    inside = start.lt(Var("x_shape0"))
    return ThreadKernel(
        name=f"tg_copy_{dtype.name}_v{vec}", threads=threads,
        params=[TensorParam("x", dtype, 1), TensorParam("y", dtype, 1, writes=True)],
        registers=[r], shared=[],
        body=[Comment("copy(x, y)"),
              GlobalLoad(Reg(r, Const(0)), "x", start * Var("x_stride0"), vec, pred=inside),
              GlobalStore("y", start * Var("y_stride0"), Reg(r, Const(0)), vec, pred=inside)])


def shared_transpose(tile: int = 32, threads: int = 256) -> ThreadKernel:
    """`y = x.T` for a 2-D f32 tensor of any shape (boundary tiles predicated).

    Block (bx, by) moves the tile x[by*T:(by+1)*T, bx*T:(bx+1)*T] through shared memory
    (rows padded to T+1 words against bank conflicts). Grid: (cdiv(cols, T), cdiv(rows, T)).
    """
    rows_per_pass = threads // tile
    passes = tile // rows_per_pass
    r = RegArray("v", f32, passes)
    buf = SharedBuffer("tile", f32, tile * (tile + 1), 0)
    i = Var("i")
    lane_col, lane_row = TID % tile, TID // tile
    row = BID_Y * tile + lane_row + i * rows_per_pass
    col = BID_X * tile + lane_col
    load = [GlobalLoad(Reg(r, i), "x", row * Var("x_stride0") + col * Var("x_stride1"), 1,
                       pred=all_of([row.lt(Var("x_shape0")), col.lt(Var("x_shape1"))])),
            SharedStore("tile", (lane_row + i * rows_per_pass) * (tile + 1) + lane_col,
                        Reg(r, i), 1)]
    # After the barrier, thread (c, r) reads the tile's column and writes y's row.
    out_row = BID_X * tile + lane_row + i * rows_per_pass
    out_col = BID_Y * tile + lane_col
    store = [SharedLoad(Reg(r, i), "tile", lane_col * (tile + 1) + lane_row + i * rows_per_pass,
                        1),
             GlobalStore("y", out_row * Var("y_stride0") + out_col * Var("y_stride1"),
                         Reg(r, i), 1,
                         pred=all_of([out_row.lt(Var("y_shape0")), out_col.lt(Var("y_shape1"))]))]
    return ThreadKernel(
        name="tg_transpose_f32", threads=threads,
        params=[TensorParam("x", f32, 2), TensorParam("y", f32, 2, writes=True)],
        registers=[r], shared=[buf],
        body=[Comment("copy(x tile, shared)"),
              For(i, Const(0), Const(passes), 1, load[:1], unroll=True),
              For(i, Const(0), Const(passes), 1, load[1:], unroll=True),
              Barrier(),
              Comment("copy(shared^T, y tile)"),
              For(i, Const(0), Const(passes), 1, store, unroll=True)])


def cp_async_pipeline(rows: int = 64, cols: int = 64, stages: int = 2,
                      threads: int = 128) -> ThreadKernel:
    """Column-block sums through a cp.async double buffer: for a (R, K) f16 tensor `x` with
    R == rows and K % cols == 0, `y[r, c] = sum_k x[r, k*cols + c]` (f32, shape (rows, cols)).

    Each pipeline stage is a (rows, cols) f16 tile copied with 16-byte cp.async (zero-filled
    past the tensor's end); the loop waits for the oldest stage, accumulates it from shared
    memory with 16-byte shared loads, and issues the next copy. One block.
    """
    chunks = rows * cols // 8           # 16-byte chunks per tile
    per_thread = chunks // threads
    bufs = [SharedBuffer(f"stage{s}", f16, rows * cols, s * rows * cols * 2) for s in range(stages)]
    frag, acc = RegArray("h", f16, 8), RegArray("acc", f32, per_thread * 8)
    j, e, kt = Var("j"), Var("e"), Var("kt")
    chunk = TID + j * threads
    r_, c_ = chunk // (cols // 8), (chunk % (cols // 8)) * 8
    ntiles = Var("x_shape1") // cols

    def issue(stage: int, tile_expr) -> list:
        col = tile_expr * cols + c_
        return [For(j, Const(0), Const(per_thread), 1, [
            CpAsync(bufs[stage].name, r_ * cols + c_, "x",
                    r_ * Var("x_stride0") + col * Var("x_stride1"), 8,
                    pred=all_of([r_.lt(Var("x_shape0")), col.lt(Var("x_shape1"))]))],
            unroll=True), CpAsyncCommit()]

    def consume(stage: int) -> list:
        return [For(j, Const(0), Const(per_thread), 1, [
            SharedLoad(Reg(frag, Const(0)), bufs[stage].name, r_ * cols + c_, 8),
            For(e, Const(0), Const(8), 1, [
                Assign(Reg(acc, j * 8 + e), Binary("add", RegRead(Reg(acc, j * 8 + e)),
                                                   Cast(RegRead(Reg(frag, e)), f32), f32))],
                unroll=True)], unroll=True)]

    body = [Comment("acc = zeros"),
            For(j, Const(0), Const(per_thread * 8), 1,
                [Assign(Reg(acc, j), Literal(0.0, f32))], unroll=True),
            Comment("pipeline(x tiles, stages=2)")]
    body += issue(0, Const(0))
    loop = []
    for s in range(stages):  # the loop body handles `stages` tiles so buffers are static
        tile = kt + s
        loop += [If(tile.lt(ntiles), [
            *issue((s + 1) % stages, tile + 1),
            CpAsyncWait(1), Barrier(), *consume(s), Barrier()])]
    body.append(For(kt, Const(0), ntiles, stages, loop))
    body += [CpAsyncWait(0), Comment("copy(acc, y)"),
             For(j, Const(0), Const(per_thread), 1, [
                 GlobalStore("y", r_ * Var("y_stride0") + c_ * Var("y_stride1"),
                             Reg(acc, j * 8), 4, pred=r_.lt(Var("y_shape0"))),
                 GlobalStore("y", r_ * Var("y_stride0") + (c_ + 4) * Var("y_stride1"),
                             Reg(acc, j * 8 + 4), 4, pred=r_.lt(Var("y_shape0")))],
                 unroll=True)]
    return ThreadKernel(
        name="tg_cp_async_colsum", threads=threads,
        params=[TensorParam("x", f16, 2), TensorParam("y", f32, 2, writes=True)],
        registers=[frag, acc], shared=bufs, body=body)


def mma_ldmatrix(dtype: DType = f16) -> ThreadKernel:
    """One warp: `c (16x8, f32) = a (16x16) @ b (8x16).T` with ldmatrix.x4 / .x2 and
    `mma.m16n8k16.f32.{dtype}.{dtype}.f32`. Both inputs row-major (b is N x K); one block."""
    lane = TID
    a_frag, b_frag = RegArray("a_frag", dtype, 8), RegArray("b_frag", dtype, 4)
    c_frag, stage = RegArray("c_frag", f32, 4), RegArray("ld", dtype, 8)
    sa = SharedBuffer("sa", dtype, 16 * 16, 0)
    sb = SharedBuffer("sb", dtype, 8 * 16, 512)
    name = dtype.name
    body = [Comment("copy(a, sa); copy(b, sb)  -- 16-byte loads, one row half per lane"),
            GlobalLoad(Reg(stage, Const(0)), "a",
                       (lane // 2) * Var("a_stride0") + (lane % 2) * 8, 8),
            SharedStore("sa", (lane // 2) * 16 + (lane % 2) * 8, Reg(stage, Const(0)), 8),
            If(lane.lt(16), [
                GlobalLoad(Reg(stage, Const(0)), "b",
                           (lane // 2) * Var("b_stride0") + (lane % 2) * 8, 8),
                SharedStore("sb", (lane // 2) * 16 + (lane % 2) * 8, Reg(stage, Const(0)), 8)]),
            Barrier(),
            Comment("gemm(c, sa, sb): ldmatrix fragments, one mma.sync"),
            LdMatrix(Reg(a_frag, Const(0)), 4, False, "sa", (lane % 16) * 16 + (lane // 16) * 8),
            LdMatrix(Reg(b_frag, Const(0)), 2, False, "sb", (lane % 8) * 16 + ((lane // 8) % 2) * 8),
            *[Assign(Reg(c_frag, Const(k)), Literal(0.0, f32)) for k in range(4)],
            Mma(f"mma.m16n8k16.f32.{name}.{name}.f32",
                d=[Reg(c_frag, Const(k)) for k in range(4)],
                a=[Reg(a_frag, Const(k)) for k in range(8)],
                b=[Reg(b_frag, Const(k)) for k in range(4)],
                c=[Reg(c_frag, Const(k)) for k in range(4)]),
            Comment("copy(c_frag, c): rows lane/4 and lane/4+8, columns 2*(lane%4)+{0,1}"),
            GlobalStore("c", (lane // 4) * Var("c_stride0") + (lane % 4) * 2,
                        Reg(c_frag, Const(0)), 2),
            GlobalStore("c", (lane // 4 + 8) * Var("c_stride0") + (lane % 4) * 2,
                        Reg(c_frag, Const(2)), 2)]
    return ThreadKernel(
        name=f"tg_mma_{name}_16x8x16", threads=32,
        params=[TensorParam("a", dtype, 2), TensorParam("b", dtype, 2),
                TensorParam("c", f32, 2, writes=True)],
        registers=[stage, a_frag, b_frag, c_frag], shared=[sa, sb], body=body)


def warp_sum_of_squares(threads: int = 256) -> ThreadKernel:
    """`out[0] += sum(float(x)**2)` over a contiguous 1-D f16 tensor: one element per
    thread, xor-shuffle warp reduction, one atomic add per warp. `out` must start at 0."""
    v, t = RegArray("v", f32, 1), RegArray("h", f16, 1)
    idx = BID_X * threads + TID
    inside = idx.lt(Var("x_shape0"))
    sq = Binary("mul", Cast(RegRead(Reg(t, Const(0))), f32), Cast(RegRead(Reg(t, Const(0))), f32),
                f32)
    body = [Comment("reduce(sum, x*x)"),
            GlobalLoad(Reg(t, Const(0)), "x", idx * Var("x_stride0"), 1, pred=inside, fill=0.0),
            Assign(Reg(v, Const(0)), sq)]
    # The partner's value arrives in a second register, then is added to our own.
    own, other = Reg(v, Const(0)), Reg(RegArray("w", f32, 1), Const(0))
    for off in (16, 8, 4, 2, 1):
        body += [Shuffle(other, own, "xor", Const(off)),
                 Assign(own, Binary("add", RegRead(own), RegRead(other), f32))]
    body.append(GlobalAtomicAdd("out", Const(0), own, pred=(TID % 32).eq(0)))
    return ThreadKernel(
        name="tg_warp_sumsq", threads=threads,
        params=[TensorParam("x", f16, 1), TensorParam("out", f32, 1, writes=True)],
        registers=[t, v, other.array], shared=[], body=body)


def elementwise_zoo(threads: int = 128) -> ThreadKernel:
    """A compile test of value expressions: casts between every float type, math, compare,
    where, a scalar parameter. `y[i] = bf16(where(x > alpha, exp(x) * 2, -x)) + f8(x)`."""
    x, y = RegArray("xv", f16, 2), RegArray("yv", bf16, 2)
    q, n = RegArray("qv", f8e4m3, 2), RegArray("nv", i32, 2)
    idx = (BID_X * threads + TID) * 2
    inside = idx.lt(Var("x_shape0"))
    body = [GlobalLoad(Reg(x, Const(0)), "x", idx * Var("x_stride0"), 2, pred=inside, fill=-1.0)]
    for k in range(2):
        xv = RegRead(Reg(x, Const(k)))
        big = Binary("gt", Cast(xv, f32), IndexValue(Var("alpha"), f32, source=f32), bool_)
        val = Where(big, Binary("mul", Unary("exp", xv, f16), Literal(2.0, f16), f16),
                    Unary("neg", xv, f16), f16)
        body += [Assign(Reg(q, Const(k)), Cast(xv, f8e4m3)),
                 Assign(Reg(n, Const(k)), Cast(Unary("tanh", xv, f16), i32)),
                 Assign(Reg(y, Const(k)),
                        Binary("add", Cast(val, bf16),
                               Binary("add", Cast(RegRead(Reg(q, Const(k))), bf16),
                                      Cast(RegRead(Reg(n, Const(k))), bf16), bf16), bf16))]
    body.append(GlobalStore("y", idx * Var("y_stride0"), Reg(y, Const(0)), 2, pred=inside))
    body.append(GlobalStore("q", idx * Var("q_stride0"), Reg(q, Const(0)), 2, pred=inside))
    return ThreadKernel(
        name="tg_elementwise_zoo", threads=threads,
        params=[TensorParam("x", f16, 1), ScalarParam("alpha", f32),
                TensorParam("y", bf16, 1, writes=True),
                TensorParam("q", f8e4m3, 1, writes=True)],
        registers=[x, y, q, n], shared=[], body=body)


ALL_SAMPLES = {"vector_copy": vector_copy, "shared_transpose": shared_transpose,
               "cp_async_pipeline": cp_async_pipeline, "mma_ldmatrix": mma_ldmatrix,
               "warp_sum_of_squares": warp_sum_of_squares, "elementwise_zoo": elementwise_zoo}


# --------------------------------------------------------------------------------------
# Hopper: TMA, mbarriers, wgmma, warp roles (sm_90a)
# --------------------------------------------------------------------------------------

def tma_round_trip(rows: int = 64, cols: int = 32, threads: int = 128) -> ThreadKernel:
    """`y = x + 1` for 2-D f32 tensors of any shape (x and y of one shape, rows contiguous),
    through shared memory with TMA both ways: one thread arms an mbarrier with the box's
    bytes and issues the load (128-byte swizzle; out-of-bounds elements arrive as zeros),
    every thread waits on the barrier's phase 0, adds 1 to its elements in place (generic
    proxy: the position in the swizzled box does not matter for an elementwise op), fences
    the writes to the async proxy and one thread stores the box back (TMA does not write
    out-of-bounds elements) and waits for the bulk group. Grid: (cdiv(C, cols), cdiv(R, rows)).
    """
    box = rows * cols
    per_thread = box // threads // 4             # 16-byte vectors per thread
    tile = SharedBuffer("tile", f32, box, 0)
    bar = MBarrierArray("bar", 1, box * 4)
    v, j, e = RegArray("v", f32, 4), Var("j"), Var("e")
    one_thread = TID.eq(0)
    coords = [BID_X * cols, BID_Y * rows]          # tensor-map order: column, then row
    offset = (j * threads + TID) * 4
    body = [Comment("init the mbarrier (one arrival: the producer's expect-tx)"),
            MBarrierInit("bar", Const(0), 1, pred=one_thread), FenceBarrierInit(), Barrier(),
            Comment("copy(x box, tile) by TMA"),
            MBarrierArrive("bar", Const(0), pred=one_thread, tx_bytes=box * 4),
            TmaLoad("tile", Const(0), "x_map", coords, "bar", Const(0), pred=one_thread),
            MBarrierWait("bar", Const(0), parity=Const(0)),
            Comment("tile += 1"),
            For(j, Const(0), Const(per_thread), 1, [
                SharedLoad(Reg(v, Const(0)), "tile", offset, 4),
                For(e, Const(0), Const(4), 1, [
                    Assign(Reg(v, e), Binary("add", RegRead(Reg(v, e)), Literal(1.0, f32),
                                             f32))], unroll=True),
                SharedStore("tile", offset, Reg(v, Const(0)), 4)], unroll=True),
            FenceProxyAsync(), Barrier(),
            Comment("copy(tile, y box) by TMA"),
            TmaStore("y_map", coords, "tile", Const(0), pred=one_thread),
            BulkCommit(), BulkWait(0, read_only=True)]
    return ThreadKernel(
        name="tg_tma_round_trip_f32", threads=threads,
        params=[TensorParam("x", f32, 2),
                TensorMapParam("x_map", "x", f32, dims=(1, 0), box=(cols, rows), swizzle=128),
                TensorParam("y", f32, 2, writes=True),
                TensorMapParam("y_map", "y", f32, dims=(1, 0), box=(cols, rows), swizzle=128)],
        registers=[v], shared=[tile], body=body, mbarriers=[bar])


def warp_specialized_gemm(block_n: int = 64, stages: int = 2) -> ThreadKernel:
    """`c = a @ b.T` (a: (M, K) f16, b: (N, K) f16, both rows contiguous; c: (M, N) f32) for
    any M, N, K, one 64 x `block_n` tile of c per block, with a producer warpgroup (TMA into
    a ring of `stages` 128-byte-swizzled buffers, one thread issuing) and a consumer
    warpgroup (`wgmma.m64n{block_n}k16` from shared-memory descriptors, accumulating in
    registers) that meet at two mbarriers per stage: `full[s]` (one arrival with the
    stage's transaction bytes, completed by TMA) and `empty[s]` (128 consumer arrivals
    after the stage's wgmmas retired). Phase parity is `(kt // stages) % 2`; the producer
    waits on `empty` with the opposite parity, which a fresh barrier passes at once.
    Out-of-bounds elements of a box arrive as zeros (K need not divide 64); the epilogue
    stores c directly from the accumulator fragment, predicated on the tensor's extent.
    256 threads; grid (cdiv(N, block_n), cdiv(M, 64)).
    """
    bk = 64                                      # 64 f16 = 128 bytes: one swizzle span
    a_elems, b_elems = 64 * bk, block_n * bk
    sa = SharedBuffer("sa", f16, stages * a_elems, 0)
    sb = SharedBuffer("sb", f16, stages * b_elems, stages * a_elems * 2)
    bars_at = sb.byte_offset + stages * b_elems * 2
    full = MBarrierArray("full", stages, bars_at)
    empty = MBarrierArray("empty", stages, full.end)
    acc = RegArray("acc", f32, block_n // 2)
    kt, j, i, v = Var("kt"), Var("j"), Var("i"), Var("v")
    stage, parity = kt % stages, (kt // stages) % 2
    k_tiles = (Var("a_shape1") + (bk - 1)) // bk
    issuer = TID.eq(128)
    stage_bytes = (a_elems + b_elems) * 2

    producer = [For(kt, Const(0), k_tiles, 1, [
        MBarrierWait("empty", stage, parity=parity ^ 1),
        MBarrierArrive("full", stage, pred=issuer, tx_bytes=stage_bytes),
        TmaLoad("sa", stage * a_elems, "a_map", [kt * bk, BID_Y * 64], "full", stage,
                pred=issuer),
        TmaLoad("sb", stage * b_elems, "b_map", [kt * bk, BID_X * block_n], "full", stage,
                pred=issuer)])]

    def desc(buffer: str, elems: int) -> SmemDesc:
        # k-step j of the stage: +16 elements (32 bytes) inside the 128-byte swizzle span;
        # 8-row core-matrix groups are 1024 bytes apart.
        return SmemDesc(buffer, stage * elems + j * 16, leading_bytes=16, stride_bytes=1024,
                        swizzle=128)

    fragment = [Reg(acc, Const(x)) for x in range(block_n // 2)]
    consumer = [For(kt, Const(0), k_tiles, 1, [
        MBarrierWait("full", stage, parity=parity),
        WgmmaFence(),
        For(j, Const(0), Const(bk // 16), 1, [
            Wgmma(f"wgmma.m64n{block_n}k16.f32.f16.f16", d=fragment, a=desc("sa", a_elems),
                  b=desc("sb", b_elems), scale_d=Const(0).lt(kt * (bk // 16) + j))],
            unroll=True),
        WgmmaCommit(), WgmmaWait(0),
        MBarrierArrive("empty", stage)])]
    # The accumulator fragment of warp w, lane l: value v is c[16w + l/4 + 8((v/2)%2),
    # 2(l%4) + v%2 + 8(v/4)] (PTX ISA, wgmma D fragment; tests check it against acc_tv).
    row = BID_Y * 64 + (TID // 32) * 16 + (TID % 32) // 4 + ((v // 2) % 2) * 8
    col = BID_X * block_n + (TID % 4) * 2 + v % 2 + (v // 4) * 8
    # K == 0 leaves no k-step to clear the accumulators: start them at zero.
    consumer = [For(i, Const(0), Const(block_n // 2), 1,
                    [Assign(Reg(acc, i), Literal(0.0, f32))], unroll=True)] + consumer + [
        NamedBarrier(1, 128),
        For(v, Const(0), Const(block_n // 2), 1, [
            GlobalStore("c", row * Var("c_stride0") + col * Var("c_stride1"), Reg(acc, v), 1,
                        pred=all_of([row.lt(Var("c_shape0")), col.lt(Var("c_shape1"))]))],
            unroll=True)]
    init = [MBarrierInit("full", Const(s), 1, pred=TID.eq(0)) for s in range(stages)]
    init += [MBarrierInit("empty", Const(s), 128, pred=TID.eq(0)) for s in range(stages)]
    body = [Comment("init the stage barriers"), *init, FenceBarrierInit(), Barrier(),
            Roles([Role("consumer", TID.lt(128), consumer, max_registers=232,
                        loc="warp_specialized_gemm: consumer warpgroup"),
                   Role("producer", TID.ge(128), producer, max_registers=40,
                        loc="warp_specialized_gemm: producer warpgroup")])]
    maps = dict(dims=(1, 0), swizzle=128)
    return ThreadKernel(
        name=f"tg_ws_gemm_f16_64x{block_n}", threads=256,
        params=[TensorParam("a", f16, 2), TensorMapParam("a_map", "a", f16, box=(bk, 64), **maps),
                TensorParam("b", f16, 2),
                TensorMapParam("b_map", "b", f16, box=(bk, block_n), **maps),
                TensorParam("c", f32, 2, writes=True)],
        registers=[acc], shared=[sa, sb], body=body, mbarriers=[full, empty])


HOPPER_SAMPLES = {"tma_round_trip": tma_round_trip,
                  "warp_specialized_gemm": warp_specialized_gemm}
