"""Shared-memory layout synthesis: one layout per buffer that serves every access well.

A shared buffer is written by some copies and read by others (and by gemms' operand
loads); each access has a fixed distribution of elements over threads (a TV table). For
every candidate layout — each alloc dim as the contiguous one, times the CuTe swizzles
`Sw<B, M, S>` that permute 16-byte chunks (M = log2 of elements per 16 bytes) — every
access is planned as the instruction it would get under that layout (`ldmatrix` where the
16-bit rows line up, else the widest aligned vector load/store) and costed by issue slots
plus shared-memory wavefronts, counted by enumerating the actual byte addresses of every
warp instruction. The cheapest candidate wins; ties go to the smaller swizzle, so an
access pattern that is conflict-free unswizzled stays unswizzled.

Enumeration rather than the F2 optimal-swizzle construction keeps non-power-of-two tiles
first class; both agree on power-of-two tiles (tests/synth compare them).
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import numpy as np

from tegula.arch.catalogue import ldmatrix
from tegula.errors import SynthesisError
from tegula.ir.values import SharedAlloc
from tegula.layout.cute import Layout
from tegula.layout.swizzle import ComposedLayout, Swizzle, buffer_offset, make_swizzled_layout

BANKS, BANK_BYTES = 32, 4


def wavefronts(byte_addresses: np.ndarray, access_bytes: int) -> int:
    """Shared-memory wavefronts for warp instructions whose lanes access `access_bytes`
    at `byte_addresses` (instructions × lanes; -1 marks an inactive lane).

    Lanes are served in phases of 128/access_bytes lanes (all 32 for ≤ 4 bytes); within a
    phase, each bank serves one distinct 4-byte word per wavefront, and lanes touching the
    same word share it. Computed for all phases at once: sort each phase's words, keep the
    first of each run of equal words, count them per bank, take the busiest bank.
    """
    addresses = np.atleast_2d(np.asarray(byte_addresses, dtype=np.int64))
    per_phase = max(1, min(32, 128 // max(access_bytes, 4)))
    words_per_access = max(1, access_bytes // BANK_BYTES)
    lanes = addresses.shape[1]
    pad = (-lanes) % per_phase
    if pad:
        addresses = np.pad(addresses, ((0, 0), (0, pad)), constant_values=-1)
    phases = addresses.reshape(-1, per_phase)                     # one row per phase
    active = phases >= 0
    words = phases[:, :, None] // BANK_BYTES + np.arange(words_per_access)
    words = np.where(active[:, :, None], words, -1).reshape(len(phases), -1)
    words.sort(axis=1)
    first = np.ones_like(words, dtype=bool)
    first[:, 1:] = words[:, 1:] != words[:, :-1]
    counted = first & (words >= 0)
    rows = np.broadcast_to(np.arange(len(phases))[:, None], words.shape)
    per_bank = np.zeros((len(phases), BANKS), dtype=np.int64)
    np.add.at(per_bank, (rows[counted], words[counted] % BANKS), 1)
    return int(per_bank.max(axis=1).sum())


@dataclass(frozen=True)
class SharedAccess:
    """One op's access to a shared buffer: `coords[t, v]` is the buffer coordinate (rank
    entries) that thread t moves in register v; `write` says which direction;
    `elem_bits` the element width (4-bit types are two to a byte: widths and addresses
    are counted in bits, never rounded up to a byte); `vector` fixes the vector width
    (for copy partitions), or 0 to let the layout decide; `ldmatrix` allows ldmatrix for
    16-bit register reads. `op_name` is for reports."""

    coords: np.ndarray
    write: bool
    elem_bits: int
    vector: int = 0
    ldmatrix: bool = False
    op_name: str = ""
    repeats: int = 1


@dataclass(frozen=True)
class AccessPlan:
    """The instruction an access gets under a layout, and its cost per execution."""

    instr: str            # "ldmatrix", "ld.shared", "st.shared"
    vector: int           # elements per lane per instruction (ldmatrix: 2*num)
    ldmatrix_num: int     # 4/2/1 for ldmatrix, else 0
    trans: bool
    instructions: int     # warp instructions per block
    wavefronts: int       # shared-memory wavefronts per block
    ideal_wavefronts: int

    @property
    def conflicts(self) -> int:
        return self.wavefronts - self.ideal_wavefronts

    def cost(self) -> int:
        return self.instructions + self.wavefronts


def _vector_width(offsets: np.ndarray, elem_bits: int, cap: int) -> int:
    """Widest power-of-two run (at most 16 bytes) of consecutive registers at consecutive,
    aligned offsets."""
    width = max(1, min(cap, 128 // elem_bits))
    values = offsets.shape[1]
    while width > 1:
        if values % width == 0:
            grouped = offsets.reshape(offsets.shape[0], values // width, width)
            if (np.all(grouped == grouped[:, :, :1] + np.arange(width)) and
                    np.all(grouped[:, :, 0] % width == 0)):
                return width
        width //= 2
    return 1


def _plan_vector_access(access: SharedAccess, offsets: np.ndarray) -> AccessPlan:
    bits = access.elem_bits
    cap = access.vector if access.vector else 128 // bits
    width = _vector_width(offsets, bits, cap)
    threads, values = offsets.shape
    starts = offsets[:, ::width] * bits // 8               # byte addresses: threads × instructions
    warps = threads // 32
    per_warp = starts.reshape(warps, 32, -1).transpose(0, 2, 1).reshape(-1, 32)
    access_bytes = max(1, width * bits // 8)
    waves = wavefronts(per_warp, access_bytes)
    ideal = per_warp.shape[0] * max(1, (32 * access_bytes + 127) // 128)
    return AccessPlan("st.shared" if access.write else "ld.shared", width, 0, False,
                      per_warp.shape[0], waves, ideal)


def _plan_ldmatrix(access: SharedAccess, offsets: np.ndarray) -> AccessPlan | None:
    """Plan the access as ldmatrix (x4, else x2, x1) if some variant's rows line up."""
    threads, values = offsets.shape
    if not ldmatrix(4).accepts(access.elem_bits) or threads % 32:
        return None
    warps = offsets.reshape(threads // 32, 32, values)
    for num in (4, 2, 1):
        group = 2 * num
        if values % group:
            continue
        for trans in (False, True):
            rows = _ldmatrix_row_addresses(warps, num, trans)
            if rows is None:
                continue
            instr_rows = rows.reshape(-1, 8 * num)  # one row per (warp, group): lanes' addresses
            waves = sum(wavefronts(instr_rows[:, 8 * j:8 * j + 8] * 2, 16) for j in range(num))
            count = instr_rows.shape[0]
            return AccessPlan("ldmatrix", group, num, trans, count, waves, count * num)
    return None


def _ldmatrix_row_addresses(warps: np.ndarray, num: int, trans: bool) -> np.ndarray | None:
    """Row start offsets (warps × groups × 8*num lanes) if every 8-element row each lane
    would address is contiguous and 16-byte aligned, else None."""
    n_warps, _, values = warps.shape
    group = 2 * num
    lane_index, value_index = _ldmatrix_gather(num, trans)      # (num, 8 rows, 8 cols)
    groups = np.arange(values // group)[:, None, None, None] * group
    rows = warps[:, lane_index[None], groups + value_index[None]]  # (warps, G, num, 8, 8)
    if not np.array_equal(rows, rows[..., :1] + np.arange(8)) or np.any(rows[..., 0] % 8):
        return None
    return rows[..., 0].reshape(n_warps, values // group, 8 * num)


@lru_cache(maxsize=8)
def _ldmatrix_gather(num: int, trans: bool) -> tuple[np.ndarray, np.ndarray]:
    """For matrix j, row r, column c of an ldmatrix.x{num}: the lane and the register
    (within the group) that receive it (`MatrixInstr.holder`, the catalogue's TV layout)."""
    instr = ldmatrix(num, trans)
    lane = np.empty((num, 8, 8), dtype=np.int64)
    value = np.empty((num, 8, 8), dtype=np.int64)
    for j in range(num):
        for r in range(8):
            for c in range(8):
                lane[j, r, c], value[j, r, c] = instr.holder(j, r, c)
    return lane, value


def plan_access(access: SharedAccess, offsets: np.ndarray) -> AccessPlan:
    """The best instruction for an access given the buffer offsets of its elements."""
    if access.ldmatrix and not access.write:
        plan = _plan_ldmatrix(access, offsets)
        if plan is not None:
            return plan
    return _plan_vector_access(access, offsets)


def base_layout(shape: tuple, contiguous_dim: int) -> Layout:
    """Compact layout of `shape` with `contiguous_dim` fastest, the others in order."""
    order = [contiguous_dim] + [d for d in range(len(shape)) if d != contiguous_dim]
    strides = [0] * len(shape)
    running = 1
    for d in order:
        strides[d] = running
        running *= shape[d]
    return Layout(tuple(shape), tuple(strides))


def evaluate_offsets(layout, coords: np.ndarray) -> np.ndarray:
    """Element offsets of buffer coordinates `coords[..., rank]` under a (swizzled) layout:
    `buffer_offset`, the function lowering addresses the buffer with, on numpy arrays."""
    coords = np.asarray(coords, dtype=np.int64)
    offsets = buffer_offset(layout, [coords[..., d] for d in range(coords.shape[-1])])
    return np.broadcast_to(np.asarray(offsets, dtype=np.int64), coords.shape[:-1])


def check_pinned_shared_layout(alloc: SharedAlloc) -> None:
    """A layout pinned with `tg.shared(..., layout=...)` must be a CuTe layout (optionally
    under a swizzle) with one mode per buffer dim, each of the dim's extent (a mode may be
    hierarchical within its dim), mapping the buffer's coordinates one to one onto its
    elements: a pinned layout that reaches past them would address other buffers (there
    is no padding: the buffer holds exactly its elements), and one that maps two
    coordinates to one element would make every write race. Said at the pinning line."""
    layout, shape = alloc.layout, tuple(alloc.shape)
    size = int(np.prod(shape))
    where = f"the layout {layout} pinned for shared buffer {alloc.name} {shape}"
    inner = layout.inner if isinstance(layout, ComposedLayout) else layout
    if not isinstance(inner, Layout) or (isinstance(layout, ComposedLayout) and not (
            isinstance(layout.outer, Swizzle) and isinstance(layout.offset, int))):
        raise SynthesisError(f"the layout {layout!r} pinned for shared buffer {alloc.name} "
                             f"{shape} is not a shared-memory layout: pin a "
                             f"tegula.layout.Layout (coordinate -> element offset), or one "
                             f"under a Swizzle (tegula.layout.make_swizzled_layout)",
                             loc=alloc.loc)
    extents = tuple(mode.size for mode in inner.modes())
    if inner.rank != len(shape) or extents != shape:
        raise SynthesisError(f"{where} needs one mode per buffer dim with that dim's extent "
                             f"{shape}, but its modes have the extents {extents}",
                             loc=alloc.loc)
    grid = np.indices(shape).reshape(len(shape), -1)
    offsets = np.asarray(buffer_offset(layout, list(grid)), dtype=np.int64)
    outside = offsets[(offsets < 0) | (offsets >= size)]
    if len(outside):
        raise SynthesisError(f"{where} reaches the offset {int(outside[0])}, outside the "
                             f"buffer's {size} elements (a pinned layout must map onto "
                             f"exactly the buffer's elements; padding is not supported)",
                             loc=alloc.loc)
    if len(np.unique(offsets)) != size:
        values, counts = np.unique(offsets, return_counts=True)
        raise SynthesisError(f"{where} maps several coordinates to the offset "
                             f"{int(values[counts > 1][0])} (it must be one to one, or "
                             f"writes to the buffer race)", loc=alloc.loc)


def candidate_layouts(shape: tuple, elem_bits: int) -> list:
    """Every (contiguous dim, swizzle) candidate for a buffer, smallest swizzle first; the
    swizzles permute 16-byte chunks (32 elements of a 4-bit type)."""
    stage_elems = int(np.prod(shape))
    chunk_bits = max(0, (128 // elem_bits).bit_length() - 1)
    candidates = []
    for contig in range(len(shape)):
        base = base_layout(shape, contig)
        candidates.append(base)
        for bits in (1, 2, 3):
            for shift in range(max(bits, 1), 8):
                period = 1 << (bits + chunk_bits + shift)
                if stage_elems % period == 0:
                    candidates.append(make_swizzled_layout(Swizzle(bits, chunk_bits, shift), base))
    return candidates


@dataclass
class SharedLayoutChoice:
    layout: object
    plans: list
    cost: int
    candidates_tried: int


def synthesize_shared_layout(alloc: SharedAlloc, accesses: list[SharedAccess],
                             fixed=None) -> SharedLayoutChoice:
    """Choose the buffer's layout minimizing the summed cost of all its accesses; with
    `fixed` (a layout an instruction requires, e.g. wgmma's canonical operand buffer) only
    plan the accesses under it."""
    if fixed is not None:
        candidates = [fixed]
    elif alloc.pinned and alloc.layout is not None:
        candidates = [alloc.layout]
    else:
        candidates = candidate_layouts(tuple(alloc.shape), alloc.dtype.bits)
    best: SharedLayoutChoice | None = None
    for candidate in candidates:
        plans = [plan_access(a, evaluate_offsets(candidate, a.coords)) for a in accesses]
        cost = sum(p.cost() * a.repeats for p, a in zip(plans, accesses))
        if best is None or cost < best.cost:
            best = SharedLayoutChoice(candidate, plans, cost, len(candidates))
    if best is None:
        raise SynthesisError(f"no layout for shared buffer {alloc.name}", loc=alloc.loc)
    return best

