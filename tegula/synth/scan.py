"""The register layout a scan runs in, and the conversions into and out of it.

A scan needs, for every element, the elements before it along the axis, so its layout is
chosen for the scan (`scan_layout`) rather than read off its operands: every thread holds
`k` consecutive elements along the axis of each of its rows (scanned in registers, one
after the other), the `n` threads of one row are consecutive lanes (scanned with `n`-wide
Kogge–Stone shuffles; each is a power of two), and when `n` exceeds a warp the row's warps
are consecutive (combined through shared memory). Threads go to the rows first: a row
scanned inside one thread costs no shuffle at all. Extents need not be powers of two:
threads take a dim only where they divide it (a row of 100 is 4 threads × 25 registers),
and threads left over hold copies. A scan's initial and carry (the tile with the axis of
extent 1, `carry_layout`) sit where the runs do: register r of a thread is its row r, and
the row's lanes hold copies.

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
    on_rows, n, left = _thread_split(shape, axis, threads)
    k = shape[axis] // n
    layout = _plan_layout(shape, axis, on_rows, n, k, left // n, collapsed=False)
    rows = int(np.prod([shape[d] // on_rows[d] for d in on_rows], dtype=np.int64))
    return ScanPlan(layout=layout, k=k, n=n, rows=rows)


def carry_layout(shape: tuple, axis: int, threads: int) -> Layout:
    """The layout of a scan's initial and carry (`shape` with the axis of extent 1) for
    the scan of a `shape` tile: each thread holds its rows' elements (register r for row
    r, as run r of the scan) and the lanes along the axis hold copies."""
    on_rows, n, left = _thread_split(shape, axis, threads)
    return _plan_layout(shape, axis, on_rows, n, shape[axis] // n, left // n, collapsed=True)


def _thread_split(shape: tuple, axis: int, threads: int) -> tuple[dict, int, int]:
    """Threads per other dim (rows first: whole runs stay in one thread), the `n` threads
    along the axis, and the threads left after the rows."""
    left = threads
    on_rows = {}
    for d in range(len(shape)):
        if d != axis:
            on_rows[d] = math.gcd(shape[d], left)
            left //= on_rows[d]
    along = math.gcd(shape[axis], left)
    return on_rows, along & -along, left    # n: a power of two (shuffles need it)


def _plan_layout(shape: tuple, axis: int, on_rows: dict, n: int, k: int, copies: int,
                 collapsed: bool) -> Layout:
    """Threads: `n` lanes along the axis, then the rows' threads, then `copies`; registers:
    the run of `k`, then the rows' remainders. `collapsed`: the layout of the tile with the
    axis of extent 1 (the lanes and the run hold one element: stride 0)."""
    strides = tile_strides(tuple(1 if collapsed and d == axis else e
                                 for d, e in enumerate(shape)))
    run_stride = 0 if collapsed else strides[axis]
    others = list(on_rows)
    thread_shape = [n] + [on_rows[d] for d in others] + [copies]
    thread_stride = [k * run_stride] + [strides[d] for d in others] + [0]
    value_shape = [1 if collapsed else k] + [shape[d] // on_rows[d] for d in others]
    value_stride = [run_stride] + [strides[d] * on_rows[d] for d in others]
    return Layout((tuple(thread_shape), tuple(value_shape)),
                  (tuple(thread_stride), tuple(value_stride)))


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
            carried = carry_layout(tuple(op.xs[0].shape), op.axis, kernel.threads)
            for initial in op.initials:
                state.set(initial, carried, f"the initial of a scan along axis {op.axis}")
            for carry in op.carries:
                state.set(carry, carried, f"the carry of a scan along axis {op.axis}")


def _same_layout(a: Layout, b: Layout) -> bool:
    return np.array_equal(tv_table(a), tv_table(b))


def scan_conversions(op: Scan, state, kernel: TracedKernel) -> tuple[list, list]:
    """Conversions to put before the scan (operands laid out otherwise) and after it
    (results whose layout was decided elsewhere), rewriting the op to use fresh tiles in
    the scan layout (the carry layout for initials and carries)."""
    layout = plan_of(op, kernel.threads).layout
    carried = carry_layout(tuple(op.xs[0].shape), op.axis, kernel.threads)
    before, after = [], []
    for tiles, want in ((op.xs, layout), (op.initials, carried)):
        for i, x in enumerate(tiles):
            if not _same_layout(state.get(x), want):
                converted = RegisterTile(x.dtype, tuple(x.shape), f"{x.name}_scan", op.loc)
                state.set(converted, want, f"converted from {x.name} for the scan")
                kernel.register_tiles.append(converted)
                before.append(Rearrange(x, converted, loc=op.loc))
                tiles[i] = converted
    for tiles, want in ((op.outs, layout), (op.carries, carried)):
        for i, out in enumerate(tiles):
            if not _same_layout(state.get(out), want):
                scanned = RegisterTile(out.dtype, tuple(out.shape), f"{out.name}_scan", op.loc)
                state.set(scanned, want, f"scan along axis {op.axis}, then converted into "
                                         f"{out.name}'s layout ({state.reasons.get(out.id)})")
                kernel.register_tiles.append(scanned)
                after.append(Rearrange(scanned, out, loc=op.loc))
                tiles[i] = scanned
    return before, after


__all__ = ["ScanPlan", "scan_plan", "carry_layout", "plan_of", "anchor_scans",
           "scan_conversions"]
