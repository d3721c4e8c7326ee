"""Compilers for the asynchronous thread-IR statements (`tegula/lower/async_ir.py`): each
returns a closure over the block state, like `ops.py`. The state they share lives in
`state.asyncs` (`async_state.AsyncState`); blocking statements go through
`roles.block_until`. What the hardware does is read from the catalogue entries:
where a TMA box lands and what it holds (`tegula.arch.tma`), which shared byte a wgmma
descriptor reads (`tegula.arch.smem_matrix`) and what a wgmma computes (`WgmmaInstr`)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from tegula.arch.smem_matrix import MatrixDescriptor, descriptor_element_addresses
from tegula.arch.tma import (tma_box_addresses, tma_box_copy, tma_box_window, tma_reduce_add,
                             tma_store_box)
from tegula.arch.wgmma import WARPGROUP, get_wgmma
from tegula.emulate.errors import EmulationError
from tegula.emulate.exprs import compile_expr
from tegula.emulate.global_races import check_box, issue_tma_store
from tegula.emulate.ops import Ctx, bytes_to_values, values_to_bytes, _check_dtype
from tegula.emulate.roles import Wait, block_until, release_block, stall_point
from tegula.emulate.state import BlockState, lanes_doing, per_thread, uniform_int
from tegula.emulate.stats import OpStats
from tegula.emulate.values import from_bits, round_to, to_bits
from tegula.errors import TegulaError
from tegula.lower.async_ir import (BulkCommit, BulkWait, ClusterBarrier, FenceBarrierInit,
                                   FenceProxyAsync,
                                   MBarrierArrive, MBarrierInit, MBarrierWait, NamedBarrier,
                                   PrefetchTensorMap, SmemDesc, StMatrix, TmaLoad, TmaStore,
                                   Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait)

Run = Callable[[BlockState], None]


def _pred(p):
    return compile_expr(p) if p is not None else None


def _at(value, lane: int):
    """An evaluated index expression's value for one thread."""
    return int(value[lane]) if isinstance(value, np.ndarray) and value.ndim else int(value)


def _by_value(value, lanes: np.ndarray, threads: int):
    """(value, the lanes where the expression has it) for an evaluated expression."""
    if not isinstance(value, np.ndarray):
        if len(lanes):
            yield int(value), lanes
        return
    vals = per_thread(value, threads)[lanes]
    for v in np.unique(vals):
        yield int(v), lanes[vals == v]


def warpgroups(state: BlockState, what: str) -> np.ndarray:
    """Indices of the warpgroups executing a warpgroup-collective statement: each must be
    entirely active (wgmma.*.sync.aligned)."""
    if state.threads % WARPGROUP:
        raise EmulationError(f"{what}: warpgroup instruction in a block of {state.threads} "
                             f"threads (not a multiple of {WARPGROUP})")
    m = state.mask.reshape(-1, WARPGROUP)
    anyg, allg = m.any(axis=1), m.all(axis=1)
    if (anyg & ~allg).any():
        g = int(np.flatnonzero(anyg & ~allg)[0])
        raise EmulationError(f"{what}: warpgroup {g} executes a warpgroup-collective "
                             f"instruction with only {int(m[g].sum())} of its {WARPGROUP} "
                             "threads active")
    return np.flatnonzero(anyg)


def _warpgroup_uniform(value, lanes: np.ndarray, threads: int, what: str) -> int:
    """An evaluated expression's value on a warpgroup's `lanes`, which must all agree (one
    wgmma operand per warpgroup; different warpgroups may address different tiles)."""
    if not isinstance(value, np.ndarray):
        return int(value)
    vals = per_thread(value, threads)[lanes]
    if (vals != vals[0]).any():
        raise EmulationError(f"{what}: differs between the threads of one warpgroup "
                             f"({int(vals.min())}..{int(vals.max())})")
    return int(vals[0])


# ---------------------------------------------------------------------- mbarriers

