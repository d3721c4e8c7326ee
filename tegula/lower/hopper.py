"""Lowering the sm_90a GEMM path: wgmma gemms and TMA + mbarrier pipelines, in one role or
warp-specialized.

Synthesis decided, per `tg.gemm`, a `WgmmaPlan` (instruction, warpgroup grid, canonical
swizzled operand buffers), and per `tg.pipeline` loop whether the copies it runs ahead are
TMA boxes (`choices["instr"] == "tma"`, with a `TmaPlan`). This module turns those into the
asynchronous thread IR of `lower/async_ir.py`:

**A wgmma gemm** (`lower_wgmma_gemm`): `WgmmaFence`; for each k16 step and each M/N repeat
of the warpgroup one `Wgmma` whose descriptors point at the warpgroup's rows of the stage
(`SmemDesc` element offset = stage + first row * K + k offset: the canonical buffer is
row-major under the swizzle, and a K step inside the swizzle span advances the start
address, the hardware swizzling absolute addresses); `WgmmaCommit`; `WgmmaWait(0)`. So the
accumulator is complete when the gemm's statements end, and the operand stage may be
overwritten once every warpgroup has passed them — except in a TMA pipeline whose body is
just the gemm, which keeps one group in flight (below).

**A TMA pipeline**, single role (every thread computes; thread 0 also issues the copies),
`S` stages, iterations `start … stop-1` — the `MBarrierRing` instance of the one pipelining
transformation, `lower/pipeline.py` (its ring, schedule and protocol live there):

    kernel start:  thread 0: prefetch.tensormap of each TMA descriptor (`finish_async`);
                   init full[0..S-1] (count 1); fence.mbarrier_init; barrier
    prologue:      thread 0: for j < S-1 with start+j < stop: expect_tx(full[(start+j)%S],
                   box bytes of one stage) and the TMA boxes of iteration start+j
    loop k:        wait full[k%S] with parity ((k - start) // S) % 2
                   the gemm's wgmmas; commit; wait_group 1 (iteration k-1's retire)
                   barrier          (every warpgroup is done with iteration k-1's stage)
                   thread 0, if k+S-1 < stop: expect_tx + TMA boxes of iteration k+S-1
                   into stage (k+S-1) % S = (k-1) % S
    after:         wait_group 0 (the accumulator is complete), barrier

When the body holds more than the one gemm (other ops might read its accumulator), its
gemms wait for their wgmmas by the end of the body (each wait deferred to the first
statement that needs it, `lower/wgmma_waits.py`) and the barrier + refill come first in
the iteration instead; or, where the body's last groups are carried into the next
iteration (`carry_wgmma_groups`), in the order above, the next iteration retiring them.

**Warp-specialized** (synthesis put a `RolesPlan` on the loop, `synth/roles.py`; the same
`Ring`, full barriers and boxes as one role, `lower/pipeline.py`): the block is the user's `T` threads plus one producer warpgroup, and after the setup the body
splits into `Roles` (`split_roles`); every tile, layout and statement of the kernel other
than the copies belongs to the consumer:

    kernel start:  thread 0: init full[S] (count 1), empty[S] (count R); fence; barrier
    producer (tid >= T, setmaxnreg.dec): one elected lane of warp T / 32, for k in start … stop-1:
                   wait empty[k%S] with parity (((k - start) // S) % 2) ^ 1
                   expect_tx(full[k%S], box bytes) and the TMA boxes of iteration k
    consumer (tid < T, setmaxnreg.inc where the budget allows), loop k:
                   wait full[k%S] with parity ((k - start) // S) % 2
                   the gemm's wgmmas; commit; wait_group 1 (iteration k-1's retire)
                   one elected lane of each warp, if k > start: arrive empty[(k-1) % S]   (R = T / 32)
    after:         wait_group 0; the rest of the kernel; its barriers are named barriers
                   `bar.sync 1, T` (the producer never reaches them)

The producer's first round passes its waits at once (a fresh barrier's phase "-1" has
parity 1), so it runs up to S iterations ahead, then each refill waits for the release of
the stage's previous use. With more than the gemm in the body, the gemm waits for its own
wgmmas and every consumer thread arrives on empty[k%S] at the end of iteration k, after
its own reads (R = T), with the loop's shared-memory barrier, if any, before it. Where
the body's last groups are carried into the next iteration (`carry_wgmma_groups`, no
barrier ending the body), iteration k instead releases stage (k-1) % S, right after the
wait that retires the carried groups (`_carried_consumer_loop`).

Stage `k % S` is the same convention as every other access of a multi-stage buffer
(`addressing.shared_offset`), and the j-th use of stage s completes the barrier's j-th
phase: between start and k there are (k - start) // S earlier iterations with the same
stage, hence the parity. Only iterations that exist are issued, so no copy is in flight
when the loop ends; boxes past the tensor's edge (the last K step, ragged M/N) are
zero-filled by TMA and still count their full bytes.

**A ring across enclosing loops** (synthesis put a `RingPlan` on the pipeline: it sits in
other run-time loops, e.g. a persistent kernel's grid-stride tile loop, its trip count
and theirs do not depend on an enclosing index, and its body is the TMA copies and one
wgmma gemm). The barriers are initialized once and never reset; the J-th run of the
pipeline (J the flattened index of the enclosing iterations) continues the ring where the
previous run left it, by a use count instead of the index: `count = J * trips + (k -
start)`, stage `count % S`, parity `(count // S) % 2` (`Ring`), and the gemm's
descriptors read stage `count % S` too. Warp-specialized, the producer runs copies of the
enclosing loops around its K loop (it walks the same tiles; the boxes' coordinates are
expressions of the loop indices), and after the K loop the consumer's `wait_group 0` is
followed by the release of the last iteration's stage, so the producer fills the next
run's first stages while the consumer runs the code after the loop (the epilogue). In one
role, each run's prologue issues its first S-1 stages into the next slots of the ring.
A run of zero iterations issues, waits and releases nothing.

**Clusters with TMA multicast** (the kernel declared `tg.cluster(x, y)`, and synthesis put
a `MulticastPlan` on copies of a warp-specialized pipeline whose boxes every block of the
cluster loads alike, `synth/roles.py`). With C blocks in the cluster and the block's rank
`r = bid_x % x + (bid_y % y) * x` (`cta_rank`, how `%cluster_ctarank` numbers them):

    kernel start:  thread 0: init full[S] (count 1), empty[S] (count R * C); fence;
                   barrier.cluster.arrive + wait (the peers' inits visible to remote use)
    producer:      wait empty[slot] (every block's consumers released the stage);
                   expect_tx(full[slot], the whole boxes' bytes); the own copies as above;
                   a multicast copy: rows r*B/C … (r+1)*B/C-1 of its B-row box, into the
                   same offset of the stage in every block (mask 2^C - 1), completing
                   their bytes on each block's full[slot]
    consumer:      the release of a stage is an arrive on empty[slot] of every block of
                   the cluster (`mapa` + `mbarrier.arrive.shared::cluster`)
    exit:          after the roles, barrier.cluster.arrive + wait: no block leaves while
                   a peer may still write a box or an arrival into its shared memory

A block's full barrier may receive a peer's bytes before its own `expect_tx` (the count
goes negative while the producer's arrival is pending, as PTX allows); they cannot belong
to the next phase, since the peer refills the stage only after this block's consumers
released it, which they do after this phase completed. Every block walks the same
iterations (synthesis proved the loop bounds cluster-uniform), so a block whose tile lies
past the tensor still loads (zeros) and releases its share.

**A TMA-store epilogue** (`lower_tma_store`; synthesis put a `TmaStorePlan` on a register
tile -> global copy of a kernel with a nested ring, `copies.plan_tma_stores`): the tile is
cut into boxes of one 128-byte (64-, 32-) swizzle span by its rows, staged `slots` boxes
at a time in a buffer after the kernel's own (1024-byte aligned, counted in the shared
budget). Each round: thread 0 waits until the previous round's stores have read the
buffer (`cp.async.bulk.wait_group.read 0`; the first round waits without `.read`, for the
global writes of earlier stores, which an earlier iteration may have made to the same
elements), barrier, every thread stores its registers of
the round's boxes at their swizzled addresses (`smem_matrix.swizzle_bytes_address`) —
one `stmatrix.x4` per 8 registers where they form its fragment with 16-byte rows (the
wgmma accumulator's layout does: `TmaStorePlan.stmatrix`), else `st.shared` —
`fence.proxy.async`, barrier, thread 0 issues one TMA store per box (clipped at the
tensor's edge) and commits them; the block ends with thread 0's `wait_group.read 0` (the
stores' global writes complete with the kernel, not the block). The
consumer goes on at once (to the next tile's waits) while the stores drain. A
`tg.atomic_add` with a bulk plan (`copies.plan_bulk_adds`, any sm_90 kernel) is lowered
the same way, its boxes added into the tensor by TMA reduce-adds (`TmaStore.reduce`).

**Ping-pong consumers** (a `RolesPlan` with two consumer groups): the pipeline is lowered
as above for one consumer warpgroup, its K loop between the turn barriers of `take_turn`,
and `lower/warp_roles.py` makes each warpgroup's copy of the consumer body (its threads,
tiles, barriers and staging share) when the roles are split.

**Generic writes read by wgmma** (cp.async or ld/st copies into a wgmma buffer, when TMA was
not possible): wgmma reads through the async proxy, so every barrier of such a kernel is
preceded by `fence.proxy.async` (`fence_generic_writes`): each thread's own shared writes
become visible to the async proxy before the barrier that orders them before the wgmma.
"""
from __future__ import annotations

