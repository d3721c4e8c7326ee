"""Compile thread-IR index expressions and value expressions into numpy closures.

Each `Expr` is compiled once into a Python closure over the environment dict (`env`:
variable name -> Python int for block-uniform values, or an int64 array [threads] for
per-thread values such as `tid`). Uniform subexpressions therefore stay Python ints and
cost almost nothing; only thread-dependent ones touch numpy. Division and remainder are
numpy/Python floor semantics, which equal C's on the non-negative operands lowering
produces (thread_ir.INDEX_BINARY_OPS).

Each `Value` compiles to a closure over the block state returning an array [threads] (or a
numpy scalar) in the storage type of its dtype, rounded to that type (see `values.py`):
float ops of 16-bit and 8-bit types are computed in float32 and rounded per operation,
which equals correctly rounded 16-bit arithmetic for + - * / sqrt.
"""
from __future__ import annotations

import math
import operator
from typing import Any, Callable

import numpy as np

from tegula.arch.convert import half_arithmetic
from tegula.arch.minmax import nan_minmax
from tegula.arch.special import LG2_APPROX
from tegula.dtypes import DType, bf16, bool_, f16
from tegula.emulate.errors import EmulationError
from tegula.emulate.values import from_bits, round_to, to_bits
from tegula.lower.async_ir import Elect
from tegula.lower.thread_ir import (BinOp, Binary, Bits, Cast, Const, Expr, IndexValue, Literal,
                                    LoadScalar, RegRead, Select, TID, Unary, Value, Var,
                                    Where, floor_div, floor_mod)

Env = dict


def tensor_key(name: str) -> str:
    """The environment key under which the machine binds tensor `name`'s `GlobalTensor`
    (for `LoadScalar`); not a C identifier, so it cannot meet a variable's name."""
    return f"@tensor:{name}"


def _logical(fn):
    def op(a, b):
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return fn(a, b)
        return int(bool(fn(bool(a), bool(b))))
    return op


def _minmax(py, npf):
    def op(a, b):
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return npf(a, b)
        return py(a, b)
    return op


def _floor_index_op(scalar_fn, array_fn):
    """A user-level `//` / `%` (index ops `floordiv` / `mod`): floor semantics with the
    zero-divisor rule, on ints or per-thread arrays."""
    def op(a, b):
        if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
            return array_fn(np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64))
        return scalar_fn(int(a), int(b))
    return op


_ERF = np.vectorize(math.erf, otypes=[np.float64])

_INDEX_OPS: dict[str, Callable[[Any, Any], Any]] = {
    "floordiv": _floor_index_op(floor_div, lambda a, b: _floor_div(a, b)),
    "mod": _floor_index_op(floor_mod, lambda a, b: _floor_mod(a, b)),
    "+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
    "%": operator.mod, "<": operator.lt, "<=": operator.le, ">": operator.gt,
    ">=": operator.ge, "==": operator.eq, "!=": operator.ne,
    "and": _logical(np.logical_and), "or": _logical(np.logical_or),
    "&": operator.and_, "|": operator.or_, "^": operator.xor,
    "<<": operator.lshift, ">>": operator.rshift,
    "min": _minmax(min, np.minimum), "max": _minmax(max, np.maximum),
}


def compile_expr(e: Expr) -> Callable[[Env], Any]:
    """A closure evaluating `e` in an environment (Python int or int64/bool array)."""
    if isinstance(e, Const):
        v = e.value
        return lambda env: v
    if isinstance(e, Var):
        name = e.name

        def var(env):
            try:
                return env[name]
            except KeyError:
                raise EmulationError(f"unbound variable {name!r} in an index expression") from None
        return var
    if isinstance(e, BinOp):
        fn = _INDEX_OPS.get(e.op)
        if fn is None:
            raise EmulationError(f"unknown index operator {e.op!r}")
        lhs, rhs = compile_expr(e.lhs), compile_expr(e.rhs)
        if isinstance(e.rhs, Const):
            c = e.rhs.value
            return lambda env: fn(lhs(env), c)
        return lambda env: fn(lhs(env), rhs(env))
    if isinstance(e, Select):
        cond, a, b = compile_expr(e.cond), compile_expr(e.if_true), compile_expr(e.if_false)

        def select(env):
            c = cond(env)
            if isinstance(c, np.ndarray):
                return np.where(c, a(env), b(env))
            return a(env) if c else b(env)
        return select
    if isinstance(e, LoadScalar):
        return _compile_load(e)
    if isinstance(e, Elect):  # lane 0 of each warp (the machine checks the warp is whole)
        return lambda env: env[TID.name] % 32 == 0
    if isinstance(e, int) and not isinstance(e, bool):
        return lambda env: e
    raise EmulationError(f"not an index expression: {e!r}")


