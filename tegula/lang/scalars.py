"""Kernel scalars for persistent kernels: grid sizes, the SM count, `min`/`max`, loads.

A kernel scalar is a block-uniform integer known only when the kernel runs (tegula.ir.scalar):
`tg.block_id(0)`, a tensor extent, an `int` argument, a loop index, and what this module
adds —

* `tg.num_programs(axis)`: how many blocks the launch has along a grid axis (CUDA's
  `gridDim`), the stride of a persistent loop `tg.range(tg.block_id(0), tiles,
  tg.num_programs(0))`;
* `tg.num_sms()`: the SM count of the device running the kernel (in the emulator the
  target's, or `tg.emulate(..., num_sms=N)`);
* `tg.cluster(x, y)`: the kernel is launched in thread-block clusters of x × y blocks
  (sm_90; blocks `x*i … x*i+x-1` along axis 0 form one cluster, so `tg.block_id(0) // x`
  is the cluster's index and `tg.block_id(0) % x` the block's rank in it). A TMA copy whose
  box is the same for every block of a cluster is then multicast (`synth/roles.py`);
* `tg.minimum(a, b)` / `tg.maximum(a, b)` on scalars (tile operands keep the element-wise
  meaning);
* `offsets[e]`: indexing every dim of an integer global tensor with scalars loads one
  element, a scalar usable in tile coordinates, loop bounds and `tg.if_` conditions.

All are run-time values, not constexprs, so one compiled kernel serves every grid size and
every variant of a GPU.
"""
from __future__ import annotations

import numbers
from typing import Any

from tegula.ir.scalar import GridSize, Scalar, ScalarLoad, SMCount, scalar_op
from tegula.lang.trace import current, fail, user_location

#: Element types a scalar load may read: integers stored whole (packed 4-bit ones are not).
LOADABLE = ("i32", "i8", "u8")


def num_programs(axis: int) -> GridSize:
    """The number of blocks launched along grid axis 0, 1 or 2 (a run-time scalar)."""
    label = "tg.num_programs"
    ctx = current(label)
    if isinstance(axis, bool) or axis not in (0, 1, 2):
        raise fail(label, f"the grid axis must be 0, 1 or 2, got {axis!r}")
    # One object per axis, like tg.block_id, so scalars compare by identity.
    return ctx.grid_sizes.setdefault(axis, GridSize(axis))


def num_sms() -> SMCount:
    """The number of streaming multiprocessors of the device running the kernel."""
    ctx = current("tg.num_sms")
    if ctx.sm_count is None:
        ctx.sm_count = SMCount()
    return ctx.sm_count


#: Blocks per cluster every cluster-capable GPU supports (the runtime's limit too).
MAX_CLUSTER_BLOCKS = 8


class ClusterShape(tuple):
    """(x, y, z) blocks per cluster, carrying the source line of its `tg.cluster` (`loc`)
    for the errors synthesis raises about it (a target without clusters)."""

    loc = None


def cluster(x: int, y: int = 1) -> None:
    """Launch the kernel in thread-block clusters of `x` blocks along grid axis 0 by `y`
    along axis 1 (sm_90). The grid must be a whole number of clusters. The blocks of a
    cluster run at the same time on neighbouring SMs, so a TMA box every block of the
    cluster loads (its coordinates the same for all of them: computed from
    `tg.block_id(0) // x`, not from the rank `tg.block_id(0) % x`) is loaded once and
    multicast into all of them — by a warp-specialized TMA pipeline (sm_90a) only: a
    build where no box is multicast warns (`tg.ClusterWarning`, at this line) and
    `explain` says why. `tg.cluster(1)` changes nothing."""
    label = "tg.cluster"
    ctx = current(label)
    for v in (x, y):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise fail(label, f"cluster dimensions are positive Python ints (constexprs), got "
                              f"{x!r} x {y!r}")
    if x * y > MAX_CLUSTER_BLOCKS:
        raise fail(label, f"a cluster of {x} x {y} blocks is over the portable "
                          f"{MAX_CLUSTER_BLOCKS}")
    if ctx.cluster != (1, 1, 1) and ctx.cluster != (int(x), int(y), 1):
        raise fail(label, f"the kernel already declared a {ctx.cluster[0]} x {ctx.cluster[1]} "
                          f"cluster")
    if ctx.body or ctx.shared_allocs:
        raise fail(label, "declare the cluster first in the kernel body, before any tile op")
    ctx.cluster = ClusterShape((int(x), int(y), 1))
    ctx.cluster.loc = user_location()


def is_scalar_operand(x: Any) -> bool:
    """A kernel scalar or a Python int (what scalar `min`/`max` combine)."""
    return isinstance(x, Scalar) or (isinstance(x, numbers.Integral) and not isinstance(x, bool))


def scalar_extremum(kind: str, a: Any, b: Any):
    """`tg.minimum(a, b)` / `tg.maximum(a, b)` of two kernel scalars (or a scalar and an
    int): a scalar; two Python ints give a Python int."""
    label = f"tg.{'minimum' if kind == 'min' else 'maximum'}"
    for x in (a, b):
        if not is_scalar_operand(x):
            raise fail(label, f"kernel scalars are integers; {x!r} cannot meet the kernel "
                              f"scalar {a if x is b else b} (a float needs a tile: compute "
                              f"in a register tile, or keep the value an integer)")
    if not isinstance(a, Scalar) and not isinstance(b, Scalar):
        return min(int(a), int(b)) if kind == "min" else max(int(a), int(b))
    return scalar_op(kind, a, b)


def scalar_load(view, coords: list) -> ScalarLoad:
    """`tensor[i, j]` with every dim indexed by an int or a kernel scalar: one element of an
    integer tensor, loaded by every thread. `coords` are tensor coordinates."""
    label = "view[...]"
    arg = view.ir.arg
    if arg.dtype.name not in LOADABLE:
        why = "floats cannot be tile coordinates or loop bounds" if arg.dtype.is_float \
            else f"{arg.dtype} elements are not loaded one at a time"
        raise fail(label, f"indexing every dim of {arg.name} ({arg.dtype}) loads one element "
                          f"as a kernel scalar, which needs an integer tensor "
                          f"({', '.join(LOADABLE)}): {why}. To read a tile, keep at least "
                          f"one dim with ':'")
    return ScalarLoad(arg.name, tuple(coords), arg.dtype)


__all__ = ["num_programs", "num_sms", "scalar_extremum", "scalar_load", "is_scalar_operand"]
