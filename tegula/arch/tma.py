"""Hopper's asynchronous data movement and ordering: TMA boxes and the catalogue entries of
TMA copies, bulk groups, mbarriers, proxy fences, wgmma ordering, named barriers,
`setmaxnreg` and `elect.sync` (all `sm_90`; `setmaxnreg` `sm_90a`).

Where a TMA box lands (`tma_box_addresses`): the box (extents in tensor-map dim order,
dim 0 innermost) is written densely, dim 0 fastest, from the shared byte address `base`,
and then the swizzle mode permutes 16-byte chunks of the *absolute* byte addresses
(`tegula.arch.smem_matrix.swizzle_bytes_address` — the same function wgmma descriptors
read through). Rules, each refused with a TegulaError naming it:

* the inner box extent in bytes is a multiple of 16 (cuTensorMapEncodeTiled);
* with a swizzle, the inner box extent in bytes equals the swizzle span (the hardware
  allows fewer; tegula does not model that case, so does not emit it);
* `base` is 128-byte aligned, and aligned to the swizzle atom (1024 bytes for 128 B);
* every box extent is in 1 .. 256, rank 1 .. 5.

`tma_box_copy` is the load's numpy semantics (elements outside the tensor read as zero);
`tma_store_box` the store's (elements outside are not written); `tma_box_window` which
elements of a box lie inside the tensor (the reduce-add adds only those, each as
`TmaReduceInstr.execute` says). The emulator and the GPU tests share them.

PTX forms (PTX ISA "cp.async.bulk.tensor", "mbarrier", "fence.proxy", "wgmma.fence",
"bar.sync", "setmaxnreg", "elect.sync"); shared addresses are 32-bit shared-window
addresses ("r"), the tensor map a 64-bit generic address of the `__grid_constant__`
parameter ("l"), coordinates int32 ("r"), element coordinates in tensor-map dim order:

    cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes
        [dst], [tmap, {c0, c1}], [bar];             (load; .multicast::cluster adds a 16-bit CTA mask)
    cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [tmap, {c0, c1}], [src];   (store)
    cp.reduce.async.bulk.tensor.2d.global.shared::cta.add.tile.bulk_group [tmap, {c0, c1}], [src];
        (reduce-add: each element of the box is added atomically into the tensor; the
        element type is the map's, f32 only here; completes like a store, by bulk group)
    cp.async.bulk.commit_group;  cp.async.bulk.wait_group[.read] N;
    mbarrier.init.shared::cta.b64 [bar], count;
    mbarrier.arrive[.expect_tx].shared::cta.b64 _, [bar][, tx_bytes];
    mapa.shared::cluster.u32 R, bar, cta;  mbarrier.arrive.shared::cluster.b64 _, [R];
        (an arrive on the barrier at the same offset in CTA `cta` of the cluster)
    barrier.cluster.arrive.release.aligned;  barrier.cluster.wait.acquire.aligned;
    mbarrier.try_wait.parity.shared::cta.b64 P, [bar], parity;   (in a retry loop whose
        labels carry `%=`, unique per asm statement)
    fence.proxy.async.shared::cta;  fence.mbarrier_init.release.cluster;
    wgmma.fence.sync.aligned;  wgmma.commit_group.sync.aligned;  wgmma.wait_group.sync.aligned N;
    bar.sync id, threads;  bar.arrive id, threads;
    setmaxnreg.{inc,dec}.sync.aligned.u32 N;
    elect.sync _|P, 0xffffffff;

Timing numbers are approximate (issue 1 cycle per instruction; a TMA load's latency that of
a global load, ~ 500 cycles; an mbarrier poll ~ 20 cycles): the cost model ranks with them.
"""
from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Sequence

import numpy as np

from tegula.arch.instructions import AsmOperand, Instruction
from tegula.arch.smem_matrix import (  # noqa: F401  (re-exported: one definition)
    SWIZZLE_MODES, swizzle_atom_bytes, swizzle_bytes_address)
