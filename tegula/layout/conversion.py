"""Planning a layout conversion of a distributed tensor (paper §5.4), and executing plans.

A conversion from ``src`` to ``dst`` (distributed layouts of one tensor) is described by
``X = src⁻¹ ∘ dst``: for every hardware index ``(warp, lane, register)`` of ``dst``, the
index of ``src`` that holds the same element. ``X`` is linear; its columns are chosen with
a "stay put" policy: a lane (warp) bit of ``dst`` maps to the same bit of ``src`` plus
registers (plus registers and lanes) whenever possible, so data that does not have to
move is not moved. The kind of plan follows from the columns of ``X``:

* ``"registers"``: lanes and warps map to themselves, registers to registers — the
  conversion is a register renaming, no instruction (``instruction_count == 0``);
* ``"shuffle"``: warps map to themselves (plus in-warp parts), nothing else leaves the
  warp — warp shuffles (``shfl.sync.idx`` of 32-bit words) in rounds, below;
* ``"shared"``: everything else — a store to and a load from shared memory laid out by
  :func:`~tegula.layout.optimal_swizzle.optimal_swizzle`.

Shuffle rounds (our formulation of the paper's ``V ∪ I ∪ G`` construction). Work in the
input space of ``dst`` within one warp: essential register bits (broadcast copies are
filled afterwards) and lane bits. A vector ``V`` of dst register bits whose sources are
registers of the same source thread is packed into one 32-bit word. A round is a coset of
``K = V ⊕ {(l, φ(l))}``: in round ``c`` lane ``l`` receives one word into registers
``c ⊕ φ(l) ⊕ V`` from lane ``X_lane(l, c ⊕ φ(l))``. ``φ`` (lane -> register) is built bit
by bit so that two receivers reading the same sender want the same word (``ker X_lane ⊆
ker X`` on the graph of ``φ``); when no broadcasting is involved the greedy step never
gets stuck (each step can raise the rank of the sending lanes, as in the paper). Rounds:
``2^(essential dst register bits - |V|)``; a round where every lane reads itself is a
local register select and costs no shuffle.

:func:`simulate_conversion` executes a plan on per-(warp, lane, register) values with
numpy, so every plan can be checked element by element.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tegula.layout import f2
from tegula.layout.banks import BankReport, align_outs, bank_report, dim_cols, log2_bytes
from tegula.layout.errors import LayoutError
from tegula.layout.linear import LinearLayout
from tegula.layout.optimal_swizzle import optimal_swizzle, swizzle_cost

SHUFFLE_WORD_BYTES = 4


@dataclass(frozen=True)
class ShuffleRound:
    """One ``shfl.sync.idx`` round, tables indexed ``[warp][lane]``.

    Lane ``l`` sends the word packed from its registers ``send_reg[w][l] ^ s`` (``s`` over
    the source slot offsets) and receives the word of lane ``src_lane[w][l]`` into registers
    ``dst_reg[w][l] ^ t`` (``t`` over the destination slot offsets).
    """

    src_lane: tuple[tuple[int, ...], ...]
    send_reg: tuple[tuple[int, ...], ...]
    dst_reg: tuple[tuple[int, ...], ...]
    local: bool


@dataclass(frozen=True)
class SharedStep:
    """The shared-memory round trip: layout, per-side bank reports and address bases.

    A thread of warp ``w`` lane ``l`` stores slot ``j`` of instruction ``i`` of ``store``
    at offset ``i.base_offset ^ src_lane_off(l) ^ src_warp_off(w) ^ j`` (likewise for
    loads with the ``dst`` offsets). When a report is not ``aligned`` the XOR reaches into
    the vector bits for some lanes: their vector is the same aligned block with its slots
    permuted, which codegen must undo with register selects.
    """

    layout: LinearLayout
    store: BankReport
    load: BankReport
    src_lane_offsets: tuple[int, ...]
    src_warp_offsets: tuple[int, ...]
    dst_lane_offsets: tuple[int, ...]
    dst_warp_offsets: tuple[int, ...]


@dataclass(frozen=True)
class ConversionPlan:
    """How to convert ``src`` to ``dst`` (see module doc). ``instruction_count`` is per
    thread: 0 for renaming, shuffles for ``"shuffle"`` (local rounds excluded),
    stores + loads for ``"shared"`` (the barrier between them not counted)."""

    kind: str
    instruction_count: int
    elem_bytes: int
    register_map: tuple[int, ...] | None = None
    rounds: tuple[ShuffleRound, ...] = ()
    slots: tuple[tuple[int, int], ...] = ()
    words_per_element: int = 1
    shared: SharedStep | None = None
    dst_copies: tuple[tuple[int, int], ...] = field(default=())


# ----------------------------------------------------------------------------------------
# The conversion map X.


@dataclass
class _Spaces:
    """Bit widths of the two layouts' inputs and the packed X columns (over dst flat bits)."""

    sreg: int
    dreg: int
    lane: int
    warp: int
    x: list[int]
    ker: list[int] = field(default_factory=list)  # in-warp src inputs holding nothing new

    def split_src(self, y: int) -> tuple[int, int, int]:
        """A flat src input -> (register, lane, warp)."""
        r = y & ((1 << self.sreg) - 1)
        l = (y >> self.sreg) & ((1 << self.lane) - 1)
        return r, l, y >> (self.sreg + self.lane)

    def dst_flat(self, r: int, l: int, w: int) -> int:
        return r | (l << self.dreg) | (w << (self.dreg + self.lane))