import math
from dataclasses import replace

from tegula.arch.wgmma import WARPGROUP
from tegula.errors import SynthesisError
from tegula.ir.ops import AtomicAdd, Copy, ForLoop, Gemm, walk_ops, wgmma_stage_reads_only
from tegula.ir.values import SharedTile, describe
from tegula.layout.tv import match_values, tv_table
from tegula.lower.addressing import scalar_expr
from tegula.lower.async_ir import (BulkCommit, BulkWait, ClusterBarrier, Elect,
                                   FenceBarrierInit, FenceProxyAsync, MBarrierArrive,
                                   MBarrierInit, PrefetchTensorMap, contains_elect,
                                   SmemDesc, StMatrix, TensorMapParam, TmaLoad, TmaStore, Wgmma,
                                   WgmmaCommit, WgmmaFence, WgmmaWait)
from tegula.lower.context import LoweringContext, reg
from tegula.lower.pipeline import MBarrierRing, Ring, nested_stage_slots
from tegula.lower.warp_roles import WarpRoles, map_barriers, split_roles, take_turn
from tegula.lower.wgmma_waits import (carry_wgmma_groups, defer_wgmma_waits,
                                      split_reused_products)
from tegula.lower.thread_ir import (BLOCK_IDS, TID, Barrier, Comment, Const, Expr, For, If,
                                    SharedBuffer, SharedStore, Stmt, Var, all_of)


