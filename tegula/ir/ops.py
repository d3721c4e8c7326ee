"""Tile IR operations and the traced kernel that holds them.

Every op records the user's source line (`loc`) so that synthesis and lowering can blame
the right line. Ops that produce a new register tile name it in `out`; ops that update a
tile in place (`Copy` into a destination, `Gemm` into an accumulator, `Fill`) name the
tile they write. Synthesis fills in `instr` (the catalogue instruction chosen for a
data-moving op) and any parameters it decided (e.g. a copy's vector width).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tegula.dtypes import DType
from tegula.errors import SourceLocation
from tegula.ir.scalar import LoopIndex, ScalarLike
from tegula.ir.values import GlobalArg, RegisterTile, SharedAlloc, Tile


@dataclass(eq=False)
class Op:
    """Base of tile IR ops. `choices` is where synthesis records its decisions."""

    loc: SourceLocation | None = field(default=None, kw_only=True)
    choices: dict = field(default_factory=dict, kw_only=True)


@dataclass(eq=False)
class Copy(Op):
    """`tg.copy(src, dst)`: dst[i] = src[i] for every in-bounds i (any pair of scopes).
    Out-of-bounds source elements read as `fill`."""

    src: Tile
    dst: Tile
    fill: float = 0.0


@dataclass(eq=False)
class Gemm(Op):
    """`tg.gemm(c, a, b)`: c[m, n] += sum_k a[m, k] * b[n, k]. a: (M, K), b: (N, K),
    c: (M, N) register tile; a and b in shared memory or registers, in any major order."""

    c: RegisterTile
    a: Tile
    b: Tile


@dataclass(eq=False)
class Fill(Op):
    """Set every element of a register tile to `value`."""

    dst: RegisterTile
    value: float


@dataclass(eq=False)
class Elementwise(Op):
    """`out = op(*inputs)` element by element, with size-1 dims broadcast. `op` is a name
    from thread IR's VALUE_UNARY_OPS / VALUE_BINARY_OPS, or "where" (three inputs), or
    "cast" (one input, to out.dtype). Scalar inputs — Python numbers, or block-uniform
    kernel scalars (`tegula.ir.scalar.Scalar`, converted to the operands' type) — are in
    `scalars`, keyed by input position."""

    op: str
    inputs: list[Tile]
    out: RegisterTile
    scalars: dict = field(default_factory=dict)


@dataclass(eq=False)
class Reduce(Op):
    """`out = reduce(x, axis)` with `kind` in sum/max/min/argmax/argmin; out keeps the axis
    with extent 1. argmax/argmin give i32 positions along `axis` (0 … extent-1): the first
    maximum (minimum), a NaN counting as larger (smaller) than everything, as in torch."""

    x: RegisterTile
    axis: int
    kind: str
    out: RegisterTile


@dataclass(eq=False)
class ScanCombine:
    """The associative function of a `Scan`, traced once on placeholder tiles: `lhs` stands
    for the earlier operand(s), `rhs` for the later one(s) (one tile each per scanned tile);
    `ops` (element-wise only) compute `results` from them, and a result may be an operand
    itself (`lambda a, b: b`). Lowering evaluates `ops` per element on registers."""

    lhs: list[RegisterTile]
    rhs: list[RegisterTile]
    ops: list[Op]
    results: list[RegisterTile]


@dataclass(eq=False)
class Scan(Op):
    """`outs = inclusive scan of xs along axis`: out[.., i, ..] = x[.., 0, ..] ⊕ … ⊕
    x[.., i, ..], with ⊕ = `combine` applied to the tuple of all `xs` at once (the linear
    recurrence h = a·h + b scans (a, b) pairs). `reverse`: flip along the axis, scan, flip
    back, so out[i] = x[n-1] ⊕ … ⊕ x[i]. Each out has its x's shape and dtype.
    `initials` (one per x, x's shape with the axis 1, or empty): the scan continues one
    that came before, out[i] = initial ⊕ x[0] ⊕ … ⊕ x[i], and `carries` (same shapes)
    receive the last element in scan order, the initial of the next chunk."""

    xs: list[RegisterTile]
    axis: int
    combine: ScanCombine
    outs: list[RegisterTile]
    reverse: bool = False
    initials: list[RegisterTile] = field(default_factory=list)
    carries: list[RegisterTile] = field(default_factory=list)


@dataclass(eq=False)
class Indices(Op):
    """`out[i] = i[axis] + offset` for every element of register tile `out` (i32): the
    coordinate of each element along one axis (`tg.arange`, `tg.indices`). `offset` is an
    int or a block-uniform kernel scalar (e.g. the block's origin)."""

    out: RegisterTile
    axis: int
    offset: ScalarLike = 0


@dataclass(eq=False)
class Reshape(Op):
    """`out = x.transpose(perm).reshape(out.shape)` (numpy, C order; `perm` () = no
    transpose): size-1 dims inserted or removed (`t[None, :]`, `t[:, 0]` of a size-1 dim,
    rank promotion for broadcasting), or `tg.reshape` / `tg.permute`. Each thread keeps
    its registers: `out`'s TV layout is `x`'s with the flat indices renamed
    (`layout/reshape.py`; the same layout when only size-1 dims change)."""

    x: RegisterTile
    out: RegisterTile
    perm: tuple = ()

    @property
    def order(self) -> tuple:
        """The transpose applied before the reshape (the identity when `perm` is ())."""
        return tuple(self.perm) if self.perm else tuple(range(self.x.rank))


@dataclass(eq=False)
class Rearrange(Op):
    """`out = x` with a different register layout (an explicit layout conversion)."""

    x: RegisterTile
    out: RegisterTile


@dataclass(eq=False)
class Bitcast(Op):
    """`out` = the bits of `x` read as `out.dtype` (`tg.bitcast`): the same shape where
    the widths match; from 32-bit elements to 16-bit ones, a new last dim of 2 (index 0
    the low half). Each thread keeps its elements (lowering: register reads, no moves)."""

    x: RegisterTile
    out: RegisterTile


@dataclass(eq=False)
class AtomicAdd(Op):
    """`dst[i] += src[i]` atomically on a global tile."""

    src: RegisterTile
    dst: Tile


@dataclass(eq=False)
class LastArrival(Op):
    """`tg.last_arrival(counter, count)`: the block arrives on the one-element i32 global
    tile `counter` (an atomic increment that wraps to 0 at the `count`-th arrival);
    `flag` is 1 in the block that arrived `count`-th, else 0. Everything the arriving
    blocks stored before it is visible to the last one after it (release / acquire at
    GPU scope)."""

    counter: Tile
    count: ScalarLike
    flag: Any


@dataclass(eq=False)
class RoleRegion:
    """A `with tg.producer(): …` or `with tg.consumer(): …` block of a `tg.pipeline` body
    (`lang/roles.py`): the warp role that runs `ops`, and the register budget per thread
    the source asked for (`setmaxnreg`; None: synthesis chooses). The ops stay in the
    loop's one flat body, which every pass walks as before; a region names a part of it."""

    role: str                     # "producer" or "consumer"
    ops: list[Op]
    registers: int | None = None
    loc: SourceLocation | None = None
    #: The consumer's schedule the source asked for (`tg.consumer(schedule=)`:
    #: "cooperative" or "pingpong"; None: the `consumers=` build option or synthesis).
    schedule: str | None = None

    def holds(self, op: Op) -> bool:
        return any(o is op for o in self.ops)


@dataclass(eq=False)
class ForLoop(Op):
    """`for var in range(start, stop, step)` at run time. With `stages > 1` the loop is
    software-pipelined: copies into multi-stage shared buffers are issued `stages - 1`
    iterations ahead (tg.pipeline). `regions`: the producer and consumer blocks its body
    was written in (empty where the source states no warp roles)."""

    var: LoopIndex
    start: ScalarLike
    stop: ScalarLike
    step: int
    body: list[Op]
    stages: int = 1
    regions: list[RoleRegion] = field(default_factory=list)

    def region(self, role: str) -> RoleRegion | None:
        """The loop's `role` block ("producer" / "consumer"), if the source wrote one."""
        return next((r for r in self.regions if r.role == role), None)


@dataclass(eq=False)
class IfThen(Op):
    """`tg.if_(cond)`: run `then` when the block-uniform condition holds."""

    cond: Any
    then: list[Op]
    otherwise: list[Op] = field(default_factory=list)


@dataclass(eq=False)
class TracedKernel:
    """A kernel after tracing: its signature, the tiles it made, and its op list."""

    name: str
    threads: int
    args: list[GlobalArg]
    scalar_args: list[str]
    constexprs: dict
    body: list[Op]
    shared_allocs: list[SharedAlloc] = field(default_factory=list)
    register_tiles: list[RegisterTile] = field(default_factory=list)
    loc: SourceLocation | None = None
    cluster: tuple = (1, 1, 1)  # blocks per thread-block cluster along x, y, z (tg.cluster)


def walk_ops(ops: list[Op]):
    """Every op, depth first, loop and branch bodies included."""
    for op in ops:
        yield op
        if isinstance(op, ForLoop):
            yield from walk_ops(op.body)
        elif isinstance(op, IfThen):
            yield from walk_ops(op.then)
            yield from walk_ops(op.otherwise)


def tiles_read(op: Op) -> list[Tile]:
    """The tiles an op reads."""
    if isinstance(op, Copy):
        return [op.src]
    if isinstance(op, Gemm):
        return [op.a, op.b, op.c]
    if isinstance(op, Elementwise):
        return list(op.inputs)
    if isinstance(op, (Reduce, Rearrange, Reshape, Bitcast)):
        return [op.x]
    if isinstance(op, Scan):
        return list(op.xs) + list(op.initials)
    if isinstance(op, AtomicAdd):
        return [op.src]
    return []


def wgmma_stage_reads_only(ops: list[Op], allocs: set) -> bool:
    """True if every read of the shared allocations `allocs` in `ops` is a shared operand
    of a gemm planned on wgmma (its descriptors can address any stage: a TMA ring running
    across enclosing loops gives them its own, `lower/pipeline.py: nested_stage_slots`)."""
    for op in walk_ops(ops):
        wgmma = isinstance(op, Gemm) and getattr(op.choices.get("plan"), "kind", "") == "wgmma"
        reads = [t for t in tiles_read(op)
                 if getattr(t, "alloc", None) is not None and t.alloc.id in allocs]
        if reads and not (wgmma and all(t is op.a or t is op.b for t in reads)):
            return False
    return True


def tiles_written(op: Op) -> list[Tile]:
    """The tiles an op writes."""
    if isinstance(op, Copy):
        return [op.dst]
    if isinstance(op, Gemm):
        return [op.c]
    if isinstance(op, Fill):
        return [op.dst]
    if isinstance(op, (Elementwise, Reduce, Rearrange, Reshape, Bitcast, Indices)):
        return [op.out]
    if isinstance(op, Scan):
        return list(op.outs) + list(op.carries)
    if isinstance(op, AtomicAdd):
        return [op.dst]
    if isinstance(op, LastArrival):
        return [op.counter]
    return []


__all__ = ["Op", "Copy", "Gemm", "Fill", "Elementwise", "Reduce", "Scan", "ScanCombine",
           "Indices", "Reshape", "Bitcast",
           "Rearrange", "AtomicAdd", "LastArrival",
           "ForLoop", "RoleRegion", "IfThen", "TracedKernel", "walk_ops", "tiles_read", "tiles_written",
           "DType"]