def _conversion_map(src: LinearLayout, dst: LinearLayout) -> _Spaces:
    """Columns of ``X`` with the stay-put policy (module doc)."""
    sr, sl, sw = (dim_cols(src, n) for n in ("register", "lane", "warp"))
    dr, dl, dw = (dim_cols(dst, n) for n in ("register", "lane", "warp"))
    if len(sl) != len(dl) or len(sw) != len(dw):
        raise LayoutError(
            f"plan_conversion: src has {1 << len(sl)} lanes x {1 << len(sw)} warps but dst "
            f"{1 << len(dl)} x {1 << len(dw)}; a conversion keeps the thread block")
    sp = _Spaces(len(sr), len(dr), len(sl), len(sw), [], f2.nullspace(sr + sl))
    regs = f2.eliminate(sr)
    in_warp = f2.eliminate(sr + sl)
    every = f2.eliminate(sr + sl + sw)

    def own(bit: int, have: int, want: int, e: f2.Elimination) -> int | None:
        # Keep the same hardware index and fix the rest with cheaper resources.
        rest = e.solve(want ^ have)
        return None if rest is None else (1 << bit) | rest

    for t in dr:
        x = regs.solve(t)
        x = in_warp.solve(t) if x is None else x
        x = every.solve(t) if x is None else x
        sp.x.append(x)
    for j, t in enumerate(dl):
        x = own(sp.sreg + j, sl[j], t, regs)
        sp.x.append(x if x is not None else (in_warp.solve(t) if in_warp.solve(t) is not None
                                             else every.solve(t)))
    for k, t in enumerate(dw):
        x = own(sp.sreg + sp.lane + k, sw[k], t, in_warp)
        sp.x.append(x if x is not None else every.solve(t))
    if any(x is None for x in sp.x):
        raise LayoutError(
            "plan_conversion: dst holds tensor elements that src does not hold "
            f"(src {src!r} is not onto dst's image)")
    return sp


def _kind(sp: _Spaces) -> str:
    """Classify X: renaming, in-warp, or across warps."""
    cols = sp.x
    regs_only = all(sp.split_src(x)[1:] == (0, 0) for x in cols[:sp.dreg])
    lanes_fixed = all(sp.split_src(x) == (0, 1 << j, 0)
                      for j, x in enumerate(cols[sp.dreg:sp.dreg + sp.lane]))
    warps_fixed = all(sp.split_src(x) == (0, 0, 1 << k)
                      for k, x in enumerate(cols[sp.dreg + sp.lane:]))
    if regs_only and lanes_fixed and warps_fixed:
        return "registers"
    in_warp = all(sp.split_src(x)[2] == 0 for x in cols[:sp.dreg + sp.lane])
    warps_home = all(sp.split_src(x)[2] == 1 << k
                     for k, x in enumerate(cols[sp.dreg + sp.lane:]))
    return "shuffle" if in_warp and warps_home else "shared"


def _essential_registers(dr: list[int]) -> tuple[list[int], tuple[tuple[int, int], ...]]:
    """Register bits that carry distinct data, and copies ``(reg, from_reg)`` for the rest."""
    ess = [1 << i for i in f2.eliminate(dr).independent]
    mask = sum(ess)
    first: dict[int, int] = {}
    for r in range(1 << len(dr)):
        if r & ~mask == 0:
            first.setdefault(f2.mat_vec(dr, r), r)
    copies = tuple((r, first[f2.mat_vec(dr, r)]) for r in range(1 << len(dr))
                   if r & ~mask)
    return ess, copies


# ----------------------------------------------------------------------------------------
# Shuffles.


