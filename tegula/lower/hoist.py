"""Loop-invariant code motion on thread IR.

Addresses inside a k-loop look like `(row_base + 16*j) * a_stride0 + (k*32 + col)`: most
of the sum does not change from one iteration to the next, but the CUDA compiler often
recomputes it (64-bit multiplies under predicates are not hoisted). This pass reassociates
every index expression in a loop body into the sum of its terms (and every predicate into
the conjunction of its conditions), moves the terms that do not depend on the loop into
one `Let` in front of the loop, and leaves `hoisted + varying terms` inside. A wholly
invariant expression that divides by a run-time value (a persistent kernel's tile
coordinates, `tg_floordiv` of the tile index, in every k-step's TMA box) moves out whole.
Nested loops are processed inside out, and a `Let` whose value is invariant moves out
further.

A term depends on the loop if it reads the loop variable or a variable bound inside the
loop body. Hoisted sums that involve a 64-bit tensor stride are bound as 64-bit values
(`wide`); tensors specialized on 32-bit offsets keep everything in 32 bits.
"""
from __future__ import annotations

import dataclasses
from itertools import count

from tegula.lower.thread_ir import (BinOp, Const, Expr, For, If, Let, LoadScalar, Reg, Select,
                                    Stmt, Value, Var, _bin)


#: What `variables` reports for a load from memory (LoadScalar): never in a Let's or an
#: expression's invariant part, since an address valid only inside a loop or branch (or
#: memory written in the loop) must not be read before it.
MEMORY = "<memory>"


def variables(expr: Expr) -> set[str]:
    """Names of the variables an index expression reads (`MEMORY` for a load)."""
    if isinstance(expr, Var):
        return {expr.name}
    if isinstance(expr, BinOp):
        return variables(expr.lhs) | variables(expr.rhs)
    if isinstance(expr, Select):
        return variables(expr.cond) | variables(expr.if_true) | variables(expr.if_false)
    if isinstance(expr, LoadScalar):
        return {MEMORY}.union(*(variables(c) for c in expr.coords))
    return set()


def _terms(expr: Expr, op: str) -> list[Expr]:
    """The operands of a chain of `op` (+ or and) nodes."""
    if isinstance(expr, BinOp) and expr.op == op:
        return _terms(expr.lhs, op) + _terms(expr.rhs, op)
    return [expr]


def _combine(terms: list[Expr], op: str) -> Expr:
    result = terms[0]
    for t in terms[1:]:
        result = _bin(op, result, t)
    return result


def _is_trivial(expr: Expr) -> bool:
    return isinstance(expr, (Var, Const))


