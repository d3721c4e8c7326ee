"""Gemm anchors: choose the MMA instruction and how the warps tile the C tile.

Hexcute leaves the warp arrangement to the user; here both choices are one exhaustive
search, small enough to be complete: every MMA the target offers for the operand and
accumulator types × every factorization of the block's warps into `wm × wn` that divides
the C tile. Each candidate is scored with the analytical model of Hexcute §VI reduced to
the two resources a gemm's inner loop competes for, per block and gemm call:

    tensor cycles = MMAs × issue cycles (catalogue timing) / 4 tensor-core sub-partitions
    shared cycles = operand bytes loaded from shared memory / 128 bytes per clock
    (4 and 128 are `Target.subpartitions` and `Target.shared_bytes_per_clk`)

(operand bytes count each warp's A rows and B rows once: warps that share rows load them
again), and the candidate with the smallest `max(tensor, shared)` wins; ties go to less shared
traffic, then the larger K, then the larger `wm`, so the choice is deterministic. All candidates and their
scores are kept on the plan for `explain`.

The plan fixes three TV layouts: the accumulator's, and the layouts in which A and B
must reach the MMA (tiled from the instruction's fragment layouts).

On sm_90a a gemm whose operands are shared tiles that wgmma can read (f16, bf16, 8-bit
floats or f32 as tf32; K-major, or for f16/bf16 also MN-major — a transposed view such as
`v.T` —; K any multiple of the instruction's K, rows spanning several swizzle spans) and
whose C tile splits into 64 x N wgmma fragments over whole warpgroups runs on `wgmma`
instead (`plan_wgmma`): the same search over warpgroup grids, the accumulator the
instruction's D fragment tiled over them, and the operand buffers pinned to the canonical
swizzled layout (`tegula.arch.smem_matrix`; `operand_layout`). When it does not fit, the
plan says why (`wgmma_skipped`, shown by `tegula explain`) and the mma.sync search above
runs.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from tegula.arch.catalogue import mma_for
from tegula.arch.mma import MMA_INSTRUCTIONS
from tegula.arch.targets import Target
from tegula.arch.wgmma import WARPGROUP, WGMMA_INSTRUCTIONS
from tegula.dtypes import bf16, f8e4m3, f8e5m2, f16, f32
from tegula.errors import SynthesisError, TegulaError
from tegula.ir.ops import Gemm
from tegula.ir.values import RegisterTile, SharedTile, describe
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
    #: On a wgmma target: why this gemm does not use wgmma ("" when not considered).
    wgmma_skipped: str = ""
    #: Why the warp grid was chosen together with another gemm's (`synth/search.py`).
    joint: str = ""
    kind = "mma.sync"

    def describe(self) -> str:
        rm, rn, rk = self.repeats
        text = (f"{self.atom.name} on a {self.grid.wm}x{self.grid.wn} warp grid, "
                f"{rm}x{rn}x{rk} MMAs per warp per gemm")
        text += f"; {self.joint}" if self.joint else ""
        return text + (f"; wgmma not used: {self.wgmma_skipped}" if self.wgmma_skipped else "")


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
    tensor = mmas * issue / target.subpartitions
    operand_bytes = warps * bk * ((bm // grid.wm) * atom.a_dtype.bits +
                                  (bn // grid.wn) * atom.b_dtype.bits) / 8
    shared = operand_bytes / target.shared_bytes_per_clk
    return (max(tensor, shared), shared)


def plan_gemm(op: Gemm, threads: int, target: Target):
    """How `op` runs: a `WgmmaPlan` where the target has wgmma and the gemm fits it, else
    the cheapest (mma.sync, warp grid) `GemmPlan`, with the TV layouts they imply."""
    if not has_wgmma(target):
        _check_some_mma_sync(op, target, "")
        return plan_mma_sync(op, threads, target)
    plan, reason = plan_wgmma(op, threads, target)
    if plan is not None:
        return plan
    _check_some_mma_sync(op, target, reason)
    return dataclasses.replace(plan_mma_sync(op, threads, target), wgmma_skipped=reason)


def _check_some_mma_sync(op: Gemm, target: Target, wgmma_reason: str) -> None:
    """Types only a wgmma multiplies (f32 x f32, as tf32: no mma.sync on any target) need
    it: say why it did not fit, or that the target has none, rather than that no mma.sync
    exists. Types some other target's mma.sync takes (f8 on sm_89) keep mma_sync_plans's
    "no MMA instruction on <target>"."""
    types = (op.a.dtype, op.b.dtype, op.c.dtype)
    if any((i.a_dtype, i.b_dtype, i.c_dtype) == types for i in MMA_INSTRUCTIONS):
        return
    if not any((w.a_dtype, w.b_dtype, w.acc_dtype) == types for w in WGMMA_INSTRUCTIONS):
        return  # no instruction anywhere: mma_sync_plans says so
    where = (f"it does not fit here: {wgmma_reason}" if wgmma_reason else
             f"{target.name} has no wgmma (sm_90a has)")
    raise SynthesisError(
        f"gemm: {op.a.dtype} x {op.b.dtype} into {op.c.dtype} ({describe(op.a)}, "
        f"{describe(op.b)}) multiplies only through wgmma (as tf32 for f32 data), and "
        f"{where}; convert the operands with .to(f16) or .to(bf16) for mma.sync",
        loc=op.loc)


def plan_mma_sync(op: Gemm, threads: int, target: Target) -> GemmPlan:
    """The cheapest (MMA, warp grid) for `op`, with the TV layouts they imply."""
    return mma_sync_plans(op, threads, target)[0]


def _fewer_warps_hint(atoms, tile: tuple, threads: int) -> str:
    """When the C tile is too small for the block's warps (a 16x16 tile on 4 warps): the
    largest block whose warps an MMA fits, as a suggestion."""
    bm, bn, bk = tile
    for warps in range(threads // 32 - 1, 0, -1):
        if any(bk % a.shape_mnk[2] == 0 and any(
                bm % (a.shape_mnk[0] * g.wm) == 0 and bn % (a.shape_mnk[1] * g.wn) == 0
                for g in warp_grids(warps)) for a in atoms):
            return (f" (the tile is too small for {threads // 32} warps: it fits a block of "
                    f"threads={32 * warps}, or a larger tile)")
    return ""


def mma_sync_plans(op: Gemm, threads: int, target: Target) -> list[GemmPlan]:
    """Every (MMA, warp grid) that fits `op`, as plans, cheapest first (ties: less shared
    traffic, larger K, larger wm); each plan's `candidates` lists them all with scores."""
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
        raise SynthesisError("gemm: no MMA fits the tiles: " + "; ".join(reasons)
                             + _fewer_warps_hint(atoms, (bm, bn, ak), threads), loc=op.loc)
    scored.sort(key=lambda c: c[:3])  # cost, then shared traffic, larger K, larger wm
    candidates = tuple((c[3].name, c[4], round(c[0][0], 1)) for c in scored)
    plans = []
    for _, _, _, atom, grid in scored:
        m, n, k = atom.shape_mnk
        plans.append(GemmPlan(
            atom=atom, grid=grid,
            c_tv=mma_tiled_tv(atom.c_tv, (m, n), (bm, bn), grid, "c"),
            a_tv=mma_tiled_tv(atom.a_tv, (m, k), (am, ak), grid, "a"),
            b_tv=mma_tiled_tv(atom.b_tv, (n, k), (bn2, bk), grid, "b"),
            repeats=(bm // (m * grid.wm), bn // (n * grid.wn), ak // k),
            candidates=candidates))
    return plans


# --------------------------------------------------------------------------------------
# wgmma (sm_90a): warpgroup-wide, operands read from shared memory through descriptors
# --------------------------------------------------------------------------------------

WGMMA_M = 64
WGMMA_K_BYTES = 32            # one wgmma reads 32 bytes of K (k16 for 16-bit types)
WGMMA_MAX_N = 256
SWIZZLE_SPANS = (128, 64, 32)  # bytes; the canonical buffer's blocks are one span wide
WGMMA_OPERAND_TYPES = (f16, bf16, f8e4m3, f8e5m2, f32)  # f32 as tf32; i8/u8: no entry yet
WGMMA_MN_MAJOR_TYPES = (f16, bf16)  # the ISA's imm-trans exists for 16-bit types only


@dataclass(frozen=True)
class WgmmaPlan:
    """How one `tg.gemm` runs on wgmma: the instruction `atom` (64 x n x 16), the warpgroup
    grid (`grid.wm` warpgroups along M, `grid.wn` along N; warpgroup index
    `tid // 128 = i_m + wm * i_n`), the accumulator layout `c_tv` (the atom's D fragment
    tiled like mma.sync's: warpgroup (i_m, i_n) at repeat (rm, rn) holds rows
    64 * (i_m + wm * rm) … and columns n * (i_n + wn * rn) …), the repeats per warpgroup
    (RM, RN, RK = K / 16), and each operand buffer's swizzle (bytes) — the buffer holds the
    canonical layout (`operand_layout`) — and major-ness: `trans_a`/`trans_b` 1 for an
    MN-major operand (a transposed view: its buffer's contiguous dim is M or N; the PTX
    imm-trans-a/b), 0 for K-major. With A in registers (`a_tv` set: the atom's A fragment
    tiled like the accumulator, warpgroups along N holding the same rows), `swizzle_a` is
    0 and only B is read through a descriptor."""

    atom: object
    grid: WarpGrid
    c_tv: Layout
    repeats: tuple
    swizzle_a: int
    swizzle_b: int
    candidates: tuple = ()
    a_tv: Layout | None = None  # None: A is read from shared memory by the instruction
    trans_a: int = 0
    trans_b: int = 0
    joint: str = ""  # why the one search took this plan over the cheapest alone
    b_tv = None
    kind = "wgmma"  # what lowering dispatches on (`lower/hopper.py: is_wgmma`)

    def describe(self) -> str:
        rm, rn, rk = self.repeats
        mn = lambda t: " (MN-major)" if t else ""  # noqa: E731  (K-major: unsaid)
        where = (f"A from registers, B{mn(self.trans_b)} read from shared memory through "
                 f"descriptors ({self.swizzle_b} B swizzle)" if self.a_tv is not None
                 else f"A{mn(self.trans_a)} and B{mn(self.trans_b)} read from shared memory "
                 f"through descriptors ({self.swizzle_a} B / {self.swizzle_b} B swizzle)")
        return (f"{self.atom.name} on a {self.grid.wm}x{self.grid.wn} warpgroup grid, "
                f"{rm}x{rn}x{rk} wgmmas per warpgroup per gemm; {where}"
                + (f"; {self.joint}" if self.joint else ""))


def has_wgmma(target: Target) -> bool:
    """wgmma exists on the architecture-specific sm_90a (and later "a" targets)."""
    return target.cc >= 90 and target.arch_suffix == "a"


def buffer_swizzle(alloc) -> int:
    """The swizzle (bytes) of a wgmma operand buffer: the widest span (128, 64, 32 bytes)
    that divides its contiguous (last) dim's row, else 0 (interleave: 16-byte blocks).
    A function of the buffer alone, so every gemm reading the buffer — K-major in one,
    MN-major in another, as attention's backward reads K — agrees on its layout."""
    row_bytes = alloc.shape[-1] * alloc.dtype.bits // 8
    return next((s for s in SWIZZLE_SPANS if row_bytes % s == 0), 0)


def block_width(dtype, swizzle: int) -> int:
    """W: elements of one block of the canonical buffer along its contiguous dim (a swizzle
    span, or 16 bytes without a swizzle)."""
    return max(swizzle, 16) * 8 // dtype.bits


def operand_layout(rows: int, cols: int, dtype, swizzle: int):
    """The canonical wgmma operand buffer of shape (rows, cols), `cols` contiguous (K of a
    K-major operand, M or N of an MN-major one), in the buffer's own coordinates: blocks of
    W = `block_width` columns, each a row-major (rows, W) tile (row r at r * W), the blocks
    rows * W elements apart, all under the element swizzle —
    `tegula.arch.smem_matrix.canonical_smem_layout` in the per-dim form shared-memory
    addressing (`layout.swizzle.buffer_offset`) evaluates (tests/synth/test_hopper_decision.py
    checks both majors). One block (cols == W) is the flat (rows, cols):(cols, 1). K-major
    and MN-major operands of one buffer read the same layout; only the descriptors differ.
    TMA writes it as one box of (W, rows) per block."""
    from tegula.arch.smem_matrix import element_swizzle
    from tegula.layout.swizzle import make_swizzled_layout
    w = block_width(dtype, swizzle)
    if cols % w or rows % 8:
        raise TegulaError(f"canonical wgmma buffer ({rows}, {cols}) of {dtype} with "
                          f"{swizzle}-byte swizzle: rows a multiple of 8, columns of {w}")
    plain = (Layout((rows, cols), (cols, 1)) if cols == w else
             Layout((rows, (w, cols // w)), (w, (1, rows * w))))
    if not swizzle:
        return plain
    return make_swizzled_layout(element_swizzle(swizzle, dtype), plain)


def is_transposed(tile: SharedTile) -> bool:
    """True if the shared tile view permutes its buffer's dims."""
    return bool(tile.permutation) and tuple(tile.permutation) != tuple(range(len(tile.shape)))


def _wgmma_operand_problem(op: Gemm, threads: int) -> str:
    """Why the operands/threads of `op` cannot go to wgmma ("" when they can). A may be a
    register tile (16-bit: the instruction's A fragment), B is always in shared memory;
    a transposed shared view is an MN-major operand (16-bit types only)."""
    if isinstance(op.a, RegisterTile) and op.a.dtype not in (f16, bf16):
        return (f"operand A {describe(op.a)} is in registers as {op.a.dtype} (wgmma takes "
                f"f16/bf16 A fragments from registers here)")
    for role, tile in (("A", op.a), ("B", op.b)):
        if role == "A" and isinstance(tile, RegisterTile):
            continue
        if not isinstance(tile, SharedTile):
            return f"operand {role} {describe(tile)} is not a shared tile"
        if len(tile.alloc.shape) != 2:
            return f"operand {role}'s buffer is not 2-D"
        if is_transposed(tile) and tile.dtype not in WGMMA_MN_MAJOR_TYPES:
            return (f"operand {role} {describe(tile)} is a transposed view of {tile.dtype} "
                    f"(MN-major wgmma operands exist for f16/bf16 only; {tile.dtype} is read "
                    f"K-major)")
        if tuple(tile.shape) != tuple(tile.alloc.shape)[::-1 if is_transposed(tile) else 1]:
            return f"operand {role} {describe(tile)} is part of its buffer"
        if tile.alloc.pinned:
            return f"operand {role}'s buffer has a pinned layout"
        if tile.dtype not in WGMMA_OPERAND_TYPES:
            return (f"operand {role} is {tile.dtype} (wgmma from shared memory here: "
                    f"{', '.join(map(str, WGMMA_OPERAND_TYPES))})")
    if op.c.pinned:
        return f"the accumulator {describe(op.c)} has a pinned layout"
    if threads % WARPGROUP:
        return f"{threads} threads are not whole warpgroups of {WARPGROUP}"
    return ""


def plan_wgmma(op: Gemm, threads: int, target: Target) -> tuple[WgmmaPlan | None, str]:
    """(the cheapest wgmma plan, "") for `op`, or (None, why wgmma does not fit)."""
    plans, why = wgmma_plans(op, threads, target, every=False)
    return (plans[0] if plans else None), why


def wgmma_plans(op: Gemm, threads: int, target: Target,
                every: bool = True) -> tuple[list[WgmmaPlan], str]:
    """(every wgmma plan of `op` — one per warpgroup grid and instruction N width that
    tile its C — cheapest first, "") or ([], why wgmma does not fit); `every=False`: the
    cheapest only. The one search (`synth/search.py`) weighs them with the conversions
    of chained gemms."""
    problem = _wgmma_operand_problem(op, threads)
    if problem:
        return [], problem
    (bm, bn), (_, bk) = op.c.shape, op.a.shape
    k_step = WGMMA_K_BYTES * 8 // op.a.dtype.bits
    if bk % k_step:
        return None, (f"K = {bk} ({describe(op.b)}) is not a multiple of the wgmma's "
                      f"K = {k_step} for {op.a.dtype} (32 bytes)")
    a_shared = not isinstance(op.a, RegisterTile)
    swizzles = [buffer_swizzle(op.a.alloc) if a_shared else 0, buffer_swizzle(op.b.alloc)]
    trans = [int(a_shared and is_transposed(op.a)), int(is_transposed(op.b))]
    # An MN-major B's descriptor starts on a block of W rows: N must be a multiple of W.
    b_rows = block_width(op.b.dtype, swizzles[1]) if trans[1] else 8
    scored, reasons = [], []
    for grid in warp_grids(threads // WARPGROUP):
        if bm % (WGMMA_M * grid.wm) or bn % (8 * grid.wn):
            continue
        for n in _wgmma_widths(bn // grid.wn):
            if n % b_rows:
                reasons.append(f"N={n} of an MN-major B ({describe(op.b)}) is not a multiple "
                               f"of its {b_rows}-column swizzle block")
                continue
            atom = _wgmma_entry(op, n)
            if atom is None:
                reasons.append(f"no wgmma with N={n} for {op.a.dtype} x {op.b.dtype} -> {op.c.dtype}")
                continue
            score = _wgmma_score(atom, grid, (bm, bn, bk), target, a_shared=a_shared)
            scored.append((score, -n, -grid.wm, atom, grid))
    if not scored:
        why = "; ".join(reasons[:1]) or (
            f"the {bm}x{bn} C tile does not split into 64xN (N a multiple of 8) fragments "
            f"over {threads // WARPGROUP} warpgroup(s)")
        return [], why
    scored.sort(key=lambda c: c[:3])
    candidates = tuple((c[3].name, f"{c[4].wm}x{c[4].wn} warpgroup grid", round(c[0][0], 1))
                       for c in scored)
    plans = []
    for _, _, _, atom, grid in scored if every else scored[:1]:
        n = atom.n
        c_tv = mma_tiled_tv(atom.acc_tv, (WGMMA_M, n), (bm, bn), grid, "c")
        a_tv = (mma_tiled_tv(atom.a_tv, (WGMMA_M, k_step), (bm, bk), grid, "a")
                if isinstance(op.a, RegisterTile) else None)
        repeats = (bm // (WGMMA_M * grid.wm), bn // (n * grid.wn), bk // k_step)
        plans.append(WgmmaPlan(atom, grid, c_tv, repeats, swizzles[0], swizzles[1],
                               candidates, a_tv, *trans))
    return plans, ""


def _wgmma_widths(n_per_group: int) -> list[int]:
    """wgmma N extents (multiples of 8, at most 256) that tile `n_per_group` columns."""
    return [n for n in range(8, WGMMA_MAX_N + 1, 8) if n_per_group % n == 0]


def _wgmma_entry(op: Gemm, n: int):
    """The catalogue's wgmma for these types and N, or None."""
    from tegula.arch.wgmma import wgmma_for
    try:
        return wgmma_for(op.a.dtype, op.b.dtype, op.c.dtype, n)
    except TegulaError:
        return None


def _wgmma_score(atom, grid: WarpGrid, tile_mnk: tuple, target: Target,
                 a_shared: bool = True) -> tuple:
    """(block cycles per gemm call: max of tensor-core and shared-memory time, shared
    cycles), as `candidate_score` for mma.sync: every wgmma occupies the SM's four tensor
    cores for its issue cycles, and every wgmma reads its own 64xK A slice and NxK B slice
    through its descriptors — operands are not shared between the instructions of one
    warpgroup, so a warpgroup covering two 64-row slices with m64n128 reads B twice, where
    the same C tile split along M across warpgroups with m64n256 reads it once."""
    bm, bn, bk = tile_mnk
    wgmmas = (bm // atom.m) * (bn // atom.n) * (bk // atom.k)
    issue, _ = atom.timing(target)
    tensor = wgmmas * issue
    a_bits = atom.m * atom.a_dtype.bits if a_shared else 0  # A from registers: no shared read
    operand_bytes = wgmmas * atom.k * (a_bits + atom.n * atom.b_dtype.bits) / 8
    shared = operand_bytes / target.shared_bytes_per_clk
    return (max(tensor, shared), shared)
