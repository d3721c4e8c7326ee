"""Tile schedulers for persistent kernels, written in the language.

A persistent kernel launches about one block per SM and walks the output tiles with a
grid-stride loop, `for t in tg.range(tg.block_id(0), tiles, tg.num_programs(0))`. Which
output tile the t-th one is decides how well L2 serves the operands: in plain row-major
order the blocks running at the same time share one row tile of A but sweep across all of
B. `grouped_tile` numbers the tiles in groups of `group` row tiles, walking down the group's
rows before moving one column right (Triton's "grouped ordering"), so the blocks running at
once touch `group` row tiles of A and about `blocks / group` column tiles of B.

The functions run at trace time on kernel scalars (and on Python ints, for host code and
tests), so they cost a few integer operations per tile in the kernel.
"""
from __future__ import annotations

from typing import Any

from tegula.lang.elementwise import minimum


def grouped_tile(t: Any, tiles_m: Any, tiles_n: Any, group: int) -> tuple[Any, Any]:
    """(row tile, column tile) of linear tile index `t` in grouped-rows order.

    Tiles 0 … group*tiles_n - 1 cover row tiles 0 … group-1: tile t is row
    `t % group`, column `t // group` of that band; the last band has only
    `tiles_m % group` rows (when that is not 0), so its rows are counted from what is left.
    Every t in [0, tiles_m * tiles_n) maps to a distinct (m, n) in range.
    """
    if isinstance(group, bool) or not isinstance(group, int) or group < 1:
        raise ValueError(f"grouped_tile: group must be a positive int, got {group!r}")
    per_band = group * tiles_n
    band = t // per_band
    first_m = band * group
    rows = minimum(tiles_m - first_m, group)   # the last band may be shorter
    within = t % per_band
    return first_m + within % rows, within // rows


__all__ = ["grouped_tile"]
