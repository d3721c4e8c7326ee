"""Copies between global memory and registers or shared memory: vector widths.

A global access of `w` elements per lane is one instruction when the `w` elements are
consecutive in memory and `w * elem_bytes` aligned. Consecutive: the tile dim being
walked must be the tensor's contiguous dim with step 1, and the thread's registers must
hold `w` consecutive elements along it. Aligned: the data pointer, every other stride,
and the tile origin along that dim must be multiples of `w`. And since a vector is
predicated as a whole, the extent along that dim must be a multiple of `w` too (so a
boundary vector is wholly in or out). The facts come from `synth.facts`.

On sm_90a a copy into a wgmma operand buffer that a `tg.pipeline` runs ahead may instead be
one TMA box per stage (`plan_tma_copy`): the facts must prove what `cuTensorMapEncodeTiled`
requires (contiguous dim walked by the tile's last dim, 16-byte aligned base and strides,
box extents at most 256), and the fill must be +0, the only one TMA writes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from tegula.ir.ops import ForLoop, IfThen
from tegula.ir.scalar import (BlockIndex, GridSize, LoopIndex, ScalarArg, ScalarBinOp,
                              ScalarConst, ScalarLoad, SMCount, TensorExtent)
from tegula.ir.values import GlobalTile
from tegula.layout.cute import Layout
from tegula.synth.facts import MAX_DIVISOR, TensorFacts
from tegula.layout.tv import tv_coords, tv_table


def scalar_divisor(x, facts: dict) -> int:
    """A power of two (≤ 16) known to divide the block-uniform scalar `x`."""
    if isinstance(x, int):
        return _pow2_divisor(x)
    if isinstance(x, ScalarConst):
        return _pow2_divisor(x.value)
    if isinstance(x, TensorExtent):
        return facts[x.tensor].extent_divisors[x.dim] if x.tensor in facts else 1
    if isinstance(x, (BlockIndex, LoopIndex, ScalarArg)):
        return 1
    if isinstance(x, ScalarBinOp):
        a, b = scalar_divisor(x.lhs, facts), scalar_divisor(x.rhs, facts)
        if x.op == "*":
            return min(MAX_DIVISOR, a * b)
        if x.op in ("+", "-"):
            return math.gcd(a, b)
    return 1


def _pow2_divisor(v: int) -> int:
    d = 1
    while d < MAX_DIVISOR and v % (2 * d) == 0:
        d *= 2
    return d


def contiguous_tile_dim(view: GlobalTile, facts: TensorFacts) -> int | None:
    """The tile dim that walks the tensor's contiguous dim with step 1, if any."""
    if facts.contiguous_dim is None:
        return None
    for k, dim in enumerate(view.dims):
        if dim.tensor_dim == facts.contiguous_dim and dim.step == 1:
            return k
    return None