def _choose_phi(sp: _Spaces, rest: list[int]) -> list[int] | None:
    """φ(lane bit j) as a dst register mask over ``rest`` (greedy, module doc).

    When src replicates data inside the warp (``sp.ker``), lane bit j of X may also be
    moved by a kernel vector (another holder of the same elements); the chosen move is
    written back into ``sp.x``, which stays a valid conversion map.
    """
    lane_mask = ((1 << sp.lane) - 1) << sp.sreg
    chosen_lanes: list[int] = []
    chosen_full: list[int] = []
    phi = []
    kers = [f2.mat_vec(sp.ker, i) for i in range(1 << min(len(sp.ker), 4))]
    for j in range(sp.lane):
        best = None
        for m in range(1 << len(rest)):
            reg = f2.mat_vec(rest, m)
            for n in kers:
                xk = f2.mat_vec(sp.x, sp.dst_flat(reg, 1 << j, 0)) ^ n
                lanes, full = chosen_lanes + [xk & lane_mask], chosen_full + [xk]
                rl, rf = f2.rank(lanes), f2.rank(full)
                if rl != rf:
                    continue  # two receivers would read one sender wanting different words
                grows = rl > f2.rank(chosen_lanes)
                if best is None or (grows and not best[0]):
                    best = (grows, reg, xk, n)
                if grows:
                    break
            if best is not None and best[0]:
                break
        if best is None:
            return None
        phi.append(best[1])
        sp.x[sp.dreg + j] ^= best[3]
        chosen_lanes.append(best[2] & lane_mask)
        chosen_full.append(best[2])
    return phi


def _round(sp: _Spaces, base: int, phi: list[int]) -> ShuffleRound | None:
    """Tables of the round whose receivers use registers ``base ^ φ(l)``."""
    src_lane, send, dst = [], [], []
    for w in range(1 << sp.warp):
        row_src, row_dst, row_send = [], [], {}
        for l in range(1 << sp.lane):
            reg = base ^ f2.mat_vec(phi, l)
            r, sl, sw = sp.split_src(f2.mat_vec(sp.x, sp.dst_flat(reg, l, w)))
            if sw != w or row_send.setdefault(sl, r) != r:
                return None
            row_src.append(sl)
            row_dst.append(reg)
        src_lane.append(tuple(row_src))
        dst.append(tuple(row_dst))
        send.append(tuple(row_send.get(l, 0) for l in range(1 << sp.lane)))
    local = all(row[l] == l for row in src_lane for l in range(len(row)))
    return ShuffleRound(tuple(src_lane), tuple(send), tuple(dst), local)


