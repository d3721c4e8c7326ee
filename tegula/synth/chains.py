"""Gemm chains: choosing two gemms' warp grids together when one feeds the other.

In attention, `s` (the accumulator of `tg.gemm(s, q, k)`) becomes `p = exp(s - m)` and
`p.to(f16)` is the A operand of the next gemm, in registers. Chosen one gemm at a time, each
takes the warp grid that is cheapest for itself — for a 64x64 tile on four warps a 2x2 grid
— and then the first gemm's C fragments are spread over warps differently from the second
gemm's A fragments, so P makes a shared-memory round trip every key block. With both gemms
on a grid that keeps whole rows in one warp (4x1), each thread already holds, in its C
fragments, exactly the A fragment elements it needs (the m16n8 C fragment of two adjacent
n8 tiles is the k16 A fragment), and the conversion is a renaming of registers.

So a *chain* — a gemm whose register A operand is computed, element by element, from
another gemm's accumulator (`gemm_chains`) — couples the two gemms' decisions: the one
search over every gemm of the program (`synth/search.py`) adds to their own costs the
cost of converting the first one's C layout into the second one's A layout
(`conversion_cycles`, from the conversion the planner of `synth/convert.py` would pick).
A wgmma accumulator's warp-by-rows layout is what the mma.sync A operand on a 4x1 grid
needs.
"""
from __future__ import annotations

from tegula.arch.targets import Target
from tegula.ir.ops import Elementwise, Gemm, walk_ops
from tegula.ir.values import RegisterTile
from tegula.synth.convert import choose_conversion

#: A shared-memory round trip's fixed cost in cycles: the barrier between the stores and
#: the loads, and one shared-memory latency (both are paid once per conversion).
ROUND_TRIP_LATENCY = 60


def gemm_chains(gemms: list[Gemm], body: list) -> list[tuple[Gemm, Gemm]]:
    """(first, second) pairs where `second.a` is a register tile computed element by
    element (casts, unary ops, binary ops with broadcast row/column tiles) from the
    accumulator of `first`."""
    producer: dict[int, Elementwise] = {}
    for op in walk_ops(body):
        if isinstance(op, Elementwise):
            producer[op.out.id] = op
    accumulated_by = {g.c.id: g for g in gemms}
    chains = []
    for second in gemms:
        tile, seen = second.a, set()
        if not isinstance(tile, RegisterTile):
            continue
        while tile.id not in accumulated_by and tile.id in producer and tile.id not in seen:
            seen.add(tile.id)
            op = producer[tile.id]
            full = [x for x in op.inputs
                    if isinstance(x, RegisterTile) and tuple(x.shape) == tuple(op.out.shape)]
            if len(full) != 1:  # two full-size inputs: which layout wins is not ours to say
                break
            tile = full[0]
        first = accumulated_by.get(tile.id)
        if first is not None and first is not second:
            chains.append((first, second))
    return chains


def conversion_cycles(src_tv, dst_tv, shape: tuple, elem_bytes: int, threads: int,
                      target: Target) -> float:
    """Cycles one block spends converting a tile from `src_tv` to `dst_tv`: nothing for a
    register renaming, the shuffles' issue slots, or a shared-memory round trip's
    bandwidth, instructions and latency."""
    choice = choose_conversion(src_tv, dst_tv, shape, elem_bytes)
    warps = max(1, threads // 32)
    if choice.kind == "registers":
        return 0.0
    if choice.kind == "shuffle":
        return choice.instructions * warps / target.subpartitions
    elements = 1
    for extent in shape:
        elements *= extent
    per_thread = -(-elements // threads)
    bandwidth = 2 * elements * elem_bytes / target.shared_bytes_per_clk
    issue = 2 * per_thread * warps / target.subpartitions
    return bandwidth + issue + ROUND_TRIP_LATENCY