def compile_mbarrier_init(s: MBarrierInit, ctx: Ctx, st: OpStats, what: str) -> Run:
    if not 1 <= s.count < 1 << 20:
        raise EmulationError(f"{what}: arrival count {s.count} outside 1 .. 2^20-1")
    index, pred, count = compile_expr(s.index), _pred(s.pred), s.count

    def run(state: BlockState) -> None:
        a = state.asyncs
        lanes = np.flatnonzero(lanes_doing(state, pred))
        for idx, sub in _by_value(index(state.env), lanes, state.threads):
            gid, bar = a.barrier(s.barrier, idx, what)
            if len(sub) > 1:
                raise EmulationError(f"{what}: threads {', '.join(map(str, sub[:4]))} all "
                                     f"initialize mbarrier {bar.name} (predicate one thread)")
            a.init(gid, count, int(sub[0]))
        st.add(state.active_warps())
    return run


def compile_fence_barrier_init(s: FenceBarrierInit, ctx: Ctx, st: OpStats, what: str) -> Run:
    def run(state: BlockState) -> None:
        active = set(np.flatnonzero(state.mask).tolist())
        for bar in state.asyncs.bars:
            if bar.count and bar.init_tid in active:
                bar.fenced = True
        st.add(state.active_warps())
    return run


def compile_mbarrier_arrive(s: MBarrierArrive, ctx: Ctx, st: OpStats, what: str) -> Run:
    if s.tx_bytes < 0:
        raise EmulationError(f"{what}: negative expect_tx bytes {s.tx_bytes}")
    if s.cta is not None:
        return compile_remote_arrive(s, ctx, st, what)
    index, pred, tx = compile_expr(s.index), _pred(s.pred), s.tx_bytes

    def run(state: BlockState) -> None:
        a = state.asyncs
        lanes = np.flatnonzero(lanes_doing(state, pred))
        for idx, sub in _by_value(index(state.env), lanes, state.threads):
            gid, bar = a.barrier(s.barrier, idx, what)
            a.used(gid, sub, what)
            # A completed phase orders what its arrivals did before what its waiters do
            # next (the waiters acquire it, `compile_mbarrier_wait`), nothing else.
            a.arrive(bar, len(sub), tx, what, state.smem.release(sub))
        st.add(state.active_warps())
        if len(lanes) and not tx:  # a release (not a producer's expect_tx): roles.py
            stall_point(state)
    return run


def compile_remote_arrive(s: MBarrierArrive, ctx: Ctx, st: OpStats, what: str) -> Run:
    """An arrive on the barrier at the same offset in CTA `s.cta` of the cluster (the
    peer's barrier, its phase completion ordering the peer's waiters)."""
    if s.tx_bytes:
        raise EmulationError(f"{what}: a remote arrive carries no expect_tx bytes")
    index, pred, cta = compile_expr(s.index), _pred(s.pred), compile_expr(s.cta)

    def run(state: BlockState) -> None:
        lanes = np.flatnonzero(lanes_doing(state, pred))
        for rank, by_rank in _by_value(cta(state.env), lanes, state.threads):
            peer = _peer(state, rank, what)
            for idx, sub in _by_value(index(state.env), by_rank, state.threads):
                gid, bar = peer.asyncs.barrier(s.barrier, idx, what)
                if peer is _own(state):
                    state.asyncs.used(gid, sub, what)
                else:
                    peer.asyncs.used_by_peer(gid, what, f"block {state.bid}")
                # The peer's clocks do not know this block's threads: the arrive counts,
                # and orders no generic access of the peer's (its stages are TMA's).
                peer.asyncs.arrive(bar, len(sub), 0, f"{what} (CTA {rank})")
        st.add(state.active_warps())
        if len(lanes):  # a release to the cluster (roles.py: the stall orders)
            stall_point(state)
    return run


def _own(state: BlockState) -> BlockState:
    """The block-level state of the block `state` (a role's, or the block's) runs in."""
    return state.cluster.blocks[state.rank] if state.cluster is not None else state


def _peer(state: BlockState, rank: int, what: str) -> BlockState:
    """The block state of CTA `rank` of the cluster (this block's own for its own rank;
    without a cluster only rank 0, the block itself, exists)."""
    if state.cluster is None:
        if rank != 0:
            raise EmulationError(f"{what}: names CTA {rank} of the cluster, but the kernel "
                                 "has no cluster (only CTA 0, the block itself)")
        return _own(state)
    return state.cluster.peer(rank, _own(state), what)


