"""Structural checks of a traced kernel's tile IR.

`verify(traced)` raises a `TegulaError` (with the offending op's source line) when the IR
breaks an invariant that every later pass relies on:

* every register tile an op touches is registered in `traced.register_tiles`, every shared
  tile's buffer in `traced.shared_allocs`, every global view's tensor in `traced.args`;
* no register tile is read before some earlier op (in program order) wrote it;
* every scalar an op uses is defined there: loop indices only inside their loop, tensor
  extents of known arguments, scalar arguments of the signature;
* each op's operands have legal scopes, consistent shapes and element types.

The language checks the same things with friendlier messages while tracing; this exists
for IR that passes build or rewrite (synthesis inserting conversions, pipelining).
"""
from __future__ import annotations

import math

from tegula.dtypes import bool_, i32
from tegula.errors import TegulaError
from tegula.ir.ops import (AtomicAdd, Bitcast, Copy, Elementwise, Fill, ForLoop, Gemm, IfThen,
                           Indices, LastArrival, Op, Rearrange, Reduce, Reshape, Scan,
                           TracedKernel, tiles_read, tiles_written)
from tegula.ir.scalar import (ArrivalFlag, Condition, LoopIndex, Scalar, ScalarArg,
                              ScalarBinOp, ScalarLoad, TensorExtent, constant_value)
from tegula.ir.values import GlobalTile, RegisterTile, SharedTile, Tile, describe

# Element-wise op names and their operand counts (thread IR's VALUE_UNARY_OPS and
# VALUE_BINARY_OPS; repeated here because ir may not import lower).
UNARY_OPS = frozenset(("neg", "abs", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin",
                       "cos", "tanh", "sigmoid", "erf", "not", "cast"))
BINARY_OPS = frozenset(("add", "sub", "mul", "div", "max", "min", "pow", "and", "or", "xor",
                        "lt", "le", "gt", "ge", "eq", "ne", "floordiv", "mod"))
COMPARISON_OPS = frozenset(("lt", "le", "gt", "ge", "eq", "ne"))
REDUCE_KINDS = frozenset(("sum", "max", "min"))
ARG_REDUCE_KINDS = frozenset(("argmax", "argmin"))  # i32 positions along the axis


def _equal_extent(a, b) -> bool:
    ca, cb = constant_value(a), constant_value(b)
    if ca is not None or cb is not None:
        return ca == cb
    return a is b or str(a) == str(b)


def _equal_shape(a: tuple, b: tuple) -> bool:
    return len(a) == len(b) and all(_equal_extent(x, y) for x, y in zip(a, b))