def is_wgmma(op) -> bool:
    """True for a gemm synthesis planned on wgmma (lowering reads the plan's fields, and
    does not import synthesis: `kind` says which plan it is)."""
    return isinstance(op, Gemm) and getattr(op.choices.get("plan"), "kind", "") == "wgmma"


# --------------------------------------------------------------------------------------
# wgmma gemm
# --------------------------------------------------------------------------------------


def operand_desc(ctx: LoweringContext, tile: SharedTile, first_row: Expr, k_offset: int,
                 swizzle: int, trans: int, slot: Expr | None = None) -> SmemDesc:
    """The descriptor of the 64 (A) or n (B) rows from `first_row`, K elements from
    `k_offset`, of the stage of `tile` (the canonical buffer: blocks of one swizzle span
    along its contiguous dim, K-major, or MN-major where `trans`) — or of ring stage
    `slot` where a nested TMA ring decides it (`Ring`). The start (an element offset) and
    the leading/stride byte offsets come from the arch's one definition of the canonical
    buffer (`smem_matrix.operand_start_offset`, `operand_descriptor_strides`)."""
    from tegula.arch.smem_matrix import operand_descriptor_strides, operand_start_offset
    rows, k = tile.shape  # the operand's (M or N, K), whichever dim is contiguous
    leading, stride = operand_descriptor_strides(rows, k, tile.dtype, swizzle, not trans)
    stage = Const(0)
    if tile.alloc.stages > 1:
        if slot is None:
            slot = ctx.ring_slots.get(tile.alloc.id)
        if slot is None:
            slot = scalar_expr(tile.stage) % tile.alloc.stages
        stage = slot * (rows * k)
    offset = stage + operand_start_offset(first_row, k_offset, rows, k, tile.dtype, swizzle,
                                          not trans)
    return SmemDesc(ctx.buffer_of(tile.alloc).name, offset, leading, stride, swizzle)


