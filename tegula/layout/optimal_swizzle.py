"""Optimal shared-memory swizzle for a write by one distributed layout and a read by another.

Paper §5.4 / §9.2, in our own formulation. The shared layout ``S`` (offset -> tensor) is
chosen as an ordered basis of the tensor space, read in consecutive groups of offset bits:

    [ Vec | Ext | Lo-extra | Bank | Row ]

* ``Vec``: a basis of ``span(writer_reg) ∩ span(reader_reg)``, so both sides move
  ``2^v`` consecutive offsets per instruction (capped at 16 bytes).
* ``Ext``: more directions of ONE side's registers, so that side alone moves wider
  vectors (a writer holding 16-byte rows while the reader holds single elements of a
  column: the common vector is one element, yet the writer can still store 16 bytes per
  instruction). Each side's vector is the run of offsets ``0, 1, ...`` its registers hold.
* ``Lo`` = ``Vec + Ext`` + extra bits up to one bank word: elements of one word never
  conflict.
* ``Row``: the offset bits above one 128-byte wavefront. Two lanes of one phase conflict
  exactly when their addresses differ by a nonzero element of ``Row`` modulo ``Lo``.
* ``Bank``: whatever completes the basis.

With ``U_X = Lo + span(lane bases of one phase of side X)``, side X pays
``2^dim((U_X ∩ (Row + Lo)) / Lo)`` wavefronts per phase (see :mod:`tegula.layout.banks`).
Working modulo ``Lo``, the Row space ``H`` of dimension ``s`` must avoid ``U_A`` and
``U_B`` as much as possible. Lemma 9.5 says the best is ``dim(H ∩ U_X) >= s - (n - dim
U_X)`` for each side (``n`` the dimension modulo ``Lo``), and the construction below
reaches BOTH bounds at once:

    I = U_A ∩ U_B;  E, F extend I to U_A, U_B (|E| <= |F| after naming);
    C completes U_A + U_B to the whole space;
    H = first s of  C,  G = {e_i ^ f_i},  F beyond |E|,  I beyond Lo,  E.

The choices the lemma leaves open — how far to extend one side's vector (``Ext``,
which also changes that side's phase size) and the extra ``Lo`` bits of a narrow vector
— are few; each candidate is built and scored with the bank model itself, and the
cheapest kept (see :class:`SwizzleCost` for the order). Element sizes may be sub-byte
(``elem_bytes=0.5`` for 4-bit data): addresses are modelled in bits.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from tegula.layout import f2
from tegula.layout.banks import (MAX_VECTOR_BYTES, align_outs, conflict_log2, dim_cols,
                                 leading_units_in_span, log2_bytes, log2_elem_bits,
                                 phase_lane_bits, shared_solver, to_offsets,
                                 vector_cap_bits)
from tegula.layout.errors import LayoutError
from tegula.layout.linear import LinearLayout


@dataclass(frozen=True)
class SwizzleCost:
    """How good a shared layout is for a (writer, reader) pair, per warp.

    Each side accesses shared memory with its own widest vector: ``read_vec_elems`` /
    ``write_vec_elems`` consecutive offsets held by one thread's registers (capped at
    16 bytes); ``*_instructions`` is how many such accesses one thread makes, and
    ``*_wavefronts`` what one access instruction costs the warp (``*_ideal`` without
    bank conflicts).
    """

    read_vec_elems: int
    write_vec_elems: int
    read_wavefronts: int
    write_wavefronts: int
    read_ideal: int
    write_ideal: int
    read_instructions: int
    write_instructions: int

    @property
    def vec_elems(self) -> int:
        """The common vector: both sides move this many consecutive offsets at once."""
        return min(self.read_vec_elems, self.write_vec_elems)

    @property
    def ideal_wavefronts(self) -> int:
        """The conflict-free cost of one instruction (the larger side's when they differ)."""
        return max(self.read_ideal, self.write_ideal)

    @property
    def total_wavefronts(self) -> int:
        """Wavefronts of all of one warp's reads and writes."""
        return (self.read_instructions * self.read_wavefronts
                + self.write_instructions * self.write_wavefronts)

    @property
    def key(self) -> tuple[int, int]:
        """Sort key, smaller is better: fewest access instructions first (maximal
        vectorization), then fewest wavefronts in total."""
        return (self.read_instructions + self.write_instructions, self.total_wavefronts)


def _side_cost(regs: list[int], lanes: list[int], cap: int, elem_bytes: float,
               banks: int, bank_bytes: int) -> tuple[int, int, int, int]:
    """(vector bits, wavefronts, ideal, instructions) of one side, from its offsets."""
    v = leading_units_in_span(regs, cap)
    vbytes = (1 << v) * elem_bytes
    pbits = phase_lane_bits(len(lanes), vbytes, banks, bank_bytes)
    phases = 1 << (len(lanes) - pbits)
    wavefronts = phases << conflict_log2(lanes[:pbits], v, elem_bytes, banks, bank_bytes)
    return v, wavefronts, phases, 1 << (f2.rank(regs) - v)


def swizzle_cost(shared: LinearLayout, reader: LinearLayout, writer: LinearLayout,
                 elem_bytes: float, *, banks: int = 32, bank_bytes: int = 4) -> SwizzleCost:
    """Score ``shared`` for a write by ``writer`` and a read by ``reader``, each side
    using its own widest vector. ``elem_bytes`` may be a fraction (0.5 for 4-bit)."""
    reader = align_outs(reader, shared, "swizzle_cost")
    writer = align_outs(writer, shared, "swizzle_cost")
    solver = shared_solver(shared)
    cap = vector_cap_bits(elem_bytes)
    sides = []
    for lay in (reader, writer):
        regs = to_offsets(solver, dim_cols(lay, "register"), "swizzle_cost")
        lanes = to_offsets(solver, dim_cols(lay, "lane"), "swizzle_cost")
        sides.append(_side_cost(regs, lanes, cap, elem_bytes, banks, bank_bytes))
    (rv, rw, ri, rn), (wv, ww, wi, wn) = sides
    return SwizzleCost(1 << rv, 1 << wv, rw, ww, ri, wi, rn, wn)


# ----------------------------------------------------------------------------------------
# The construction.


def _extend(base: list[int], candidates: list[int]) -> list[int]:
    """Candidates (in order) that raise the rank of ``base``: a basis extension."""
    out: list[int] = []
    e = f2.eliminate(base)
    for c in candidates:
        if e.reduce(c)[0]:
            out.append(c)
            e = f2.eliminate(base + out)
    return out


def _vector_basis(reg_a: list[int], reg_b: list[int], cap: int) -> list[int]:
    """A basis of ``span(reg_a) ∩ span(reg_b)``, at most ``cap`` long.

    Register bases themselves are preferred (reader's, in register order, then writer's)
    so that the vector is made of registers in their natural order where possible.
    """
    in_a, in_b = f2.eliminate(reg_a), f2.eliminate(reg_b)
    preferred = [r for r in reg_a if r and in_b.solve(r) is not None]
    preferred += [r for r in reg_b if r and in_a.solve(r) is not None]
    basis = _extend([], preferred + f2.intersection(reg_a, reg_b))
    return basis[:cap]


def _one_sided_extensions(vec: list[int], regs: list[int], room: int,
                          other_lanes: list[int]) -> list[list[int]]:
    """Ways to widen ONE side's vector past the common ``vec`` by as many directions of
    that side's register span as fit (``room``): a longer vector always means fewer
    instructions, so only the longest widenings are candidates.

    When all of the span fits there is one; when the 16-byte cap cuts it, the subspaces
    of the cut size are drawn from a basis and its pairwise sums (a bounded sample, so the
    lower bits need not align with register bits).

    Directions the OTHER side's phase lanes also move come first: the lowest ones can
    share the other side's bank word, and a lane that stays inside a word is free.
    """
    shared_dirs = f2.intersection(vec + regs, vec + other_lanes)
    basis = _extend(vec, shared_dirs + regs)
    t = min(room, len(basis))
    if t <= 0:
        return []
    if t == len(basis):
        return [basis]
    pool = basis + [x ^ y for x, y in combinations(basis, 2)]
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for combo in combinations(pool, t):
        if f2.rank(vec + list(combo)) != len(vec) + t:
            continue
        span = tuple(sorted(f2.span_basis(vec + list(combo))))
        if span not in seen:
            seen.add(span)
            out.append(list(combo))
            if len(out) == _MAX_WIDENINGS:
                break
    return out


#: Bound on the capped widenings tried per side (each is built and scored).
_MAX_WIDENINGS = 8


def _row_space(lo: list[int], lo_a: list[int], lo_b: list[int], ua: list[int],
               ub: list[int], d: int, s: int) -> list[int]:
    """The ``s`` Row vectors: C, then G, then the larger side's rest, then shared ones.

    Side X's conflicts are ``dim(Row ∩ U_X)`` with ``U_X`` = its OWN low bits ``lo_x``
    (its vector, or a word if wider) plus its phase lanes; the sides are compared modulo
    the smaller of the two low spaces (inside both). All low bits ``lo`` are a direction
    Row must never take, so the preference order is walked keeping only vectors
    independent of ``lo`` and of those already taken.
    """
    ua_star, ub_star = lo_a + ua, lo_b + ub
    base = lo_a if len(lo_a) <= len(lo_b) else lo_b
    inter = _extend(base, f2.intersection(ua_star, ub_star))  # I beyond the common low
    i_full = base + inter
    e = _extend(i_full, ua_star)
    f = _extend(i_full, ub_star)
    if len(e) > len(f):
        e, f = f, e
    g = [x ^ y for x, y in zip(e, f)]
    c = f2.complement(ua_star + ub_star, d)
    rows: list[int] = []
    for v in c + g + f[len(e):] + inter + e + f2.complement(lo, d):
        if len(rows) == s:
            break
        if f2.rank(lo + rows + [v]) == len(lo) + len(rows) + 1:
            rows.append(v)
    return rows


def _build(lo: list[int], lo_a: list[int], lo_b: list[int], ua: list[int], ub: list[int],
           d: int, wave_bits: int) -> list[int]:
    """Offset columns ``Lo | Bank | Row`` for one choice of the low bits."""
    s = max(0, d - max(wave_bits, len(lo)))
    rows = _row_space(lo, lo_a, lo_b, ua, ub, d, s)
    bank = f2.complement(lo + rows, d)
    return lo + bank + rows


def _extra_candidates(vec: list[int], ua: list[int], ub: list[int], d: int,
                      k: int) -> list[list[int]]:
    """Choices of ``k`` extra Lo directions: common, reader-only, writer-only, neutral."""
    if k <= 0:
        return [[]]
    common = _extend(vec, f2.intersection(vec + ua, vec + ub))
    only_a = _extend(vec + common, ua)
    only_b = _extend(vec + common, ub)
    neutral = f2.complement(vec + ua + ub, d)[:k]
    pool = common + only_a + only_b + neutral
    out = []
    for combo in combinations(pool, min(k, len(pool))):
        if f2.rank(vec + list(combo)) == len(vec) + len(combo):
            out.append(list(combo))
    return out or [[]]


def _phase_lanes(layout: LinearLayout, vec_bits: int, elem_bytes: float, banks: int,
                 bank_bytes: int) -> list[int]:
    """The nonzero lane bases of one phase of ``layout`` at a vector of ``vec_bits``."""
    lanes = dim_cols(layout, "lane")
    pbits = phase_lane_bits(len(lanes), (1 << vec_bits) * elem_bytes, banks, bank_bytes)
    return [x for x in lanes[:pbits] if x]


def optimal_swizzle(reader: LinearLayout, writer: LinearLayout, elem_bytes: float, *,
                    banks: int = 32, bank_bytes: int = 4) -> LinearLayout:
    """A shared layout (``offset`` -> tensor) with the fewest access instructions (each
    side at its widest vector, common or one-sided) and then the fewest bank-conflict
    wavefronts, for ``writer`` storing and ``reader`` loading.

    Both are distributed layouts (register, lane, warp -> tensor) of the same tensor; the
    result uses ``reader``'s out dims. ``elem_bytes`` may be a fraction of a byte (0.5
    for 4-bit data). See the module doc for the construction; the tests check it against
    exhaustive enumeration of every shared layout of small tensors.
    """
    writer = align_outs(writer, reader, "optimal_swizzle")
    d = reader.total_out_bits
    for name, lay in (("reader", reader), ("writer", writer)):
        if not lay.is_surjective():
            raise LayoutError(
                f"optimal_swizzle: the {name} layout does not cover the whole tensor "
                f"(rank {lay.rank()} < {d}), so shared memory would hold unknown values")
    e = log2_elem_bits(elem_bytes)
    wave_bits = max(0, (banks * bank_bytes * 8).bit_length() - 1 - e)
    word_bits = max(0, log2_bytes(bank_bytes, "bank_bytes") + 3 - e)
    cap = vector_cap_bits(elem_bytes)
    regs = (dim_cols(reader, "register"), dim_cols(writer, "register"))
    vec = _vector_basis(regs[0], regs[1], cap)
    # (low bits, reader vector bits, writer vector bits): the common vector alone, or
    # widened on one side.
    lows = [(vec, len(vec), len(vec))]
    at_common = [_phase_lanes(lay, len(vec), elem_bytes, banks, bank_bytes)
                 for lay in (reader, writer)]
    for side in (0, 1):
        for ext in _one_sided_extensions(vec, regs[side], cap - len(vec), at_common[1 - side]):
            widths = [len(vec), len(vec)]
            widths[side] += len(ext)
            lows.append((vec + ext, widths[0], widths[1]))
    best = None
    for low, rv, wv in lows:
        ua = _phase_lanes(reader, rv, elem_bytes, banks, bank_bytes)
        ub = _phase_lanes(writer, wv, elem_bytes, banks, bank_bytes)
        k = min(max(word_bits, len(low)), d) - len(low)
        for extra in _extra_candidates(low, ua, ub, d, k):
            lo = low + extra  # each side's own low bits: its vector, or a word if wider
            cols = _build(lo, lo[:max(word_bits, rv)], lo[:max(word_bits, wv)], ua, ub, d,
                          wave_bits)
            shared = LinearLayout.from_packed({"offset": cols}, list(reader.out_dims.items()))
            key = swizzle_cost(shared, reader, writer, elem_bytes, banks=banks,
                               bank_bytes=bank_bytes).key
            if best is None or key < best[0]:
                best = (key, shared)
    return best[1]


# ----------------------------------------------------------------------------------------
# Reporting a result in CuTe's vocabulary.


def _swizzle_cols(bits: int, base: int, shift: int, d: int) -> list[int]:
    """Columns of CuTe's ``Swizzle<bits, base, shift>`` (shift > 0) on ``d`` offset bits:
    source bit ``base + shift + i`` also flips target bit ``base + i``."""
    cols = [1 << i for i in range(d)]
    for i in range(bits):
        cols[base + shift + i] |= 1 << (base + i)
    return cols


def cute_swizzle_for(shared: LinearLayout):
    """``(Swizzle(B, M, S), base)`` with ``S⁻¹(coord) == swizzle(base(coord))``, or None.

    ``base`` is a LinearLayout tensor -> ``offset`` whose columns are distinct powers of
    two: a plain, unswizzled strided layout of the tile's bits (CuTe shape ``(2,2,..)``
    with power-of-two strides). The search tries the identity first, then every
    ``Swizzle<B,M,S>`` with ``S >= B >= 1`` that fits the offset bits, fewest bits first.
    None means the layout is not a single CuTe swizzle of a strided layout.
    """
    from tegula.layout.swizzle import Swizzle

    d = shared.total_in_bits
    solver = shared_solver(shared)
    inv = [solver.solve(1 << j) for j in range(d)]  # tensor bit j -> offset vector
    for bits in range(0, d // 2 + 1):
        for shift in ([0] if bits == 0 else range(bits, d - bits + 1)):
            for base in range(0, d - bits - shift + 1 if bits else 1):
                z = _swizzle_cols(bits, base, shift, d)
                perm = [f2.mat_vec(z, c) for c in inv]  # Z is an involution: Z·M
                if all(f2.is_pow2(c) for c in perm):
                    cols = dict(zip(shared.out_dim_names, _split(perm, shared)))
                    lay = LinearLayout.from_packed(cols, [("offset", 1 << d)])
                    return Swizzle(bits, base, shift), lay
    return None


def _split(cols: list[int], shared: LinearLayout) -> list[list[int]]:
    """Columns over the flattened tensor bits, grouped per out dim of ``shared``."""
    out, k = [], 0
    for name in shared.out_dim_names:
        nb = shared.out_dim_bits(name)
        out.append(cols[k:k + nb])
        k += nb
    return out
