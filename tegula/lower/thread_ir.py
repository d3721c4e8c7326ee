"""Thread IR: what one thread of a block does, as a small imperative program.

Lowering (`tegula.lower`) turns typed tile IR into this; two consumers read it and must
agree: the CUDA emitter (`tegula.codegen`) prints it, and the emulator (`tegula.emulate`)
executes it with numpy for all threads of a block at once.

The vocabulary is deliberately small:

* **Index expressions** (`Expr`): integer/boolean scalars that may differ per thread —
  built from constants, named variables (the thread index, block indices, loop variables,
  kernel scalar parameters such as a global tensor's extents and strides), arithmetic, and
  `LoadScalar` (an element of an integer tensor: a kernel scalar loaded from memory).
  They are addresses, loop bounds and predicates.
* **Register arrays** (`RegArray`): per-thread arrays of one element type with a fixed
  size. `Reg(array, index)` names one element; the index must be a compile-time constant
  after loop unrolling (an `Expr` of constants and variables of unrolled loops), so CUDA
  keeps the array in registers.
* **Value expressions** (`Value`): element arithmetic over registers for elementwise ops.
* **Statements**: memory instructions (vector loads/stores, cp.async, ldmatrix), matrix
  instructions (mma), warp shuffles, barriers, loops and branches. Each memory statement
  moves `count` consecutive elements between consecutive registers and consecutive memory
  addresses: the vector width is explicit, so "is this a 16-byte load?" is a field, not an
  analysis.

Variable names used by lowering:
  `tid`                  thread index in the block (0 … threads-1)
  `bid_x`, `bid_y`, `bid_z` block indices
  `tg_grid_x`, `tg_grid_y`, `tg_grid_z` the grid's block counts; `tg_num_sms` the SM count

Asynchronous operations, mbarriers, TMA, wgmma and warp roles are in `lower/async_ir.py`.
  `{tensor}_shape{i}`, `{tensor}_stride{i}`  a global tensor parameter's extents/strides (elements)
  loop variables         whatever `For.var` names
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from tegula.dtypes import DType, i32

# --------------------------------------------------------------------------------------
# Index expressions
# --------------------------------------------------------------------------------------

#: Binary operators of index expressions, with their C spelling. `//` and `%` are C's
#: truncating division on non-negative operands (lowering only divides non-negative values
#: of its own making). `floordiv` and `mod` are the user's kernel-scalar `//` and `%`, whose
#: operands may be negative or zero: floor semantics as on tiles (`x // 0 == -1`,
#: `x % 0 == x`), the helpers `tg_floordiv` / `tg_mod` in CUDA.
INDEX_BINARY_OPS = {
    "+": "+", "-": "-", "*": "*", "//": "/", "%": "%",
    "<": "<", "<=": "<=", ">": ">", ">=": ">=", "==": "==", "!=": "!=",
    "and": "&&", "or": "||", "&": "&", "|": "|", "^": "^", "<<": "<<", ">>": ">>",
    "min": "min", "max": "max", "floordiv": "tg_floordiv", "mod": "tg_mod",
}


class Expr:
    """An integer or boolean scalar per thread. Use the operators; they fold constants."""

    def __add__(self, o): return _bin("+", self, o)
    def __radd__(self, o): return _bin("+", o, self)
    def __sub__(self, o): return _bin("-", self, o)
    def __rsub__(self, o): return _bin("-", o, self)
    def __mul__(self, o): return _bin("*", self, o)
    def __rmul__(self, o): return _bin("*", o, self)
    def __floordiv__(self, o): return _bin("//", self, o)
    def __mod__(self, o): return _bin("%", self, o)
    def __xor__(self, o): return _bin("^", self, o)
    def __and__(self, o): return _bin("&", self, o)
    def __lshift__(self, o): return _bin("<<", self, o)
    def __rshift__(self, o): return _bin(">>", self, o)
    def lt(self, o): return _bin("<", self, o)
    def le(self, o): return _bin("<=", self, o)
    def ge(self, o): return _bin(">=", self, o)
    def eq(self, o): return _bin("==", self, o)
    def logical_and(self, o): return _bin("and", self, o)


@dataclass(frozen=True, eq=True)
class Const(Expr):
    value: int

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, eq=True)
class Var(Expr):
    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=True)
class BinOp(Expr):
    op: str
    lhs: Expr
    rhs: Expr

    def __str__(self) -> str:
        if self.op in ("min", "max", "floordiv", "mod"):
            return f"{self.op}({self.lhs}, {self.rhs})"
        return f"({self.lhs} {self.op} {self.rhs})"


@dataclass(frozen=True, eq=True)
class Select(Expr):
    """`cond ? if_true : if_false` on index values."""

    cond: Expr
    if_true: Expr
    if_false: Expr

    def __str__(self) -> str:
        return f"({self.cond} ? {self.if_true} : {self.if_false})"


@dataclass(frozen=True, eq=True)
class LoadScalar(Expr):
    """The element at coordinate `coords` (one Expr per dim) of integer global tensor
    `tensor`, read by every thread where the expression is evaluated (a kernel scalar
    loaded from memory: MoE offsets, variable lengths). Its address is
    `sum(coords[d] * {tensor}_stride{d})`; the emulator checks each coordinate against the
    extent. Never hoisted out of a loop or branch: the address may only be valid inside."""

    tensor: str
    coords: tuple
    dtype: DType

    def __str__(self) -> str:
        return f"{self.tensor}[{', '.join(str(c) for c in self.coords)}]"


ExprLike = Union[Expr, int]

TID = Var("tid")
BLOCK_IDS = (Var("bid_x"), Var("bid_y"), Var("bid_z"))
#: The grid's block counts (CUDA `gridDim`) and the device's SM count, read at run time.
#: (`tg_` names: user parameters cannot take them, the emitter refuses the prefix.)
GRID_SIZES = (Var("tg_grid_x"), Var("tg_grid_y"), Var("tg_grid_z"))
NUM_SMS = Var("tg_num_sms")


def floor_div(a: int, b: int) -> int:
    """The index operator `floordiv` on ints (floor division; `a // 0 == -1`)."""
    return -1 if b == 0 else a // b


def floor_mod(a: int, b: int) -> int:
    """The index operator `mod` on ints (divisor's sign; `a % 0 == a`)."""
    return a if b == 0 else a % b


_FOLD = {
    "floordiv": floor_div, "mod": floor_mod,
    "+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
    "//": lambda a, b: a // b, "%": lambda a, b: a % b, "^": lambda a, b: a ^ b,
    "&": lambda a, b: a & b, "|": lambda a, b: a | b, "<<": lambda a, b: a << b,
    ">>": lambda a, b: a >> b, "min": min, "max": max,
    "<": lambda a, b: int(a < b), "<=": lambda a, b: int(a <= b), ">": lambda a, b: int(a > b),
    ">=": lambda a, b: int(a >= b), "==": lambda a, b: int(a == b), "!=": lambda a, b: int(a != b),
    "and": lambda a, b: int(bool(a) and bool(b)), "or": lambda a, b: int(bool(a) or bool(b)),
}


def as_expr(x: ExprLike) -> Expr:
    """Wrap a Python int as a `Const`; pass expressions through."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool) or not isinstance(x, int):
        raise TypeError(f"index expressions are built from ints and Exprs, not {x!r}")
    return Const(x)


def _bin(op: str, lhs: ExprLike, rhs: ExprLike) -> Expr:
    """Build `lhs op rhs`, folding constants and the identities lowering produces most."""
    a, b = as_expr(lhs), as_expr(rhs)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(_FOLD[op](a.value, b.value))
    if op == "+":
        if a == Const(0):
            return b
        if b == Const(0):
            return a
    if op == "-" and b == Const(0):
        return a
    if op == "*":
        if Const(0) in (a, b):
            return Const(0)
        if a == Const(1):
            return b
        if b == Const(1):
            return a
    if op in ("//",) and b == Const(1):
        return a
    if op == "%" and b == Const(1):
        return Const(0)
    if op == "and":
        if a == Const(1):
            return b
        if b == Const(1):
            return a
    return BinOp(op, a, b)


def all_of(conds: list[Expr | None]) -> Expr | None:
    """The conjunction of predicates (None entries mean "always true" and are skipped),
    or None when no predicate is left."""
    result: Expr | None = None
    for c in conds:
        if c is not None:
            result = c if result is None else _bin("and", result, c)
    return result


# --------------------------------------------------------------------------------------
# Registers and value expressions
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class RegArray:
    """A per-thread register array: `dtype name[size];` in CUDA."""

    name: str
    dtype: DType
    size: int


@dataclass(frozen=True)
class Reg:
    """Element `index` of a register array (index constant after unrolling)."""

    array: RegArray
    index: Expr

    def __str__(self) -> str:
        return f"{self.array.name}[{self.index}]"


class Value:
    """An element-valued expression for elementwise computation. `dtype` is its type."""

    dtype: DType


@dataclass(frozen=True)
class RegRead(Value):
    reg: Reg

    @property
    def dtype(self) -> DType:
        return self.reg.array.dtype


@dataclass(frozen=True)
class Literal(Value):
    value: float
    dtype: DType


@dataclass(frozen=True)
class IndexValue(Value):
    """An index expression used as a value (e.g. a coordinate, to mask out-of-range elements),
    converted from `source`, the type of `expr`'s value, to `dtype`. Every index expression
    the lowering makes is i32; a float scalar parameter of a hand-written thread kernel
    (`ScalarParam("alpha", f32)`) says `source=f32`, so the emitter does not convert it as
    an integer (it would pass 0.25 to the i32 -> f32 entry as 0)."""

    expr: Expr
    dtype: DType
    source: DType = i32


#: Unary ops on values: neg, abs, exp, exp2, log, log2, sqrt, rsqrt, sin, cos, tanh,
#: sigmoid, erf, not. Binary ops: add, sub, mul, div, max, min, pow, and, or, xor,
#: lt, le, gt, ge, eq, ne (comparisons have dtype bool), and on integers floordiv and mod
#: (floor semantics, as torch.floor_divide / torch.remainder; `x // 0` is -1, `x % 0` is x).
VALUE_UNARY_OPS = ("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos",
                   "tanh", "sigmoid", "erf", "not")
VALUE_BINARY_OPS = ("add", "sub", "mul", "div", "max", "min", "pow", "and", "or", "xor",
                    "lt", "le", "gt", "ge", "eq", "ne", "floordiv", "mod")


@dataclass(frozen=True)
class Unary(Value):
    op: str
    x: Value
    dtype: DType


@dataclass(frozen=True)
class Binary(Value):
    op: str
    x: Value
    y: Value
    dtype: DType


@dataclass(frozen=True)
class Cast(Value):
    """Convert to `dtype` with round-to-nearest-even (floats) or C semantics (ints)."""

    x: Value
    dtype: DType


@dataclass(frozen=True)
class Bits(Value):
    """The bits of `x` read as `dtype` (`tg.bitcast`): all of them where the widths match,
    else the `part`-th `dtype`-wide piece of x's bits, 0 the least significant."""

    x: Value
    dtype: DType
    part: int = 0


@dataclass(frozen=True)
class Where(Value):
    cond: Value
    if_true: Value
    if_false: Value
    dtype: DType


# --------------------------------------------------------------------------------------
# Statements
# --------------------------------------------------------------------------------------

class Stmt:
    """One thread-IR statement."""


@dataclass
class Comment(Stmt):
    """Says which tile op the following statements implement (kept in the CUDA source)."""

    text: str


@dataclass
class Let(Stmt):
    """`const int var = value;` — a per-thread integer computed once (a thread's
    coordinate base, a loop-invariant address) and read later as `Var(var.name)`.
    A name is bound once per kernel (lowering keeps names unique). `wide` values may exceed
    32 bits (they involve a tensor stride) and are 64-bit in CUDA."""

    var: Var
    value: Expr
    wide: bool = False


@dataclass
class Assign(Stmt):
    """`dst = value` for one register element."""

    dst: Reg
    value: Value


@dataclass
class GlobalLoad(Stmt):
    """Load `count` consecutive elements of global tensor `tensor` starting at element
    `index` into registers `dst … dst+count-1`, as one vector access of count*elem bytes.
    Where `pred` is false the registers get `fill` instead (no memory access)."""

    dst: Reg
    tensor: str
    index: Expr
    count: int
    pred: Expr | None = None
    fill: float = 0.0


@dataclass
class GlobalStore(Stmt):
    """Store registers `src … src+count-1` to `tensor[index … index+count-1]` where `pred`."""

    tensor: str
    index: Expr
    src: Reg
    count: int
    pred: Expr | None = None


@dataclass
class GlobalAtomicAdd(Stmt):
    """`tensor[index] += src` atomically (one element) where `pred`."""

    tensor: str
    index: Expr
    src: Reg
    pred: Expr | None = None


@dataclass
class SharedLoad(Stmt):
    """Load `count` consecutive elements of shared buffer `buffer` at element `offset`."""

    dst: Reg
    buffer: str
    offset: Expr
    count: int
    pred: Expr | None = None


@dataclass
class SharedStore(Stmt):
    """Store `count` consecutive registers to shared buffer `buffer` at element `offset`."""

    buffer: str
    offset: Expr
    src: Reg
    count: int
    pred: Expr | None = None


@dataclass
class CpAsync(Stmt):
    """`cp.async` of `count` elements (4, 8 or 16 bytes) from global to shared memory.
    Where `pred` is false the shared bytes are zero-filled (src-size 0)."""

    buffer: str
    offset: Expr
    tensor: str
    index: Expr
    count: int
    pred: Expr | None = None


@dataclass
class CpAsyncCommit(Stmt):
    """Close the current group of cp.async operations."""


@dataclass
class CpAsyncWait(Stmt):
    """Wait until at most `pending` groups of cp.async are still in flight."""

    pending: int


@dataclass
class LdMatrix(Stmt):
    """`ldmatrix.sync.aligned.m8n8.x{num}[.trans].shared.b16`.

    Each lane supplies the element offset (into `buffer`) of one 8-element row:
    lanes 0-7 address matrix 0, 8-15 matrix 1, 16-23 matrix 2, 24-31 matrix 3 (only
    the first 8*num lanes' addresses are used). Each lane receives 2*num 16-bit elements
    into `dst … dst+2*num-1`, matrix j's pair in elements 2j, 2j+1.
    """

    dst: Reg
    num: int
    trans: bool
    buffer: str
    offset: Expr


@dataclass
class Mma(Stmt):
    """One warp-wide matrix instruction, named by its catalogue entry (e.g.
    "mma.m16n8k16.f32.f16.f16.f32"). The register lists are in the PTX fragment order of
    that instruction: d and c hold the accumulator fragment, a and b the operands."""

    instr: str
    d: list[Reg]
    a: list[Reg]
    b: list[Reg]
    c: list[Reg]


@dataclass
class Shuffle(Stmt):
    """Warp shuffle of one 32-bit-or-narrower element: `dst = src` of lane
    (mode "xor": lane ^ arg, "idx": arg, "down": lane + arg, "up": lane - arg)."""

    dst: Reg
    src: Reg
    mode: str
    arg: Expr


@dataclass
class Barrier(Stmt):
    """`__syncthreads()`."""


@dataclass
class For(Stmt):
    """`for (var = start; var < stop; var += step) body`. `unroll` loops have constant
    bounds and may index registers with `var`; others must not."""

    var: Var
    start: Expr
    stop: Expr
    step: int
    body: list[Stmt]
    unroll: bool = False


@dataclass
class If(Stmt):
    cond: Expr
    then: list[Stmt]
    otherwise: list[Stmt] = field(default_factory=list)


# --------------------------------------------------------------------------------------
# The kernel
# --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorParam:
    """A global tensor argument: a pointer plus `rank` extents and strides (in elements),
    which the body reads as `{name}_shape{i}` / `{name}_stride{i}`. `writes` says whether the
    kernel writes it; `index_bits` whether its element offsets need 64-bit arithmetic."""

    name: str
    dtype: DType
    rank: int
    writes: bool = False
    index_bits: int = 64  # 32 when every element offset of the tensor fits in an int


@dataclass(frozen=True)
class ScalarParam:
    name: str
    dtype: DType


@dataclass(frozen=True)
class SharedBuffer:
    """A region of the block's dynamic shared memory, `size` elements at `byte_offset`."""

    name: str
    dtype: DType
    size: int
    byte_offset: int


@dataclass
class ThreadKernel:
    """A whole lowered kernel: what every thread of a block of `threads` runs."""

    name: str
    threads: int
    params: list[TensorParam | ScalarParam]
    registers: list[RegArray]
    shared: list[SharedBuffer]
    body: list[Stmt]
    #: mbarrier arrays (`async_ir.MBarrierArray`), placed in dynamic shared memory too.
    mbarriers: list = field(default_factory=list)
    #: Thread-block cluster dimensions (launched with `cuLaunchKernelEx` when not 1×1×1).
    cluster: tuple[int, int, int] = (1, 1, 1)
    #: Blocks an SM must hold at once (the `blocks_per_sm` build option; None: no minimum):
    #: `__launch_bounds__`'s second argument, capping each thread's registers.
    blocks_per_sm: int | None = None

    @property
    def shared_bytes(self) -> int:
        """Bytes of dynamic shared memory the kernel needs."""
        ends = [b.byte_offset + int(b.size * b.dtype.bits // 8) for b in self.shared]
        ends += [m.end for m in self.mbarriers]
        return max(ends, default=0)


def scalar_loaded_tensors(node) -> set[str]:
    """Names of the tensors any `LoadScalar` in `node` (statements, expressions, lists of
    them, loop and branch bodies included) reads."""
    found: set[str] = set()
    stack = [node]
    while stack:
        x = stack.pop()
        if isinstance(x, LoadScalar):
            found.add(x.tensor)
            stack.extend(x.coords)
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
        elif isinstance(x, (Stmt, Expr, Value, Reg)) and hasattr(x, "__dataclass_fields__"):
            stack.extend(getattr(x, f) for f in x.__dataclass_fields__)
        elif hasattr(x, "roles"):  # async_ir.Roles
            stack.extend(x.roles)
        elif hasattr(x, "body") and isinstance(getattr(x, "body"), list):
            stack.append(x.body)
    return found


def walk(stmts: list[Stmt]):
    """Every statement in `stmts`, depth first, loop and branch bodies included."""
    for s in stmts:
        yield s
        if isinstance(s, For):
            yield from walk(s.body)
        elif isinstance(s, If):
            yield from walk(s.then)
            yield from walk(s.otherwise)
        elif hasattr(s, "roles"):  # async_ir.Roles: each role's body
            for role in s.roles:
                yield from walk(role.body)