def lower_wgmma_gemm(ctx: LoweringContext, op: Gemm, pending: int = 0,
                     slot: Expr | None = None) -> list:
    """Thread IR of one gemm on wgmma (see the module docstring); `pending` wgmma groups
    may stay in flight after it (1 only inside a TMA pipeline that proved it safe); `slot`:
    the stage of its multi-stage operands, where a nested TMA ring decides it."""
    plan = op.choices["plan"]
    atom, grid = plan.atom, plan.grid
    rm_count, rn_count, rk_count = plan.repeats
    c_regs = ctx.regs_of(op.c)
    c_map = match_values(op.c.layout, tv_table(plan.c_tv))
    if c_map is None:
        raise SynthesisError(f"gemm: the accumulator {describe(op.c)} is not in the layout of "
                             f"{plan.describe()}", loc=op.loc)
    group = TID // WARPGROUP
    group_m, group_n = group % grid.wm, group // grid.wm
    values = atom.acc_tv[1].size
    a_regs = a_map = None
    if plan.a_tv is not None:  # A from registers, in the atom's fragment order per repeat
        a_regs, a_map = ctx.regs_of(op.a), match_values(op.a.layout, tv_table(plan.a_tv))
        if a_map is None:
            raise SynthesisError(f"gemm: operand a {describe(op.a)} is not in the A fragment "
                                 f"layout of {plan.describe()}", loc=op.loc)
    a_values = atom.a_tv[1].size
    stmts: list = [Comment(f"gemm {describe(op.c)} += {describe(op.a)} @ {describe(op.b)}^T: "
                           f"{plan.describe()}"), WgmmaFence()]
    for rk in range(rk_count):
        for rm in range(rm_count):
            if a_regs is not None:
                first_a = a_values * (rm + rm_count * rk)
                a = [reg(a_regs, a_map[first_a + x]) for x in range(a_values)]
            else:
                a = operand_desc(ctx, op.a, (group_m + grid.wm * rm) * atom.m, rk * atom.k,
                                 plan.swizzle_a, plan.trans_a, slot)
            for rn in range(rn_count):
                b = operand_desc(ctx, op.b, (group_n + grid.wn * rn) * atom.n, rk * atom.k,
                                 plan.swizzle_b, plan.trans_b, slot)
                first = values * (rm + rm_count * rn)
                d = [reg(c_regs, c_map[first + x]) for x in range(values)]
                stmts.append(Wgmma(atom.name, d, a, b, scale_d=Const(1),
                                   trans_a=plan.trans_a, trans_b=plan.trans_b))
    return stmts + [WgmmaCommit(), WgmmaWait(pending)]


# --------------------------------------------------------------------------------------
# TMA + mbarrier pipeline
# --------------------------------------------------------------------------------------


def tma_producers(loop: ForLoop) -> list[Copy]:
    """The loop's copies synthesis made TMA boxes (all of its run-ahead copies, or none)."""
    return [o for o in loop.body if isinstance(o, Copy) and o.choices.get("instr") == "tma"]


def tensor_map(ctx: LoweringContext, view, plan) -> TensorMapParam:
    """The tensor map of a TMA copy's global `view` (one per tensor, box and swizzle)."""
    key = (view.arg.name, plan.dims, plan.box, plan.swizzle)
    found = ctx.tensor_maps.get(key)
    if found is None:
        found = TensorMapParam(ctx.unique(f"{view.arg.name}_tmap"), view.arg.name, view.dtype,
                               plan.dims, plan.box, plan.swizzle)
        ctx.tensor_maps[key] = found
    return found


def tma_issue(ctx: LoweringContext, producers: list[Copy], barrier: str, slot: Expr,
              iteration: Expr, loop_var: str, cluster: tuple = (1, 1, 1)) -> list[Stmt]:
    """The issuing thread's statements for one stage: expect the stage's bytes on
    `barrier[slot]`, then the TMA boxes of every copy (`blocks` per copy: one per
    swizzle-span block of the buffer's contiguous dim), for loop iteration `iteration`.
    A multicast copy (`choices["multicast"]`, a kernel with a `cluster`) loads this
    block's row slice of each box into every block of the cluster, whose peers load the
    other slices into this one: the stage still receives the whole box's bytes."""
    from tegula.lower.lower import substitute
    total = sum(p.choices["tma"].box_bytes for p in producers)
    stmts: list[Stmt] = [MBarrierArrive(barrier, slot, tx_bytes=total)]
    for p in producers:
        plan, multicast = p.choices["tma"], p.choices.get("multicast")
        first, mask = Const(0), 0
        if multicast is not None:
            plan = replace(plan, box=plan.box[:-1] + (multicast.slice_rows,))
            first, mask = cta_rank(cluster) * multicast.slice_rows, multicast.mask
        tmap = tensor_map(ctx, p.src, plan)
        origin = [scalar_expr(o) for o in p.src.origin]
        coords = substitute([origin[d] for d in tmap.dims], {loop_var: iteration})
        coords[-1] = coords[-1] + first if multicast is not None else coords[-1]
        size = math.prod(p.dst.alloc.shape)   # a stage: 2-D wgmma operands, or a pinned
        rows = size // p.dst.alloc.shape[-1]  # row-major tile of any rank (one block)
        width = plan.box[0]
        for block in range(plan.blocks):
            offset = slot * size + block * (rows * width)
            if multicast is not None:
                offset = offset + first * width
            inner = coords[0] + block * width if block else coords[0]
            stmts.append(TmaLoad(ctx.buffer_of(p.dst.alloc).name, offset, tmap.name,
                                 [inner] + list(coords[1:]), barrier, slot, multicast=mask))
    return stmts


def cta_rank(cluster: tuple) -> Expr:
    """The block's rank in its cluster (`%cluster_ctarank`: x fastest), from its block
    indices: clusters tile the grid, so blocks `cx*i … cx*i+cx-1` along x form one."""
    rank: Expr | None = None
    scale = 1
    for axis, extent in enumerate(cluster):
        if extent > 1:
            term = (BLOCK_IDS[axis] % extent) * scale if scale > 1 else BLOCK_IDS[axis] % extent
            rank = term if rank is None else rank + term
        scale *= extent
    return rank if rank is not None else Const(0)