class _Verifier:
    def __init__(self, traced: TracedKernel):
        self.traced = traced
        self.registers = {id(t) for t in traced.register_tiles}
        self.allocs = {id(a) for a in traced.shared_allocs}
        self.arg_names = {a.name: a for a in traced.args}
        self.written: set[int] = set()
        self.loop_vars: list[LoopIndex] = []
        self.arrival_flags: list[ArrivalFlag] = []   # set by the LastArrivals seen so far

    def fail(self, op: Op | None, message: str) -> TegulaError:
        name = type(op).__name__ if op is not None else "kernel"
        loc = op.loc if op is not None else self.traced.loc
        return TegulaError(f"tile IR of {self.traced.name} is invalid: {name}: {message}", loc)

    # -- scalars --------------------------------------------------------------------------
    def check_scalar(self, x, op: Op) -> None:
        if isinstance(x, int) and not isinstance(x, bool):
            return
        if isinstance(x, ScalarBinOp):
            self.check_scalar(x.lhs, op)
            self.check_scalar(x.rhs, op)
        elif isinstance(x, Condition):
            self.check_scalar(x.lhs, op)
            if x.rhs is not None:
                self.check_scalar(x.rhs, op)
        elif isinstance(x, LoopIndex):
            if not any(v is x for v in self.loop_vars):
                raise self.fail(op, f"loop index {x} is used outside its loop")
        elif isinstance(x, TensorExtent):
            arg = self.arg_names.get(x.tensor)
            if arg is None or not 0 <= x.dim < arg.rank:
                raise self.fail(op, f"{x} names no dim of a tensor argument")
        elif isinstance(x, ScalarArg):
            if x.name not in self.traced.scalar_args:
                raise self.fail(op, f"{x} is not a scalar argument of the kernel")
        elif isinstance(x, ArrivalFlag):
            if not any(f is x for f in self.arrival_flags):
                raise self.fail(op, f"{x} is used before its last_arrival")
        elif isinstance(x, ScalarLoad):
            arg = self.arg_names.get(x.tensor)
            if arg is None or len(x.coords) != arg.rank:
                raise self.fail(op, f"{x} does not index every dim of a tensor argument")
            for c in x.coords:
                self.check_scalar(c, op)
        elif not isinstance(x, Scalar):
            raise self.fail(op, f"{x!r} is not a kernel scalar")

    # -- tiles ----------------------------------------------------------------------------
    def check_tile(self, t: Tile, op: Op) -> None:
        if isinstance(t, RegisterTile):
            if id(t) not in self.registers:
                raise self.fail(op, f"{describe(t)} is not in the kernel's register_tiles")
            if not all(isinstance(s, int) and s > 0 for s in t.shape):
                raise self.fail(op, f"{describe(t)} needs a static positive shape")
        elif isinstance(t, SharedTile):
            self.check_shared(t, op)
        elif isinstance(t, GlobalTile):
            self.check_global(t, op)
        else:
            raise self.fail(op, f"{t!r} is not a tile")

    def check_shared(self, t: SharedTile, op: Op) -> None:
        a = t.alloc
        if a is None or id(a) not in self.allocs:
            raise self.fail(op, f"{describe(t)} views a buffer not in shared_allocs")
        if sorted(t.permutation) != list(range(len(a.shape))):
            raise self.fail(op, f"{describe(t)} has permutation {t.permutation}, not a "
                                f"permutation of its buffer's {len(a.shape)} dims")
        if tuple(a.shape[p] for p in t.permutation) != tuple(t.shape) or t.dtype != a.dtype:
            raise self.fail(op, f"{describe(t)} does not match its buffer %{a.name} "
                                f"({a.shape}, {a.dtype})")
        self.check_scalar(t.stage, op)

    def check_global(self, t: GlobalTile, op: Op) -> None:
        arg = t.arg
        if arg is None or self.arg_names.get(arg.name) is not arg:
            raise self.fail(op, f"{describe(t)} views a tensor that is not a kernel argument")
        if len(t.origin) != arg.rank or t.dtype != arg.dtype:
            raise self.fail(op, f"{describe(t)} has {len(t.origin)} origin coordinates for "
                                f"rank-{arg.rank} tensor {arg.name}, or the wrong dtype")
        if len(t.dims) != len(t.shape):
            raise self.fail(op, f"{describe(t)} has {len(t.dims)} view dims for its shape")
        for d, extent in zip(t.dims, t.shape):
            if not 0 <= d.tensor_dim < arg.rank:
                raise self.fail(op, f"{describe(t)} has a dim along tensor dim {d.tensor_dim}")
            if not _equal_extent(d.extent, extent):
                raise self.fail(op, f"{describe(t)}: shape and view extents disagree")
            self.check_scalar(d.extent, op)
            self.check_scalar(d.step, op)
        for o in t.origin:
            self.check_scalar(o, op)
        for d, upper in t.limits:
            if not 0 <= d < arg.rank:
                raise self.fail(op, f"{describe(t)} limits tensor dim {d}")
            self.check_scalar(upper, op)

    # -- ops ------------------------------------------------------------------------------
    def check_block(self, ops: list[Op]) -> None:
        for op in ops:
            if isinstance(op, ForLoop):
                self.check_loop(op)
                continue
            if isinstance(op, IfThen):
                if not isinstance(op.cond, Condition):
                    raise self.fail(op, f"condition {op.cond!r} is not a Condition")
                self.check_scalar(op.cond, op)
                self.check_block(op.then)
                self.check_block(op.otherwise)
                continue
            for t in tiles_read(op) + tiles_written(op):
                self.check_tile(t, op)
            for t in tiles_read(op):
                if isinstance(t, RegisterTile) and id(t) not in self.written:
                    raise self.fail(op, f"{describe(t)} is read before any op writes it")
            self.check_op(op)
            self.written.update(id(t) for t in tiles_written(op) if isinstance(t, RegisterTile))

    def check_loop(self, op: ForLoop) -> None:
        if not isinstance(op.var, LoopIndex):
            raise self.fail(op, f"loop variable {op.var!r} is not a LoopIndex")
        if isinstance(op.step, bool) or not isinstance(op.step, int) or op.step == 0:
            raise self.fail(op, f"step {op.step!r} must be a nonzero int")
        if not isinstance(op.stages, int) or op.stages < 1:
            raise self.fail(op, f"stages {op.stages!r} must be a positive int")
        self.check_scalar(op.start, op)
        self.check_scalar(op.stop, op)
        for region in op.regions:  # role blocks name ops of this body, each op once
            if region.role not in ("producer", "consumer") or not all(
                    any(o is x for x in op.body) for o in region.ops):
                raise self.fail(op, f"its {region.role} region holds ops outside its body")
        if sum(len(r.ops) for r in op.regions) != len({id(o) for r in op.regions
                                                       for o in r.ops}):
            raise self.fail(op, "an op is in two of its role regions")
        self.loop_vars.append(op.var)
        self.check_block(op.body)
        self.loop_vars.pop()

    def check_op(self, op: Op) -> None:
        checker = _OP_CHECKS.get(type(op))
        if checker is None:
            raise self.fail(op, "unknown op type")
        checker(self, op)