def global_vector_limit(view: GlobalTile, facts: dict,
                        allow_tail: bool = False) -> tuple[int | None, int]:
    """(tile dim, largest vector in elements) that the tensor's facts allow for `view`,
    before looking at how registers are distributed. With `allow_tail` the extent along
    the contiguous dim need not be a multiple of the vector: lowering then splits the one
    vector that straddles the edge into predicated elements (see `needs_tail`)."""
    tensor_facts = facts[view.arg.name]
    k = contiguous_tile_dim(view, tensor_facts)
    bits = view.arg.dtype.bits
    if k is None:
        return None, 1
    c = tensor_facts.contiguous_dim
    limit = 128 // bits
    limit = min(limit, tensor_facts.align_bytes * 8 // bits)
    divisors = [scalar_divisor(view.origin[c], facts)]
    # A slice's bound along the contiguous dim (`a[:, :n]`) must not cut a vector: the
    # vector's predicate is its first element's.
    divisors += [scalar_divisor(upper, facts) for d, upper in view.limits if d == c]
    if not allow_tail:
        divisors.append(tensor_facts.extent_divisors[c])
    divisors += [tensor_facts.stride_divisors[d] for d in range(tensor_facts.rank) if d != c]
    divisors += [scalar_divisor(dim.step, facts) for j, dim in enumerate(view.dims)
                 if j != k and dim.tensor_dim == c]
    extent = view.dims[k].extent
    divisors.append(_pow2_divisor(extent) if isinstance(extent, int) else 1)
    for d in divisors:
        limit = math.gcd(limit, d)
    return k, max(1, limit)


def register_run_length(tv: Layout, shape: tuple, dim: int, cap: int) -> int:
    """Largest power-of-two w ≤ cap such that registers v0..v0+w-1 (v0 a multiple of w) of
    every thread hold consecutive elements along `dim`, starting at a multiple of w."""
    coords = tv_coords(tv, shape)
    values = coords.shape[1]
    w = cap
    while w > 1:
        if values % w == 0:
            grouped = coords.reshape(coords.shape[0], values // w, w, len(shape))
            step = np.zeros(len(shape), dtype=np.int64)
            step[dim] = 1
            expected = grouped[:, :, :1, :] + np.arange(w)[:, None] * step
            if np.array_equal(grouped, expected) and np.all(grouped[:, :, 0, dim] % w == 0):
                return w
        w //= 2
    return 1


def needs_tail(view: GlobalTile, facts: dict, width: int) -> bool:
    """True if vectors of `width` along the contiguous dim may straddle the tensor's edge
    (its extent is not known to be a multiple of `width`)."""
    tensor_facts = facts[view.arg.name]
    c = tensor_facts.contiguous_dim
    return (width > 1 and c is not None and view.arg.dtype.bits >= 8
            and tensor_facts.extent_divisors[c] % width != 0)


def global_access_vector(view: GlobalTile, tv: Layout, facts: dict) -> tuple[int | None, int]:
    """(tile dim, vector width) for moving a register tile with layout `tv` to/from `view`
    (vectors may straddle the edge: check `needs_tail`)."""
    # Packed 4-bit elements cannot be moved one by one (half a byte), so no tails for them.
    k, limit = global_vector_limit(view, facts, allow_tail=view.arg.dtype.bits >= 8)
    if k is None:
        return None, 1
    return k, register_run_length(tv, tuple(view.shape), k, limit)


# --------------------------------------------------------------------------------------
# TMA (sm_90a): one thread copies a whole box global -> shared, zero-filling past the edge
# --------------------------------------------------------------------------------------

TMA_MAX_BOX = 256
TMA_ALIGN_BYTES = 16
TMA_MAX_RANK = 5


@dataclass(frozen=True)
class TmaPlan:
    """A copy global -> shared done by TMA: the tensor map's dims (tensor dims, innermost
    = the contiguous one first), the box extent per map dim (the shared tile's extents
    along the dims the view walks, 1 elsewhere), the swizzle in bytes of the destination
    buffer, and `box_bytes` (what the copy completes on its mbarrier, out-of-bounds
    elements included, all its boxes). A tile whose contiguous dim is wider than one
    swizzle span is `blocks` boxes of one span each (`box[0]` elements), box b reading
    columns b * box[0] … and landing b boxes further in the buffer (the canonical wgmma
    buffer's column blocks, `synth/gemm.operand_layout`)."""

    dims: tuple
    box: tuple
    swizzle: int
    box_bytes: int
    blocks: int = 1


def plan_tma_copy(op, facts: dict, swizzle: int,
                  row_major: bool = False) -> tuple[TmaPlan | None, str]:
    """(TmaPlan, "") if the copy global -> shared `op` can be one TMA box per stage under
    the specialization facts, else (None, why not). The destination buffer holds the
    tile row-major (its last dim contiguous) under `swizzle`, which is how TMA writes a
    box whose first map dim is the tensor's contiguous dim.

    A wgmma operand buffer is column blocks of one swizzle span each (`blocks` boxes);
    `row_major` (a stage the kernel pinned to its tile's plain row-major order, no
    swizzle) is one box of whole rows: boxes one 16-byte span wide would land dense,
    block after block, where the pinned rows have a pitch of the whole contiguous extent
    (the silent wrong result of an (8, 256) f16 stage read as 32 boxes of 8x8)."""
    view, tile = op.src, op.dst
    name = view.arg.name
    tensor_facts = facts[name]
    eb = view.dtype.bits // 8
    if not (isinstance(op.fill, (int, float)) and op.fill == 0
            and math.copysign(1.0, op.fill) > 0):
        return None, f"its fill {op.fill!r} is not +0 (TMA fills out-of-bounds elements with zeros)"
    if view.dtype.bits % 8:
        return None, f"{view.dtype} elements are narrower than a byte"
    if view.limits:
        return None, (f"the view of {name} is narrowed by a slice (TMA bounds a box only at "
                      f"the tensor's extents)")
    if tile.permutation and tuple(tile.permutation) != tuple(range(len(tile.shape))):
        return None, "the destination is a transposed view of its buffer"
    if tensor_facts.rank > TMA_MAX_RANK:
        return None, f"{name} has rank {tensor_facts.rank} (TMA: at most {TMA_MAX_RANK})"
    c = tensor_facts.contiguous_dim
    if c is None:
        return None, f"{name} has no contiguous dim"
    walked = [dim.tensor_dim for dim in view.dims]
    if any(dim.step != 1 for dim in view.dims) or len(set(walked)) != len(walked):
        return None, f"the view of {name} steps over elements or repeats a dim"
    if walked[-1] != c:
        return None, (f"the destination's contiguous (last) dim walks dim {walked[-1]} of "
                      f"{name}, not its contiguous dim {c}")
    if tensor_facts.align_bytes < TMA_ALIGN_BYTES:
        return None, f"{name}'s data pointer is only known {tensor_facts.align_bytes}-byte aligned"
    for d in range(tensor_facts.rank):
        if d != c and (tensor_facts.stride_divisors[d] * eb) % TMA_ALIGN_BYTES:
            return None, (f"{name}'s stride along dim {d} is not known to be a multiple of "
                          f"{TMA_ALIGN_BYTES} bytes")
    if any(not isinstance(x, int) or x > TMA_MAX_BOX for x in tile.shape):
        return None, f"a box extent of {tuple(tile.shape)} exceeds {TMA_MAX_BOX}"
    # Map dims: the contiguous dim first, then the view's other dims from the shared tile's
    # fastest to slowest, then the dims the view does not walk (box extent 1).
    order = list(reversed(walked)) + [d for d in reversed(range(tensor_facts.rank))
                                      if d not in walked]
    extent_of = {dim.tensor_dim: dim.extent for dim in view.dims}
    box = tuple(extent_of.get(d, 1) for d in order)
    box_bytes = int(np.prod(box)) * eb
    width = max(swizzle, 16) // eb  # one block of the buffer along its contiguous dim
    if row_major:
        if swizzle or (box[0] * eb) % TMA_ALIGN_BYTES:
            return None, (f"the tile's contiguous extent {box[0]} is not a multiple of "
                          f"{TMA_ALIGN_BYTES} bytes (an unswizzled TMA box's row)")
        width = box[0]  # the whole row: the box lands exactly in the pinned order
    if box[0] % width:
        return None, (f"the tile's contiguous extent {box[0]} is not a multiple of its "
                      f"buffer's {width}-element swizzle block")
    blocks = box[0] // width
    return TmaPlan(tuple(order), (width,) + box[1:], swizzle, box_bytes, blocks), ""


# --------------------------------------------------------------------------------------
# A TMA ring inside other run-time loops (a persistent kernel's tile loop)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class RingPlan:
    """The mbarrier ring of a TMA pipeline that runs once per iteration of the run-time
    loops around it (`enclosing`, outermost first; e.g. a persistent kernel's tile loop).
    The ring is never reset: its *use count* runs on across the enclosing iterations,
    `count = J * trips + (k - start)` for iteration k of the pipeline in the J-th run
    (J the flattened index of the enclosing iterations, `trips` the pipeline's trip
    count, the same in every run). Stage `count % S`, phase parity `count // S % 2`, so
    the producer can fill the next run's first stages while the consumer still finishes
    the current one (`lower/hopper.py`)."""

    enclosing: tuple
    kind = "nested_ring"  # what lowering dispatches on (lowering does not import synthesis)

    def describe(self) -> str:
        lines = ", ".join(f"line {loop.loc.lineno}" if loop.loc else loop.var.name
                          for loop in self.enclosing)
        return (f"the ring runs across the enclosing loop{'s' if len(self.enclosing) > 1 else ''}"
                f" ({lines}): stage and phase from a use count that continues from one run "
                f"of the pipeline to the next")


def plan_nested_ring(body: list, loop, wgmma_reads_only: bool) -> tuple[RingPlan | None, str]:
    """(RingPlan, "") if the TMA pipeline `loop`, inside other run-time loops of the kernel
    `body`, can keep one ring across their iterations, else (None, why not).

    The count must be computable from the loop indices alone: every run of the pipeline
    happens (no `tg.if_` between the outermost enclosing loop and it), and the trip counts
    of the pipeline and of the enclosing loops inside the outermost do not depend on an
    enclosing loop's index. The stage is then a function of the count rather than of the
    pipeline's index, which lowering applies to the gemms' descriptors: the body's only
    reads of its stages must be wgmma gemm operands (`wgmma_reads_only`; the blockwise FP8
    GEMM also scales and adds a fresh product per K block)."""
    path = enclosing_ops(body, loop) or []
    first_loop = next((i for i, op in enumerate(path) if _is_loop(op)), len(path))
    inner = path[first_loop:]
    if any(not _is_loop(op) for op in inner):
        return None, ("the pipeline is inside a tg.if_ within another run-time loop (the "
                      "ring's running count would skip the runs the branch leaves out)")
    indices = {op.var.name for op in inner}
    for op in inner[1:] + [loop]:
        used = _loop_indices(op.start) | _loop_indices(op.stop)
        if used & indices:
            what = "the pipeline's" if op is loop else f"the loop at line {op.loc.lineno}'s"
            return None, (f"{what} trip count depends on the index of an enclosing loop "
                          f"({', '.join(sorted(used & indices))}), so the ring's running "
                          f"count across the enclosing loop is not known")
    if not wgmma_reads_only:
        return None, ("the pipeline is inside another run-time loop and something other "
                      "than a wgmma gemm reads its staged tiles (the ring's running stage is "
                      "applied to wgmma descriptors only)")
    return RingPlan(tuple(inner)), ""


def cluster_uniform(x, cluster: tuple, loops: dict) -> bool:
    """True if the block-uniform scalar `x` is provably the same in every block of one
    thread-block cluster of `cluster` blocks (x, y, z): it reads no block index along an
    axis the cluster spans except as `tg.block_id(a) // c` with c a multiple of the
    cluster's extent there (the cluster's index), and the loops whose indices it reads
    (`loops`: index name -> ForLoop) have such bounds too."""
    if isinstance(x, (int, ScalarConst, ScalarArg, TensorExtent, GridSize, SMCount)):
        return True
    if isinstance(x, BlockIndex):
        return cluster[x.axis] == 1
    if isinstance(x, LoopIndex):
        loop = loops.get(x.name)
        return loop is not None and all(cluster_uniform(b, cluster, loops)
                                        for b in (loop.start, loop.stop))
    if isinstance(x, ScalarLoad):
        return all(cluster_uniform(c, cluster, loops) for c in x.coords)
    if isinstance(x, ScalarBinOp):
        if x.op == "//" and isinstance(x.lhs, BlockIndex) and isinstance(x.rhs, ScalarConst) \
                and x.rhs.value > 0 and x.rhs.value % cluster[x.lhs.axis] == 0:
            return True  # blocks c*k .. c*k+c-1 of a cluster along the axis: the same k
        return cluster_uniform(x.lhs, cluster, loops) and cluster_uniform(x.rhs, cluster, loops)
    return False


def enclosing_ops(ops: list, target) -> list | None:
    """The loops and branches around `target` in `ops`, outermost first (None if absent)."""
    for op in ops:
        if op is target:
            return []
        for body in _bodies(op):
            inside = enclosing_ops(body, target)
            if inside is not None:
                return [op] + inside
    return None


def _bodies(op) -> list:
    if isinstance(op, ForLoop):
        return [op.body]
    if isinstance(op, IfThen):
        return [op.then, op.otherwise]
    return []


def _is_loop(op) -> bool:
    return isinstance(op, ForLoop)


def _loop_indices(x) -> set:
    """Names of the loop indices a kernel scalar reads."""
    if isinstance(x, LoopIndex):
        return {x.name}
    if isinstance(x, ScalarBinOp):
        return _loop_indices(x.lhs) | _loop_indices(x.rhs)
    if isinstance(x, ScalarLoad):
        return set().union(*(_loop_indices(c) for c in x.coords))
    return set()


# --------------------------------------------------------------------------------------
# TMA-store epilogue (sm_90a, persistent kernels)
# --------------------------------------------------------------------------------------

#: Bytes kept free after the staging buffer for lowering's mbarriers.
_MBARRIER_HEADROOM = 256


@dataclass(frozen=True)
class TmaStorePlan:
    """A register tile -> global copy done through shared memory and TMA: the threads store
    their values into a staging buffer of `boxes` swizzled boxes (`inner` elements of the
    contiguous dim by `rows`, `swizzle` = the inner bytes, each box's rows one swizzle
    span), fence them for the async proxy, and one thread issues a TMA store per box,
    which writes only the elements inside the tensor. `offset`: the staging buffer's byte
    offset in shared memory (aligned to 1024, after the kernel's buffers)."""

    dims: tuple          # tensor-map dims, the contiguous one first
    rows: int
    inner: int
    boxes: int
    swizzle: int
    offset: int
    elem_bytes: int
    vector: int          # registers per st.shared (consecutive along the contiguous dim)
    slots: int           # boxes the staging buffer holds (a divisor of `boxes`)
    stmatrix: bool = False  # each 8 registers one stmatrix.x4 (else `vector`-wide st.shared)
    #: Staging buffers, back to back: one per ping-pong consumer warpgroup (each stores its
    #: own tiles at its own time, `lower/hopper.py` `consumer_group`), else 1.
    copies: int = 1
    #: "add": a `tg.atomic_add` whose boxes are added into the tensor (`tma.reduce.add`
    #: entries, `plan_bulk_adds`) instead of stored; "" a store.
    reduce: str = ""

    @property
    def box(self) -> tuple:
        """Box extents in map order: the tile's columns and rows, 1 in the dims after
        (those of a higher-rank tensor the view does not walk)."""
        return (self.inner, self.rows) + (1,) * (len(self.dims) - 2)

    @property
    def box_bytes(self) -> int:
        return self.rows * self.inner * self.elem_bytes

    @property
    def bytes(self) -> int:
        """One staging buffer's bytes (there are `copies` of them from `offset`)."""
        return self.slots * self.box_bytes

    def describe(self) -> str:
        rounds = self.boxes // self.slots
        where = (f"{self.bytes} B at byte {self.offset}" if self.copies == 1 else
                 f"{self.bytes} B per consumer warpgroup ({self.copies} buffers) from byte "
                 f"{self.offset}")
        what = ("atomic add" if self.reduce else "epilogue") + " through shared memory"
        issue = ("TMA reduce-add (cp.reduce.async.bulk.tensor .add)" if self.reduce
                 else "TMA store")
        return (f"{what}: {self.boxes} swizzled {self.rows}x"
                f"{self.inner} box{'es' if self.boxes > 1 else ''} ({self.swizzle} B swizzle) "
                f"staged {self.slots} at a time in {where} "
                f"({rounds} round{'s' if rounds > 1 else ''} of {self.shared_store}, "
                f"fence.proxy.async, {issue} clipped at the tensor's edge)")

    @property
    def shared_store(self) -> str:
        return "stmatrix.x4" if self.stmatrix else "st.shared"

    def staging_offset(self, row, col):
        """The staging buffer's element offset of tile element (row, col): box b of the
        tile in slot b % slots, the box's rows one swizzle span each, swizzled. On numpy
        arrays (synthesis) and thread-IR expressions (lowering) alike."""
        from tegula.arch.smem_matrix import swizzle_bytes_address
        within = (row * self.inner + col % self.inner) * self.elem_bytes  # bytes into the box
        slot = (col // self.inner) % self.slots
        return slot * (self.rows * self.inner) + \
            swizzle_bytes_address(within, self.swizzle) // self.elem_bytes

    def offsets(self, tile) -> np.ndarray:
        """`staging_offset` of each (thread, register) of register tile `tile`."""
        coords = tv_coords(tile.layout, tuple(tile.shape))
        return self.staging_offset(coords[..., 0], coords[..., 1])


def plan_tma_store(op, facts: dict, shared_end: int, limit: int, copies: int = 1,
                   bulk_add: bool = False) -> tuple:
    """(TmaStorePlan, "") if the copy register tile -> global `op` can go through a
    swizzled staging buffer (`copies` of them, back to back) and TMA stores, with the
    buffers placed at `shared_end` under the block's shared-memory `limit`; else (None,
    why not). `bulk_add` (a `tg.atomic_add`, `plan_bulk_adds`): the tensor may have more
    than 2 dims (a 2-D tile of it, the other dims fixed by the view's origin: boxes of
    extent 1 there), and a layout whose registers hold elements of different boxes in
    different threads is staged in one round of all its boxes."""
    tile, view = op.src, op.dst
    name, eb = view.arg.name, view.dtype.bits // 8
    tensor_facts = facts[name]
    c = tensor_facts.contiguous_dim
    if view.dtype.bits not in (16, 32) or tile.dtype != view.dtype:
        return None, "only 16- and 32-bit tiles of the tensor's type are staged"
    rank_ok = 2 <= tensor_facts.rank <= TMA_MAX_RANK if bulk_add else tensor_facts.rank == 2
    if len(tile.shape) != 2 or not rank_ok or view.limits:
        return None, f"the view of {name} is not a whole 2-D tile"
    walked = [dim.tensor_dim for dim in view.dims]
    if c is None or len(walked) != 2 or walked[1] != c or walked[0] == c \
            or any(dim.step != 1 for dim in view.dims):
        return None, f"the tile's last dim does not walk {name}'s contiguous dim"
    if tensor_facts.align_bytes < TMA_ALIGN_BYTES or any(
            (tensor_facts.stride_divisors[d] * eb) % TMA_ALIGN_BYTES
            for d in range(tensor_facts.rank) if d != c):
        return None, f"{name} is not known 16-byte aligned with 16-byte strides"
    held = tv_table(tile.layout).ravel()
    if held.size != int(np.prod(tile.shape)) or np.unique(held).size != held.size:
        return None, "the register tile's layout holds some elements twice (or not at all)"
    rows, cols = tile.shape
    inner = min(cols, 128 // eb)
    # Rows in multiples of 8: every box starts on a swizzle atom (8 rows of one span).
    if rows > TMA_MAX_BOX or rows % 8 or cols % inner or inner * eb not in (32, 64, 128):
        return None, f"a {rows}x{cols} tile does not split into swizzled boxes"
    # Each register's box must be the same for every thread, so a round of boxes is a
    # fixed set of registers.
    box_of = tv_coords(tile.layout, tuple(tile.shape))[:, :, 1] // inner
    mixed = not (box_of == box_of[:1]).all()
    if mixed and not bulk_add:
        return None, "a register holds elements of different boxes in different threads"
    offset = -(-shared_end // 1024) * 1024
    boxes, box_bytes = cols // inner, rows * inner * eb
    room = (limit - _MBARRIER_HEADROOM - offset) // (box_bytes * copies)
    slots = max([d for d in range(1, boxes + 1) if boxes % d == 0 and d <= room], default=0)
    if mixed and slots < boxes:  # rounds are sets of registers: all boxes in one
        return None, (f"a register holds elements of different boxes in different "
                      f"threads, and the {boxes} boxes ({boxes * box_bytes} B) do not fit "
                      f"the shared memory left ({limit - shared_end} B) in one round")
    if not slots:
        return None, (f"a {box_bytes} B staging box does not fit the shared memory left "
                      f"({limit - shared_end} B)")
    vector = register_run_length(tile.layout, tuple(tile.shape), 1, 16 // eb)
    dims = (c, walked[0]) + tuple(d for d in reversed(range(tensor_facts.rank))
                                  if d not in walked)
    plan = TmaStorePlan(dims, rows, inner, boxes, inner * eb, offset, eb, vector, slots,
                        copies=copies)
    return replace(plan, stmatrix=_stmatrix_fits(tile, plan)), ""


def _stmatrix_fits(tile, plan: TmaStorePlan) -> bool:
    """True if every 8 consecutive registers of the (16-bit) tile are one stmatrix.x4's
    fragment (the catalogue entry's TV layout) whose 8-element rows are 16 contiguous,
    aligned bytes of the staging buffer, and all in one round of boxes (sm_90: the entry's
    target is checked where it is emitted)."""
    from tegula.synth.shared import _ldmatrix_row_addresses  # stmatrix's fragment is ldmatrix's
    if plan.elem_bytes != 2 or tile.layout[1].size % 8:
        return False
    offsets = plan.offsets(tile)
    threads, values = offsets.shape
    if threads % 32 or _ldmatrix_row_addresses(offsets.reshape(threads // 32, 32, values),
                                                4, False) is None:
        return False
    rounds = tv_coords(tile.layout, tuple(tile.shape))[..., 1] // plan.inner // plan.slots
    grouped = rounds.reshape(threads, values // 8, 8)
    return bool((grouped == grouped[:, :, :1]).all())


def plan_tma_stores(kernel, facts: dict, shared_end: int, limit: int) -> int:
    """Stage the register -> global copies of a persistent TMA kernel (one whose TMA ring
    runs across an enclosing loop, `RingPlan`) through shared memory and TMA stores, where
    `plan_tma_store` allows: their stores then leave the consumer at once and overlap the
    producer's next loads. Records `choices["tma_store"]` (or `"tma_store_skipped"`, why
    not) and returns the shared-memory end after the staging buffers."""
    from tegula.ir.ops import Copy, tiles_read, tiles_written, walk_ops
    from tegula.ir.values import RegisterTile
    ops = list(walk_ops(kernel.body))
    if not any(isinstance(op, ForLoop) and op.choices.get("ring") is not None for op in ops):
        return shared_end
    # Ping-pong consumer warpgroups (synth/roles.py) store their own tiles, each at its
    # own time: one staging buffer each.
    copies = max([getattr(op.choices.get("roles"), "consumer_groups", 1) for op in ops
                  if isinstance(op, ForLoop)], default=1)
    for op in ops:
        if isinstance(op, Copy) and isinstance(op.src, RegisterTile) \
                and isinstance(op.dst, GlobalTile):
            name = op.dst.arg.name
            # A TMA store lands asynchronously: a later read or write of the tensor by the
            # block's threads would not be ordered after it.
            others = [o for o in ops if o is not op and any(
                isinstance(t, GlobalTile) and t.arg.name == name
                for t in tiles_read(o) + tiles_written(o))]
            plan, problem = plan_tma_store(op, facts, shared_end, limit, copies)
            if others:
                plan, problem = None, (f"{name} is also accessed at line "
                                       f"{others[0].loc.lineno if others[0].loc else '?'} "
                                       f"(a TMA store completes asynchronously)")
            if plan is None:
                op.choices["tma_store_skipped"] = problem
                continue
            op.choices["tma_store"] = plan
            shared_end = plan.offset + plan.bytes * plan.copies
    return shared_end


def plan_bulk_adds(kernel, facts: dict, shared_end: int, target,
                   keep_occupancy: bool = True) -> int:
    """Stage each `tg.atomic_add` of a register tile into an f32 global tile through shared
    memory and TMA reduce-adds (`cp.reduce.async.bulk.tensor ... .add`, sm_90), where
    `plan_tma_store` allows: one bulk add per box instead of a `red.global.add` per
    element (FlashAttention-3's dQ). The staging takes only the shared memory that keeps
    the blocks per SM the kernel's own buffers allow (`keep_occupancy`; else any up to the
    block's maximum: the build option `atomic_path="bulk"`). Records `choices["bulk_add"]` (a
    `TmaStorePlan` with `reduce="add"`) or `"bulk_add_skipped"` (why not); returns the
    shared-memory end after the staging buffers."""
    from tegula.arch.tma import tma_reduce_add
    from tegula.ir.ops import AtomicAdd, tiles_read, tiles_written, walk_ops
    from tegula.ir.values import RegisterTile
    ops = list(walk_ops(kernel.body))
    entry = tma_reduce_add(2)
    copies = max([getattr(op.choices.get("roles"), "consumer_groups", 1) for op in ops
                  if isinstance(op, ForLoop)], default=1)
    for op in ops:
        if not (isinstance(op, AtomicAdd) and isinstance(op.src, RegisterTile)
                and isinstance(op.dst, GlobalTile)):
            continue
        name = op.dst.arg.name
        # A bulk add lands asynchronously: other atomic adds commute with it, but the
        # block's own reads or writes of the tensor would not be ordered after it.
        others = [o for o in ops if not isinstance(o, AtomicAdd) and any(
            isinstance(t, GlobalTile) and t.arg.name == name
            for t in tiles_read(o) + tiles_written(o))]
        plan, problem = None, ""
        if not entry.available_on(target):
            problem = f"{entry.ptx} needs sm_90 (target {target.name})"
        elif op.dst.dtype != entry.dtype:
            problem = f"the bulk add is issued for {entry.dtype} tensors, not {op.dst.dtype}"
        elif others:
            problem = (f"{name} is also accessed at line "
                       f"{others[0].loc.lineno if others[0].loc else '?'} (a bulk add "
                       f"completes asynchronously)")
        else:
            limit = _same_occupancy_limit(shared_end, kernel.threads, target) \
                if keep_occupancy else target.smem_per_block_max
            plan, problem = plan_tma_store(op, facts, shared_end, limit, copies, bulk_add=True)
        if plan is None:
            op.choices["bulk_add_skipped"] = problem
            continue
        op.choices["bulk_add"] = replace(plan, reduce="add")
        shared_end = plan.offset + plan.bytes * plan.copies
    return shared_end


#: Shared memory the hardware reserves per block (sm_80 on: smem per SM less the opt-in
#: maximum per block, CUDA programming guide).
_RESERVED_PER_BLOCK = 1024


#: Registers per thread assumed when bounding blocks per SM before ptxas has counted them
#: (a kernel with register tiles rarely takes fewer).
_ASSUMED_REGISTERS = 64


def _same_occupancy_limit(shared_end: int, threads: int, target) -> int:
    """The most shared memory a block of `threads` may take and still fit as many blocks
    per SM as `shared_end` bytes, its threads and `_ASSUMED_REGISTERS` registers each
    allow (capped at the per-block maximum)."""
    blocks = min(target.smem_per_sm // (shared_end + _MBARRIER_HEADROOM + _RESERVED_PER_BLOCK),
                 target.max_threads_per_sm // threads, target.max_blocks_per_sm,
                 target.regs_per_sm // (threads * _ASSUMED_REGISTERS))
    return min(target.smem_per_block_max,
               target.smem_per_sm // max(1, blocks) - _RESERVED_PER_BLOCK)