def cluster_size(cluster: tuple) -> int:
    return cluster[0] * cluster[1] * cluster[2]


# --------------------------------------------------------------------------------------
# Warp-specialized TMA pipeline: a producer warpgroup and a consumer role
# --------------------------------------------------------------------------------------


def lower_specialized_pipeline(lowering, op: ForLoop, producers: list[Copy],
                               plan) -> list[Stmt]:
    """The consumer's statements for a warp-specialized TMA pipeline (module docstring);
    the producer's loop (inside the enclosing loops of a nested ring) goes to
    `ctx.warp_roles`."""
    ctx = lowering.ctx
    if ctx.warp_roles is not None:
        raise SynthesisError("tg.pipeline: a second warp-specialized pipeline in one kernel "
                             "(synthesis specializes at most one)", loc=op.loc)
    stages, k = op.stages, Var(op.var.name)
    ring = Ring(op)
    consumers = plan.consumer_threads
    rest = [o for o in op.body if not any(o is p for p in producers)]
    in_flight = one_gemm_in_flight(rest)
    # A stage is released once nothing reads it: with only wgmmas reading it (a lone gemm,
    # or a body whose other ops never touch the stages: the blockwise FP8 promotion),
    # after the warpgroup's wait_group retired them (one elected lane of each warp arrives; the wait
    # is warp-aligned, so the whole warp has passed it, and the body's deferred waits
    # retire every group before the release); otherwise every consumer thread arrives
    # after its own reads.
    wgmma_reads_only = in_flight or wgmma_stage_reads_only(
        rest, {p.dst.alloc.id for p in producers})
    releasers = consumers // 32 if wgmma_reads_only else consumers
    # Multicast boxes land in every block of the cluster: a stage is free once the
    # consumers of all of them released it, each arriving on every block's empty barrier.
    multicast = any(p.choices.get("multicast") is not None for p in producers)
    ctas = cluster_size(plan.cluster) if multicast else 1
    # The ring, its full barriers and the producer's boxes are the one-role pipeline's
    # (`lower/pipeline.py`); warp-specialized, stages are released on empty barriers.
    ring_protocol = MBarrierRing(lowering, op, producers, ring, plan.cluster)
    full = ring_protocol.full
    empty = ctx.mbarrier_array("empty", stages)
    ctx.setup += [If(TID.eq(0), ring_protocol.init_full()
                     + [MBarrierInit(empty.name, Const(s), releasers * ctas)
                        for s in range(stages)]
                     + [FenceBarrierInit()]),
                  # The peers' inits must be visible before a remote arrive or multicast.
                  ClusterBarrier() if multicast else Barrier()]

    def release(index: Expr, pred: Expr | None = None) -> list[Stmt]:
        return stage_release(empty.name, index, pred, ctas)

    # The producer waits for the stage's previous use to be released, then issues.
    producer_loop = For(k, ring.start, ring.stop, 1, [ring_protocol.producer_wait(empty.name, k)]
                        + ring_protocol.boxes(k))
    where = f"{op.loc.filename}:{op.loc.lineno}" if op.loc is not None else "tg.pipeline"
    pingpong = getattr(plan, "pingpong", False)
    tile_loop = op.choices["ring"].enclosing[0] if pingpong else None
    producer_thread = consumers * getattr(plan, "consumer_groups", 1)
    ctx.warp_roles = WarpRoles(plan, [
        Comment(f"producer: TMA boxes into {full.name}[{stages}], stages released on "
                f"{empty.name}[{stages}]"),
        If(all_of([TID.ge(producer_thread), TID.lt(producer_thread + 32), Elect()]),
           [_in_enclosing_loops(op, producer_loop)])], where,
        multicast, tile_loop, tuple(ctx.buffer_of(p.dst.alloc).name for p in producers))
    wait, = ring_protocol.acquire(k)
    head = Comment(f"consumer: waits on {full.name}[{stages}], releases stages on "
                   f"{empty.name}[{stages}] ({releasers} arrivals"
                   + (f" on each of the cluster's {ctas} blocks)" if ctas > 1 else ")"))
    if in_flight:
        # wait_group 1 retires iteration k-1's wgmmas, which read stage slot(k-1).
        gemm = lower_wgmma_gemm(ctx, rest[0], pending=1, slot=ring.gemm_slot(k))
        one_lane = Elect()  # one lane of each warp: the warp passed its wait_group together
        releases = release(ring.slot(k - 1), all_of([ring.start.lt(k), one_lane]))
        loop = For(k, ring.start, ring.stop, 1, [wait] + gemm + releases)
        after: list[Stmt] = [WgmmaWait(0)]
        if ring.nested:
            # The ring goes on in the next run: release the last iteration's stage now
            # that wait_group 0 retired its wgmmas, so the producer refills it (with the
            # next run's boxes) while this role runs the code after the loop (epilogue).
            last = ring.stop - 1
            after += release(ring.slot(last), all_of([ring.start.lt(ring.stop), one_lane]))
        if pingpong:
            return [head] + take_turn(tile_loop, loop) + after + [Barrier()]
        return [head, loop] + after + [Barrier()]
    one_lane = Elect() if wgmma_reads_only else None
    return [head] + _specialized_consumer_loop(
        lowering, op, ring, rest, producers, wait,
        lambda index, guard=None: release(index, all_of([guard, one_lane])),
        getattr(plan, "consumer_registers", None))


