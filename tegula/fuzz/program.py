"""A fuzz program: a small description of a tile kernel, from which the kernel's source
text (`source`) and its numpy reference (`tegula.fuzz.reference`) are both built.

Every kernel has the same frame: a 2-D grid of (BM, BN) tiles over (M, N) tensors, block
(m, n) loading tile (m, n) of its inputs and storing tile (m, n) of its outputs. The body
is a list of statements over named register tiles; each tile has a shape of (BM or 1,
BN or 1) — a reduction keeps its axis with extent 1 — and an element type. Loops walk a
further tensor tile by tile along one axis (`tg.range` or `tg.pipeline`).

`check(program)` type-checks a description (the generator's rules, which are stricter
than the language's: no in-place update of a tile with two names, for instance), so the
shrinker can discard a simplification that would produce a program outside them.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Union

from tegula.fuzz.numerics import BOOL, is_float, is_int


@dataclass(frozen=True)
class Num:
    """A Python number operand (or fill value), written into the source as a literal."""

    value: float | int | bool

    def text(self) -> str:
        v = self.value
        if isinstance(v, bool) or isinstance(v, int):
            return repr(v)
        if v != v:
            return 'float("nan")'
        if v in (float("inf"), -float("inf")):
            return ('-' if v < 0 else '') + 'float("inf")'
        return repr(float(v))


@dataclass(frozen=True)
class Extent:
    """A kernel scalar operand: extent `dim` of tensor `tensor` (`x0.shape[1]`)."""

    tensor: str
    dim: int

    def text(self) -> str:
        return f"{self.tensor}.shape[{self.dim}]"


Operand = Union[str, Num, Extent]


@dataclass(frozen=True)
class Load:
    """`out` = tile (m, n) of `tensor` (or the loop's current tile), along `route`."""

    out: str
    tensor: str
    route: str = "load"
    fill: Num | None = None
    loop: int | None = None


@dataclass(frozen=True)
class Full:
    out: str
    shape: tuple[bool, bool]  # (full rows?, full columns?)
    dtype: str
    value: Num


@dataclass(frozen=True)
class Indices:
    """`tg.indices(shape, axis, offset)`: each element's coordinate along `axis`, plus
    the block's origin along it when `block_offset` (`m * BM` or `n * BN`)."""

    out: str
    shape: tuple[bool, bool]
    axis: int
    block_offset: bool


@dataclass(frozen=True)
class Unary:
    out: str
    op: str
    x: str


@dataclass(frozen=True)
class Binary:
    out: str
    op: str
    a: Operand
    b: Operand


@dataclass(frozen=True)
class Where:
    out: str
    cond: str
    a: Operand
    b: Operand


@dataclass(frozen=True)
class Cast:
    """`x.to(dtype)`; with `bits`, `tg.bitcast(x, dtype)` (f32 <-> i32: the same bits)."""
    out: str
    x: str
    dtype: str
    bits: bool = False


@dataclass(frozen=True)
class Reduce:
    out: str
    kind: str
    x: str
    axis: int


@dataclass(frozen=True)
class Cumsum:
    """`out = tg.cumsum(x, axis, reverse=)`: inclusive, 16/8-bit floats accumulating in
    f32 (one rounding to x's type), integers wrapping in their own type."""

    out: str
    x: str
    axis: int
    reverse: bool = False


@dataclass(frozen=True)
class InPlace:
    """`target op= x` (op in add sub mul div): writes the tile `target` names."""

    target: str
    op: str
    x: Operand


@dataclass(frozen=True)
class Assign:
    """`target.assign(x)`: overwrite the tile `target` names."""

    target: str
    x: Operand


@dataclass(frozen=True)
class Alias:
    """`target = src`: Python rebinding (used at the end of loop bodies)."""

    target: str
    src: str


@dataclass(frozen=True)
class Loop:
    """`for i in tg.range(...)` over the tiles of `tensor` along `axis` (1: the tiles
    (m, i); 0: the tiles (i, n)); `stages` > 1 makes it a `tg.pipeline`."""

    id: int
    tensor: str
    axis: int
    body: tuple
    stages: int = 1


@dataclass(frozen=True)
class Gemm:
    """`tg.gemm(acc, a, b)`: acc (BM, BN) += rows m of `a` (M x K) @ rows n of `b` (N x K).T,
    operands through shared memory or registers. `stages` 0: one K tile of `bk` (K ≤ bk,
    padded); 1: a `tg.range` over the K tiles of `bk`; ≥ 2: the README's `tg.pipeline` with
    that many staged shared buffers (on sm_90a the path that may become TMA + wgmma).

    `scratch` (a K loop, square tiles): each K tile's product goes through a shared
    scratch tile, `part = 0; tg.gemm(part, …); copy part -> scratch; acc += load(scratch.T)`
    — the warp-specialized consumer body that writes, then reads, one tile each iteration
    (its next write must wait for every thread's reads). acc gets each tile's transpose.

    `ta` / `tb`: how an operand stored transposed — a "gemm_a_t" (K x M) / "gemm_b_t"
    (K x N) tensor — is read (`TRANSPOSED_READS`): "smem", its (bk, BM) tile copied into a
    shared buffer of that shape and multiplied through the buffer's `.T` view (an MN-major
    wgmma operand, `ldmatrix.trans` on mma.sync); "gmem", through the tensor's `.T` global
    view, tiled (BM, bk) like a K-major operand. "" for a K-major tensor.

    `roles` (a pipeline, stages ≥ 2): the loop body written as warp-role blocks,
    `with tg.producer(regs=p):` around the copies into the staged buffers and `with
    tg.consumer(regs=c, schedule=s):` around the rest — (p, c, s), each None or a value
    (`ROLE_PRODUCER_REGS`, `ROLE_CONSUMER_REGS`, `ROLE_SCHEDULES`); () for none. sm_90a
    only: the stated split of a TMA + wgmma pipeline (other targets and near-miss tiles
    refuse it at its line).

    `repeat` (a K loop, stages ≥ 1): the K loop runs that many times inside a `tg.range`
    around it, accumulating into the same `acc` (acc + repeat · a @ b.T): a pipeline in
    a run-time loop whose iterations are *not* independent, which the ping-pong consumer
    split must not take for a persistent kernel's tile loop (session 10: it did, and
    each warpgroup summed every other repetition)."""

    acc: str
    a: str
    b: str
    bk: int
    route: str = "shared"
    stages: int = 0
    ta: str = ""
    tb: str = ""
    scratch: bool = False
    roles: tuple = ()
    repeat: int = 1


@dataclass(frozen=True)
class Stash:
    """`tg.copy(x, buffer)`: the full tile `x` into a shared scratch tile of the kernel,
    declared once at its top, so loop iterations and the code around a loop share it —
    a write at the end of one iteration read at the start of the next, reads in a loop
    then a write after it: the hazards barrier placement must order (`lower.SharedSync`).
    The first stash of a buffer is outside loops and gives it its type."""

    buffer: str
    x: str


@dataclass(frozen=True)
class Unstash:
    """`out = tg.load(buffer)` (`buffer.T` when `transposed`, for square tiles: each
    thread then reads elements other threads stored)."""

    out: str
    buffer: str
    transposed: bool = False


@dataclass(frozen=True)
class Branch:
    """`with tg.if_(m < bound):` (`axis` 0: the block row m, 1: the column n; `op` lt, ge
    or eq): `body` runs in the blocks where it holds. Its statements stash and read
    scratch tiles and update tiles in place — the shared accesses barrier placement must
    order around a branch, and the register work it must not fence; names it defines end
    with it."""

    axis: int
    op: str
    bound: int
    body: tuple


BRANCH_STATEMENTS = (Stash, Unstash, InPlace, Assign, Binary)


@dataclass(frozen=True)
class Store:
    tensor: str
    x: str
    route: str = "copy"


Stmt = Union[Load, Full, Indices, Unary, Binary, Where, Cast, Reduce, Cumsum, InPlace, Assign,
             Alias, Loop, Gemm, Stash, Unstash, Branch, Store]

LOAD_ROUTES = ("load", "copy", "shared", "shared2", "via_register", "transposed")
TRANSPOSED_READS = ("smem", "gmem")  # Gemm.ta / Gemm.tb
#: What a `Gemm.roles` block states: setmaxnreg budgets (multiples of 8 in [24, 256]; 24
#: and 256 the extremes, 256 over the register file with any producer) and schedules.
ROLE_PRODUCER_REGS = (None, 40, 24, 56)
ROLE_CONSUMER_REGS = (None, 232, 240, 216, 256)
ROLE_SCHEDULES = (None, "cooperative", "pingpong")
STORE_ROUTES = ("copy", "shared", "shared_reg")
FLOAT_UNARY = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh",
               "sigmoid")