def compile_cluster_barrier(s: ClusterBarrier, ctx: Ctx, st: OpStats, what: str) -> Run:
    def run(state: BlockState) -> None:
        if state.task is not None:
            raise EmulationError(f"{what}: barrier.cluster inside {state.task.label()} (every "
                                 "thread of the block must reach it)")
        if not state.full:
            off = int(np.count_nonzero(~state.mask))
            raise EmulationError(f"{what}: cluster barrier under divergent control flow "
                                 f"({off} of {state.threads} threads do not reach it)")
        st.add(state.warps)
        cluster = state.cluster
        if cluster is None:
            release_block(state)
            return
        gen = cluster.arrive(state)
        block_until(state, Wait(lambda: cluster.generation != gen,
                                lambda: f"{what}: {cluster.arrived} of "
                                        f"{len(cluster.blocks)} blocks arrived"))
    return run


def compile_mbarrier_wait(s: MBarrierWait, ctx: Ctx, st: OpStats, what: str) -> Run:
    index, parity = compile_expr(s.index), compile_expr(s.parity)

    def run(state: BlockState) -> None:
        a = state.asyncs
        lanes = np.flatnonzero(state.mask)
        idx = uniform_int(index(state.env), state, f"{what}: barrier index")
        p = uniform_int(parity(state.env), state, f"{what}: parity")
        if p not in (0, 1):
            raise EmulationError(f"{what}: parity {p} is not 0 or 1")
        gid, bar = a.barrier(s.barrier, idx, what)
        a.used(gid, lanes, what)
        block_until(state, Wait(lambda: bar.phase % 2 != p,
                                lambda: f"{what} [{s.barrier}[{idx}] parity {p}]: "
                                        f"{bar.describe()}"))
        a.observe(gid, lanes, what, repeat=s.repeat)
        state.smem.acquire(lanes, bar.completed)
        st.add(state.active_warps())
    return run


def compile_named_barrier(s: NamedBarrier, ctx: Ctx, st: OpStats, what: str) -> Run:
    if not 1 <= s.id <= 15:
        raise EmulationError(f"{what}: named barrier id {s.id} outside 1..15 (0 is "
                             "__syncthreads)")
    if s.threads <= 0 or s.threads % 32:
        raise EmulationError(f"{what}: thread count {s.threads} is not a positive multiple of 32")
    bar_id, expected = s.id, s.threads

    def run(state: BlockState) -> None:
        a = state.asyncs
        warps = state.full_warps(what)
        lanes = np.flatnonzero(state.mask)
        nb = a.named_barrier(bar_id)
        if nb.arrived and nb.expected != expected:
            raise EmulationError(f"{what}: named barrier {bar_id} used with {expected} threads "
                                 f"while {nb.arrived} threads wait at it with {nb.expected}")
        nb.expected = expected
        _check_lapping(nb, lanes, bar_id, what)
        nb.arrived += 32 * len(warps)
        nb.lanes.append(lanes)
        if not s.arrive:
            nb.waiters.append(lanes)
        released = state.smem.release(lanes)
        if released is not None:
            nb.released = released if nb.released is None else np.maximum(nb.released,
                                                                            released)
        st.add(len(warps))
        if nb.arrived > expected:
            raise EmulationError(f"{what}: {nb.arrived} threads reach named barrier {bar_id}, "
                                 f"which counts {expected}")
        if nb.arrived == expected:
            # Every arrival released; only the threads that wait (bar.sync) acquire: a
            # bar.arrive goes on at once and learns nothing of the others' accesses.
            waiters = np.concatenate(nb.waiters) if nb.waiters else lanes[:0]
            a.share_observations(np.concatenate(nb.lanes), waiters)
            state.smem.acquire(waiters, nb.released)
            nb.arrived, nb.lanes, nb.waiters, nb.released = 0, [], [], None
            nb.generation += 1
        if s.arrive:  # bar.arrive: counted, goes on at once (a stall point, roles.py)
            stall_point(state)
            return
        if nb.arrived == 0:  # this sync completed the barrier
            return
        gen = nb.generation
        block_until(state, Wait(lambda: nb.generation != gen,
                                lambda: f"{what}: {nb.arrived} of {expected} threads arrived"))
    return run