from tegula.dtypes import DType, f32
from tegula.errors import TegulaError

_SOURCE = ("PTX ISA cp.async.bulk.tensor / mbarrier / fence.proxy / bar / setmaxnreg; "
           "timing approximate (Luo et al. 2024)")

MAX_RANK = 5
MAX_BOX = 256
#: A TMA box's shared destination must be this aligned (more with a swizzle).
TMA_SMEM_ALIGN = 128


# --------------------------------------------------------------------------------------
# Where a box lands, and what it holds
# --------------------------------------------------------------------------------------


def check_tma_box(box: Sequence[int], dtype: DType, swizzle: int, base: int) -> None:
    """Raise a TegulaError naming the rule a TMA box of `dtype` elements with swizzle
    `swizzle`, written at shared byte address `base`, breaks (see module doc)."""
    box = tuple(int(b) for b in box)
    what = f"TMA box {box} of {dtype} with {swizzle}-byte swizzle at shared byte {base:#x}"
    if not 1 <= len(box) <= MAX_RANK or any(not 1 <= b <= MAX_BOX for b in box):
        raise TegulaError(f"{what}: a box has 1 to {MAX_RANK} dims of 1 to {MAX_BOX} elements")
    if swizzle not in SWIZZLE_MODES:
        raise TegulaError(f"{what}: swizzle must be one of {SWIZZLE_MODES}")
    inner = box[0] * dtype.bits // 8
    if (box[0] * dtype.bits) % 128:
        raise TegulaError(f"{what}: the inner box extent ({box[0]} elements) must be a multiple "
                          "of 16 bytes")
    if swizzle and inner != swizzle:
        raise TegulaError(f"{what}: the inner box extent is {inner} bytes; with a swizzle it "
                          f"must equal the swizzle span ({swizzle} bytes) — choose the "
                          "swizzle mode equal to the inner extent in bytes (32, 64, 128)")
    align = max(TMA_SMEM_ALIGN, swizzle_atom_bytes(swizzle))
    if base % align:
        raise TegulaError(f"{what}: the shared destination must be {align}-byte aligned "
                          "(128 bytes for TMA, the swizzle atom for a swizzled box)")


