"""Scalar expressions of tile IR: block indices, grid sizes, loop variables, tensor extents,
elements loaded from global memory, arithmetic.

A traced kernel computes tile origins and loop bounds from these (`m * BM`, `cdiv(K, BK)`,
`tg.minimum(tiles - first, G)`). They are uniform across the threads of a block; lowering
turns them into thread-IR index expressions. Python ints mix in freely and fold.

Integer `//` and `%` have floor semantics (Python's and torch's, as on tiles), with
`x // 0 == -1` and `x % 0 == x` at run time; a literal zero divisor is a TraceError.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Union

from tegula.dtypes import DType


def _with_tile(o) -> bool:
    """True for a language tile handle (it sets `__tegula_tile__`): a scalar combined with
    a tile leaves the operator to the tile (`n < cols`, `m * BM + tg.arange(BM)`), which
    builds an element-wise op; ir cannot import the language, hence the marker."""
    return getattr(o, "__tegula_tile__", False)


def _comparable(o) -> bool:
    """Whether `scalar == o` is a condition: o a Scalar or an int (anything else — a
    slice, Ellipsis, None, a tile — compares by identity, or is the tile's operator)."""
    return isinstance(o, Scalar) or (isinstance(o, int) and not isinstance(o, bool))


class Scalar:
    """A block-uniform integer. Operators build expressions and fold constants."""

    def __add__(self, o): return NotImplemented if _with_tile(o) else scalar_op("+", self, o)
    def __radd__(self, o): return scalar_op("+", o, self)
    def __sub__(self, o): return NotImplemented if _with_tile(o) else scalar_op("-", self, o)
    def __rsub__(self, o): return scalar_op("-", o, self)
    def __mul__(self, o): return NotImplemented if _with_tile(o) else scalar_op("*", self, o)
    def __rmul__(self, o): return scalar_op("*", o, self)
    def __floordiv__(self, o):
        return NotImplemented if _with_tile(o) else scalar_op("//", self, o)
    def __rfloordiv__(self, o): return scalar_op("//", o, self)
    def __mod__(self, o): return NotImplemented if _with_tile(o) else scalar_op("%", self, o)
    def __rmod__(self, o): return scalar_op("%", o, self)
    # Ordering comparisons build a `Condition` (for `tg.if_`). So do `==` and `!=`, as an
    # `Equality`: a Condition for `tg.if_(tg.block_id(0) == 0)`, and in the compiler's own
    # code (dict keys, `x in list`, `a == b`) the identity test Scalars always had. A kernel
    # that branches on one with Python's `if` gets a TraceError, not a branch silently
    # never taken (`tg.block_id(0) == 0` used to be a plain False).
    def __eq__(self, o):
        return Equality.of("==", self, o) if _comparable(o) else NotImplemented

    def __ne__(self, o):
        return Equality.of("!=", self, o) if _comparable(o) else NotImplemented

    __hash__ = object.__hash__
    def __lt__(self, o): return NotImplemented if _with_tile(o) else compare("<", self, o)
    def __le__(self, o): return NotImplemented if _with_tile(o) else compare("<=", self, o)
    def __gt__(self, o): return NotImplemented if _with_tile(o) else compare(">", self, o)
    def __ge__(self, o): return NotImplemented if _with_tile(o) else compare(">=", self, o)

    def __bool__(self) -> bool:
        # Python control flow on a runtime value would silently pick one branch at trace time.
        from tegula.errors import TraceError
        raise TraceError(f"the value {self} is only known when the kernel runs, so Python "
                         f"`if`/`while`/`and` cannot branch on it; use tg.if_ or tg.where")

    def __index__(self) -> int:
        from tegula.errors import TraceError
        raise TraceError(f"the value {self} is only known when the kernel runs and cannot be "
                         f"used where Python needs an int (a tile shape, range(), a list "
                         f"index); to loop over it, write `for k in tg.range(...)` (or "
                         f"tg.pipeline) instead of Python's range()")


@dataclass(frozen=True, eq=False)
class ScalarConst(Scalar):
    value: int

    def __str__(self) -> str:
        return str(self.value)


@dataclass(frozen=True, eq=False)
class BlockIndex(Scalar):
    """`tg.block_id(axis)`: the block's index along grid axis 0, 1 or 2."""

    axis: int

    def __str__(self) -> str:
        return f"block_id({self.axis})"


@dataclass(frozen=True, eq=False)
class GridSize(Scalar):
    """`tg.num_programs(axis)`: the number of blocks launched along grid axis 0, 1 or 2."""

    axis: int

    def __str__(self) -> str:
        return f"num_programs({self.axis})"


@dataclass(frozen=True, eq=False)
class SMCount(Scalar):
    """`tg.num_sms()`: the number of streaming multiprocessors of the device running the
    kernel (read at run time, so one compiled kernel serves every variant of a GPU)."""

    def __str__(self) -> str:
        return "num_sms()"


@dataclass(frozen=True, eq=False)
class ScalarLoad(Scalar):
    """`offsets[e]`: one element of integer global tensor `tensor` at tensor coordinate
    `coords` (one Scalar per dim), loaded by every thread at run time."""

    tensor: str
    coords: tuple
    dtype: DType

    def __str__(self) -> str:
        return f"{self.tensor}[{', '.join(str(c) for c in self.coords)}]"


@dataclass(frozen=True, eq=False)
class LoopIndex(Scalar):
    """The induction variable of a `tg.range` / `tg.pipeline` loop. `non_negative`: its
    loop starts at a value known to be >= 0 and counts up, so the index never is negative
    (lowering then keeps C's `/` and `%` on it, which equal floor division only there)."""

    name: str
    non_negative: bool = False

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class ArrivalFlag(Scalar):
    """1 in the block that arrives last on a `tg.last_arrival` counter, else 0 (the op
    `ir.ops.LastArrival` sets it; block-uniform, known from that op on)."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class TensorExtent(Scalar):
    """Extent `dim` of global tensor argument `tensor` (known at launch)."""

    tensor: str
    dim: int

    def __str__(self) -> str:
        return f"{self.tensor}.shape[{self.dim}]"


@dataclass(frozen=True, eq=False)
class ScalarArg(Scalar):
    """A scalar (int) kernel argument."""

    name: str

    def __str__(self) -> str:
        return self.name


@dataclass(frozen=True, eq=False)
class ScalarBinOp(Scalar):
    op: str
    lhs: Scalar
    rhs: Scalar

    def __str__(self) -> str:
        if self.op in ("min", "max"):
            return f"{self.op}({self.lhs}, {self.rhs})"
        return f"({self.lhs} {self.op} {self.rhs})"


@dataclass(frozen=True, eq=False)
class SteppedIndex(ScalarBinOp):
    """What the body of `tg.range(start, stop, step)` with a run-time `step` sees as its
    index: `start + i * step` for the loop's counter `i` (0, 1, …). Lowered like any
    `ScalarBinOp`; a distinct type so the language knows it is a loop index."""


def is_loop_index(x) -> bool:
    """True for what a run-time loop yields (a LoopIndex, or a SteppedIndex)."""
    return isinstance(x, (LoopIndex, SteppedIndex))


ScalarLike = Union[Scalar, int]

_FOLD = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
         "//": lambda a, b: a // b, "%": lambda a, b: a % b, "min": min, "max": max}


def as_scalar(x: ScalarLike) -> Scalar:
    if isinstance(x, Scalar):
        return x
    if isinstance(x, bool) or not isinstance(x, int):
        from tegula.errors import TraceError
        raise TraceError(f"expected an integer or a kernel scalar, got {x!r}")
    return ScalarConst(x)


def scalar_op(op: str, lhs: ScalarLike, rhs: ScalarLike) -> Scalar:
    """`lhs op rhs`, folded when both sides are constants or one side is an identity."""
    a, b = as_scalar(lhs), as_scalar(rhs)
    if op in ("//", "%") and isinstance(b, ScalarConst) and b.value == 0:
        from tegula.errors import TraceError
        raise TraceError(f"the kernel scalar expression {a} {op} 0 divides by a literal zero")
    if isinstance(a, ScalarConst) and isinstance(b, ScalarConst):
        return ScalarConst(_FOLD[op](a.value, b.value))
    if op in ("+", "-") and isinstance(b, ScalarConst) and b.value == 0:
        return a
    if op == "+" and isinstance(a, ScalarConst) and a.value == 0:
        return b
    if op in ("*", "//") and isinstance(b, ScalarConst) and b.value == 1:
        return a
    if op == "*" and isinstance(a, ScalarConst) and a.value == 1:
        return b
    if op == "*" and any(isinstance(s, ScalarConst) and s.value == 0 for s in (a, b)):
        return ScalarConst(0)
    return ScalarBinOp(op, a, b)


@dataclass(frozen=True, eq=False)
class Condition:
    """A block-uniform boolean: `lhs op rhs` with op in < <= > >= == != (Scalar operands),
    or `and` / `or` of two Conditions, or `not` of one (`rhs` is None). Built by comparing
    Scalars (`k < n`), combined with `&`, `|`, `~`; `tg.if_` branches on it."""

    op: str
    lhs: object
    rhs: object = None

    def __and__(self, o): return Condition("and", self, _as_condition(o))
    def __rand__(self, o): return Condition("and", _as_condition(o), self)
    def __or__(self, o): return Condition("or", self, _as_condition(o))
    def __ror__(self, o): return Condition("or", _as_condition(o), self)
    def __invert__(self): return Condition("not", self)

    def __bool__(self) -> bool:
        from tegula.errors import TraceError
        raise TraceError(f"the condition {self} is only known when the kernel runs, so Python "
                         f"`if`/`and`/`or`/`not` cannot use it; combine conditions with & | ~ "
                         f"and branch with tg.if_")

    def __str__(self) -> str:
        if self.op == "not":
            return f"!{self.lhs}"
        return f"({self.lhs} {self.op} {self.rhs})"


COMPARISONS = {"<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b,
               ">=": lambda a, b: a >= b, "==": lambda a, b: a == b, "!=": lambda a, b: a != b}


def _as_condition(x) -> Condition:
    if isinstance(x, Condition):
        return x
    from tegula.errors import TraceError
    raise TraceError(f"expected a condition (a comparison of kernel scalars), got {x!r}")


_COMPILER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_KERNEL_CODE_DIRS = (os.path.join(_COMPILER_DIR, "kernels") + os.sep,)  # kernels: user code


def _compiler_code(filename: str) -> bool:
    """Whether a frame's file is tegula's compiler (not a kernel written in the language)."""
    return filename.startswith(_COMPILER_DIR) and not filename.startswith(_KERNEL_CODE_DIRS)


@dataclass(frozen=True, eq=False)
class Equality(Condition):
    """`a == b` / `a != b` with a Scalar on one side: a Condition for tg.if_; as a Python
    bool, the identity test in the compiler's code and a TraceError in a kernel's."""

    same: bool = False  # whether the operands are the very same object

    @staticmethod
    def of(op: str, lhs, rhs):
        result = compare(op, lhs, rhs)
        if isinstance(result, bool):  # two constants
            return result
        return Equality(result.op, result.lhs, result.rhs, same=lhs is rhs)

    def __bool__(self) -> bool:
        import sys
        if _compiler_code(sys._getframe(1).f_code.co_filename):
            return self.same if self.op == "==" else not self.same
        from tegula.errors import TraceError
        text = str(self)
        call = f"tg.if_{text}" if text.startswith("(") else f"tg.if_({text})"
        raise TraceError(f"the comparison {text} is only known when the kernel runs, so a "
                         f"Python `if`/`and`/`or` cannot branch on it (it would silently "
                         f"take one branch); branch with `with {call}:` or select with "
                         f"tg.where")


def compare(op: str, lhs: ScalarLike, rhs: ScalarLike):
    """`lhs op rhs` as a Condition; a plain bool when both sides are constants."""
    a, b = as_scalar(lhs), as_scalar(rhs)
    if isinstance(a, ScalarConst) and isinstance(b, ScalarConst):
        return COMPARISONS[op](a.value, b.value)
    return Condition(op, a, b)


def cdiv(a: ScalarLike, b: ScalarLike):
    """Ceiling division; plain ints give an int so it works on the host side too."""
    if isinstance(a, int) and isinstance(b, int):
        return -(-a // b)
    return (as_scalar(a) + (as_scalar(b) - 1)) // b


def constant_value(x: ScalarLike) -> int | None:
    """The int value of `x` if it is a compile-time constant, else None."""
    if isinstance(x, int):
        return x
    return x.value if isinstance(x, ScalarConst) else None


def positive_constant(x) -> bool:
    """True if `x` is a Python int (or ScalarConst) > 0."""
    value = x.value if isinstance(x, ScalarConst) else x
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def known_non_negative(x) -> bool:
    """True if the kernel scalar `x` is known to be >= 0 whenever the kernel runs."""
    if isinstance(x, (int, ScalarConst)):
        return (x.value if isinstance(x, ScalarConst) else x) >= 0
    if isinstance(x, (BlockIndex, GridSize, SMCount, TensorExtent)):
        return True
    if isinstance(x, LoopIndex):
        return x.non_negative
    if isinstance(x, ScalarBinOp) and x.op in ("+", "*", "min", "max"):
        both = known_non_negative(x.lhs) and known_non_negative(x.rhs)
        return both or (x.op == "max" and (known_non_negative(x.lhs) or
                                           known_non_negative(x.rhs)))
    if isinstance(x, ScalarBinOp) and x.op in ("//", "%"):
        return known_non_negative(x.lhs) and positive_constant(x.rhs)
    return False  # an int argument, a loaded value, a difference