def _check_lapping(nb, lanes: np.ndarray, bar_id: int, what: str) -> None:
    """Threads arriving at a named barrier they already arrived at in this generation: the
    hardware counts every arrival, so a role that arrives twice (bar.arrive, then again)
    completes the barrier without the threads it should meet, whose bar.sync then waits
    for an arrival that never comes, or passes a generation early (a role lapping another;
    the ping-pong turns of 2be99ba). Reported at the second arrival."""
    if not nb.lanes:
        return
    again = np.intersect1d(lanes, np.concatenate(nb.lanes))
    if again.size:
        raise EmulationError(
            f"{what}: threads {int(again[0])}..{int(again[-1])} arrive at named barrier "
            f"{bar_id} a second time before it completed ({nb.arrived} of {nb.expected} "
            "threads counted): every arrival counts, so these threads would complete it "
            "without the others, whose bar.sync then waits for an arrival that never comes "
            "(a role lapping another: it must wait for the other's turn before it arrives "
            "again)")


# ---------------------------------------------------------------------- TMA

def _tensor_map(ctx: Ctx, name: str, what: str):
    tm = ctx.tensor_maps.get(name)
    if tm is None:
        raise EmulationError(f"{what}: no tensor map parameter {name!r}")
    if len(tm.dims) != len(tm.box):
        raise EmulationError(f"{what}: tensor map {name!r} has {len(tm.dims)} dims but a box "
                             f"of rank {len(tm.box)}")
    return tm


def _global_view(state: BlockState, tm, what: str):
    """The bound tensor as a numpy view whose last axis is tensor-map dim 0."""
    t = state.tensors.get(tm.tensor)
    if t is None:
        raise EmulationError(f"{what}: tensor map {tm.name!r} encodes tensor {tm.tensor!r}, "
                             "which is not a tensor parameter")
    if t.packed:
        raise EmulationError(f"{what}: TMA copies of packed {t.dtype} tensors are not modelled")
    if sorted(tm.dims) != list(range(t.array.ndim)):
        raise EmulationError(f"{what}: tensor map {tm.name!r} dims {tm.dims} are not a "
                             f"permutation of tensor {tm.tensor!r}'s {t.array.ndim} dims")
    if t.array.shape[tm.dims[0]] > 1 and t.array.strides[tm.dims[0]] != t.array.itemsize:
        raise EmulationError(f"{what}: tensor map {tm.name!r} dim 0 (tensor dim {tm.dims[0]}) "
                             f"of {tm.tensor!r} is not contiguous")
    return t, np.transpose(t.array, tuple(reversed(tm.dims)))


def _box_base(ctx: Ctx, s, tm, state: BlockState, lane: int, offset, what: str):
    """(buffer, byte addresses [elements, bytes] of the box, in box order)."""
    buf = ctx.buffer(s.buffer, what)
    _check_dtype(buf.dtype, tm.dtype, what)
    n = int(np.prod(tm.box))
    off = _at(offset(state.env), lane)
    if off < 0 or off + n > buf.size:
        raise EmulationError(f"{what}: the box of {n} elements at element {off} leaves shared "
                             f"buffer {buf.name!r} ({buf.size} elements)")
    eb = tm.dtype.bits // 8
    try:
        elem = tma_box_addresses(tm.box, tm.dtype, tm.swizzle, buf.byte_offset + off * eb)
    except TegulaError as e:
        raise EmulationError(f"{what}: {e}") from None
    addrs = elem.reshape(-1, 1) + np.arange(eb, dtype=np.int64)
    end = buf.byte_offset + buf.size * eb
    if addrs.min() < buf.byte_offset or addrs.max() >= end:
        raise EmulationError(f"{what}: the swizzled box leaves shared buffer {buf.name!r}")
    return buf, addrs