COMPARISONS = ("lt", "le", "gt", "ge", "eq", "ne")
ARITHMETIC = ("add", "sub", "mul", "div", "max", "min", "pow")
LOGIC = ("and", "or", "xor")
INT_DIVISION = ("floordiv", "mod")  # integer // and % (torch floor semantics)


@dataclass(frozen=True)
class TensorDecl:
    """A kernel tensor. `kind` says how its extents follow from the program's: "in" (M, N),
    "in_t" (N, M: read transposed), "loop1" (M, extent: walked along columns), "loop0"
    (extent, N), gemm operands "gemm_a" (M, extent: K), "gemm_b" (N, K), "gemm_a_t"
    (K, M), "gemm_b_t" (K, N) (stored transposed), "out" (one tile of `shape` per block: M or one row per block, N or one
    column per block)."""

    name: str
    dtype: str
    kind: str
    extent: int = 0
    shape: tuple = (True, True)


@dataclass(frozen=True)
class Program:
    threads: int
    BM: int
    BN: int
    M: int
    N: int
    tensors: tuple  # TensorDecl, inputs and outputs
    body: tuple
    label: str = ""  # how to regenerate it (seed and index)
    #: Blocks per thread-block cluster along grid axis 0 (`tg.cluster(2)`: blocks m = 2c and
    #: 2c + 1 share tile column n, so b's box may be multicast); the grid's rows divide it.
    cluster: int = 1
    #: The sm_90a build's `warp_specialize` (None: the cost model decides a TMA pipeline's
    #: roles, and keeps small one-gemm tiles in one role; True forces the producer
    #: warpgroup; False one role). Other targets have no warp roles and build without it.
    warp_specialize: bool | None = None
    #: The sm_90a build's `consumers=` schedule (None, "cooperative", "pingpong") of a
    #: warp-specialized pipeline (`Generator.build_options`); other targets ignore it.
    consumers: str | None = None
    #: Blocks of a persistent launch (0: one block a tile). With P > 0 the kernel runs P
    #: blocks, each walking the tiles `t = block, block + P, ...` of the (gm, gn) grid in
    #: a tile loop, `m, n = t // gn, t % gn`, the whole body inside it: where the pipeline
    #: sits directly in that loop, ping-pong consumer warpgroups take whole tiles in turn
    #: (`consumers="pingpong"`), each running its own copy of the body's epilogue.
    persistent: int = 0

    @property
    def grid(self) -> tuple[int, int]:
        """The output's tiles (gm, gn): one block each unless `persistent`."""
        return (-(-self.M // self.BM), -(-self.N // self.BN))

    @property
    def launch_grid(self) -> tuple:
        """The grid the kernel is launched on: `grid`, or (P,) for a persistent program."""
        return (self.persistent,) if self.persistent else self.grid

    def tensor(self, name: str) -> TensorDecl:
        return next(t for t in self.tensors if t.name == name)

    def extents(self, t: TensorDecl) -> tuple[int, int]:
        """(rows, cols) of tensor `t` in this program."""
        gm, gn = self.grid
        return {"in": (self.M, self.N), "in_t": (self.N, self.M),
                "gemm_a": (self.M, t.extent), "gemm_b": (self.N, t.extent),
                "gemm_a_t": (t.extent, self.M), "gemm_b_t": (t.extent, self.N),
                "loop1": (self.M, t.extent), "loop0": (t.extent, self.N),
                "out": (self.M if t.shape[0] else gm, self.N if t.shape[1] else gn)}[t.kind]

    def with_body(self, body) -> Program:
        return replace(self, body=tuple(body))


class Invalid(Exception):
    """The description breaks the generator's typing rules."""


@dataclass
class TileType:
    dtype: str
    shape: tuple[bool, bool]  # (spans BM rows?, spans BN columns?)


def broadcast(a: tuple[bool, bool], b: tuple[bool, bool]) -> tuple[bool, bool]:
    return (a[0] or b[0], a[1] or b[1])


@dataclass
class Scope:
    """Names visible at a point of the program, their types, and which names share a tile
    (an in-place write through one would change the other, which the model does not
    follow, so the rules forbid it)."""

    types: dict = field(default_factory=dict)
    shared_with: dict = field(default_factory=dict)  # name -> set of names on its tile
    every_type: dict = field(default_factory=dict)  # every name ever defined, loops included
    buffers: dict = field(default_factory=dict)  # scratch buffer (`Stash`) -> element type

    def define(self, name: str, t: TileType) -> None:
        self._unshare(name)
        self.types[name] = self.every_type[name] = t
        self.shared_with[name] = {name}

    def alias(self, target: str, src: str) -> None:
        self._unshare(target)
        self.types[target] = self.every_type[target] = self.types[src]
        group = self.shared_with[src]
        group.add(target)
        self.shared_with[target] = group

    def _unshare(self, name: str) -> None:
        group = self.shared_with.get(name)
        if group is not None:
            group.discard(name)

    def copy(self) -> Scope:
        groups: dict = {}
        shared = {}
        for name, g in self.shared_with.items():
            shared[name] = groups.setdefault(id(g), set(g))
        return Scope(dict(self.types), shared, self.every_type, dict(self.buffers))


def _operand_type(scope: Scope, x: Operand) -> TileType | None:
    if isinstance(x, (Num, Extent)):
        return None
    if x not in scope.types:
        raise Invalid(f"{x} is not defined here")
    return scope.types[x]


def _value_dtype(scope: Scope, a: Operand, b: Operand) -> tuple[str, tuple[bool, bool]]:
    ta, tb = _operand_type(scope, a), _operand_type(scope, b)
    tiles = [t for t in (ta, tb) if t is not None]
    if not tiles:
        raise Invalid("no tile operand")
    if len({t.dtype for t in tiles}) != 1:
        raise Invalid("operand types differ")
    shape = tiles[0].shape
    for t in tiles[1:]:
        shape = broadcast(shape, t.shape)
    return tiles[0].dtype, shape


def check(program: Program) -> dict:
    """Raise `Invalid` unless `program` follows the generator's rules; else return the
    type (`TileType`) of every name it defines."""
    names = {t.name for t in program.tensors}
    if len(names) != len(program.tensors):
        raise Invalid("duplicate tensor")
    if not any(isinstance(s, Store) for s in program.body):
        raise Invalid("no output")
    if program.cluster not in (1, 2) or program.grid[0] % program.cluster:
        raise Invalid("a cluster of 1 or 2 blocks, dividing the grid's rows")
    if program.persistent < 0 or (program.persistent and program.cluster > 1):
        raise Invalid("a persistent launch of P >= 1 blocks, in no cluster")
    scope = Scope()
    _check_block(program, program.body, scope, loop=None, outputs=set())
    return scope.every_type


def _check_block(program: Program, body, scope: Scope, loop: Loop | None, outputs: set):
    for s in body:
        _check_stmt(program, s, scope, loop, outputs)


def _check_cast(s: "Cast", scope: Scope) -> None:
    """A value conversion or a bitcast (only between f32 and i32 is generated)."""
    t = _operand_type(scope, s.x)
    if t.dtype == s.dtype:
        raise Invalid("a no-op cast (it would return the same tile)")
    if s.dtype == BOOL:
        raise Invalid("casts to bool are not generated")
    if s.bits and {t.dtype, s.dtype} != {"f32", "i32"}:
        raise Invalid("bitcasts are generated between f32 and i32")
    scope.define(s.out, TileType(s.dtype, t.shape))


def _check_stmt(program: Program, s, scope: Scope, loop, outputs: set) -> None:  # noqa: C901
    decl = {t.name: t for t in program.tensors}
    if isinstance(s, Load):
        _check_load(s, decl, scope, loop)
    elif isinstance(s, Full):
        scope.define(s.out, TileType(s.dtype, s.shape))
    elif isinstance(s, Indices):
        if not s.shape[s.axis]:
            raise Invalid("indices along a size-1 dim")
        scope.define(s.out, TileType("i32", s.shape))
    elif isinstance(s, Unary):
        t = _operand_type(scope, s.x)
        if s.op in FLOAT_UNARY and not is_float(t.dtype):
            raise Invalid("math on a non-float")
        if s.op == "not" and is_float(t.dtype):
            raise Invalid("~ on floats")
        if s.op in ("neg", "abs") and t.dtype == BOOL:
            raise Invalid("arithmetic on bool")
        scope.define(s.out, TileType(t.dtype, t.shape))
    elif isinstance(s, Binary):
        for x in (s.a, s.b):
            if isinstance(x, Extent) and (x.tensor not in decl or decl[x.tensor].kind != "in"):
                raise Invalid("an extent of a tensor that is not an input")
        dtype, shape = _value_dtype(scope, s.a, s.b)
        _check_binary(s.op, dtype, s.a, s.b)
        scope.define(s.out, TileType(BOOL if s.op in COMPARISONS else dtype, shape))
    elif isinstance(s, Where):
        c = _operand_type(scope, s.cond)
        if c.dtype != BOOL:
            raise Invalid("condition not bool")
        dtype, shape = _value_dtype(scope, s.a, s.b)
        scope.define(s.out, TileType(dtype, broadcast(shape, c.shape)))
    elif isinstance(s, Cast):
        _check_cast(s, scope)
    elif isinstance(s, Reduce):
        t = _operand_type(scope, s.x)
        if t.dtype == BOOL:
            raise Invalid("reducing bool")
        shape = (False, t.shape[1]) if s.axis == 0 else (t.shape[0], False)
        scope.define(s.out, TileType("i32" if s.kind.startswith("arg") else t.dtype, shape))
    elif isinstance(s, Cumsum):
        t = _operand_type(scope, s.x)
        if t.dtype == BOOL or s.axis not in (0, 1):
            raise Invalid("a cumulative sum of bool, or along no axis")
        scope.define(s.out, t)
    elif isinstance(s, (InPlace, Assign)):
        _check_update(s, scope)
    elif isinstance(s, Alias):
        _operand_type(scope, s.src)
        if s.target in scope.types:
            old, new = scope.types[s.target], scope.types[s.src]
            if (old.dtype, old.shape) != (new.dtype, new.shape):
                raise Invalid("a rebinding that changes shape or type")
        scope.alias(s.target, s.src)
    elif isinstance(s, Loop):
        _check_loop(program, s, scope, loop, outputs)
    elif isinstance(s, Gemm):
        _check_gemm(program, s, decl, scope)
    elif isinstance(s, (Stash, Unstash)):
        _check_scratch(program, s, scope, loop)
    elif isinstance(s, Branch):
        _check_branch(program, s, scope, loop, outputs)
    elif isinstance(s, Store):
        t = _operand_type(scope, s.x)
        if s.tensor not in decl or s.tensor in outputs:
            raise Invalid("unknown or twice-written output")
        if t.dtype == BOOL or decl[s.tensor].dtype != t.dtype or \
                decl[s.tensor].kind != "out" or decl[s.tensor].shape != t.shape:
            raise Invalid("output type or shape")
        if loop is not None:
            raise Invalid("stores inside loops are not generated")
        outputs.add(s.tensor)
    else:
        raise Invalid(f"unknown statement {s!r}")


def _check_load(s: Load, decl: dict, scope: Scope, loop) -> None:
    if s.loop is not None:
        if loop is None or loop.id != s.loop or s.tensor != loop.tensor:
            raise Invalid("a loop load outside its loop")
    elif s.tensor not in decl or decl[s.tensor].kind != (
            "in_t" if s.route == "transposed" else "in"):
        raise Invalid("unknown tensor, or one of the wrong kind")
    if s.route == "transposed" and s.loop is not None:
        raise Invalid("transposed loads are not generated inside loops")
    dtype = decl[s.tensor].dtype
    if s.fill is not None and is_int(dtype) and not isinstance(s.fill.value, int):
        raise Invalid("an integer fill must be an int")
    scope.define(s.out, TileType(dtype, (True, True)))


def _check_update(s, scope: Scope) -> None:
    """An in-place operator or `.assign`."""
    target = _operand_type(scope, s.target)
    if len(scope.shared_with[s.target]) > 1:
        raise Invalid("in-place write to a tile with two names")
    if isinstance(s, InPlace):
        dtype, shape = _value_dtype(scope, s.target, s.x)
        _check_binary(s.op, dtype, s.target, s.x)
        if s.op not in ("add", "sub", "mul", "div"):
            raise Invalid("no such in-place operator")
    else:
        value = _operand_type(scope, s.x)
        dtype, shape = (target.dtype, target.shape) if value is None else \
            (value.dtype, value.shape)
    if dtype != target.dtype or shape != target.shape:
        raise Invalid("in-place result does not fit the target")
    if isinstance(s.x, Num) and is_int(target.dtype) and not isinstance(s.x.value, int):
        raise Invalid("a non-integer number for an integer tile")


def _check_scratch(program: Program, s, scope: Scope, loop) -> None:
    if isinstance(s, Unstash):
        if s.buffer not in scope.buffers:
            raise Invalid("a scratch tile read before anything is stashed in it")
        if s.transposed and program.BM != program.BN:
            raise Invalid("a transposed scratch read needs a square tile")
        scope.define(s.out, TileType(scope.buffers[s.buffer], (True, True)))
        return
    t = _operand_type(scope, s.x)
    if t.shape != (True, True) or t.dtype == BOOL:
        raise Invalid("a stashed tile is a full, non-bool tile")
    known = scope.buffers.get(s.buffer)
    if known is None and loop is not None:
        raise Invalid("a scratch tile is first stashed outside loops")
    if known is not None and known != t.dtype:
        raise Invalid("a scratch tile keeps its element type")
    scope.buffers[s.buffer] = t.dtype


def _check_branch(program: Program, s: Branch, scope: Scope, loop, outputs: set) -> None:
    if s.axis not in (0, 1) or s.op not in ("lt", "ge", "eq") or not s.body:
        raise Invalid("a branch on m or n, with lt, ge or eq, and a body")
    inner = scope.copy()
    for b in s.body:
        if not isinstance(b, BRANCH_STATEMENTS):
            raise Invalid("a branch holds scratch accesses and element-wise work only")
        if isinstance(b, Stash) and b.buffer not in scope.buffers:
            raise Invalid("a scratch tile is first stashed outside branches")
        _check_stmt(program, b, inner, loop, outputs)
    # Names made in the body end with it; updated ones keep their type (in place).


GEMM_ACCUMULATOR = {"f16": "f32", "bf16": "f32", "f8e4m3": "f32", "f8e5m2": "f32",
                    "i8": "i32"}
MAX_GEMM_K_TILES = 6  # a looped gemm's K extent is at most this many tiles of bk


def _check_gemm(program: Program, s: Gemm, decl: dict, scope: Scope) -> None:
    a, b = decl.get(s.a), decl.get(s.b)
    kinds = tuple(f"gemm_{x}" + ("_t" if t else "") for x, t in (("a", s.ta), ("b", s.tb)))
    if a is None or b is None or (a.kind, b.kind) != kinds:
        raise Invalid("gemm operands must be gemm tensors, transposed as the gemm reads them")
    if any(t not in ("",) + TRANSPOSED_READS for t in (s.ta, s.tb)) or \
            (s.route == "register" and "smem" in (s.ta, s.tb)):
        raise Invalid("a transposed gemm operand is read through a shared or global .T view")
    if s.repeat < 1 or (s.repeat > 1 and s.stages == 0):
        raise Invalid("a repeated gemm is a K loop run one or more times")
    if a.dtype != b.dtype or a.dtype not in GEMM_ACCUMULATOR or a.extent != b.extent or \
            not 0 < a.extent <= (s.bk if s.stages == 0 else MAX_GEMM_K_TILES * s.bk):
        raise Invalid("gemm operand types or extents")
    if s.stages > 1 and s.route != "shared":
        raise Invalid("a pipelined gemm stages its operands in shared memory")
    if s.scratch and (s.stages == 0 or program.BM != program.BN):
        raise Invalid("a gemm through a scratch tile is a K loop over square tiles")
    if s.roles and (s.stages < 2 or len(s.roles) != 3 or s.roles[0] not in ROLE_PRODUCER_REGS
                    or s.roles[1] not in ROLE_CONSUMER_REGS or s.roles[2] not in ROLE_SCHEDULES):
        raise Invalid("warp-role blocks are a pipeline's, with listed budgets and schedules")
    acc = _operand_type(scope, s.acc)
    if (acc.dtype, acc.shape) != (GEMM_ACCUMULATOR[a.dtype], (True, True)) or \
            len(scope.shared_with[s.acc]) > 1:
        raise Invalid("gemm accumulator")


def _check_binary(op: str, dtype: str, a: Operand, b: Operand) -> None:
    if op in LOGIC and is_float(dtype):
        raise Invalid("bitwise op on floats")
    if (op in ARITHMETIC or op in INT_DIVISION) and dtype == BOOL:
        raise Invalid("arithmetic on bool")
    if op == "pow" and not is_float(dtype):
        raise Invalid("pow on integers")
    for x in (a, b):
        if isinstance(x, Extent) and dtype != "i32":
            raise Invalid("kernel scalars are generated only with i32 tiles")
        if isinstance(x, Num) and is_int(dtype) and not isinstance(x.value, int):
            raise Invalid("a non-integer number for an integer tile")
        if isinstance(x, Num) and dtype == BOOL and not isinstance(x.value, bool):
            raise Invalid("a number for a bool tile")
    if op in INT_DIVISION and not is_int(dtype):
        raise Invalid("// and % are integer ops")
    if op in ("div",) + INT_DIVISION and is_int(dtype) and isinstance(b, Num) and b.value == 0:
        raise Invalid("a literal 0 divisor")


def _check_loop(program: Program, s: Loop, scope: Scope, loop, outputs: set) -> None:
    if loop is not None:
        raise Invalid("nested loops are not generated")
    loop_tensor = next((t for t in program.tensors if t.name == s.tensor), None)
    if loop_tensor is None or loop_tensor.kind != f"loop{s.axis}" or loop_tensor.extent < 1:
        raise Invalid("unknown loop tensor")
    inner = scope.copy()
    _check_block(program, s.body, inner, s, outputs)
    for name, t in inner.types.items():
        if name in scope.types:
            old = scope.types[name]
            if (old.dtype, old.shape) != (t.dtype, t.shape):
                raise Invalid("a loop-carried name changes shape or type")
    # Names made in the body are not used after the loop; carried names keep their type.
    for name in scope.types:
        scope.shared_with[name] = {name}


def defined_names(body) -> list[str]:
    """Every name a statement list (loops included) defines, in order."""
    out = []
    for s in body:
        if isinstance(s, (Loop, Branch)):
            out += defined_names(s.body)
        elif hasattr(s, "out"):
            out.append(s.out)
    return out


def used_names(s) -> set[str]:
    """Names a statement reads (a loop: everything its body reads)."""
    if isinstance(s, (Loop, Branch)):
        return set().union(*(used_names(b) for b in s.body)) if s.body else set()
    fields = {Gemm: ("acc",), Unary: ("x",), Binary: ("a", "b"), Where: ("cond", "a", "b"), Cast: ("x",),
              Reduce: ("x",), Cumsum: ("x",), InPlace: ("target", "x"), Assign: ("target", "x"),
              Alias: ("src",), Store: ("x",), Stash: ("x",)}.get(type(s), ())
    return {getattr(s, f) for f in fields if isinstance(getattr(s, f), str)}


__all__ = ["TRANSPOSED_READS", "ROLE_PRODUCER_REGS", "ROLE_CONSUMER_REGS", "ROLE_SCHEDULES", "Num", "Extent", "Indices", "Gemm", "GEMM_ACCUMULATOR", "MAX_GEMM_K_TILES", "Load", "Full", "Unary", "Binary", "Where", "Cast", "Reduce", "Cumsum", "InPlace",
           "Assign", "Alias", "Loop", "Stash", "Unstash", "Branch", "Store", "Program", "TensorDecl", "Invalid", "check",
           "TileType", "Scope", "broadcast", "defined_names", "used_names", "LOAD_ROUTES",
           "STORE_ROUTES", "FLOAT_UNARY", "COMPARISONS", "ARITHMETIC", "LOGIC"]