def _check_copy(v: _Verifier, op: Copy) -> None:
    if isinstance(op.src, GlobalTile) and isinstance(op.dst, GlobalTile):
        raise v.fail(op, "copies from global to global memory")
    if not _equal_shape(op.src.shape, op.dst.shape) or op.src.dtype != op.dst.dtype:
        raise v.fail(op, f"{describe(op.src)} -> {describe(op.dst)}: shape or dtype differ")


def _check_gemm(v: _Verifier, op: Gemm) -> None:
    if not isinstance(op.c, RegisterTile):
        raise v.fail(op, f"accumulator {describe(op.c)} is not a register tile")
    if isinstance(op.a, GlobalTile) or isinstance(op.b, GlobalTile):
        raise v.fail(op, "gemm operands must be in shared memory or registers")
    if not all(t.rank == 2 for t in (op.a, op.b, op.c)):
        raise v.fail(op, "gemm operands must have rank 2")
    (m, k), (n, k2) = op.a.shape, op.b.shape
    if k != k2 or tuple(op.c.shape) != (m, n):
        raise v.fail(op, f"shapes c {op.c.shape}, a {op.a.shape}, b {op.b.shape} do not fit "
                         f"c[M,N] += a[M,K] b[N,K]")


def _check_fill(v: _Verifier, op: Fill) -> None:
    if not isinstance(op.dst, RegisterTile):
        raise v.fail(op, f"{describe(op.dst)} is not a register tile")


def _check_elementwise(v: _Verifier, op: Elementwise) -> None:
    arity = len(op.inputs) + len(op.scalars)
    expected = 3 if op.op == "where" else 1 if op.op in UNARY_OPS else \
        2 if op.op in BINARY_OPS else None
    if expected is None:
        raise v.fail(op, f"unknown element-wise op {op.op!r}")
    if arity != expected or any(not 0 <= i < arity for i in op.scalars):
        raise v.fail(op, f"{op.op} takes {expected} operands, has {len(op.inputs)} tiles and "
                         f"scalars at {sorted(op.scalars)}")
    if not op.inputs or not all(isinstance(t, RegisterTile) for t in op.inputs + [op.out]):
        raise v.fail(op, f"{op.op} operands and result must be register tiles")
    for t in op.inputs:
        if t.rank != op.out.rank or any(e not in (1, o) for e, o in zip(t.shape, op.out.shape)):
            raise v.fail(op, f"{describe(t)} does not broadcast to {describe(op.out)}")
    if op.op in COMPARISON_OPS and op.out.dtype != bool_:
        raise v.fail(op, f"comparison {op.op} must produce a bool tile")
    for value in op.scalars.values():
        if isinstance(value, Scalar):
            v.check_scalar(value, op)


def _check_reduce(v: _Verifier, op: Reduce) -> None:
    if op.kind not in REDUCE_KINDS | ARG_REDUCE_KINDS or not 0 <= op.axis < op.x.rank:
        raise v.fail(op, f"reduce kind {op.kind!r} / axis {op.axis} invalid for "
                         f"{describe(op.x)}")
    expected = tuple(1 if d == op.axis else e for d, e in enumerate(op.x.shape))
    dtype = i32 if op.kind in ARG_REDUCE_KINDS else op.x.dtype
    if tuple(op.out.shape) != expected or op.out.dtype != dtype:
        raise v.fail(op, f"result {describe(op.out)} should have shape {expected} and "
                         f"type {dtype}")