def _specialized_consumer_loop(lowering, op: ForLoop, ring: Ring, rest: list,
                               producers: list[Copy], wait: Stmt, release,
                               registers: int | None = None) -> list[Stmt]:
    """The consumer role's loop where the body is more than one lone gemm (any tile ops):
    each iteration waits for its stage, runs the body with its wgmma waits deferred and
    releases the stage; a barrier ends the body or follows the loop where its shared
    accesses need one. Where the body's last wgmma groups need not be retired by its end
    (the attention forward's p @ v) and no barrier ends it, they stay in flight into the
    next iteration (`_carried_consumer_loop`; `registers`: a consumer thread's budget)."""
    k = Var(op.var.name)
    nested_stage_slots(lowering.ctx, ring, op, rest, producers)
    from tegula.lower.lower import SharedSync
    inner = SharedSync()
    stmts = lowering.ops(rest, inner)
    # No refill barrier orders one iteration's shared accesses before the next's, so the
    # body ends in one where they could race: a consumer wrote shared memory since the
    # body's last barrier (or has cp.async copies in flight), or it reads a buffer there
    # that the next iteration writes before its first barrier (`carried_conflict`: write,
    # barrier, read of one scratch tile). Only the producer's TMA writes the stages, once
    # every consumer thread released them, so reading them needs none; nor does reading a
    # buffer nothing in the loop writes (the attention forward's q tile) — but what
    # follows the loop may write it, so one barrier after the loop orders those reads
    # (the body leaves shared memory clean, as every loop's does). A barrier every
    # iteration held the consumer warpgroups in lockstep: without it the blockwise FP8
    # GEMM went from 802 to 861 TFLOP/s on an H100, the attention forward (D=128) from
    # 467 to 505.
    stages = {p.dst.alloc.id for p in producers}
    end_barrier = inner.written or inner.async_pending or \
        inner.carried_conflict(ignore=stages)
    after = inner.barrier() if not end_barrier and inner.read - stages else []
    carried = None if end_barrier or ring.stages < 2 else \
        carry_wgmma_groups(stmts, registers=registers)
    if carried is not None:
        return _carried_consumer_loop(ring, k, wait, *carried, release) + after
    body = [wait] + split_reused_products(defer_wgmma_waits(stmts), wait)
    if end_barrier:
        body += inner.barrier()
    body += release(ring.slot(k))
    return [For(k, ring.start, ring.stop, 1, body)] + after


def _carried_consumer_loop(ring: Ring, k: Var, wait: Stmt, body: list, at: int,
                           release) -> list[Stmt]:
    """The consumer's loop whose last wgmma groups run on into the next iteration
    (`wgmma_waits.carry_wgmma_groups`): iteration k releases the previous iteration's
    stage, slot(k-1), right after the wait that retired its carried groups — the only
    readers of that stage left — and its own stage stays held by its groups in flight.
    With two stages or more the producer never needs the stage being held (it fills
    k+1 once iteration k-1 released its stage). After the loop wait_group 0, and, where
    the ring goes on in the next run, the release of the last iteration's stage (as a
    lone gemm's)."""
    previous = release(ring.slot(k - 1), ring.start.lt(k))
    loop = For(k, ring.start, ring.stop, 1, [wait] + body[:at] + previous + body[at:])
    after: list[Stmt] = [WgmmaWait(0)]
    if ring.nested:
        after += release(ring.slot(ring.stop - 1), ring.start.lt(ring.stop))
    return [loop] + after


def stage_release(empty: str, index: Expr, pred: Expr | None, ctas: int) -> list[Stmt]:
    """The arrivals releasing stage `index` of the empty barriers `empty`: on this block's
    own (`ctas` 1), or on the barrier of every block of the cluster whose multicast boxes
    the stage receives (`ctas` blocks, remote arrives through `mapa`)."""
    if pred is not None and contains_elect(pred):  # one lane of each warp: a branch
        return [If(pred, stage_release(empty, index, None, ctas))]
    if ctas == 1:
        return [MBarrierArrive(empty, index, pred=pred)]
    return [MBarrierArrive(empty, index, pred=pred, cta=Const(r)) for r in range(ctas)]


