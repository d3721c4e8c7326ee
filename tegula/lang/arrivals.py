"""`tg.last_arrival(counter, count)`: which block of a group finishes last.

Blocks of one launch have no order, so work that needs every block's result (merging the
partial outputs of a split-K or split-KV kernel) usually takes a second launch. With a
counter in global memory the block that finishes last can do it instead:

    tg.copy(partial, partials[b, s])                  # every split block
    with tg.if_(tg.last_arrival(counters[b].tile((1,), (0,)), tg.num_programs(0))):
        ...                                           # the last one reads every partial

Each of the `count` blocks calls it once on the same counter element (an i32 global
tensor element holding 0 before the first launch). The call is a block barrier followed by
one atomic increment by one thread (`atom.acq_rel.gpu.global.inc.u32`, the catalogue's
`arch/arrivals.py`), which wraps the counter back to 0 at the `count`-th arrival, so the
next launch finds it zeroed without another kernel. The result is true, in every thread of
the block, in the block that arrived `count`-th. Everything a block stored before its call
is visible to the last block after its call (release / acquire at GPU scope), so the
loads under the `tg.if_` read the other blocks' stores; the emulator checks that ordering
and reports a read of another block's store that no arrival orders as a race.

Rules: call it in the kernel body itself (not inside a loop, branch or warp-role block:
every thread of the block must reach it, once); the counter must hold a value in 0 …
count − 1 when a block arrives (the emulator reports one that does not; on the GPU the
block traps, a launch error, rather than leaving no block to finish); launches sharing a
counter must not run at the same time (two streams), since their arrivals would mix.
"""
from __future__ import annotations

import numbers
from typing import Any

from tegula.dtypes import i32
from tegula.ir.ops import LastArrival
from tegula.ir.scalar import ArrivalFlag, Scalar, compare
from tegula.ir.values import GlobalTile, describe
from tegula.lang.tensors import GlobalView
from tegula.lang.trace import current, fail


def last_arrival(counter: Any, count: Any):
    """True (a block-uniform condition for `tg.if_`) in the block that arrives `count`-th
    on the one-element i32 global view `counter`; see the module docstring."""
    label = "tg.last_arrival"
    ctx = current(label)
    if not isinstance(counter, GlobalView):
        raise fail(label, f"the counter must be a one-element view of an i32 global tensor "
                          f"(e.g. counters[b].tile((1,), (0,))), got {counter!r}")
    tile = counter.ir
    if not isinstance(tile, GlobalTile) or tile.dtype != i32 or \
            not all(isinstance(e, int) and e == 1 for e in tile.shape):
        raise fail(label, f"the counter {describe(tile)} must be one element of an i32 "
                          f"global tensor (a view of shape (1,) or (1, 1), ...)")
    if isinstance(count, bool) or not isinstance(count, (numbers.Integral, Scalar)):
        raise fail(label, f"count must be an int or a kernel scalar (how many blocks "
                          f"arrive, e.g. tg.num_programs(0)), got {count!r}")
    if isinstance(count, numbers.Integral) and count < 1:
        raise fail(label, f"count must be at least 1, got {count}")
    if ctx.depth != 1 or ctx.open_region is not None:
        raise fail(label, "call it in the kernel body itself, not inside a loop, a tg.if_ "
                          "block or a warp-role block: every thread of the block must "
                          "arrive, once")
    flag = ArrivalFlag(ctx.fresh_name("arrived"))
    ctx.emit(LastArrival(counter=tile, count=count if isinstance(count, Scalar) else
                         int(count), flag=flag))
    return compare("!=", flag, 0)


__all__ = ["last_arrival"]