def _compile_load(e: LoadScalar) -> Callable[[Env], Any]:
    """A scalar read from a global tensor, every coordinate checked against its extent
    (out of bounds is an error naming the tensor, the coordinate and the shape)."""
    coords = [compile_expr(c) for c in e.coords]
    key, name = tensor_key(e.tensor), e.tensor

    def load(env):
        tensor = env.get(key)
        if tensor is None:
            raise EmulationError(f"scalar load from {name!r}, which is not a tensor "
                                 f"argument of the kernel")
        at = [c(env) for c in coords]
        for d, (c, extent) in enumerate(zip(at, tensor.array.shape)):
            bad = np.any((np.asarray(c) < 0) | (np.asarray(c) >= extent))
            if bad:
                shown = [int(np.asarray(x).flat[0]) if np.ndim(x) == 0 else x for x in at]
                raise EmulationError(f"scalar load {name}{shown} is out of bounds: dim {d} "
                                     f"of {name} has extent {extent} (shape "
                                     f"{tuple(tensor.array.shape)})")
        if any(isinstance(c, np.ndarray) for c in at):
            return tensor.array[tuple(np.asarray(c, dtype=np.int64) for c in at)].astype(np.int64)
        return int(tensor.array[tuple(int(c) for c in at)])
    return load


# ---------------------------------------------------------------------- values

_CMP = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
        "eq": np.equal, "ne": np.not_equal}