def compile_tma_load(s: TmaLoad, ctx: Ctx, st: OpStats, what: str) -> Run:
    tm = _tensor_map(ctx, s.tensor_map, what)
    if len(s.coords) != len(tm.box):
        raise EmulationError(f"{what}: {len(s.coords)} coordinates for tensor map "
                             f"{tm.name!r} of rank {len(tm.box)}")
    if s.multicast < 0:
        raise EmulationError(f"{what}: negative multicast mask {s.multicast}")
    coords = [compile_expr(c) for c in s.coords]
    offset, bindex, pred = compile_expr(s.offset), compile_expr(s.barrier_index), _pred(s.pred)
    nbytes = tm.box_bytes
    # The CTAs the box lands in: the mask's ranks, or (no multicast) the issuer's own.
    ranks = [r for r in range(s.multicast.bit_length()) if s.multicast >> r & 1]

    def run(state: BlockState) -> None:
        for lane in np.flatnonzero(lanes_doing(state, pred)).tolist():
            t, view = _global_view(state, tm, what)
            c = [_at(f(state.env), lane) for f in coords]
            check_box(state, t, tm, c, lane, what)
            box = tma_box_copy(view, c, tm.box)  # zero outside the tensor
            values = from_bits(box, tm.dtype) if t.bits else round_to(box, tm.dtype)
            index = _at(bindex(state.env), lane)
            targets = [_peer(state, r, what) for r in ranks] if ranks else [_own(state)]
            for target in targets:
                _land_box(ctx, s, tm, state, target, lane, offset, index, values, what)
            st.add(1, nbytes * len(targets))
    return run


def _land_box(ctx: Ctx, s: TmaLoad, tm, state: BlockState, target: BlockState, lane: int,
              offset, index: int, values: np.ndarray, what: str) -> None:
    """A TMA box issued by `lane` of `state`'s block lands in `target`'s shared memory (the
    issuer's own block, or a peer of a multicast) and completes its bytes on `target`'s
    barrier `s.barrier[index]`."""
    a = target.asyncs
    gid, bar = a.barrier(s.barrier, index, what)
    if target is _own(state):
        a.used(gid, np.array([lane]), what)
        if not bar.fenced:
            raise EmulationError(f"{what}: TMA completes on mbarrier {bar.name}, whose init "
                                 "was not followed by fence.mbarrier_init (FenceBarrierInit)")
    else:
        a.used_by_peer(gid, what, f"a multicast copy from block {state.bid}")
    buf, addrs = _box_base(ctx, s, tm, state, lane, offset, what)
    data = values_to_bytes(values.reshape(1, -1), tm.dtype).reshape(addrs.shape)
    if target.smem.check_races:
        a.tma_write(addrs, gid, what, target.smem.buffer_at)
    target.smem.write_async_proxy(addrs, data, lane, what, peer=target is not _own(state))
    a.complete_tx(bar, tm.box_bytes, what)


def compile_tma_store(s: TmaStore, ctx: Ctx, st: OpStats, what: str) -> Run:
    tm = _tensor_map(ctx, s.tensor_map, what)
    if len(s.coords) != len(tm.box):
        raise EmulationError(f"{what}: {len(s.coords)} coordinates for tensor map "
                             f"{tm.name!r} of rank {len(tm.box)}")
    coords = [compile_expr(c) for c in s.coords]
    offset, pred = compile_expr(s.offset), _pred(s.pred)
    shape = tuple(reversed(tm.box))

    def run(state: BlockState) -> None:
        a = state.asyncs
        for lane in np.flatnonzero(lanes_doing(state, pred)).tolist():
            t, view = _global_view(state, tm, what)
            c = [_at(f(state.env), lane) for f in coords]
            buf, addrs = _box_base(ctx, s, tm, state, lane, offset, what)
            tids = np.full(len(addrs), lane)
            data = state.smem.read(addrs, tids, what)
            if state.smem.check_races:
                a.async_read(addrs, tids[:, None], what, state.smem.buffer_at)
                a.bulk_store_issued(lane, addrs)
            values = bytes_to_values(data.reshape(1, -1), tm.dtype, len(addrs)).reshape(shape)
            if not getattr(s, "reduce", False):  # a reduce-add commutes: no race
                check_box(state, t, tm, c, lane, what, round_to(values, tm.dtype)
                          if not t.bits else from_bits(to_bits(values, tm.dtype), tm.dtype))
            issue_tma_store(state, t, tm, c, lane)  # in flight until the bulk wait
            if s.reduce:
                _reduce_box(t, tm, c, values, what)
                st.add(1, tm.box_bytes)
                continue
            tma_store_box(view, c, to_bits(values, tm.dtype) if t.bits else values)
            if t.written is not None:
                _mark_written(t, tm, c)
            st.add(1, tm.box_bytes)
    return run


