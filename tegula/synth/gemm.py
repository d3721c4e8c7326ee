"""Gemm anchors: choose the MMA instruction and how the warps tile the C tile.

Hexcute leaves the warp arrangement to the user; here it is a small search. For each MMA
the target offers for the operand/accumulator types (best first), every factorization of
the block's warps into `wm × wn` that divides the C tile is scored by the shared-memory
(or global) operand traffic per warp and k-step — each warp loads its `BM/wm` rows of A
and `BN/wn` rows of B, so the sum of the two is what to minimize — and the cheapest wins,
ties going to the larger `wm` so the choice is deterministic.

The plan fixes three TV layouts: the accumulator's, and the layouts in which A and B
must reach the MMA (tiled from the instruction's fragment layouts).
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.arch.catalogue import get_instruction, mma_for
from tegula.arch.targets import Target
from tegula.errors import SynthesisError
from tegula.ir.ops import Gemm
from tegula.ir.values import describe
from tegula.layout.cute import Layout
from tegula.layout.tv import WarpGrid, mma_tiled_tv


@dataclass(frozen=True)
class GemmPlan:
    """How one `tg.gemm` runs: the MMA `atom`, the warp grid, the tile-level TV layouts
    of C, A and B, and how often the atom repeats along M, N and K per warp."""

    atom: object
    grid: WarpGrid
    c_tv: Layout
    a_tv: Layout
    b_tv: Layout
    repeats: tuple  # (RM, RN, RK)

    def describe(self) -> str:
        rm, rn, rk = self.repeats
        return (f"{self.atom.name} on a {self.grid.wm}x{self.grid.wn} warp grid, "
                f"{rm}x{rn}x{rk} MMAs per warp per gemm")


def warp_grids(warps: int) -> list[WarpGrid]:
    """Every wm × wn = warps factorization, larger wm first."""
    return [WarpGrid(wm, warps // wm) for wm in range(warps, 0, -1) if warps % wm == 0]


def _grid_cost(grid: WarpGrid, bm: int, bn: int) -> int:
    return bm // grid.wm + bn // grid.wn


def plan_gemm(op: Gemm, threads: int, target: Target) -> GemmPlan:
    """The MMA and warp grid for `op`, with the TV layouts they imply."""
    (bm, bn), (am, ak), (bn2, bk) = op.c.shape, op.a.shape, op.b.shape
    atoms = mma_for(op.a.dtype, op.b.dtype, op.c.dtype, target)
    if not atoms:
        raise SynthesisError(
            f"gemm: no MMA instruction on {target.name} multiplies {op.a.dtype} by "
            f"{op.b.dtype} into {op.c.dtype} ({describe(op.a)}, {describe(op.b)}, "
            f"{describe(op.c)})", loc=op.loc)
    if threads % 32:
        raise SynthesisError(f"gemm needs whole warps, but the kernel has {threads} threads",
                             loc=op.loc)
    reasons = []
    for atom in atoms:
        m, n, k = atom.shape_mnk
        if ak % k:
            reasons.append(f"{atom.name}: K={ak} is not a multiple of {k}")
            continue
        fitting = [g for g in warp_grids(threads // 32) if bm % (m * g.wm) == 0 and bn % (n * g.wn) == 0]
        if not fitting:
            reasons.append(f"{atom.name}: the {bm}x{bn} C tile does not split into "
                           f"{m}x{n} fragments over {threads // 32} warps")
            continue
        grid = min(fitting, key=lambda g: (_grid_cost(g, bm, bn), -g.wm))
        return GemmPlan(
            atom=atom, grid=grid,
            c_tv=mma_tiled_tv(atom.c_tv, (m, n), (bm, bn), grid, "c"),
            a_tv=mma_tiled_tv(atom.a_tv, (m, k), (am, ak), grid, "a"),
            b_tv=mma_tiled_tv(atom.b_tv, (n, k), (bn2, bk), grid, "b"),
            repeats=(bm // (m * grid.wm), bn // (n * grid.wn), ak // k))
    raise SynthesisError("gemm: no MMA fits the tiles: " + "; ".join(reasons), loc=op.loc)