def tma_box_addresses(box: Sequence[int], dtype: DType, swizzle: int, base: int) -> np.ndarray:
    """The shared byte address of every element of a TMA box, as an int64 array of shape
    `reversed(box)` (numpy order: the last axis is tensor-map dim 0, the innermost)."""
    check_tma_box(box, dtype, swizzle, base)
    shape = tuple(reversed([int(b) for b in box]))
    dense = base + np.arange(prod(shape), dtype=np.int64).reshape(shape) * (dtype.bits // 8)
    return swizzle_bytes_address(dense, swizzle)


def _box_window(shape: Sequence[int], coords: Sequence[int], box: Sequence[int]):
    """(in-tensor slices of the global view, matching slices of the box), numpy order."""
    if len(coords) != len(box) or len(box) != len(shape):
        raise TegulaError(f"TMA copy: {len(coords)} coordinates and a box of rank {len(box)} "
                          f"for a tensor of rank {len(shape)}")
    g_slices, b_slices = [], []
    for extent, c, b in zip(reversed(list(shape)), reversed(list(coords)), reversed(list(box))):
        lo, hi = max(int(c), 0), min(int(c) + int(b), int(extent))
        if hi <= lo:
            return None
        g_slices.append(slice(lo, hi))
        b_slices.append(slice(lo - int(c), hi - int(c)))
    return tuple(g_slices), tuple(b_slices)


def tma_box_copy(global_view: np.ndarray, coords: Sequence[int],
                 box: Sequence[int]) -> np.ndarray:
    """The box a TMA load reads: `global_view` is the tensor in numpy order (its last axis is
    tensor-map dim 0), `coords` / `box` in tensor-map order (dim 0 first; coordinates may be
    negative or past the end). Returns an array of shape `reversed(box)`, zero where the box
    lies outside the tensor (the hardware's zero fill; the bytes still count as
    transferred)."""
    g = np.asarray(global_view)
    out = np.zeros(tuple(reversed([int(b) for b in box])), dtype=g.dtype)
    window = _box_window(g.shape[::-1], coords, box)
    if window is not None:
        out[window[1]] = g[window[0]]
    return out


def tma_box_window(shape: Sequence[int], coords: Sequence[int], box: Sequence[int]):
    """(slices of the tensor, matching slices of the box), both in numpy order, of the part
    of a box at `coords` (tensor-map order) inside a tensor of numpy `shape`; None if the
    box lies wholly outside."""
    return _box_window(tuple(shape)[::-1], coords, box)


def tma_store_box(global_view: np.ndarray, coords: Sequence[int], data: np.ndarray) -> None:
    """A TMA store: writes `data` (shape `reversed(box)`) into `global_view` at `coords`
    (tensor-map order), skipping elements outside the tensor."""
    box = data.shape[::-1]
    window = _box_window(global_view.shape[::-1], coords, box)
    if window is not None:
        global_view[window[0]] = data[window[1]]


# --------------------------------------------------------------------------------------
# Catalogue entries
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AsyncInstr(Instruction):
    """An asynchronous-copy, barrier, fence or register-budget instruction (Hopper).

    `kind` is the family ("tma.load", "tma.store", "tma.reduce", "tma.prefetch",
    "bulk.commit", "bulk.wait",
    "mbarrier.init", "mbarrier.arrive", "mbarrier.arrive_tx", "mbarrier.arrive_remote",
    "mbarrier.wait", "cluster.arrive", "cluster.wait",
    "fence.proxy_async", "fence.mbarrier_init", "wgmma.fence", "wgmma.commit",
    "wgmma.wait", "bar.named", "setmaxnreg", "elect"); `pipe` the unit that executes it
    ("tma", "sync", "alu"; `Instruction.pipe`); `rank` the tensor rank of a TMA copy (0
    otherwise)."""

    rank: int = 0
    multicast: bool = False

    def available_on(self, target) -> bool:
        if self.kind == "setmaxnreg" and target.arch_suffix != "a":
            return False  # setmaxnreg is sm_90a-specific
        return target.cc >= self.min_cc


def _entry(name: str, kind: str, template: str, operands: tuple[AsmOperand, ...] = (),
           pipe: str = "sync", latency: float = 1.0, min_cc: int = 90, ptx: str = "",
           clobbers_memory: bool = True, **extra) -> AsyncInstr:
    ptx = ptx or template.split(" ", 1)[0].rstrip(";")
    return AsyncInstr(name=name, kind=kind, ptx=ptx, template=template, operands=operands,
                      min_cc=min_cc, issue_cycles=1.0, latency_cycles=latency,
                      clobbers_memory=clobbers_memory, source=_SOURCE, pipe=pipe, **extra)


def _in(name: str, constraint: str = "r", count: int = 1, vector: bool = False) -> AsmOperand:
    return AsmOperand(name, "in", count, constraint, vector)


def _tma_load(rank: int, multicast: bool) -> AsyncInstr:
    mc = ".multicast::cluster" if multicast else ""
    ptx = (f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes"
           + mc)
    operands = (_in("dst"), _in("tmap", "l"), _in("coords", count=rank, vector=True),
                _in("bar")) + ((_in("mask", "h"),) if multicast else ())
    tail = ", {mask};" if multicast else ";"
    return _entry(f"tma.load.{rank}d" + (".multicast" if multicast else ""), "tma.load",
                  ptx + " [{dst}], [{tmap}, {coords}], [{bar}]" + tail, operands, pipe="tma",
                  latency=500.0, rank=rank, multicast=multicast)


def _tma_store(rank: int) -> AsyncInstr:
    ptx = f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group"
    operands = (_in("tmap", "l"), _in("coords", count=rank, vector=True), _in("src"))
    return _entry(f"tma.store.{rank}d", "tma.store", ptx + " [{tmap}, {coords}], [{src}];",
                  operands, pipe="tma", latency=500.0, rank=rank)


@dataclass(frozen=True)
class TmaReduceInstr(AsyncInstr):
    """`cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.add.tile.bulk_group` (PTX ISA
    8.0, sm_90): one thread adds a box of shared memory into the tensor the map describes,
    element by element and atomically per element (other blocks' adds and `red`s to the
    same elements interleave safely), elements outside the tensor skipped. Completion as a
    TMA store's: `cp.async.bulk.commit_group`, then `wait_group.read` before the shared
    box is written again and `wait_group` before the block exits. The shared data must be
    fenced (`fence.proxy.async.shared::cta`) after the threads wrote it. `dtype`: the
    element type tegula issues it for (the map's: f32; other types add with
    `red.global`)."""

    dtype: DType = f32

    def execute(self, old, v) -> np.ndarray:
        """The new memory values from `old` and the added `v`: the f32 sum rounded to
        nearest even, subnormal operands and results kept (measured on the H100, session
        11 round 1: tiny/4 + 0, tiny/16 + tiny/8, 1.5 tiny - tiny/2 all exact), where
        `red.global.add.f32` flushes them (`arch/memory.py`)."""
        old, v = np.asarray(old, np.float32), np.asarray(v, np.float32)
        with np.errstate(all="ignore"):
            return (old + v).astype(np.float32)


def _tma_reduce_add(rank: int) -> TmaReduceInstr:
    ptx = f"cp.reduce.async.bulk.tensor.{rank}d.global.shared::cta.add.tile.bulk_group"
    operands = (_in("tmap", "l"), _in("coords", count=rank, vector=True), _in("src"))
    return TmaReduceInstr(
        name=f"tma.reduce.add.{rank}d", kind="tma.reduce", ptx=ptx,
        template=ptx + " [{tmap}, {coords}], [{src}];", operands=operands, min_cc=90,
        issue_cycles=1.0, latency_cycles=500.0, clobbers_memory=True, source=_SOURCE,
        pipe="tma", rank=rank)


#: try_wait in a retry loop; `%=` makes the labels unique per asm statement.
_WAIT_LOOP = ("{{ .reg .pred P; WAIT_%=: mbarrier.try_wait.parity.shared::cta.b64 P, [{bar}], "
              "{parity}; @P bra DONE_%=; bra WAIT_%=; DONE_%=: }}")

#: An arrive on the mbarrier at the same shared offset in CTA `cta` of the cluster (`mapa`
#: turns the local address into that CTA's), with the default semantics (release at CTA
#: scope, as CUTLASS's ClusterBarrier::arrive): what it orders, a stage's wgmma reads, is
#: complete before it (their wait_group retired them), and the peer refills the stage only
#: after seeing it. `.release.cluster` compiles to a MEMBAR.ALL.GPU before every arrive
#: (seen in ptxas's SASS), far too slow for a release per K step.
_REMOTE_ARRIVE = ("{{ .reg .b32 R; mapa.shared::cluster.u32 R, {bar}, {cta}; "
                  "mbarrier.arrive.shared::cluster.b64 _, [R]; }}")

ASYNC_INSTRUCTIONS: tuple[AsyncInstr, ...] = (
    *[_tma_load(r, False) for r in range(1, MAX_RANK + 1)],
    *[_tma_load(r, True) for r in range(1, MAX_RANK + 1)],
    *[_tma_store(r) for r in range(1, MAX_RANK + 1)],
    *[_tma_reduce_add(r) for r in range(1, MAX_RANK + 1)],
    # A hint: the descriptor (a generic address of the __grid_constant__ parameter) is
    # fetched into the SM's descriptor cache before the first copy needs it.
    _entry("prefetch.tensormap", "tma.prefetch", "prefetch.tensormap [{tmap}];",
           (_in("tmap", "l"),), pipe="tma", latency=1.0),
    _entry("cp.async.bulk.commit_group", "bulk.commit", "cp.async.bulk.commit_group;"),
    _entry("mbarrier.init", "mbarrier.init", "mbarrier.init.shared::cta.b64 [{bar}], {count};",
           (_in("bar"), _in("count"))),
    _entry("mbarrier.arrive", "mbarrier.arrive", "mbarrier.arrive.shared::cta.b64 _, [{bar}];",
           (_in("bar"),), latency=20.0),
    _entry("mbarrier.arrive.expect_tx", "mbarrier.arrive_tx",
           "mbarrier.arrive.expect_tx.shared::cta.b64 _, [{bar}], {tx};",
           (_in("bar"), _in("tx")), latency=20.0),
    _entry("mbarrier.arrive.shared::cluster", "mbarrier.arrive_remote", _REMOTE_ARRIVE,
           (_in("bar"), _in("cta")), latency=100.0, ptx="mbarrier.arrive.shared::cluster"),
    _entry("barrier.cluster.arrive", "cluster.arrive", "barrier.cluster.arrive.release.aligned;",
           latency=20.0),
    _entry("barrier.cluster.wait", "cluster.wait", "barrier.cluster.wait.acquire.aligned;",
           latency=200.0),
    _entry("mbarrier.try_wait.parity", "mbarrier.wait", _WAIT_LOOP,
           (_in("bar"), _in("parity")), latency=20.0,
           ptx="mbarrier.try_wait.parity.shared::cta.b64"),
    _entry("fence.proxy.async.shared::cta", "fence.proxy_async",
           "fence.proxy.async.shared::cta;"),
    _entry("fence.mbarrier_init.release.cluster", "fence.mbarrier_init",
           "fence.mbarrier_init.release.cluster;"),
    _entry("wgmma.fence", "wgmma.fence", "wgmma.fence.sync.aligned;", pipe="tensor"),
    _entry("wgmma.commit_group", "wgmma.commit", "wgmma.commit_group.sync.aligned;",
           pipe="tensor"),
    _entry("bar.sync", "bar.named", "bar.sync {id}, {threads};", (_in("id"), _in("threads")),
           latency=20.0, min_cc=70),
    # bar.sync whose barrier id waits for register values: ptxas moves register work
    # across a bar.sync (it names no register), so a ping-pong turn's sync carries a data
    # dependency on the operands its gemms read (`lower/warp_roles.py`): min.u32 with 0
    # is 0 for any `after`, which ptxas does not fold.
    _entry("bar.sync.after", "bar.named",
           "{{ .reg .u32 t; min.u32 t, {after}, 0; add.u32 t, t, {id}; bar.sync t, {threads}; }}",
           (_in("id"), _in("threads"), _in("after")), latency=20.0, min_cc=70,
           ptx="bar.sync"),
    _entry("bar.arrive", "bar.named", "bar.arrive {id}, {threads};",
           (_in("id"), _in("threads")), min_cc=70),
    _entry("elect.sync", "elect",
           "{{ .reg .pred P; elect.sync _|P, 0xffffffff; selp.u32 {d}, 1, 0, P; }}",
           (AsmOperand("d", "out", 1, "r"),), pipe="alu", ptx="elect.sync",
           clobbers_memory=False),  # touches no memory: loads may move across it
)
_ASYNC_BY_NAME = {i.name: i for i in ASYNC_INSTRUCTIONS}


def bulk_wait(pending: int, read: bool = False) -> AsyncInstr:
    """`cp.async.bulk.wait_group[.read] N`: at most `pending` bulk groups stay in flight
    (`read`: only until their shared-memory reads are done)."""
    if not isinstance(pending, int) or not 0 <= pending <= 63:
        raise TegulaError(f"cp.async.bulk.wait_group: pending {pending!r} must be 0..63")
    r = ".read" if read else ""
    return _entry(f"cp.async.bulk.wait_group{r}.{pending}", "bulk.wait",
                  f"cp.async.bulk.wait_group{r} {pending};", latency=500.0)


def wgmma_wait(pending: int) -> AsyncInstr:
    """`wgmma.wait_group.sync.aligned N`: at most `pending` wgmma groups stay in flight."""
    if not isinstance(pending, int) or not 0 <= pending <= 7:
        raise TegulaError(f"wgmma.wait_group: pending {pending!r} must be 0..7")
    return _entry(f"wgmma.wait_group.{pending}", "wgmma.wait",
                  f"wgmma.wait_group.sync.aligned {pending};", pipe="tensor")


def setmaxnreg(registers: int, increase: bool) -> AsyncInstr:
    """`setmaxnreg.{inc,dec}.sync.aligned.u32 N` (sm_90a): the warpgroup's per-thread
    register budget becomes N (a multiple of 8 in 24..256)."""
    if not isinstance(registers, int) or registers % 8 or not 24 <= registers <= 256:
        raise TegulaError(f"setmaxnreg: {registers!r} registers must be a multiple of 8 in "
                          "24..256")
    op = "inc" if increase else "dec"
    return _entry(f"setmaxnreg.{op}.{registers}", "setmaxnreg",
                  f"setmaxnreg.{op}.sync.aligned.u32 {registers};", pipe="alu")


def register_share(threads: int) -> int:
    """Registers per thread ptxas allocates to a block of `threads` alone on an SM (65536 /
    threads, a multiple of 8, at most 255): what `__launch_bounds__(threads, 1)` gives a
    kernel that uses `setmaxnreg`, and so the budget `setmaxnreg` increases or decreases
    from (codegen picks `.inc`/`.dec` by it; synthesis sizes warp-role budgets with it)."""
    return min(255, 65536 // threads) // 8 * 8


def tma_load(rank: int, multicast: bool = False) -> AsyncInstr:
    """The TMA load entry of tensor rank `rank` (1..5)."""
    return get_async(f"tma.load.{rank}d" + (".multicast" if multicast else ""))


def tma_store(rank: int) -> AsyncInstr:
    """The TMA store entry of tensor rank `rank` (1..5)."""
    return get_async(f"tma.store.{rank}d")


def tma_reduce_add(rank: int) -> TmaReduceInstr:
    """The TMA reduce-add entry (f32) of tensor rank `rank` (1..5)."""
    return get_async(f"tma.reduce.add.{rank}d")


def get_async(name: str) -> AsyncInstr:
    """The entry called `name` (also ``cp.async.bulk.wait_group[.read].N``,
    ``wgmma.wait_group.N``, ``setmaxnreg.{inc,dec}.N``)."""
    found = _ASYNC_BY_NAME.get(name)
    if found is not None:
        return found
    head, _, last = name.rpartition(".")
    if last.isdigit():
        if head in ("cp.async.bulk.wait_group", "cp.async.bulk.wait_group.read"):
            return bulk_wait(int(last), head.endswith(".read"))
        if head == "wgmma.wait_group":
            return wgmma_wait(int(last))
        if head in ("setmaxnreg.inc", "setmaxnreg.dec"):
            return setmaxnreg(int(last), head.endswith("inc"))
    raise TegulaError(f"no asynchronous instruction {name!r} in the catalogue")


__all__ = [
    "MAX_RANK", "MAX_BOX", "TMA_SMEM_ALIGN", "check_tma_box", "tma_box_addresses",
    "tma_box_copy", "tma_box_window", "tma_store_box", "AsyncInstr", "TmaReduceInstr",
    "tma_reduce_add", "ASYNC_INSTRUCTIONS", "bulk_wait",
    "wgmma_wait", "setmaxnreg", "tma_load", "tma_store", "get_async",
    "swizzle_bytes_address", "swizzle_atom_bytes", "SWIZZLE_MODES",
]