class LoopHoister:
    """Hoists invariant parts of expressions out of the loops of one kernel body."""

    def __init__(self, wide_vars: set[str]) -> None:
        self._names = count()
        self._wide_vars = wide_vars

    def body(self, stmts: list[Stmt]) -> list[Stmt]:
        out: list[Stmt] = []
        for s in stmts:
            if isinstance(s, For):
                out += self.loop(s)
            elif isinstance(s, If):
                out.append(dataclasses.replace(s, then=self.body(s.then),
                                               otherwise=self.body(s.otherwise)))
            elif hasattr(s, "roles"):  # async_ir.Roles: each role's loops, in its own body
                out.append(dataclasses.replace(s, roles=self._roles(s.roles)))
            else:
                out.append(s)
        return out

    def _roles(self, roles: list) -> list:
        """Each role with its body hoisted; roles with equal bodies (consumer warpgroups
        taking turns, `lower/warp_roles.py`) keep equal ones, which codegen emits once."""
        done: list = []  # (body, hoisted body)
        out = []
        for r in roles:
            hoisted = next((h for b, h in done if b == r.body), None)
            if hoisted is None:
                hoisted = self.body(r.body)
                done.append((r.body, hoisted))
            out.append(dataclasses.replace(r, body=hoisted))
        return out

    def loop(self, loop: For) -> list[Stmt]:
        inner = self.body(loop.body)  # inside out: inner loops first
        variant = {loop.var.name, MEMORY} | _bound_inside(inner)
        hoisted: list[Let] = []
        kept: list[Stmt] = []
        for s in inner:
            if isinstance(s, Let) and not (variables(s.value) & variant):
                hoisted.append(s)  # invariant Lets move out whole
                variant.discard(s.var.name)
            else:
                kept.append(s)
        # Variables of hoisted Lets are defined outside now, so expressions using them may
        # become invariant; recompute what varies.
        variant = {loop.var.name, MEMORY} | _bound_inside(kept)
        new_body = [self._rewrite(s, variant, hoisted) for s in kept]
        return hoisted + [dataclasses.replace(loop, body=new_body)]

    def _rewrite(self, node, variant: set[str], hoisted: list[Let]):
        if isinstance(node, list):
            return [self._rewrite(x, variant, hoisted) for x in node]
        if isinstance(node, Expr):
            return self._split(node, variant, hoisted)
        if isinstance(node, For):
            return dataclasses.replace(node, start=self._split(node.start, variant, hoisted),
                                       stop=self._split(node.stop, variant, hoisted),
                                       body=self._rewrite(node.body, variant, hoisted))
        if isinstance(node, (Stmt, Value, Reg)) and dataclasses.is_dataclass(node):
            if isinstance(node, Reg):
                return node  # register indices are constants after unrolling
            changes = {f.name: self._rewrite(getattr(node, f.name), variant, hoisted)
                       for f in dataclasses.fields(node) if f.init}
            return dataclasses.replace(node, **changes)
        return node

    def _split(self, expr: Expr, variant: set[str], hoisted: list[Let]) -> Expr:
        """`expr` with its loop-invariant sum terms / conjuncts bound before the loop
        (recursively, so sums inside comparisons and products are split too), and any
        wholly invariant division by a run-time value bound before the loop whole."""
        if not isinstance(expr, BinOp):
            return expr
        if not (variables(expr) & variant) and _run_time_divisions(expr) == {"floor"}:
            # ~25 dependent instructions per run-time division (the persistent GEMM's
            # producer recomputed its tile's grouped coordinates every k-step: 4-6
            # divisions, about a stage's worth of the tensor cores' time), which nvcc does
            # not hoist: the guarded divisions of tg_floordiv are not speculated.
            var = Var(f"inv{next(self._names)}")
            hoisted.append(Let(var, expr, wide=bool(variables(expr) & self._wide_vars)))
            return var
        if expr.op not in ("+", "and"):
            return _bin(expr.op, self._split(expr.lhs, variant, hoisted),
                        self._split(expr.rhs, variant, hoisted))
        op = expr.op
        terms = _terms(expr, op)
        fixed = [t for t in terms if not (variables(t) & variant)]
        moving = [self._split(t, variant, hoisted) for t in terms if variables(t) & variant]
        if not moving or not fixed or (len(fixed) == 1 and _is_trivial(fixed[0])):
            return _combine(moving + fixed, op) if moving else expr
        invariant = _combine(fixed, op)
        var = Var(f"inv{next(self._names)}")
        wide = op == "+" and bool(variables(invariant) & self._wide_vars)
        hoisted.append(Let(var, invariant, wide=wide))
        return _combine([var] + moving, op)


#: Index operators that divide: the floor helpers (defined for every divisor, 0 included)
#: and C's truncating `/` and `%` (lowering's own, on values it knows to be positive).
DIVISIONS = {"floordiv": "floor", "mod": "floor", "//": "c", "%": "c"}


def _run_time_divisions(expr: Expr) -> set[str]:
    """The kinds ("floor", "c") of the divisions in `expr` by something other than a
    constant (a constant divisor compiles to a multiply-high and shifts, cheap enough to
    leave in place). Only floor divisions are hoisted whole: evaluated before a loop that
    may run zero times, C's `/` could divide by a zero that the loop never saw."""
    if not isinstance(expr, BinOp):
        return set()
    kinds = _run_time_divisions(expr.lhs) | _run_time_divisions(expr.rhs)
    if expr.op in DIVISIONS and not isinstance(expr.rhs, Const):
        kinds.add(DIVISIONS[expr.op])
    return kinds


def _bound_inside(stmts: list[Stmt]) -> set[str]:
    """Variables bound by Lets and loops anywhere in `stmts`."""
    names: set[str] = set()
    for s in stmts:
        if isinstance(s, Let):
            names.add(s.var.name)
        elif isinstance(s, For):
            names.add(s.var.name)
            names |= _bound_inside(s.body)
        elif isinstance(s, If):
            names |= _bound_inside(s.then) | _bound_inside(s.otherwise)
    return names


def hoist_loop_invariants(body: list[Stmt], wide_vars: set[str] = frozenset()) -> list[Stmt]:
    """The kernel body with loop-invariant index arithmetic computed once per loop;
    sums that read any of `wide_vars` (64-bit strides) are bound as 64-bit values."""
    return LoopHoister(set(wide_vars)).body(body)