def _reduce_box(t, tm, coords, values: np.ndarray, what: str) -> None:
    """A TMA reduce-add: the box's elements inside the tensor are added into it as the
    catalogue entry computes (`TmaReduceInstr.execute`), atomically per element."""
    entry = tma_reduce_add(len(tm.box))
    if t.dtype != entry.dtype or t.bits:
        raise EmulationError(f"{what}: the bulk add is modelled for {entry.dtype} tensors, "
                             f"not {t.dtype}")
    strides = np.array(t.array.strides, dtype=np.int64) // t.array.itemsize
    offsets = np.tensordot(strides, np.indices(t.array.shape, dtype=np.int64), axes=1)
    offsets = np.transpose(offsets, tuple(reversed(tm.dims)))  # numpy order of the map
    window = tma_box_window(offsets.shape, coords, tm.box)
    if window is not None:
        t.atomic_add(offsets[window[0]], values[window[1]], entry)


def _mark_written(t, tm, coords) -> None:
    """Record the elements a TMA store wrote, for the output coverage check."""
    hit = np.zeros(t.array.shape, dtype=bool)
    tma_store_box(np.transpose(hit, tuple(reversed(tm.dims))), coords,
                  np.ones(tuple(reversed(tm.box)), dtype=bool))
    strides = np.array(t.array.strides, dtype=np.int64) // t.array.itemsize
    t.written[np.stack(np.nonzero(hit), axis=1) @ strides] = True


def compile_bulk_commit(s: BulkCommit, ctx: Ctx, st: OpStats, what: str) -> Run:
    def run(state: BlockState) -> None:
        state.asyncs.bulk_commit(np.flatnonzero(state.mask))
        st.add(state.active_warps())
    return run


def compile_bulk_wait(s: BulkWait, ctx: Ctx, st: OpStats, what: str) -> Run:
    # TMA stores write global memory at issue in this model, but their elements stay in
    # flight (`global_races.issue_tma_store`) until a full wait retires the group; `.read`
    # only frees their shared source.
    pending, read_only = s.pending, s.read_only

    def run(state: BlockState) -> None:
        state.asyncs.bulk_wait(np.flatnonzero(state.mask), pending, read_only)
        st.add(state.active_warps())
    return run


def compile_stmatrix(s: StMatrix, ctx: Ctx, st: OpStats, what: str) -> Run:
    """stmatrix: lanes 8j+r address row r of matrix j; the entry's `store` says which
    lane's register goes to which element (the inverse of ldmatrix's `load`)."""
    from tegula.arch.catalogue import stmatrix
    from tegula.emulate.ops import _reg_list, _gather, _shared_addrs
    instr = stmatrix(s.num, s.trans)
    buf = ctx.buffer(s.buffer, what)
    if len(s.src) != 2 * s.num:
        raise EmulationError(f"{what}: {len(s.src)} registers for stmatrix .x{s.num}")
    for dtype in {buf.dtype, *(r.array.dtype for r in s.src)}:
        refusal = instr.operand_refusal(dtype.bits)
        if refusal is not None:
            raise EmulationError(f"{what}: stmatrix into {buf.name} ({buf.dtype}): {refusal}")
    for r in s.src:
        _check_dtype(r.array.dtype, buf.dtype, what)
    regs = _reg_list(s.src, ctx, what)
    offset, num, dt = compile_expr(s.offset), s.num, buf.dtype
    bytes_ar = np.arange(16, dtype=np.int64)

    def run(state: BlockState) -> None:
        warps = state.full_warps(what)
        lanes = (warps[:, None] * 32 + np.arange(32)).ravel()
        values = _gather(regs, state, lanes).reshape(len(warps), 32, 2 * num)
        rows = instr.store(to_bits(values, dt))                      # [W, num, 8, 8] bits
        offs = per_thread(offset(state.env), state.threads).reshape(-1, 32)[warps, : 8 * num]
        baddr = _shared_addrs(state, buf, offs.ravel(), 8, 16, what)
        tids = (warps[:, None] * 32 + np.arange(8 * num)).ravel()
        data = np.ascontiguousarray(rows).view(np.uint8).reshape(-1, 16)
        state.smem.write(baddr[:, None] + bytes_ar, data, tids, what)
        st.add(len(warps), len(warps) * 128 * num)
    return run


