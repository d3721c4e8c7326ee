"""Evaluate tile IR scalars and global views numerically (helpers for the tests)."""
from __future__ import annotations

from tegula.ir.scalar import (BlockIndex, LoopIndex, ScalarArg, ScalarBinOp, ScalarConst,
                              TensorExtent)
from tegula.ir.values import GlobalTile

_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b,
        "//": lambda a, b: a // b, "%": lambda a, b: a % b}


def evaluate(x, env: dict) -> int:
    """`x` with block indices, loop indices, extents and scalar args taken from `env`:
    env["block"] = (bx, by, bz), env[loop name] = value, env[(tensor, dim)] = extent."""
    if isinstance(x, int):
        return x
    if isinstance(x, ScalarConst):
        return x.value
    if isinstance(x, BlockIndex):
        return env["block"][x.axis]
    if isinstance(x, (LoopIndex, ScalarArg)):
        return env[x.name]
    if isinstance(x, TensorExtent):
        return env[(x.tensor, x.dim)]
    if isinstance(x, ScalarBinOp):
        return _OPS[x.op](evaluate(x.lhs, env), evaluate(x.rhs, env))
    raise TypeError(x)


def tensor_coord(view: GlobalTile, index: tuple, env: dict) -> tuple:
    """The tensor coordinate of tile coordinate `index` (values.py's documented map)."""
    coord = [evaluate(o, env) for o in view.origin]
    for i, dim in zip(index, view.dims):
        coord[dim.tensor_dim] += i * evaluate(dim.step, env)
    return tuple(coord)


def view_shape(view: GlobalTile, env: dict) -> tuple:
    return tuple(evaluate(d.extent, env) for d in view.dims)
