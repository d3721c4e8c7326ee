"""Gemm anchors: choose the MMA instruction and how the warps tile the C tile.

Hexcute leaves the warp arrangement to the user; here both choices are one exhaustive
search, small enough to be complete: every MMA the target offers for the operand and
accumulator types × every factorization of the block's warps into `wm × wn` that divides
the C tile. Each candidate is scored with the analytical model of Hexcute §VI reduced to
the two resources a gemm's inner loop competes for, per block and gemm call:

    tensor cycles = MMAs × issue cycles (catalogue timing) / 4 tensor-core sub-partitions
    shared cycles = operand bytes loaded from shared memory / 128 bytes per clock

(operand bytes count each warp's A rows and B rows once: warps that share rows load them
again), and the candidate with the smallest `max(tensor, shared)` wins; ties go to less shared
traffic, then the larger K, then the larger `wm`, so the choice is deterministic. All candidates and their
scores are kept on the plan for `explain`.

The plan fixes three TV layouts: the accumulator's, and the layouts in which A and B
must reach the MMA (tiled from the instruction's fragment layouts).
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.arch.catalogue import mma_for
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
    candidates: tuple = ()  # (instruction, warp grid, score) of every candidate, best first

    def describe(self) -> str:
        rm, rn, rk = self.repeats
        return (f"{self.atom.name} on a {self.grid.wm}x{self.grid.wn} warp grid, "
                f"{rm}x{rn}x{rk} MMAs per warp per gemm")


def warp_grids(warps: int) -> list[WarpGrid]:
    """Every wm × wn = warps factorization, larger wm first."""
    return [WarpGrid(wm, warps // wm) for wm in range(warps, 0, -1) if warps % wm == 0]


def candidate_score(atom, grid: WarpGrid, tile_mnk: tuple, target: Target) -> tuple:
    """(cycles per gemm call for one block — max of tensor-core and shared-memory time —,
    shared-memory cycles): the second breaks ties toward less operand traffic."""
    bm, bn, bk = tile_mnk
    m, n, k = atom.shape_mnk
    warps = grid.wm * grid.wn
    mmas = (bm // m) * (bn // n) * (bk // k)
    issue, _ = atom.timing(target)
    tensor = mmas * issue / 4
    operand_bytes = warps * bk * ((bm // grid.wm) * atom.a_dtype.bits +
                                  (bn // grid.wn) * atom.b_dtype.bits) / 8
    shared = operand_bytes / 128
    return (max(tensor, shared), shared)


def plan_gemm(op: Gemm, threads: int, target: Target) -> GemmPlan:
    """The cheapest (MMA, warp grid) for `op`, with the TV layouts they imply."""
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
    reasons, scored = [], []
    for atom in atoms:
        m, n, k = atom.shape_mnk
        if ak % k:
            reasons.append(f"{atom.name}: K={ak} is not a multiple of {k}")
            continue
        fitting = [g for g in warp_grids(threads // 32)
                   if bm % (m * g.wm) == 0 and bn % (n * g.wn) == 0]
        if not fitting:
            reasons.append(f"{atom.name}: the {bm}x{bn} C tile does not split into "
                           f"{m}x{n} fragments over {threads // 32} warps")
        for grid in fitting:
            score = candidate_score(atom, grid, (bm, bn, ak), target)
            scored.append((score, -k, -grid.wm, atom, grid))
    if not scored:
        raise SynthesisError("gemm: no MMA fits the tiles: " + "; ".join(reasons), loc=op.loc)
    scored.sort(key=lambda c: c[:3])  # cost, then shared traffic, larger K, larger wm
    score, _, _, atom, grid = scored[0]
    m, n, k = atom.shape_mnk
    return GemmPlan(
        atom=atom, grid=grid,
        c_tv=mma_tiled_tv(atom.c_tv, (m, n), (bm, bn), grid, "c"),
        a_tv=mma_tiled_tv(atom.a_tv, (m, k), (am, ak), grid, "a"),
        b_tv=mma_tiled_tv(atom.b_tv, (n, k), (bn2, bk), grid, "b"),
        repeats=(bm // (m * grid.wm), bn // (n * grid.wn), ak // k),
        candidates=tuple((c[3].name, c[4], round(c[0][0], 1)) for c in scored))