def compile_fence_proxy_async(s: FenceProxyAsync, ctx: Ctx, st: OpStats, what: str) -> Run:
    def run(state: BlockState) -> None:
        state.asyncs.fence_proxy(np.flatnonzero(state.mask))
        st.add(state.active_warps())
    return run


# ---------------------------------------------------------------------- wgmma

def compile_wgmma_fence(s: WgmmaFence, ctx: Ctx, st: OpStats, what: str) -> Run:
    def run(state: BlockState) -> None:
        groups = warpgroups(state, what)
        state.asyncs.wg_needs_fence[groups] = False
        st.add(4 * len(groups))
    return run


def compile_wgmma_commit(s: WgmmaCommit, ctx: Ctx, st: OpStats, what: str) -> Run:
    def run(state: BlockState) -> None:
        a = state.asyncs
        for g in warpgroups(state, what).tolist():
            a.wg_committed[g].append(a.wg_open[g])
            a.wg_open[g] = []
            st.add(4)
    return run


def compile_wgmma_wait(s: WgmmaWait, ctx: Ctx, st: OpStats, what: str) -> Run:
    pending = s.pending

    def run(state: BlockState) -> None:
        a = state.asyncs
        for g in warpgroups(state, what).tolist():
            while len(a.wg_committed[g]) > pending:
                a.retire(a.wg_committed[g].pop(0))
            st.add(4)
    return run


def _wgmma_regs(regs, n: int, dtype, label: str, ctx: Ctx, what: str):
    """Unchecked locators of a fragment's registers (the wgmma itself may touch them)."""
    if len(regs) != n:
        raise EmulationError(f"{what}: operand {label} has {len(regs)} registers, the "
                             f"instruction takes {n} values per thread")
    for r in regs:
        _check_dtype(r.array.dtype, dtype, f"{what} operand {label}")
    return [(r.array.name, ctx.regfile.locator(r, 1, what, checked=False)) for r in regs]


def _desc_reader(desc: SmemDesc, rows: int, k: int, dtype, trans: int, ctx: Ctx, what: str):
    """A closure (state, warpgroup lanes) -> (values (rows, k), byte addresses)."""
    buf = ctx.buffer(desc.buffer, what)
    _check_dtype(buf.dtype, dtype, what)
    offset, eb = compile_expr(desc.offset), dtype.bits // 8
    ar = np.arange(eb, dtype=np.int64)
    end = buf.byte_offset + buf.size * eb

    def read(state: BlockState, lanes: np.ndarray):
        off = _warpgroup_uniform(offset(state.env), lanes, state.threads,
                                 f"{what}: descriptor offset")
        fields = MatrixDescriptor(buf.byte_offset + off * eb, desc.leading_bytes,
                                  desc.stride_bytes, desc.swizzle)
        try:
            elem = descriptor_element_addresses(fields, rows, k, dtype, k_major=trans == 0)
        except TegulaError as e:
            raise EmulationError(f"{what}: {e}") from None
        addrs = elem.reshape(-1, 1) + ar
        if addrs.min() < buf.byte_offset or addrs.max() >= end:
            raise EmulationError(f"{what}: the descriptor reads outside shared buffer "
                                 f"{buf.name!r} ({buf.size} elements at byte {buf.byte_offset})")
        data = state.smem.buf[addrs]
        return bytes_to_values(data.reshape(1, -1), dtype, rows * k).reshape(rows, k), addrs
    return read


