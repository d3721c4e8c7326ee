"""The numpy reference of a fuzz program, built from its description (never from tegula's
compiler or emulator).

Every value is held for all blocks at once: an array of shape (GM, GN, h, w), block (m, n)
at [m, n], its tile (h, w) after it. With each value goes an error bound and a "wild" mask:

* `err` bounds |implementation - model| per element. It is 0 where the result is exactly
  determined — integer ops, + - * / of exact floats (one correctly rounded operation,
  which compute-in-f32-then-round gives for 16- and 8-bit floats too), comparisons, casts
  — and grows through math functions (a few f32 ulps: `expf` and numpy's float32 `exp`
  differ from the true value and from each other), float reductions (any summation order)
  and everything downstream of them, by first-order propagation plus one ulp per rounding.
* `wild` marks elements the model cannot decide: a comparison, truncation or branch whose
  inputs are within their error bound of the decision boundary, results that may or may not
  overflow, and so on. Wild elements are not compared.

`loose=True` models the GPU: f32 arithmetic may be contracted into FMAs and so every f32
op may be off by an ulp of its product or result.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tegula.fuzz import numerics as nx
from tegula.fuzz.program import (COMPARISONS, Alias, Assign, Binary, Branch, Cast, Extent, Full,
                                 Gemm,
                                 InPlace, Indices, Load, Loop, Num, Program, Reduce, Stash,
                                 Store, Unary, Unstash, Where, Cumsum)

MATH_ULPS = {"exp": 4, "exp2": 4, "log": 4, "log2": 4, "sqrt": 0, "rsqrt": 4, "sin": 4,
             "cos": 4, "tanh": 4, "sigmoid": 6}
_TINY = 2.0 ** -149  # the sign of a zero chosen by fmax/fmin is unspecified: a tiny error
_F32_TINY_NORMAL = 2.0 ** -126  # how far underflowing exp/sigmoid implementations may differ
#: On the GPU tg.log2 is lg2.approx.f32: |error| <= 2^-22 for inputs in [0.5, 2] (the CUDA
#: programming guide's bound for __log2f), many ulps of a result near 0; 2 ulp elsewhere.
_LG2_APPROX_ABS = 2.0 ** -22
_MATH = {"exp": np.exp, "exp2": np.exp2, "log": np.log, "log2": np.log2, "sqrt": np.sqrt,
         "rsqrt": lambda x: 1.0 / np.sqrt(x), "sin": np.sin, "cos": np.cos, "tanh": np.tanh,
         "sigmoid": lambda x: 1.0 / (1.0 + np.exp(-x))}
_MONOTONE = ("exp", "exp2", "log", "log2", "sqrt", "rsqrt", "tanh", "sigmoid")


@dataclass
class Value:
    """Values of one tile in every block, with error bound and wild mask (see above)."""

    dtype: str
    val: np.ndarray
    err: np.ndarray
    wild: np.ndarray

    @staticmethod
    def exact(dtype: str, val) -> Value:
        val = np.asarray(val)
        return Value(dtype, val, np.zeros(val.shape), np.zeros(val.shape, dtype=bool))


@dataclass
class Features:
    """Semantics the model checks, switchable while a known bug is being fixed: with a
    switch off, the affected elements are treated as wild instead of compared."""

    nan_reductions: bool = True  # tg.max/tg.min propagate NaN, as torch does


def _number(x: Num, dtype: str) -> Value:
    return Value.exact(dtype, np.array(nx.number_as(x.value, dtype)).reshape(1, 1, 1, 1))


class Model:
    """Runs a program's description on block arrays; see the module docstring."""

    def __init__(self, program: Program, inputs: dict, loose: bool = False,
                 features: Features | None = None):
        self.p = program
        self.inputs = inputs  # tensor name -> exact values (float64 / int64)
        self.loose = loose
        self.features = features or Features()
        self.env: dict[str, Value] = {}
        self.outputs: dict[str, Value] = {}
        self.loop_index: dict[int, int] = {}
        self.scratch: dict[str, Value] = {}  # shared scratch tiles (`Stash`), full-tile values

    # -- driver ---------------------------------------------------------------------------
    def run(self) -> dict[str, Value]:
        for s in self.p.body:
            self.statement(s)
        return self.outputs

    def operand(self, x, dtype: str | None = None) -> Value:
        if isinstance(x, Num):
            return _number(x, dtype)
        if isinstance(x, Extent):
            extent = self.p.extents(self.p.tensor(x.tensor))[x.dim]
            return Value.exact("i32", np.array(extent).reshape(1, 1, 1, 1))
        return self.env[x]

    def statement(self, s) -> None:  # noqa: C901 — one case per statement kind
        if isinstance(s, Load):
            self.env[s.out] = self.load(s)
        elif isinstance(s, Full):
            dtype = s.dtype
            v = nx.number_as(s.value.value, dtype)
            h, w = (self.p.BM if s.shape[0] else 1), (self.p.BN if s.shape[1] else 1)
            gm, gn = self.p.grid
            self.env[s.out] = Value.exact(dtype, np.full((gm, gn, h, w), v))
        elif isinstance(s, Indices):
            self.env[s.out] = self.indices(s)
        elif isinstance(s, Unary):
            self.env[s.out] = self.unary(s.op, self.env[s.x])
        elif isinstance(s, Binary):
            self.env[s.out] = self.binary(s.op, s.a, s.b)
        elif isinstance(s, Where):
            self.env[s.out] = self.where(s)
        elif isinstance(s, Cast):
            x = self.env[s.x]
            self.env[s.out] = bitcast(x, s.dtype) if s.bits else cast(x, s.dtype)
        elif isinstance(s, Reduce):
            self.env[s.out] = self.reduce(s.kind, self.env[s.x], s.axis)
        elif isinstance(s, Cumsum):
            self.env[s.out] = self.cumsum(self.env[s.x], s.axis, s.reverse)
        elif isinstance(s, InPlace):
            target = self.env[s.target]
            new = self.binary(s.op, s.target, s.x)
            self.env[s.target] = _broadcast_to(new, target.val.shape)
        elif isinstance(s, Assign):
            target = self.env[s.target]
            value = self.operand(s.x, target.dtype)
            self.env[s.target] = _broadcast_to(value, target.val.shape)
        elif isinstance(s, Alias):
            self.env[s.target] = self.env[s.src]
        elif isinstance(s, Loop):
            self.loop(s)
        elif isinstance(s, Gemm):
            self.env[s.acc] = self.gemm(s)
        elif isinstance(s, Stash):
            gm, gn = self.p.grid
            self.scratch[s.buffer] = _broadcast_to(self.env[s.x], (gm, gn, self.p.BM, self.p.BN))
        elif isinstance(s, Unstash):
            v = self.scratch[s.buffer]
            if s.transposed:  # element (i, j) of the view is (j, i) of the tile, padding too
                v = Value(v.dtype, *(np.swapaxes(a, 2, 3).copy() for a in (v.val, v.err, v.wild)))
            self.env[s.out] = v
        elif isinstance(s, Branch):
            self.branch(s)
        elif isinstance(s, Store):
            self.outputs[s.tensor] = self.env[s.x]
        else:
            raise TypeError(f"unknown statement {s!r}")

    def loop(self, s: Loop) -> None:
        rows, cols = self.p.extents(self.p.tensor(s.tensor))
        extent, tile = (cols, self.p.BN) if s.axis == 1 else (rows, self.p.BM)
        before = set(self.env)
        for i in range(-(-extent // tile)):
            self.loop_index[s.id] = i
            for b in s.body:
                self.statement(b)
        for name in set(self.env) - before:  # names made in the body end with it
            del self.env[name]

    def branch(self, s: Branch) -> None:
        """The body runs in every block; the blocks where the condition fails keep the
        values they had (tiles and scratch tiles), and the body's own names end with it."""
        gm, gn = self.p.grid
        index = np.arange(gm)[:, None] if s.axis == 0 else np.arange(gn)[None, :]
        held = {"lt": index < s.bound, "ge": index >= s.bound, "eq": index == s.bound}[s.op]
        held = np.broadcast_to(held, (gm, gn))[..., None, None]
        env, scratch = dict(self.env), dict(self.scratch)
        for b in s.body:
            self.statement(b)
        for before, after in ((env, self.env), (scratch, self.scratch)):
            for name, old in before.items():
                if after[name] is not old:
                    before[name] = _where(held, after[name], old)
        self.env, self.scratch = env, scratch

    # -- memory ---------------------------------------------------------------------------
    def load(self, s: Load) -> Value:
        p = self.p
        decl = p.tensor(s.tensor)
        data = self.inputs[s.tensor]
        fill = 0.0 if s.fill is None else s.fill.value
        fill_value = nx.convert(np.float64(fill), "f32", decl.dtype)  # fills are floats
        gm, gn = p.grid
        if s.loop is not None:
            loop = self._loop(s.loop)
            i = self.loop_index[s.loop]
            if loop.axis == 1:
                tiles = _tiles(data, p.BM, p.BN, fill_value, gm, i + 1)[:, i:i + 1]
            else:
                tiles = _tiles(data, p.BM, p.BN, fill_value, i + 1, gn)[i:i + 1]
            tiles = np.broadcast_to(tiles, (gm, gn, p.BM, p.BN))
        elif s.route == "transposed":
            tiles = _tiles(data, p.BN, p.BM, fill_value, gn, gm).transpose(1, 0, 3, 2)
        else:
            tiles = _tiles(data, p.BM, p.BN, fill_value, gm, gn)
        return Value.exact(decl.dtype, np.array(tiles))

    def indices(self, s: Indices) -> Value:
        p = self.p
        gm, gn = p.grid
        h, w = (p.BM if s.shape[0] else 1), (p.BN if s.shape[1] else 1)
        tile = p.BM if s.axis == 0 else p.BN
        coord = np.arange(tile).reshape((1, 1, tile, 1) if s.axis == 0 else (1, 1, 1, tile))
        if s.block_offset:
            block = np.arange(gm if s.axis == 0 else gn) * tile
            coord = coord + block.reshape((-1, 1, 1, 1) if s.axis == 0 else (1, -1, 1, 1))
        return Value.exact("i32", np.broadcast_to(coord, (gm, gn, h, w)).copy())

    def gemm(self, s: Gemm) -> Value:
        """acc + a @ b.T over all of K (zero-padded to whole tiles of bk), `s.repeat`
        times, summed in any order (tensor cores fix none), in acc's type."""
        p, acc = self.p, self.env[s.acc]
        gm, gn = p.grid
        k = s.bk * -(-p.tensor(s.a).extent // s.bk)
        # A transposed operand (K x rows) is the same matrix stored the other way round.
        a_rows = self.inputs[s.a].T if s.ta else self.inputs[s.a]     # (M, K)
        b_rows = self.inputs[s.b].T if s.tb else self.inputs[s.b]     # (N, K)
        a = _tiles(a_rows, p.BM, k, 0, gm, 1)                          # (gm, 1, BM, K)
        b = _tiles(b_rows, p.BN, k, 0, gn, 1).transpose(1, 0, 2, 3)
        with np.errstate(all="ignore"):
            products = a[:, :, :, None, :].astype(np.float64) * b[:, :, None, :, :]
        if s.scratch:  # each K tile's product is added transposed (square tiles)
            products = products.transpose(0, 1, 3, 2, 4)
        products = np.concatenate([products] * s.repeat, axis=4)   # the K loop run again
        terms = np.concatenate([products, acc.val[..., None].astype(np.float64)], axis=4)
        if nx.is_int(acc.dtype):
            total = nx.wrap_int(np.sum(terms.astype(np.int64), axis=4), acc.dtype)
            return Value(acc.dtype, total, np.zeros(total.shape), acc.wild.copy())
        err = np.concatenate([np.zeros(products.shape), acc.err[..., None]], axis=4)
        summed = self.float_sum(Value(acc.dtype, terms, err, np.zeros(terms.shape, bool)), 4,
                                acc.wild[..., None], mma=True)
        e = summed.err[..., 0]
        if self.loose and p.tensor(s.a).dtype in ("f8e4m3", "f8e5m2"):
            # Hopper's 8-bit float wgmma keeps about 14 bits of each k32 instruction's sum,
            # where the emulator and mma.sync round to f32 (arch/wgmma.py). Measured on an
            # H100 (2026-11-24): up to 2^-12.2 of sum |a·b| per instruction (fuzz seed 909
            # program 105: 2.2 off at sum |a·b| ~ 2540 over 4 instructions; seed 4242 program
            # 81, e5m2: 2^-11.75 of the result over 2). Allowed: 2^-11 per instruction.
            with np.errstate(all="ignore"):
                magnitude = np.sum(np.where(np.isfinite(terms), np.abs(terms), 0), axis=4)
            e = e + -(-k // 32) * s.repeat * 2.0 ** -11 * magnitude
        return Value(acc.dtype, summed.val[..., 0], e, summed.wild[..., 0])

    def _loop(self, loop_id: int) -> Loop:
        def find(body):
            for s in body:
                if isinstance(s, Loop):
                    if s.id == loop_id:
                        return s
                    found = find(s.body)
                    if found:
                        return found
            return None
        return find(self.p.body)

    # -- element-wise ---------------------------------------------------------------------
    def unary(self, op: str, a: Value) -> Value:
        dtype = a.dtype
        if op in _MATH:
            return self.math(op, a)
        if dtype == nx.BOOL:
            return Value(dtype, ~a.val, a.err, a.wild)
        if nx.is_int(dtype):
            v = {"neg": lambda x: -x, "abs": np.abs, "not": np.invert}[op](a.val)
            return Value(dtype, nx.wrap_int(v, dtype), a.err, a.wild)
        v = -a.val if op == "neg" else np.abs(a.val)
        return Value(dtype, v, a.err, a.wild)

    def math(self, op: str, a: Value) -> Value:
        f, x, ea = _MATH[op], a.val, a.err
        with np.errstate(all="ignore"):
            z = f(x)
            if op in _MONOTONE:
                ends = [f(x - ea), f(x + ea)]
                spread = np.maximum(np.abs(ends[0] - z), np.abs(ends[1] - z))
                nan_differs = (np.isnan(ends[0]) != np.isnan(z)) | (np.isnan(ends[1]) != np.isnan(z))
                big = np.maximum(np.abs(z), np.maximum(np.abs(ends[0]), np.abs(ends[1])))
            else:  # sin, cos: 1-Lipschitz
                spread, nan_differs, big = ea, np.zeros(z.shape, bool), np.abs(z)
            spread = np.where(ea > 0, spread, 0.0)
            nan_differs &= ea > 0
            e = spread + MATH_ULPS[op] * nx.ulp(np.where(np.isfinite(big), big, 0), "f32")
            if op in ("exp", "exp2", "sigmoid"):
                e = e + _F32_TINY_NORMAL
            if op == "log2" and self.loose:
                e = e + _LG2_APPROX_ABS
        # Special inputs (zeros, infinities, NaN) have exactly specified results.
        special = (ea == 0) & ((x == 0) | ~np.isfinite(x))
        e = np.where(special, 0.0, e)
        wild = a.wild | nan_differs
        return self.finish(a.dtype, z, e, wild, certain=special, overflow_in="f32")

    def finish(self, dtype: str, z, e_pre, wild, certain=None, overflow_in: str | None = None,
               ) -> Value:
        """A float result: `z` (float64, before rounding to `dtype`) within `e_pre` of what
        an implementation computes before its final rounding."""
        inexact = e_pre > 0
        if certain is not None:
            inexact = inexact & ~certain
        limits = [nx.FLOATS[d] for d in {dtype, overflow_in or dtype}]
        threshold = min(f.overflow_threshold for f in limits if not f.saturates) \
            if any(not f.saturates for f in limits) else np.inf
        with np.errstate(invalid="ignore"):
            near_overflow = np.abs(z) + e_pre >= threshold
            wild = wild | (inexact & (~np.isfinite(z) | near_overflow))
        r = nx.round_float(z, dtype)
        e = np.where(inexact, e_pre + nx.ulp(r, dtype), 0.0)
        return Value(dtype, r, np.where(wild, 0.0, e), wild)

    def binary(self, op: str, a_op, b_op) -> Value:
        dtype = self.operand(a_op if isinstance(a_op, str) else b_op).dtype
        a, b = self.operand(a_op, dtype), self.operand(b_op, dtype)
        wild = a.wild | b.wild
        if op in COMPARISONS:
            return _compare(op, a, b, wild)
        if dtype == nx.BOOL:
            fn = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}[op]
            return Value(dtype, fn(a.val, b.val), np.zeros(wild.shape), wild)
        if nx.is_int(dtype):
            return Value(dtype, nx.wrap_int(_int_binary(op, a.val, b.val), dtype),
                         np.zeros(wild.shape), wild)
        return self.float_binary(op, a, b, wild)

    def float_binary(self, op: str, a: Value, b: Value, wild) -> Value:
        x, y, ea, eb = a.val, b.val, a.err, b.err
        certain = None
        with np.errstate(all="ignore"):
            if op in ("add", "sub"):
                z = x + y if op == "add" else x - y
                e = ea + eb
                # inf + finite is inf however inexact the finite operand is
                certain = ((np.isinf(x) & (ea == 0) & np.isfinite(y)) |
                           (np.isinf(y) & (eb == 0) & np.isfinite(x)))
            elif op == "mul":
                z = x * y
                e = _times(np.abs(x), eb) + _times(np.abs(y), ea) + ea * eb
            elif op == "div":
                z = x / y
                room = np.abs(y) - eb
                e = np.where((ea > 0) | (eb > 0), (ea + _times(np.abs(z), eb)) / room, 0.0)
                wild = wild | ((eb > 0) & (room <= 0))
            elif op in ("max", "min"):
                # A NaN operand gives NaN (torch's maximum/minimum; PTX max.NaN).
                z = np.maximum(x, y) if op == "max" else np.minimum(x, y)
                e = np.maximum(ea, eb)
                e = np.where((x == 0) & (y == 0) & (np.signbit(x) != np.signbit(y)),
                             np.maximum(e, _TINY), e)
            elif op == "pow":
                return self.power(a, b, wild)
            else:
                raise ValueError(f"unknown float op {op}")
            if self.loose and a.dtype == "f32":  # FMA contraction: an ulp of the product
                e = e + nx.ulp(np.where(np.isfinite(z), np.abs(z), 0), "f32") + \
                    (nx.ulp(np.where(np.isfinite(x * y), x * y, 0), "f32") if op == "mul" else 0)
        nan_in = np.isnan(x) | np.isnan(y)
        certain_nan = np.isnan(z) & nan_in
        certain = certain_nan if certain is None else (certain | certain_nan)
        return self.finish(a.dtype, z, np.where(certain, 0.0, e), wild, certain)

    def power(self, a: Value, b: Value, wild) -> Value:
        x, y, ea, eb = a.val, b.val, a.err, b.err
        with np.errstate(all="ignore"):
            z = np.power(x, y)
            corners = [np.power(x + sx * ea, y + sy * eb) for sx in (-1, 1) for sy in (-1, 1)]
            spread = np.zeros(z.shape)
            nan_differs = np.zeros(z.shape, bool)
            for c in corners:
                spread = np.maximum(spread, np.abs(c - z))
                nan_differs |= np.isnan(c) != np.isnan(z)
            exact_in = (ea == 0) & (eb == 0)
            spread = np.where(exact_in, 0.0, 2 * spread)
            nan_differs &= ~exact_in
            # A negative base gives NaN or a number as the exponent is an integer or not
            # (and the sign by its parity): the corners cannot see that when the exponent
            # or the base is inexact (a gemm's -4596348.5 ± 739 ** itself: NaN here, -0.0
            # from the f32 integer the kernel holds).
            nan_differs |= ~exact_in & (x - ea <= 0) & np.isfinite(y)
            # An infinite exponent gives 0, 1 or inf as |base| is above, at or below 1: the
            # corners miss a base whose interval holds 1 inside it (cos(2137181.5 ± 40) =
            # 1 ± 40, ** -inf: the kernel's 0.99999994 gave inf; seed 1804, specialized 483).
            lowest = np.where(x - ea > 0, x - ea, np.where(x + ea < 0, -(x + ea), 0.0))
            nan_differs |= ~exact_in & np.isinf(y) & (lowest <= 1) & (np.abs(x) + ea >= 1)
            big = np.abs(z)
            e = spread + 8 * nx.ulp(np.where(np.isfinite(big), big, 0), "f32")
        special = exact_in & (np.isnan(z) | np.isinf(x) | np.isinf(y) | (x == 0) | (y == 0)
                              | (x == 1))
        return self.finish(a.dtype, z, np.where(special, 0.0, e), wild | nan_differs, special,
                           overflow_in="f32")

    def where(self, s: Where) -> Value:
        cond = self.env[s.cond]
        dtype = self.operand(s.a if isinstance(s.a, str) else s.b).dtype
        a, b = self.operand(s.a, dtype), self.operand(s.b, dtype)
        c = cond.val
        val = np.where(c, a.val, b.val)
        err = np.where(c, a.err, b.err)
        wild = cond.wild | np.where(c, a.wild, b.wild)
        return Value(dtype, val, err, wild)

    # -- reductions -----------------------------------------------------------------------
    def reduce(self, kind: str, a: Value, axis: int) -> Value:
        ax = 2 + axis
        wild = np.any(a.wild, axis=ax, keepdims=True)
        if kind.startswith("arg"):
            return _arg_reduce(kind, a, ax, wild)
        if nx.is_int(a.dtype):
            fn = {"sum": np.sum, "max": np.max, "min": np.min}[kind]
            v = nx.wrap_int(fn(a.val, axis=ax, keepdims=True), a.dtype)
            return Value(a.dtype, v, np.zeros(v.shape), wild)
        if kind == "sum":
            return self.float_sum(a, ax, wild)
        x = a.val
        has_nan = np.any(np.isnan(x), axis=ax, keepdims=True)
        fn = np.nanmax if kind == "max" else np.nanmin
        with np.errstate(all="ignore"), _quiet_all_nan():
            v = fn(x, axis=ax, keepdims=True)
        v = np.where(has_nan, np.nan, v)  # NaN propagates, as in torch
        if not self.features.nan_reductions:
            wild = wild | has_nan
        e = np.max(np.where(np.isnan(x), 0, a.err), axis=ax, keepdims=True)
        zero = x == 0
        mixed_zero = np.any(zero & np.signbit(x), axis=ax, keepdims=True) & \
            np.any(zero & ~np.signbit(x), axis=ax, keepdims=True)
        e = np.where((v == 0) & mixed_zero, np.maximum(e, _TINY), e)
        e = np.where(has_nan, 0.0, e)
        return Value(a.dtype, v, e, wild)

    def cumsum(self, a: Value, axis: int, reverse: bool) -> Value:
        """Inclusive prefix sums along `axis` (from the end when `reverse`): each prefix a
        sum in any order (the scan's tree), integers wrapping in their type, 16- and 8-bit
        floats summed in f32 and rounded once to their type (`tg.cumsum`)."""
        ax = 2 + axis
        if reverse:
            a = Value(a.dtype, np.flip(a.val, ax), np.flip(a.err, ax), np.flip(a.wild, ax))
        wild = np.logical_or.accumulate(a.wild, axis=ax)
        if nx.is_int(a.dtype):
            v = nx.wrap_int(np.cumsum(a.val.astype(np.int64), axis=ax), a.dtype)
            out = Value(a.dtype, v, np.zeros(v.shape), wild)
        else:
            wide = a if a.dtype == "f32" else cast(a, "f32")
            prefixes = []
            for k in range(a.val.shape[ax]):
                part = [slice(None)] * a.val.ndim
                part[ax] = slice(0, k + 1)
                prefix = Value("f32", wide.val[tuple(part)], wide.err[tuple(part)],
                               wide.wild[tuple(part)])
                prefixes.append(self.float_sum(prefix, ax, np.any(prefix.wild, axis=ax,
                                                                   keepdims=True)))
            out = Value("f32", *(np.concatenate([getattr(p, f) for p in prefixes], axis=ax)
                                 for f in ("val", "err", "wild")))
            if a.dtype != "f32":
                out = cast(out, a.dtype)
        if reverse:
            out = Value(out.dtype, np.flip(out.val, ax), np.flip(out.err, ax),
                        np.flip(out.wild, ax))
        return out

    def float_sum(self, a: Value, ax: int, wild, mma: bool = False) -> Value:
        """A sum in any order, each partial sum rounded to the tile's type (`mma`: tensor
        cores, whose internal rounding is not specified, get twice the bound)."""
        fmt = nx.FLOATS[a.dtype]
        x, ex = a.val, a.err
        n = x.shape[ax]
        finite = np.isfinite(x)
        xf = np.where(finite, x, 0.0)
        with np.errstate(all="ignore"):
            z = np.sum(xf, axis=ax, keepdims=True)
            magnitude = np.sum(np.abs(xf), axis=ax, keepdims=True)
            pos_inf = np.any(x == np.inf, axis=ax, keepdims=True)
            neg_inf = np.any(x == -np.inf, axis=ax, keepdims=True)
            nan = np.any(np.isnan(x), axis=ax, keepdims=True) | (pos_inf & neg_inf)
            z = np.where(nan, np.nan, np.where(pos_inf, np.inf, np.where(neg_inf, -np.inf, z)))
            # Partial sums are exact in any order when every term is a multiple of a
            # common power of two and the sum of magnitudes fits the mantissa.
            grain = np.min(np.where(xf != 0, _lowest_bit(xf), np.inf), axis=ax, keepdims=True)
            exact = (magnitude <= grain * 2.0 ** (fmt.mantissa_bits + 1)) | (magnitude == 0)
            rounding = (n - 1) * fmt.unit_roundoff * magnitude * (2 if mma else 1)
            e = np.sum(np.where(finite, ex, 0), axis=ax, keepdims=True) + \
                np.where(exact, 0.0, rounding)
            # A sum of zeros with a -0.0 among them is -0.0 or +0.0 by whether the
            # implementation adds a +0 of its own (a scan's or a tree's identity, an empty
            # lane): numpy's sum always does (+0.0), the kernel's adds may not (-0.0).
            negative_zero = np.any((xf == 0) & np.signbit(xf), axis=ax, keepdims=True)
            e = np.where((z == 0) & negative_zero, np.maximum(e, _TINY), e)
            if self.loose and n > 1:
                e = e + (n - 1) * nx.FLOATS["f32"].unit_roundoff * magnitude
        overflow_possible = (magnitude >= fmt.overflow_threshold) & (not fmt.saturates)
        nonfinite = ~np.isfinite(z)
        wild = wild | (overflow_possible & ~(nan & ~(pos_inf | neg_inf)))
        certain = nonfinite & ~overflow_possible
        return self.finish(a.dtype, z, np.where(certain, 0.0, e), wild, certain)


class _quiet_all_nan:
    """numpy warns when a nanmax slice is all NaN; the result (NaN) is what we want."""

    def __enter__(self):
        import warnings
        self._w = warnings.catch_warnings()
        self._w.__enter__()
        warnings.simplefilter("ignore", RuntimeWarning)

    def __exit__(self, *exc):
        return self._w.__exit__(*exc)


def _arg_reduce(kind: str, a: Value, ax: int, wild) -> Value:
    """Position of the first largest (smallest) element along `ax`, or of the first NaN
    (torch's rule); wild where another element is within the error bounds of the winner."""
    x = a.val.astype(np.float64) if nx.is_int(a.dtype) else a.val
    key = x if kind == "argmax" else -x
    nan = np.isnan(key)
    with np.errstate(invalid="ignore"):
        best = np.argmax(np.where(nan, -np.inf, key), axis=ax)
        first_nan = np.argmax(nan, axis=ax)
        pos = np.where(np.any(nan, axis=ax), first_nan, best)
        pos = np.expand_dims(pos, ax)
        err = np.broadcast_to(a.err, x.shape)
        top = np.take_along_axis(key, pos, ax)
        top_err = np.take_along_axis(err, pos, ax)
        index = np.arange(x.shape[ax]).reshape([-1 if d == ax else 1 for d in range(4)])
        close = (index != pos) & ((err + top_err) > 0) & (key >= top - (err + top_err))
        wild = wild | np.any(close & ~nan, axis=ax, keepdims=True) & ~np.any(nan, axis=ax,
                                                                          keepdims=True)
    return Value("i32", pos.astype(np.int64), np.zeros(pos.shape), wild)


def _lowest_bit(x: np.ndarray) -> np.ndarray:
    """The value of the lowest set mantissa bit of each nonzero float64."""
    m, e = np.frexp(np.abs(x))
    mant = (m * 2.0 ** 53).astype(np.int64)
    low = mant & -mant
    return np.ldexp(low.astype(np.float64), e.astype(np.int64) - 53)


def _times(magnitude: np.ndarray, err: np.ndarray) -> np.ndarray:
    """magnitude * err with 0 * inf = 0 (an exact operand adds no error)."""
    with np.errstate(invalid="ignore", over="ignore"):
        return np.where(err == 0, 0.0, magnitude * err)


def _int_binary(op: str, x, y):
    x, y = np.asarray(x).astype(np.int64), np.asarray(y).astype(np.int64)
    if op == "add":
        return x + y
    if op == "sub":
        return x - y
    if op == "mul":
        return x * y
    safe = np.where(y == 0, 1, y)  # tegula defines x / 0 and x // 0 as -1, x % 0 as x
    if op == "div":  # C: truncate toward zero
        q = np.abs(x) // np.abs(safe)
        return np.where(y == 0, -1, np.where((x < 0) != (safe < 0), -q, q))
    if op == "floordiv":  # floor, as Python and torch.floor_divide
        return np.where(y == 0, -1, x // safe)
    if op == "mod":  # the divisor's sign, as Python and torch.remainder
        return np.where(y == 0, x, x % safe)
    if op == "max":
        return np.maximum(x, y)
    if op == "min":
        return np.minimum(x, y)
    return {"and": np.bitwise_and, "or": np.bitwise_or, "xor": np.bitwise_xor}[op](x, y)


def _compare(op: str, a: Value, b: Value, wild) -> Value:
    fn = {"lt": np.less, "le": np.less_equal, "gt": np.greater, "ge": np.greater_equal,
          "eq": np.equal, "ne": np.not_equal}[op]
    with np.errstate(invalid="ignore"):
        v = fn(a.val, b.val)
        if nx.is_float(a.dtype):
            slack = a.err + b.err
            wild = wild | ((slack > 0) & (np.abs(a.val - b.val) <= slack))
    return Value(nx.BOOL, v, np.zeros(v.shape), wild)


def bitcast(a: Value, dtype: str) -> Value:
    """`tg.bitcast` between f32 and i32: the same bits, known only where the value is
    exact (a bound, a zero of either sign, a NaN's payload: any bits)."""
    if a.dtype == "f32":
        x = np.asarray(a.val, np.float32)
        wild = a.wild | (a.err > 0) | np.isnan(x)
        v = x.view(np.int32).astype(np.int64)
    else:
        v = np.asarray(a.val, np.int64).astype(np.int32).view(np.float32).astype(np.float64)
        wild = a.wild | np.isnan(v)
    return Value(dtype, v, np.zeros(v.shape), wild)


def cast(a: Value, dtype: str) -> Value:
    v = nx.convert(a.val, a.dtype, dtype)
    wild = a.wild.copy()
    err = np.zeros(v.shape)
    if nx.is_float(a.dtype) and nx.is_float(dtype):
        inexact = a.err > 0
        with np.errstate(invalid="ignore"):
            wild |= inexact & (not nx.FLOATS[dtype].saturates) & (
                np.abs(a.val) + a.err >= nx.FLOATS[dtype].overflow_threshold)
        err = np.where(inexact, a.err + nx.ulp(v, dtype), 0.0)
    elif nx.is_float(a.dtype):  # to an integer: which side of a whole number?
        inexact = a.err > 0
        lo = nx.convert(a.val - a.err, a.dtype, dtype)
        hi = nx.convert(a.val + a.err, a.dtype, dtype)
        wild |= inexact & ((lo != v) | (hi != v))
    return Value(dtype, v, np.where(wild, 0.0, err), wild)


def _where(held: np.ndarray, new: Value, old: Value) -> Value:
    """`new` in the blocks where `held`, `old` elsewhere (same tile, same type)."""
    parts = [np.where(held, *np.broadcast_arrays(getattr(new, f), getattr(old, f)))
             for f in ("val", "err", "wild")]
    return Value(old.dtype, *parts)


def _broadcast_to(v: Value, shape: tuple) -> Value:
    return Value(v.dtype, np.broadcast_to(v.val, shape).copy(),
                 np.broadcast_to(v.err, shape).copy(), np.broadcast_to(v.wild, shape).copy())


def _tiles(data: np.ndarray, th: int, tw: int, fill, gm: int, gn: int) -> np.ndarray:
    """Tiles (m, n) of `data` for m < gm, n < gn, out-of-bounds elements `fill`:
    an array (gm, gn, th, tw)."""
    padded = np.full((gm * th, gn * tw), fill, dtype=data.dtype)
    rows, cols = min(data.shape[0], gm * th), min(data.shape[1], gn * tw)
    padded[:rows, :cols] = data[:rows, :cols]
    return padded.reshape(gm, th, gn, tw).transpose(0, 2, 1, 3)


def assemble(v: Value, rows: int, cols: int) -> Value:
    """A stored value as its output tensor: blocks side by side, cropped to the extents."""
    gm, gn, h, w = v.val.shape

    def flat(a):
        return np.ascontiguousarray(a.transpose(0, 2, 1, 3)).reshape(gm * h, gn * w)[:rows, :cols]
    return Value(v.dtype, flat(v.val), flat(v.err), flat(v.wild))


def reference(program: Program, inputs: dict, loose: bool = False,
              features: Features | None = None) -> dict[str, Value]:
    """Output tensor name -> its expected `Value` (assembled to the tensor's extents)."""
    model = Model(program, inputs, loose, features)
    out = {}
    for name, v in model.run().items():
        val, err, wild = np.broadcast_arrays(v.val, v.err, v.wild)
        out[name] = assemble(Value(v.dtype, val, err, wild), *program.extents(program.tensor(name)))
    return out


__all__ = ["Value", "Features", "Model", "reference", "assemble", "cast", "MATH_ULPS"]
