"""The register layout a scan runs in, and the conversions into and out of it.

A scan needs, for every element, the elements before it along the axis, so its layout is
chosen for the scan (`scan_layout`) rather than read off its operands: every thread holds
`k` consecutive elements along the axis of each of its rows (scanned in registers, one
after the other), the `n` threads of one row are consecutive lanes (scanned with `n`-wide
Kogge–Stone shuffles; each is a power of two), and when `n` exceeds a warp the row's warps
are consecutive (combined through shared memory). Threads go to the rows first: a row
scanned inside one thread costs no shuffle at all. Extents need not be powers of two:
threads take a dim only where they divide it (a row of 100 is 4 threads × 25 registers),
and threads left over hold copies.

`anchor_scans` gives the scanned tiles and the results this layout where nothing decided
them yet (after the gemm anchors, before propagation); the check converts an operand decided elsewhere (a gemm accumulator, a pinned
tile) into it in front of the scan, and converts a result decided elsewhere after it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tegula.ir.ops import Rearrange, Scan, TracedKernel, walk_ops
from tegula.ir.values import RegisterTile
from tegula.layout.cute import Layout
from tegula.layout.tv import tile_strides, tv_table


@dataclass(frozen=True)
class ScanPlan:
    """How a scan's elements sit on the threads (see the module docstring): `layout`, and
    `k` registers per row run, `n` threads per row (lanes, then warps), `rows` row
    registers per thread."""

    layout: Layout
    k: int
    n: int
    rows: int

    def describe(self) -> str:
        if self.n == 1:
            return (f"each thread scans whole rows of {self.k} element(s) in registers "
                    f"({self.rows} row(s) per thread)")
        where = f"{self.n} lanes" if self.n <= 32 else f"{self.n // 32} warps of 32 lanes"
        return (f"each thread scans runs of {self.k} element(s) along the axis "
                f"({self.rows} row(s) per thread), then across {where}")


def scan_plan(shape: tuple, axis: int, threads: int) -> ScanPlan:
    """The scan layout of a `shape` tile scanned along `axis` by `threads` threads."""
    strides = tile_strides(shape)
    others = [d for d in range(len(shape)) if d != axis]
    left = threads
    on_rows = {}
    for d in others:                        # rows first: whole runs stay in one thread
        on_rows[d] = math.gcd(shape[d], left)
        left //= on_rows[d]
    along = math.gcd(shape[axis], left)
    n = along & -along                      # its largest power of two: shuffles need it
    k = shape[axis] // n
    thread_shape = [n] + [on_rows[d] for d in others] + [left // n]
    thread_stride = [k * strides[axis]] + [strides[d] for d in others] + [0]
    value_shape = [k] + [shape[d] // on_rows[d] for d in others]
    value_stride = [strides[axis]] + [strides[d] * on_rows[d] for d in others]
    layout = Layout((tuple(thread_shape), tuple(value_shape)),
                    (tuple(thread_stride), tuple(value_stride)))
    rows = int(np.prod(value_shape[1:], dtype=np.int64)) if others else 1
    return ScanPlan(layout=layout, k=k, n=n, rows=rows)


def plan_of(op: Scan, threads: int) -> ScanPlan:
    """The op's plan, made once and kept in its choices (explain prints it)."""
    plan = op.choices.get("scan")
    if plan is None:
        plan = op.choices["scan"] = scan_plan(tuple(op.xs[0].shape), op.axis, threads)
    return plan


def anchor_scans(kernel: TracedKernel, state) -> None:
    """Give the scan layout to every scan operand and result nothing decided yet (after
    the gemm anchors, before propagation carries it to the ops around)."""
    for op in walk_ops(kernel.body):
        if isinstance(op, Scan):
            layout = plan_of(op, kernel.threads).layout
            for x in op.xs:
                state.set(x, layout, f"scanned along axis {op.axis}")
            for out in op.outs:
                state.set(out, layout, f"scan along axis {op.axis}")


def _same_layout(a: Layout, b: Layout) -> bool:
    return np.array_equal(tv_table(a), tv_table(b))


def scan_conversions(op: Scan, state, kernel: TracedKernel) -> tuple[list, list]:
    """Conversions to put before the scan (operands laid out otherwise) and after it
    (results whose layout was decided elsewhere), rewriting the op to use fresh tiles in
    the scan layout."""
    layout = plan_of(op, kernel.threads).layout
    before, after = [], []
    for i, x in enumerate(op.xs):
        if not _same_layout(state.get(x), layout):
            converted = RegisterTile(x.dtype, tuple(x.shape), f"{x.name}_scan", op.loc)
            state.set(converted, layout, f"converted from {x.name} for the scan")
            kernel.register_tiles.append(converted)
            before.append(Rearrange(x, converted, loc=op.loc))
            op.xs[i] = converted
    for i, out in enumerate(op.outs):
        if not _same_layout(state.get(out), layout):
            scanned = RegisterTile(out.dtype, tuple(out.shape), f"{out.name}_scan", op.loc)
            state.set(scanned, layout, f"scan along axis {op.axis}, then converted into "
                                       f"{out.name}'s layout ({state.reasons.get(out.id)})")
            kernel.register_tiles.append(scanned)
            after.append(Rearrange(scanned, out, loc=op.loc))
            op.outs[i] = scanned
    return before, after


__all__ = ["ScanPlan", "scan_plan", "plan_of", "anchor_scans", "scan_conversions"]