def compile_wgmma(s: Wgmma, ctx: Ctx, st: OpStats, what: str) -> Run:
    try:
        instr = get_wgmma(s.instr)
    except TegulaError as e:
        raise EmulationError(f"{what}: {e}") from None
    acc_table, a_table = instr.tables()
    m, n, k = instr.m, instr.n, instr.k
    d_regs = _wgmma_regs(s.d, instr.acc_values, instr.acc_dtype, "d", ctx, what)
    if isinstance(s.a, SmemDesc):
        read_a, a_regs = _desc_reader(s.a, m, k, instr.a_dtype, s.trans_a, ctx, what), None
    else:
        read_a, a_regs = None, _wgmma_regs(s.a, instr.a_values, instr.a_dtype, "a", ctx, what)
    read_b = _desc_reader(s.b, n, k, instr.b_dtype, s.trans_b, ctx, what)
    scale_d = compile_expr(s.scale_d)
    acc_dt = instr.acc_dtype

    def fragment(locs, lanes, state):
        """The registers' values for `lanes` ([128, values]) and where they live."""
        found = [loc(state) for _, loc in locs]
        arr = found[0][0]
        cols = [c for _, c in found]
        if all(f[0] is arr for f in found):  # one array (the usual fragment): one gather
            return arr[np.ix_(lanes, cols)], found
        return np.stack([f[0][lanes, f[1]] for f in found], axis=1), found

    def run(state: BlockState) -> None:
        a = state.asyncs
        scale_value = scale_d(state.env)
        for g in warpgroups(state, what).tolist():
            lanes = np.arange(g * WARPGROUP, (g + 1) * WARPGROUP)
            scale = _warpgroup_uniform(scale_value, lanes, state.threads, f"{what}: scale-d")
            if a.wg_needs_fence[g]:
                raise EmulationError(
                    f"{what}: warpgroup {g} issues a wgmma after its accumulator or A "
                    "registers were accessed with no wgmma.fence (WgmmaFence) in between")
            d_vals, d_where = fragment(d_regs, lanes, state)
            d_flat = np.zeros(m * n, dtype=np.float64)
            d_flat[acc_table.ravel()] = d_vals.astype(np.float64).ravel()
            d = d_flat.reshape(n, m).T
            if read_a is not None:
                a_vals, a_addrs = read_a(state, lanes)
            else:
                a_flat = np.zeros(m * k, dtype=np.float64)
                a_flat[a_table.ravel()] = fragment(a_regs, lanes, state)[0].astype(
                    np.float64).ravel()
                a_vals, a_addrs = a_flat.reshape(k, m).T, np.zeros((0, 1), dtype=np.int64)
            b_vals, b_addrs = read_b(state, lanes)
            addrs = np.concatenate([a_addrs.ravel(), b_addrs.ravel()])
            if state.smem.check_races:
                state.smem.check_async_read(addrs, what, lanes)
                a.async_read(addrs, np.int64(lanes[0]), what, state.smem.buffer_at,
                             written=True)
            out = instr.execute(d if scale else None, a_vals, b_vals, scale)
            # the entry's result already holds the tensor cores' NaN; round_to keeps it
            vals = round_to(out.T.ravel()[acc_table], acc_dt)  # [128, values]
            for v, (arr, col) in enumerate(d_where):
                arr[lanes, col] = vals[:, v]
            a_where = [] if a_regs is None else [(name, loc(state)[1])
                                                 for name, loc in a_regs]
            a.wgmma_issued(g, what, lanes, [(name, col) for (name, _), (_, col)
                                            in zip(d_regs, d_where)],
                           addrs if state.smem.check_races else np.zeros(0, dtype=np.int64),
                           s.instr, a_where)
            st.add(4, int(addrs.size))
    return run


def compile_prefetch_tensormap(s: PrefetchTensorMap, ctx: Ctx, st: OpStats, what: str) -> Run:
    """`prefetch.tensormap`: a hint with no memory effect and no ordering, so nothing runs;
    it must name a tensor map parameter of the kernel."""
    _tensor_map(ctx, s.tensor_map, what)

    def run(state: BlockState) -> None:
        st.add(state.active_warps())
    return run


#: The compiler of each asynchronous statement but `Roles` (the machine compiles that one:
#: it needs to compile the role bodies).
ASYNC_COMPILERS = {
    MBarrierInit: compile_mbarrier_init, FenceBarrierInit: compile_fence_barrier_init,
    MBarrierArrive: compile_mbarrier_arrive, MBarrierWait: compile_mbarrier_wait,
    NamedBarrier: compile_named_barrier, ClusterBarrier: compile_cluster_barrier,
    StMatrix: compile_stmatrix,
    TmaLoad: compile_tma_load, TmaStore: compile_tma_store,
    BulkCommit: compile_bulk_commit, BulkWait: compile_bulk_wait,
    FenceProxyAsync: compile_fence_proxy_async, WgmmaFence: compile_wgmma_fence,
    WgmmaCommit: compile_wgmma_commit, WgmmaWait: compile_wgmma_wait, Wgmma: compile_wgmma,
    PrefetchTensorMap: compile_prefetch_tensormap,
}

__all__ = ["ASYNC_COMPILERS", "warpgroups"]