def _c_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """C integer division (truncation toward zero); division by zero gives -1 (like PTX)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        safe = np.where(y == 0, 1, y)
        q = np.abs(x) // np.abs(safe)
        q = np.where((x < 0) != (safe < 0), -q, q)
    return np.where(y == 0, -1, q)


def _floor_div(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Integer `//`: floor division (torch.floor_divide, Python); `x // 0` is -1 (as `/`)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        q = np.floor_divide(x, np.where(y == 0, 1, y))
    return np.where(y == 0, -1, q)


def _floor_mod(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Integer `%`: the remainder with the divisor's sign (torch.remainder, Python), so that
    x == (x // y) * y + x % y; `x % 0` is x (which keeps that identity with x // 0 == -1)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        r = np.remainder(x, np.where(y == 0, 1, y))
    return np.where(y == 0, x, r)


def _float_binary(op: str, x, y):
    xf = np.asarray(x, dtype=np.float32)
    yf = np.asarray(y, dtype=np.float32)
    with np.errstate(all="ignore"):
        if op == "add":
            return xf + yf
        if op == "sub":
            return xf - yf
        if op == "mul":
            return xf * yf
        if op == "div":
            return xf / yf
        if op in ("max", "min"):
            # What the emitted instruction computes (a NaN operand gives NaN, as torch).
            return nan_minmax(op).execute(xf, yf)
        if op == "pow":
            return np.power(xf, yf)
    raise EmulationError(f"operator {op!r} is not defined on floats")


def _int_binary(op: str, x, y, dt: DType):
    if dt == bool_ or (np.asarray(x).dtype == np.bool_ and op in ("and", "or", "xor")):
        xb, yb = np.asarray(x, dtype=bool), np.asarray(y, dtype=bool)
        fn = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}.get(op)
        if fn is None:
            raise EmulationError(f"operator {op!r} is not defined on bool")
        return fn(xb, yb)
    xi, yi = np.asarray(x).astype(np.int64), np.asarray(y).astype(np.int64)
    if op == "add":
        return xi + yi
    if op == "sub":
        return xi - yi
    if op == "mul":
        return xi * yi
    if op == "div":
        return _c_div(xi, yi)
    if op == "floordiv":
        return _floor_div(xi, yi)
    if op == "mod":
        return _floor_mod(xi, yi)
    if op == "max":
        return np.maximum(xi, yi)
    if op == "min":
        return np.minimum(xi, yi)
    if op == "and":
        return xi & yi
    if op == "or":
        return xi | yi
    if op == "xor":
        return xi ^ yi
    if op == "pow":
        return xi ** yi
    raise EmulationError(f"operator {op!r} is not defined on integers")


def _unary(op: str, x, dt: DType):
    if op == "not":
        a = np.asarray(x)
        return np.logical_not(a) if a.dtype == np.bool_ or dt == bool_ else ~a.astype(np.int64)
    if op in ("neg", "abs") and not dt.is_float:
        a = np.asarray(x).astype(np.int64)
        return -a if op == "neg" else np.abs(a)
    f = np.asarray(x, dtype=np.float32)
    with np.errstate(all="ignore"):
        if op == "neg":
            return -f
        if op == "abs":
            return np.abs(f)
        if op == "exp":
            return np.exp(f)
        if op == "exp2":  # CUDA's ex2.approx.ftz: results below 2^-126 flush to 0
            r = np.exp2(f)
            return np.where(np.abs(r) < np.float32(2.0 ** -126), np.float32(0), r)
        if op == "log":
            return np.log(f)
        if op == "log2":  # the catalogue's lg2.approx.f32 (`arch.special`)
            return LG2_APPROX.execute(f)
        if op == "sqrt":
            return np.sqrt(f)
        if op == "rsqrt":
            return np.float32(1) / np.sqrt(f)
        if op == "sin":
            return np.sin(f)
        if op == "cos":
            return np.cos(f)
        if op == "tanh":
            return np.tanh(f)
        if op == "sigmoid":
            return np.float32(1) / (np.float32(1) + np.exp(-f))
        if op == "erf":  # numpy has no erf: math.erf in f64, rounded once (CUDA's erff: ≤ 2 ulp)
            return _ERF(f.astype(np.float64)).astype(np.float32)
    raise EmulationError(f"unknown unary operator {op!r}")


def compile_value(v: Value, reg_index: Callable) -> Callable[[Any], Any]:
    """A closure over the block state evaluating `v` (see module docstring).

    `reg_index(reg, count)` returns a closure `state -> (array, column)` for a register.
    """
    if isinstance(v, RegRead):
        locate = reg_index(v.reg, 1)

        def read(state):
            arr, col = locate(state)
            return arr[:, col]
        return read
    if isinstance(v, Literal):
        const = round_to(np.asarray(v.value), v.dtype)[()]
        return lambda state: const
    if isinstance(v, IndexValue):
        expr, dt = compile_expr(v.expr), v.dtype
        return lambda state: round_to(np.asarray(expr(state.env)), dt)
    if isinstance(v, Cast):
        x, dt = compile_value(v.x, reg_index), v.dtype
        if v.x.dtype.name == "i4":  # held as its nibble 0..15; its value is -8..7 (as CUDA)
            return lambda state: round_to((x(state).astype(np.int8) ^ 8) - 8, dt)
        return lambda state: round_to(x(state), dt)
    if isinstance(v, Bits):  # tg.bitcast: the bits of x (or its part-th piece) as dtype
        x, src, dt = compile_value(v.x, reg_index), v.x.dtype, v.dtype
        shift, mask = v.part * dt.bits, (1 << dt.bits) - 1

        def bits(state):
            raw = to_bits(np.asarray(x(state)), src).astype(np.uint64)
            return from_bits((raw >> np.uint64(shift)) & np.uint64(mask), dt)
        return bits
    if isinstance(v, Unary):
        x, op, dt = compile_value(v.x, reg_index), v.op, v.dtype
        return lambda state: round_to(_unary(op, x(state), dt), dt)
    if isinstance(v, Binary):
        x, y, op, dt = compile_value(v.x, reg_index), compile_value(v.y, reg_index), v.op, v.dtype
        if op in _CMP:
            cmp = _CMP[op]
            return lambda state: cmp(x(state), y(state))
        if dt in (f16, bf16) and op in ("add", "sub", "mul"):
            # What the emitted code computes: the catalogue's 16-bit entry (add.rn.f16, ...).
            entry = half_arithmetic(op, dt)
            return lambda state: entry.execute(x(state), y(state))
        if dt.is_float:
            return lambda state: round_to(_float_binary(op, x(state), y(state)), dt)
        return lambda state: round_to(_int_binary(op, x(state), y(state), dt), dt)
    if isinstance(v, Where):
        c, a, b = (compile_value(v.cond, reg_index), compile_value(v.if_true, reg_index),
                   compile_value(v.if_false, reg_index))
        dt = v.dtype
        def where(state):
            return round_to(np.where(np.asarray(c(state), dtype=bool), a(state), b(state)), dt)
        return where
    raise EmulationError(f"not a value expression: {v!r}")