def _check_scan(v: _Verifier, op: Scan) -> None:
    combine = op.combine
    arity = {len(op.xs), len(op.outs), len(combine.lhs), len(combine.rhs),
              len(combine.results)}
    if arity != {len(op.xs)} or not op.xs or not 0 <= op.axis < op.xs[0].rank:
        raise v.fail(op, f"scan of {len(op.xs)} tiles along axis {op.axis} has "
                         f"{len(op.outs)} results and a combine of arity {arity}")
    for x, out, result in zip(op.xs, op.outs, combine.results):
        if not (tuple(x.shape) == tuple(out.shape) == tuple(result.shape)
                and x.dtype == out.dtype == result.dtype):
            raise v.fail(op, f"{describe(x)} -> {describe(out)} (combine gives "
                             f"{describe(result)}) changes shape or dtype")
    for inner in combine.ops:
        if not isinstance(inner, Elementwise):
            raise v.fail(op, f"combine holds a {type(inner).__name__}; only element-wise ops")
        _check_elementwise(v, inner)
    if len(op.initials) != len(op.carries) or op.initials and len(op.initials) != len(op.xs):
        raise v.fail(op, f"scan of {len(op.xs)} tiles has {len(op.initials)} initial(s) and "
                         f"{len(op.carries)} carries")
    for x, initial, carry in zip(op.xs, op.initials, op.carries):
        one_step = tuple(1 if d == op.axis else e for d, e in enumerate(x.shape))
        if not (tuple(initial.shape) == tuple(carry.shape) == one_step
                and x.dtype == initial.dtype == carry.dtype):
            raise v.fail(op, f"{describe(initial)} -> {describe(carry)} should have shape "
                             f"{one_step} and type {x.dtype} to continue {describe(x)}")


def _check_indices(v: _Verifier, op: Indices) -> None:
    if op.out.dtype != i32 or not 0 <= op.axis < op.out.rank:
        raise v.fail(op, f"{describe(op.out)} must be an i32 tile with an axis {op.axis}")
    v.check_scalar(op.offset, op)


def _check_reshape(v: _Verifier, op: Reshape) -> None:
    if sorted(op.order) != list(range(op.x.rank)) or op.x.dtype != op.out.dtype or \
            math.prod(op.x.shape) != math.prod(op.out.shape):
        raise v.fail(op, f"{describe(op.x)} -> {describe(op.out)} (perm {op.order}) changes "
                         f"the element count or the dtype, or its perm is no permutation")


def _check_bitcast(v: _Verifier, op: Bitcast) -> None:
    ratio = op.x.dtype.bits // max(1, op.out.dtype.bits)
    shape = tuple(op.x.shape) + ((2,) if ratio == 2 else ())
    if ratio not in (1, 2) or op.x.dtype.bits != ratio * op.out.dtype.bits or \
            tuple(op.out.shape) != shape:
        raise v.fail(op, f"{describe(op.x)} -> {describe(op.out)} is no bitcast (same "
                         f"width, same shape; or 32 to 16 bits with a last dim of 2)")


def _check_rearrange(v: _Verifier, op: Rearrange) -> None:
    if tuple(op.x.shape) != tuple(op.out.shape) or op.x.dtype != op.out.dtype:
        raise v.fail(op, f"{describe(op.x)} -> {describe(op.out)} changes shape or dtype")


def _check_last_arrival(v: _Verifier, op: LastArrival) -> None:
    t = op.counter
    if not isinstance(t, GlobalTile) or t.dtype != i32 or \
            not all(isinstance(e, int) and e == 1 for e in t.shape):
        raise v.fail(op, f"the counter {describe(t)} is not one i32 element of a global tensor")
    if not isinstance(op.flag, ArrivalFlag):
        raise v.fail(op, f"{op.flag!r} is not an ArrivalFlag")
    v.check_scalar(op.count, op)
    v.arrival_flags.append(op.flag)


def _check_atomic_add(v: _Verifier, op: AtomicAdd) -> None:
    if not isinstance(op.src, RegisterTile) or isinstance(op.dst, RegisterTile):
        raise v.fail(op, "atomic_add goes from a register tile to global or shared memory")
    if not _equal_shape(op.src.shape, op.dst.shape) or op.src.dtype != op.dst.dtype:
        raise v.fail(op, f"{describe(op.src)} -> {describe(op.dst)}: shape or dtype differ")


_OP_CHECKS = {Copy: _check_copy, Gemm: _check_gemm, Fill: _check_fill,
              Elementwise: _check_elementwise, Reduce: _check_reduce,
              Rearrange: _check_rearrange, AtomicAdd: _check_atomic_add,
              LastArrival: _check_last_arrival,
              Indices: _check_indices, Reshape: _check_reshape, Scan: _check_scan,
              Bitcast: _check_bitcast}


def verify(traced: TracedKernel) -> None:
    """Raise TegulaError (at the offending op's line) if `traced` breaks an invariant."""
    v = _Verifier(traced)
    if len(v.registers) != len(traced.register_tiles) or \
            len(v.allocs) != len(traced.shared_allocs):
        raise v.fail(None, "a tile or shared buffer is registered twice")
    for alloc in traced.shared_allocs:
        if alloc.stages < 1 or not all(isinstance(s, int) and s > 0 for s in alloc.shape):
            raise TegulaError(f"tile IR of {traced.name} is invalid: shared buffer %{alloc.name} "
                              f"needs a static shape and at least one stage", alloc.loc)
    v.check_block(traced.body)


__all__ = ["verify"]