def _in_enclosing_loops(op: ForLoop, producer_loop: For) -> For:
    """The producer's loop inside copies of the run-time loops around the pipeline (a
    nested ring's `enclosing`, outermost first), so the producer walks the same runs —
    the same tiles of a persistent kernel — as the consumer. Their bodies' other ops are
    the consumer's; the scalars the boxes' coordinates need are expressions of the loop
    indices, so nothing else is copied."""
    ring = op.choices.get("ring")
    loop = producer_loop
    for outer in reversed(getattr(ring, "enclosing", ())):
        loop = For(Var(outer.var.name), scalar_expr(outer.start), scalar_expr(outer.stop),
                   outer.step, [loop])
    return loop


def one_gemm_in_flight(rest: list) -> bool:
    """True if the loop body besides its TMA copies is one wgmma gemm (nothing else reads
    its accumulator or the stages inside the loop), so a wgmma group may stay in flight."""
    return len(rest) == 1 and is_wgmma(rest[0])


# --------------------------------------------------------------------------------------
# TMA-store epilogue
# --------------------------------------------------------------------------------------


def lower_tma_store(ctx: LoweringContext, op) -> list[Stmt]:
    """A register tile -> global copy through a swizzled staging buffer and TMA stores
    (`choices["tma_store"]`, a `TmaStorePlan`; module docstring): in rounds of
    `plan.slots` boxes, each: thread 0 waits until the previous round's stores have read
    the buffer, barrier, every thread stores its registers of the round's boxes, fences
    them for the async proxy, barrier, thread 0 issues the round's TMA stores. A
    `tg.atomic_add` with `choices["bulk_add"]` (the plan's `reduce="add"`) is the same
    with TMA reduce-adds in place of the stores."""
    from tegula.layout.tv import tv_coords
    plan = op.choices["bulk_add"] if "bulk_add" in op.choices else op.choices["tma_store"]
    tile, view = op.src, op.dst
    eb, width, box_elems = plan.elem_bytes, plan.vector, plan.rows * plan.inner
    regs = ctx.regs_of(tile)
    buffer = SharedBuffer(ctx.unique(f"staging_{view.arg.name}"), view.dtype,
                          plan.copies * plan.bytes // eb, plan.offset)
    ctx.shared.append(buffer)
    if plan.copies > 1:  # ping-pong: consumer warpgroup g stages at g * one buffer
        ctx.warp_roles.staging[buffer.name] = plan.bytes // eb
    tmap = tensor_map(ctx, view, plan)
    origin = [scalar_expr(o) for o in view.origin]
    inner_dim, row_dim = plan.dims[:2]
    box_of = tv_coords(tile.layout, tuple(tile.shape))[0, :, 1] // plan.inner  # same per thread
    issuer = TID.eq(0)
    what = "bulk add into" if plan.reduce else "epilogue of"
    stmts: list[Stmt] = [Comment(f"{what} {describe(view)}: {plan.describe()}")]
    for first in range(0, plan.boxes, plan.slots):
        read_only = first > 0 or not first_round_waits_for_writes(op, plan)
        stmts += [If(issuer, [BulkWait(0, read_only=read_only)]), Barrier()]
        if plan.stmatrix:
            stmts += _stmatrix_round(ctx, tile, regs, buffer, box_of, first, plan)
        else:
            for v in range(0, tile.layout[1].size, width):
                if first <= box_of[v] < first + plan.slots:
                    row, col = ctx.coords.coords(tile.layout, tile.shape, v)
                    stmts.append(SharedStore(buffer.name, plan.staging_offset(row, col),
                                             reg(regs, v), width))
        fixed = [origin[d] for d in plan.dims[2:]]  # dims of a higher-rank tensor
        stores = [TmaStore(tmap.name, [origin[inner_dim] + j * plan.inner, origin[row_dim]]
                           + fixed, buffer.name, Const((j % plan.slots) * box_elems),
                           reduce=plan.reduce)
                  for j in range(first, first + plan.slots)]
        # Each thread's generic writes become visible to the async proxy, then the barrier
        # orders all of them before thread 0's stores.
        stmts += [FenceProxyAsync(), Barrier(), If(issuer, stores + [BulkCommit()])]
    return stmts


def first_round_waits_for_writes(op, plan) -> bool:
    """Whether the epilogue's first round waits for the earlier TMA stores' global writes
    (`cp.async.bulk.wait_group 0`), not only for their reads of the staging buffer
    (`.read`, which every later round takes): an earlier iteration may have stored to
    these elements (a tile map that revisits a tile), and the async proxy does not order
    two TMA stores to one address. TMA reduce-adds commute, so they need not. The
    library's epilogues issued the earlier stores a main loop before."""
    return not plan.reduce


def _stmatrix_round(ctx: LoweringContext, tile, regs, buffer: SharedBuffer, box_of,
                    first: int, plan) -> list[Stmt]:
    """One stmatrix.x4 per 8 registers of the round's boxes (synthesis checked they form
    the entry's fragment, `copies._stmatrix_fits`): lane 8j + r addresses row r of matrix
    j, whose first element the entry's TV layout places in register `holder_value` of
    lane `holder_lane` (`MatrixInstr.row_holder`), so its tile coordinate is that
    register's under the tile's layout, on that lane of this warp."""
    from tegula.arch.catalogue import stmatrix
    holder_lane, holder_value = stmatrix(4).row_holder(TID % 32)
    thread = (TID // 32) * 32 + holder_lane
    stmts: list[Stmt] = []
    for v in range(0, tile.layout[1].size, 8):
        if not first <= box_of[v] < first + plan.slots:
            continue
        row, col = ctx.coords.coords(tile.layout, tile.shape, holder_value + v, thread=thread)
        stmts.append(StMatrix([reg(regs, v + x) for x in range(8)], 4, False, buffer.name,
                              plan.staging_offset(row, col)))
    return stmts


def has_tma_stores(kernel) -> bool:
    """True if the kernel issues TMA stores or TMA reduce-adds (bulk groups to drain)."""
    return any(isinstance(op, Copy) and "tma_store" in op.choices
               or isinstance(op, AtomicAdd) and "bulk_add" in op.choices
               for op in walk_ops(kernel.body))


# --------------------------------------------------------------------------------------
# Generic-proxy writes read by wgmma
# --------------------------------------------------------------------------------------


def needs_proxy_fence(kernel) -> bool:
    """True if some wgmma operand buffer is written by threads (not TMA)."""
    wgmma_buffers = {t.alloc.id for op in walk_ops(kernel.body) if is_wgmma(op)
                     for t in (op.a, op.b) if isinstance(t, SharedTile)}
    return any(isinstance(op, Copy) and isinstance(op.dst, SharedTile)
               and op.dst.alloc.id in wgmma_buffers and op.choices.get("instr") != "tma"
               for op in walk_ops(kernel.body))


def fence_generic_writes(stmts: list) -> list:
    """`stmts` with `fence.proxy.async` before every block barrier (recursively)."""
    return map_barriers(stmts, lambda: [FenceProxyAsync(), Barrier()])


def exit_bulk_wait() -> BulkWait:
    """Thread 0's last bulk wait before the block exits: until its TMA stores have read
    shared memory (`.read`), which may not be freed under them. Their global writes complete
    with the kernel, not the block (CUTLASS's epilogue tail waits the same way); the full
    wait held each block until its last writes had landed."""
    return BulkWait(0, read_only=True)


def finish_async(kernel, ctx: LoweringContext, params: list, body: list) -> tuple[list, list]:
    """The kernel's parameters with each TMA tensor map after its tensor, and its body with
    the kernel-start setup first — thread 0's `prefetch.tensormap` of every map (so the
    first TMA copy of each does not wait for its descriptor's fetch, which now overlaps the
    barrier inits), the mbarrier inits — and proxy fences where generic writes feed
    wgmma."""
    maps = list(ctx.tensor_maps.values())
    if maps:
        prefetch = [PrefetchTensorMap(m.name) for m in maps]
        first = ctx.setup[0] if ctx.setup else None
        if isinstance(first, If) and first.cond == TID.eq(0) and not first.otherwise:
            first.then[:0] = prefetch  # ahead of the inits, in thread 0's one branch
        else:
            ctx.setup.insert(0, If(TID.eq(0), prefetch))
    with_maps: list = []
    for p in params:
        with_maps.append(p)
        with_maps += [m for m in maps if m.tensor == p.name]
    if needs_proxy_fence(kernel):
        body = fence_generic_writes(body)
    if has_tma_stores(kernel):
        body = body + [If(TID.eq(0), [exit_bulk_wait()])]
    if ctx.warp_roles is not None:
        if getattr(ctx.warp_roles.plan, "pingpong", False):
            # The per-thread coordinate bases are Lets of `tid`: each consumer warpgroup
            # computes its own, as thread tid - 128·g (`consumer_group`).
            body, ctx.coords.prologue = ctx.coords.prologue + body, []
        # With multicast, no block may exit while a peer can still write to its shared
        # memory (a multicast box, a remote arrive): the cluster meets once more.
        exit_sync = [ClusterBarrier()] if ctx.warp_roles.multicast else []
        body = split_roles(ctx.warp_roles, body) + exit_sync
    return with_maps, ctx.setup + body
