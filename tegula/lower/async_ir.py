"""Thread IR for asynchronous operations and thread groups (the Hopper core, issue 9 §2–§3).

`thread_ir` describes what every thread of a block does in lockstep. Hopper's fast path
is not lockstep: one thread issues a TMA copy that lands later and signals an mbarrier;
a warpgroup issues `wgmma`s that read shared memory and write registers *after* the
instruction, until a `wait_group`; producer and consumer warps run different loops and
meet only at mbarriers. These statements say exactly that, and both consumers of thread
IR implement them:

* the CUDA emitter prints each as its PTX (text from the `tegula.arch` entries);
* the emulator runs each role as its own coroutine, keeps every mbarrier's phase,
  pending-arrival and transaction-byte counts, completes TMA copies and `wgmma`s
  asynchronously, and reports what the hardware would silently get wrong: reading a
  `wgmma` accumulator before its `wait_group`, reading shared memory a TMA copy is still
  writing (before the mbarrier phase it signals completes), generic-proxy writes read by
  the async proxy without `fence.proxy.async`, and a deadlock (every role blocked) with
  the statement each role waits at.

Conventions
-----------
* **mbarriers** live in shared memory as arrays of 8-byte barriers (`MBarrierArray`,
  listed in `ThreadKernel.mbarriers`, placed after the shared buffers). A statement names
  one barrier as (array name, index expression).
* **Phases**: a barrier starts in phase 0. When its pending arrivals reach zero *and* its
  transaction count is zero, the current phase completes, the phase number increments and
  the pending count resets to the init count. `MBarrierWait(parity=p)` returns once the
  phase with parity `p` has completed (PTX `mbarrier.try_wait.parity` semantics: it waits
  while the barrier's current phase parity equals `p`). Loops track parity as
  `(iteration // stages) % 2`.
* **Who executes**: every statement runs on the active threads of the enclosing block
  (the whole block, or a role's threads). Single-thread actions (TMA issue, expect-tx,
  init) carry a `pred` selecting the issuing thread; lowering writes it as an index
  expression (`tid % 128 == 0`, say), not with `elect.sync`, so the emulator and the
  emitter agree without a special case.
* **Coordinates of a TMA copy** are in elements, in the tensor map's dimension order
  (`TensorMapParam.dims`: dim 0 is the tensor's contiguous dimension). Elements of the box
  outside the tensor are written as zero and still count as transferred bytes.
* **Shared offsets** are element offsets into a `SharedBuffer` (as in `thread_ir`); the
  swizzle of a TMA box or a wgmma operand is a property of the copy/descriptor
  (`swizzle` in bytes: 0, 32, 64 or 128) applied to *byte addresses* inside a
  swizzle-sized-aligned region, exactly as the hardware does, so the buffer must be
  aligned to the swizzle atom (`MBarrierArray`/`SharedBuffer` offsets are chosen by
  lowering; 1024 bytes for 128-byte swizzle).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from tegula.dtypes import DType
from tegula.lower.thread_ir import Expr, Reg, Stmt

# --------------------------------------------------------------------------------------
# Kernel-level declarations
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MBarrierArray:
    """`count` mbarriers (8 bytes each) at `byte_offset` of dynamic shared memory."""

    name: str
    count: int
    byte_offset: int

    @property
    def end(self) -> int:
        return self.byte_offset + 8 * self.count


@dataclass(frozen=True)
class TensorMapParam:
    """A TMA tensor map (`CUtensorMap`, 128 bytes) passed by value as a
    `const __grid_constant__` kernel parameter and encoded by the runtime from the global
    tensor argument `tensor` (`cuTensorMapEncodeTiled`).

    `dims` lists the tensor's dimensions in tensor-map order, innermost first (dims[0] must
    have stride 1 — the runtime checks); `box` is the box extent per tensor-map dim in
    elements; `swizzle` the shared-memory swizzle in bytes (0, 32, 64, 128). Out-of-bounds
    elements are filled with zero. The runtime encodes one map per distinct
    (pointer, shape, strides, box, swizzle) and caches it.

    Listed in `ThreadKernel.params` (after the `TensorParam` named `tensor`, which stays a
    parameter too: its extents and strides are what the runtime encodes from, and what
    index expressions read). `codegen.param_list` gives it one 128-byte, 64-byte-aligned
    parameter (`ParamSpec.kind == "tensormap"`) at its place in the list."""

    name: str
    tensor: str
    dtype: DType
    dims: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = 0

    @property
    def box_bytes(self) -> int:
        n = 1
        for b in self.box:
            n *= b
        return n * self.dtype.bits // 8


@dataclass(frozen=True, eq=True)
class Elect(Expr):
    """True in one lane of each warp that evaluates it (`elect.sync` with the full member
    mask: the warp's lowest lane, lane 0, since every lane must take part), false in the
    others. Where one thread of a warp issues (TMA boxes, an mbarrier arrive for its
    warp), `all_of([<warp-uniform condition>, Elect()])` picks it; C's `&&` evaluates
    the election only in warps where the conditions before it hold, which must hold for
    all 32 lanes of such a warp (the emulator checks). Only work that does not care which
    lane does it may be elected — TMA loads and mbarrier arrives complete on the barrier —
    never per-thread state a later statement depends on (a bulk-store group the same
    thread must wait for keeps `tid == 0`): the PTX ISA promises one leader, not lane 0."""


def contains_elect(e) -> bool:
    """True if the index expression `e` has an `Elect` in it."""
    if isinstance(e, Elect):
        return True
    return any(contains_elect(getattr(e, f)) for f in ("lhs", "rhs", "cond", "if_true",
                                                         "if_false") if hasattr(e, f))


# --------------------------------------------------------------------------------------
# mbarriers
# --------------------------------------------------------------------------------------


@dataclass
class MBarrierInit(Stmt):
    """`mbarrier.init.shared::cta.b64 [bar], count` on `barrier[index]` by the threads where
    `pred` (lowering: one thread). Lowering follows inits with `FenceBarrierInit` and a block
    `Barrier` before any other thread uses them."""

    barrier: str
    index: Expr
    count: int
    pred: Expr | None = None


@dataclass
class FenceBarrierInit(Stmt):
    """`fence.mbarrier_init.release.cluster`: makes barrier inits visible to the async proxy
    (TMA complete-tx) and to other CTAs of a cluster."""


@dataclass
class MBarrierArrive(Stmt):
    """Each active thread where `pred` arrives once on `barrier[index]`
    (`mbarrier.arrive.shared::cta.b64`). With `tx_bytes > 0` it is
    `mbarrier.arrive.expect_tx`: the arrival also raises the barrier's expected transaction
    bytes by `tx_bytes` (the TMA copies that complete them are issued after it). With
    `cta` (an index expression: a CTA rank in the kernel's cluster) the arrival lands on the
    barrier at the same offset in that CTA's shared memory (`mapa` +
    `mbarrier.arrive.shared::cluster`; no `tx_bytes`), which must have
    been made visible to the cluster (`ClusterBarrier` after its init)."""

    barrier: str
    index: Expr
    pred: Expr | None = None
    tx_bytes: int = 0
    cta: Expr | None = None


@dataclass
class MBarrierWait(Stmt):
    """Every active thread waits until the phase of `barrier[index]` with parity `parity`
    (0 or 1, an index expression) has completed (`mbarrier.try_wait.parity` in a loop).
    `repeat`: the thread's previous wait on this barrier again, at the phase it already
    observed (returns at once; `wgmma_waits.split_reused_products` uses one to end
    ptxas's scheduling region); the emulator checks that no phase completed between."""

    barrier: str
    index: Expr
    parity: Expr
    repeat: bool = False


# --------------------------------------------------------------------------------------
# TMA (cp.async.bulk.tensor) and proxy fences
# --------------------------------------------------------------------------------------


@dataclass
class TmaLoad(Stmt):
    """`cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes`:
    the box at element coordinates `coords` (tensor-map dim order) of `tensor_map` is
    copied into shared buffer `buffer` at element `offset` (swizzled per the map) and
    completes `box_bytes` transaction bytes on `barrier[barrier_index]`. Issued by the
    threads where `pred` (one thread). `multicast` (a CTA mask over the kernel's cluster,
    0 = none): the box lands at the same offset of every CTA in the mask and completes its
    bytes on each one's barrier at the same offset (`.multicast::cluster`)."""

    buffer: str
    offset: Expr
    tensor_map: str
    coords: list[Expr]
    barrier: str
    barrier_index: Expr
    pred: Expr | None = None
    multicast: int = 0


@dataclass
class TmaStore(Stmt):
    """`cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group`: shared buffer `buffer`
    at `offset` → the box at `coords` of `tensor_map`; out-of-bounds elements are not
    written. Issued by the threads where `pred`; completion via `BulkCommit`/`BulkWait`.
    The shared data must be written and `FenceProxyAsync`-ed before. `reduce="add"`: the
    box is added into the tensor, atomically per element (`cp.reduce.async.bulk.tensor`
    ... `.add`, the catalogue's `tma.reduce.add.{rank}d`) instead of stored."""

    tensor_map: str
    coords: list[Expr]
    buffer: str
    offset: Expr
    pred: Expr | None = None
    reduce: str = ""


@dataclass
class PrefetchTensorMap(Stmt):
    """`prefetch.tensormap`: bring the descriptor of `tensor_map` (a `TensorMapParam`'s name)
    into the SM's descriptor cache ahead of the first TMA copy that reads it, so that copy
    does not wait for the fetch. A hint: no memory effect and no ordering; issued by the
    threads of an enclosing `If` (one thread)."""

    tensor_map: str


@dataclass
class BulkCommit(Stmt):
    """`cp.async.bulk.commit_group`: close the thread's group of bulk (TMA store) copies."""


@dataclass
class BulkWait(Stmt):
    """`cp.async.bulk.wait_group[.read] pending`: wait until at most `pending` bulk groups
    are in flight (`read_only`: only until their shared-memory *reads* are done)."""

    pending: int
    read_only: bool = False


@dataclass
class FenceProxyAsync(Stmt):
    """`fence.proxy.async.shared::cta`: the thread's earlier generic-proxy shared-memory
    writes become visible to later async-proxy operations (wgmma operand reads, TMA
    stores) — and async-proxy writes visible to later generic reads."""


# --------------------------------------------------------------------------------------
# wgmma
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SmemDesc:
    """A wgmma shared-memory matrix descriptor (a value, not a statement): the operand
    starts at element `offset` of `buffer`; `leading_bytes` / `stride_bytes` are the
    descriptor's leading- and stride-dimension byte offsets and `swizzle` its swizzle mode
    in bytes (0 = interleave/none, 32, 64, 128). The arch entry (`arch/wgmma.py`) defines
    which matrix element each (row, k) reads from these, for emitter and emulator alike."""

    buffer: str
    offset: Expr
    leading_bytes: int
    stride_bytes: int
    swizzle: int


@dataclass
class WgmmaFence(Stmt):
    """`wgmma.fence.sync.aligned`: orders earlier register writes of the accumulator/A
    fragment before the warpgroup's next `wgmma`s read them."""


@dataclass
class Wgmma(Stmt):
    """One warpgroup-wide `wgmma.mma_async` named by its catalogue entry (`instr`, e.g.
    "wgmma.m64n128k16.f32.f16.f16"). `d` is the accumulator fragment in PTX register order
    (read and written: D = A·B + D when `scale_d` is 1, D = A·B when 0; `scale_d` is an
    index expression so the first k-step of a loop can clear). `a` is a descriptor (A in
    shared memory) or a register fragment; `b` is always a descriptor. `trans_a`/`trans_b`
    select the operands' major-ness as the PTX imm-trans-a/b (0 = K-major). Asynchronous:
    `d` must not be read or written, nor the shared operands overwritten, until a
    `WgmmaWait` retires the group that contains it."""

    instr: str
    d: list[Reg]
    a: SmemDesc | list[Reg]
    b: SmemDesc
    scale_d: Expr
    trans_a: int = 0
    trans_b: int = 0


@dataclass
class WgmmaCommit(Stmt):
    """`wgmma.commit_group.sync.aligned`: close the warpgroup's group of wgmmas."""


@dataclass
class WgmmaWait(Stmt):
    """`wgmma.wait_group.sync.aligned pending`: wait until at most `pending` wgmma groups of
    this warpgroup are in flight."""

    pending: int


# --------------------------------------------------------------------------------------
# Thread groups
# --------------------------------------------------------------------------------------


@dataclass
class NamedBarrier(Stmt):
    """`bar.sync id, threads`: the `threads` threads (a multiple of 32) that execute it with
    this `id` (1–15; 0 is `__syncthreads`) wait for each other. With `arrive`,
    `bar.arrive id, threads`: the threads count towards the barrier without waiting (a
    producer's signal; the ping-pong consumers' turn-taking, `lower/hopper.py`). `after`:
    registers whose values a sync waits for (ptxas moves register work across a bar.sync,
    which names none; a ping-pong turn's sync names the fragments its gemms read, so that
    the softmax making them stays before it: `lower/warp_roles.py`)."""

    id: int
    threads: int
    arrive: bool = False
    after: tuple = ()


@dataclass
class StMatrix(Stmt):
    """`stmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16` (sm_90): the warp stores `num`
    8x8 matrices of 16-bit elements. Lane 8j + r supplies the element offset (into
    `buffer`) of row r of matrix j, 16 contiguous bytes (only the first 8*num lanes'
    offsets are used); each lane's registers `src` (2*num, matrix j's pair at 2j, 2j+1)
    hold its elements in the fragment order of the catalogue entry (`MatrixInstr.tv`)."""

    src: list[Reg]
    num: int
    trans: bool
    buffer: str
    offset: Expr


@dataclass
class ClusterBarrier(Stmt):
    """`barrier.cluster.arrive.release` + `barrier.cluster.wait.acquire`: every thread of
    every CTA of the cluster (the whole block, outside `Roles`) waits for all the others.
    After mbarrier inits and `FenceBarrierInit` it makes them visible to the peers (remote
    arrives, multicast copies); before exit it keeps a CTA's shared memory alive while a
    peer may still write to it. In a kernel without a cluster it is a block barrier."""


@dataclass
class Role:
    """One branch of `Roles`: the threads where `cond` (warpgroup-uniform) run `body`.
    `max_registers` (a multiple of 8, 24–256) adjusts the role's register budget with
    `setmaxnreg.inc/dec` on entry (None: unchanged). `loc` is the user's source line (or
    the tile op the compiler derived the role from), for deadlock reports."""

    name: str
    cond: Expr
    body: list[Stmt]
    max_registers: int | None = None
    loc: str = ""


@dataclass
class Roles(Stmt):
    """The block splits into concurrently running roles (warp specialization): each thread
    runs the first role whose `cond` holds for it (or nothing). The roles meet only at
    mbarriers and named barriers; a `Barrier` (`__syncthreads`) inside a role is an error."""

    roles: list[Role] = field(default_factory=list)


ASYNC_STATEMENTS = (MBarrierInit, FenceBarrierInit, MBarrierArrive, MBarrierWait, TmaLoad,
                    TmaStore, PrefetchTensorMap, BulkCommit, BulkWait, FenceProxyAsync,
                    WgmmaFence, Wgmma, WgmmaCommit, WgmmaWait, NamedBarrier, ClusterBarrier,
                    StMatrix, Roles)
