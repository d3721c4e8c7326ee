"""Choosing how a layout conversion runs: register moves, warp shuffles, or shared memory.

Where both TV layouts are power-of-two, they are F2 linear layouts and the conversion
planner of Linear Layouts §5.4 (`tegula.layout.conversion.plan_conversion`) finds the
cheapest mechanism: a renaming of registers (no data leaves a thread), rounds of warp
shuffles (data stays in its warp), or a shared-memory round trip. This module turns the
planner's answer into the form lowering emits: per-round register lists and the source
lane as an F2-linear function of the lane index. Shuffle rounds whose registers differ
from lane to lane would need per-lane register selects, which thread IR does not have, so
such plans — and everything that is not power-of-two — use the generic shared-memory path.
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.layout.conversion import plan_conversion
from tegula.layout.cute_bridge import linear_from_cute_tv
from tegula.layout.errors import LayoutError


@dataclass(frozen=True)
class ShuffleStep:
    """One shuffle of one element per lane: every lane sends register `send` and receives,
    into register `receive`, the `send` register of lane `source(lane)`, where
    `source(lane) = base ^ XOR of columns[b] for each set bit b of lane`."""

    send: int
    receive: int
    base: int
    columns: tuple[int, ...]


@dataclass(frozen=True)
class ConversionChoice:
    """How one conversion runs. `kind` is "registers" (dst register r takes src register
    `register_map[r]`), "shuffle" (`steps`, then `copies` dst[r] = dst[frm]) or "shared"."""

    kind: str
    instructions: int
    register_map: tuple = ()
    steps: tuple = ()
    copies: tuple = ()

    def describe(self) -> str:
        if self.kind == "shared":
            return "shared-memory round trip (store, barrier, load)"
        names = {"registers": "register renaming", "shuffle": "warp shuffles"}
        return f"{names[self.kind]} ({self.instructions} instructions per thread)"


SHARED = ConversionChoice("shared", 0)


def _is_pow2(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


def choose_conversion(src_tv, dst_tv, shape: tuple, elem_bytes: int) -> ConversionChoice:
    """The cheapest mechanism lowering can emit for converting `src_tv` to `dst_tv`."""
    sizes = [src_tv[0].size, src_tv[1].size, dst_tv[0].size, dst_tv[1].size, *shape]
    if not all(_is_pow2(int(s)) for s in sizes) or elem_bytes not in (1, 2, 4, 8):
        return SHARED
    try:
        src = linear_from_cute_tv(src_tv, shape)
        dst = linear_from_cute_tv(dst_tv, shape)
        plan = plan_conversion(src, dst, elem_bytes=elem_bytes)
    except LayoutError:
        return SHARED
    if plan.kind == "registers":
        return ConversionChoice("registers", 0, register_map=tuple(plan.register_map))
    if plan.kind == "shuffle":
        steps = _uniform_shuffle_steps(plan)
        if steps is not None:
            return ConversionChoice("shuffle", len(steps), steps=steps,
                                    copies=tuple(plan.dst_copies))
    return SHARED


def _uniform_shuffle_steps(plan) -> tuple | None:
    """The plan's rounds as per-element shuffles, if every lane and warp uses the same
    registers and the source lane is the same linear function in every warp."""
    steps = []
    for rnd in plan.rounds:
        warps = range(len(rnd.src_lane))
        if any(rnd.src_lane[w] != rnd.src_lane[0] or rnd.send_reg[w] != rnd.send_reg[0]
               or rnd.dst_reg[w] != rnd.dst_reg[0] for w in warps):
            return None
        send, receive = set(rnd.send_reg[0]), set(rnd.dst_reg[0])
        if len(send) != 1 or len(receive) != 1:
            return None
        lanes = rnd.src_lane[0]
        base = lanes[0]
        columns = tuple(lanes[1 << b] ^ base for b in range(len(lanes).bit_length() - 1))
        if any(_linear(base, columns, lane) != lanes[lane] for lane in range(len(lanes))):
            return None
        (sent,), (received,) = send, receive
        for s, t in plan.slots:
            steps.append(ShuffleStep(sent ^ s, received ^ t, base, columns))
    return tuple(steps)


def _linear(base: int, columns: tuple, lane: int) -> int:
    value = base
    for b, col in enumerate(columns):
        if lane >> b & 1:
            value ^= col
    return value