def _shuffle_plan(sp: _Spaces, dr: list[int], elem_bytes: int) -> ConversionPlan | None:
    """Rounds of warp shuffles, or None when the greedy construction does not apply."""
    ess, copies = _essential_registers(dr)
    cap = max(0, (SHUFFLE_WORD_BYTES // elem_bytes).bit_length() - 1) if elem_bytes <= 4 else 0
    vec, rest = [], []
    for b in ess:
        r, l, w = sp.split_src(f2.mat_vec(sp.x, b))
        (vec if (l, w) == (0, 0) and len(vec) < cap else rest).append(b)
    phi = _choose_phi(sp, rest)
    if phi is None:
        return None
    rounds = []
    for m in range(1 << len(rest)):
        rnd = _round(sp, f2.mat_vec(rest, m), phi)
        if rnd is None:
            return None
        rounds.append(rnd)
    slots = tuple((f2.mat_vec(sp.x, f2.mat_vec(vec, j)), f2.mat_vec(vec, j))
                  for j in range(1 << len(vec)))
    wpe = max(1, elem_bytes // SHUFFLE_WORD_BYTES)
    count = sum(not r.local for r in rounds) * wpe
    return ConversionPlan("shuffle", count, elem_bytes, rounds=tuple(rounds), slots=slots,
                          words_per_element=wpe, dst_copies=copies)


# ----------------------------------------------------------------------------------------
# Shared memory.


def _side_report(smem: LinearLayout, lay: LinearLayout, elem_bytes: int,
                 common: int) -> BankReport:
    """The bank report at the widest vector of this side that is aligned and no more
    conflicted than the common vector the swizzle was optimized for (fewer instructions
    at no cost); the common vector otherwise."""
    base = bank_report(smem, lay, elem_bytes, vec_elems=common)
    vec = bank_report(smem, lay, elem_bytes).vec_elems
    while vec > common:
        rep = bank_report(smem, lay, elem_bytes, vec_elems=vec)
        if rep.aligned and rep.conflict_factor <= base.conflict_factor:
            return rep
        vec //= 2
    return base


def _shared_plan(src: LinearLayout, dst: LinearLayout, elem_bytes: int) -> ConversionPlan:
    smem = optimal_swizzle(dst, src, elem_bytes)
    solver = f2.eliminate(smem.matrix())
    offs = {n: tuple(solver.solve(c) for c in dim_cols(lay, n))
            for lay, n in ((src, "lane"), (src, "warp"))}
    doffs = {n: tuple(solver.solve(c) for c in dim_cols(dst, n)) for n in ("lane", "warp")}
    common = swizzle_cost(smem, dst, src, elem_bytes).vec_elems
    store = _side_report(smem, src, elem_bytes, common)
    load = _side_report(smem, dst, elem_bytes, common)
    covered = {r for ins in load.instructions for r in ins.registers}
    dreg = dim_cols(dst, "register")
    by_off = {}
    for ins in load.instructions:
        for j, r in enumerate(ins.registers):
            by_off[ins.base_offset + j] = r
    t = [solver.solve(c) for c in dreg]
    copies = tuple((r, by_off[f2.mat_vec(t, r)]) for r in range(1 << len(dreg))
                   if r not in covered)
    step = SharedStep(smem, store, load, offs["lane"], offs["warp"], doffs["lane"],
                      doffs["warp"])
    count = len(store.instructions) + len(load.instructions)
    return ConversionPlan("shared", count, elem_bytes, shared=step, dst_copies=copies)


def plan_conversion(src: LinearLayout, dst: LinearLayout, *, elem_bytes: int = 2) -> ConversionPlan:
    """The cheapest way to move a tensor from layout ``src`` to layout ``dst`` (§5.4):
    register renaming, else warp shuffles, else a shared-memory round trip."""
    log2_bytes(elem_bytes, "elem_bytes")
    dst = align_outs(dst, src, "plan_conversion")
    sp = _conversion_map(src, dst)
    kind = _kind(sp)
    if kind == "registers":
        rmap = tuple(sp.split_src(f2.mat_vec(sp.x, r))[0] for r in range(1 << sp.dreg))
        return ConversionPlan("registers", 0, elem_bytes, register_map=rmap)
    if kind == "shuffle":
        plan = _shuffle_plan(sp, dim_cols(dst, "register"), elem_bytes)
        if plan is not None:
            return plan
    if not src.is_surjective():
        raise LayoutError(
            "plan_conversion: the data must cross warps but src does not cover the whole "
            "tensor, so it cannot be staged through shared memory")
    return _shared_plan(src, dst, elem_bytes)


# ----------------------------------------------------------------------------------------
# Execution.


def _sizes(lay: LinearLayout) -> tuple[int, int, int]:
    return tuple(1 << len(dim_cols(lay, n)) for n in ("warp", "lane", "register"))


def simulate_conversion(plan: ConversionPlan, src: LinearLayout, dst: LinearLayout,
                        values: np.ndarray) -> np.ndarray:
    """Execute ``plan`` on ``values[warp, lane, register]`` held in layout ``src``;
    returns the ``[warp, lane, register]`` array of ``dst``."""
    sw, sl, sr = _sizes(src)
    dw, dl, drn = _sizes(dst)
    values = np.asarray(values)
    if values.shape != (sw, sl, sr):
        raise LayoutError(f"values must have shape (warps, lanes, registers) = {(sw, sl, sr)}, "
                          f"got {values.shape}")
    out = np.zeros((dw, dl, drn), dtype=values.dtype)
    if plan.kind == "registers":
        out[:] = values[:, :, list(plan.register_map)]
    elif plan.kind == "shuffle":
        for rnd in plan.rounds:
            for w in range(dw):
                # every lane packs its word, then every lane reads the word of its source
                words = [[values[w, l, rnd.send_reg[w][l] ^ s] for s, _ in plan.slots]
                         for l in range(sl)]
                for l in range(dl):
                    word = words[rnd.src_lane[w][l]]
                    for (_, t), v in zip(plan.slots, word):
                        out[w, l, rnd.dst_reg[w][l] ^ t] = v
    elif plan.kind == "shared":
        _simulate_shared(plan.shared, values, out)
    else:
        raise LayoutError(f"unknown plan kind {plan.kind!r}")
    for r, frm in plan.dst_copies:
        out[:, :, r] = out[:, :, frm]
    return out


def _simulate_shared(step: SharedStep, values: np.ndarray, out: np.ndarray) -> None:
    smem = np.zeros(step.layout.total_in_size, dtype=values.dtype)
    for w in range(values.shape[0]):
        for l in range(values.shape[1]):
            t = f2.mat_vec(step.src_lane_offsets, l) ^ f2.mat_vec(step.src_warp_offsets, w)
            for ins in step.store.instructions:
                for j, r in enumerate(ins.registers):
                    smem[ins.base_offset ^ t ^ j] = values[w, l, r]
    for w in range(out.shape[0]):
        for l in range(out.shape[1]):
            t = f2.mat_vec(step.dst_lane_offsets, l) ^ f2.mat_vec(step.dst_warp_offsets, w)
            for ins in step.load.instructions:
                for j, r in enumerate(ins.registers):
                    out[w, l, r] = smem[ins.base_offset ^ t ^ j]
