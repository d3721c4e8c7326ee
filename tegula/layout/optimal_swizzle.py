"""Optimal shared-memory swizzle for a write by one distributed layout and a read by another.

Paper §5.4 / §9.2, in our own formulation. The shared layout ``S`` (offset -> tensor) is
chosen as an ordered basis of the tensor space, read in four consecutive groups of offset
bits:

    [ Vec | Lo-extra | Bank | Row ]
      v     w - v      ...    s = d - log2(elements per wavefront)

* ``Vec`` (offset bits ``0..v-1``): a basis of ``span(writer_reg) ∩ span(reader_reg)``,
  so both sides move ``2^v`` consecutive offsets per instruction. ``v`` is the largest
  possible, capped at 16 bytes — maximal vectorization comes first.
* ``Lo`` = ``Vec`` + extra bits up to one bank word (``w`` = bits of a 4-byte word, when
  the vector is narrower than a word). Elements of one word never conflict.
* ``Row``: the offset bits above one 128-byte wavefront. Two lanes of one phase conflict
  exactly when their addresses differ by a nonzero element of ``Row`` modulo ``Lo``.
* ``Bank``: whatever completes the basis.

With ``U_X = Lo + span(lane bases of one phase of side X)``, side X pays
``2^dim((U_X ∩ (Row + Lo)) / Lo)`` wavefronts per phase (see :mod:`tegula.layout.banks`).
Working modulo ``Lo``, the Row space ``H`` of dimension ``s`` must avoid ``U_A`` and
``U_B`` as much as possible. Lemma 9.5 says the best is ``dim(H ∩ U_X) >= s - (n - dim
U_X)`` for each side (``n`` the dimension modulo ``Lo``), and the construction below
reaches BOTH bounds at once, so it is optimal for any cost increasing in the two conflict
degrees:

    I = U_A ∩ U_B;  E, F extend I to U_A, U_B (|E| <= |F| after naming);
    C completes U_A + U_B to the whole space;
    H = first s of  C,  G = {e_i ^ f_i},  F beyond |E|,  I beyond Lo,  E.

``C`` and ``G`` touch neither side, the rest of ``F`` only the larger side, and only then
both. When the vector is narrower than a word, the extra ``Lo`` bits are free; they are
chosen by trying the few structured candidates (common lane directions first, then one
side's) and keeping the cheapest — each candidate is scored with the bank model itself.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import combinations

from tegula.layout import f2
from tegula.layout.banks import (MAX_VECTOR_BYTES, align_outs, conflict_log2, dim_cols,
                                 leading_units_in_span, log2_bytes, phase_lane_bits,
                                 shared_solver, to_offsets)
from tegula.layout.errors import LayoutError
from tegula.layout.linear import LinearLayout


@dataclass(frozen=True)
class SwizzleCost:
    """How good a shared layout is for a (writer, reader) pair.

    ``vec_elems``: the common vector (both sides move that many consecutive offsets per
    instruction, capped at 16 bytes). Wavefronts are per instruction at that vector.
    """

    vec_elems: int
    read_wavefronts: int
    write_wavefronts: int
    ideal_wavefronts: int

    @property
    def key(self) -> tuple[int, int]:
        """Sort key, smaller is better: vector width first, then read + write wavefronts."""
        return (-self.vec_elems, self.read_wavefronts + self.write_wavefronts)


def _vec_cap_bits(elem_bytes: int) -> int:
    e = log2_bytes(elem_bytes, "elem_bytes")
    return max(0, (MAX_VECTOR_BYTES >> e).bit_length() - 1) if elem_bytes <= MAX_VECTOR_BYTES else 0


def _side_wavefronts(lane_offs: list[int], v: int, elem_bytes: int, banks: int,
                     bank_bytes: int) -> tuple[int, int]:
    """(wavefronts, ideal) per instruction of one side, from its lane offsets."""
    vbytes = (1 << v) * elem_bytes
    pbits = phase_lane_bits(len(lane_offs), vbytes, banks, bank_bytes)
    phases = 1 << (len(lane_offs) - pbits)
    return phases << conflict_log2(lane_offs[:pbits], v, elem_bytes, banks, bank_bytes), phases


def swizzle_cost(shared: LinearLayout, reader: LinearLayout, writer: LinearLayout,
                 elem_bytes: int, *, banks: int = 32, bank_bytes: int = 4) -> SwizzleCost:
    """Score ``shared`` for a write by ``writer`` and a read by ``reader``."""
    reader = align_outs(reader, shared, "swizzle_cost")
    writer = align_outs(writer, shared, "swizzle_cost")
    solver = shared_solver(shared)
    cap = _vec_cap_bits(elem_bytes)
    sides = []
    for lay in (reader, writer):
        regs = to_offsets(solver, dim_cols(lay, "register"), "swizzle_cost")
        lanes = to_offsets(solver, dim_cols(lay, "lane"), "swizzle_cost")
        sides.append((leading_units_in_span(regs, cap), lanes))
    v = min(s[0] for s in sides)
    (rw, ideal), (ww, _) = (_side_wavefronts(s[1], v, elem_bytes, banks, bank_bytes)
                            for s in sides)
    return SwizzleCost(1 << v, rw, ww, ideal)


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


def _row_space(lo: list[int], ua: list[int], ub: list[int], d: int, s: int) -> list[int]:
    """The ``s`` Row vectors: C, then G, then the larger side's rest, then shared ones."""
    ua_star, ub_star = lo + ua, lo + ub
    inter = _extend(lo, f2.intersection(ua_star, ub_star))  # I beyond Lo
    i_full = lo + inter
    e = _extend(i_full, ua)
    f = _extend(i_full, ub)
    if len(e) > len(f):
        e, f = f, e
    g = [x ^ y for x, y in zip(e, f)]
    c = f2.complement(ua_star + ub_star, d)
    order = c + g + f[len(e):] + inter + e
    return order[:s]


def _build(vec: list[int], extra: list[int], ua: list[int], ub: list[int], d: int,
           wave_bits: int) -> list[int]:
    """Offset columns ``Vec | extra | Bank | Row`` for one choice of the extra Lo bits."""
    lo = vec + extra
    s = max(0, d - max(wave_bits, len(lo)))
    rows = _row_space(lo, ua, ub, d, s)
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


def optimal_swizzle(reader: LinearLayout, writer: LinearLayout, elem_bytes: int, *,
                    banks: int = 32, bank_bytes: int = 4) -> LinearLayout:
    """A shared layout (``offset`` -> tensor) with maximal common vectorization and then
    minimal read + write bank conflicts for ``writer`` storing and ``reader`` loading.

    Both are distributed layouts (register, lane, warp -> tensor) of the same tensor; the
    result uses ``reader``'s out dims. See the module doc for the construction and why it
    is optimal.
    """
    writer = align_outs(writer, reader, "optimal_swizzle")
    d = reader.total_out_bits
    for name, lay in (("reader", reader), ("writer", writer)):
        if not lay.is_surjective():
            raise LayoutError(
                f"optimal_swizzle: the {name} layout does not cover the whole tensor "
                f"(rank {lay.rank()} < {d}), so shared memory would hold unknown values")
    e = log2_bytes(elem_bytes, "elem_bytes")
    wave_bits = max(0, (banks * bank_bytes).bit_length() - 1 - e)
    word_bits = max(0, log2_bytes(bank_bytes, "bank_bytes") - e)
    vec = _vector_basis(dim_cols(reader, "register"), dim_cols(writer, "register"),
                        _vec_cap_bits(elem_bytes))
    v = len(vec)
    vbytes = (1 << v) * elem_bytes
    sides = []
    for lay in (reader, writer):
        lanes = dim_cols(lay, "lane")
        pbits = phase_lane_bits(len(lanes), vbytes, banks, bank_bytes)
        sides.append([x for x in lanes[:pbits] if x])
    ua, ub = sides
    k = min(max(word_bits, v), d) - v
    best = None
    for extra in _extra_candidates(vec, ua, ub, d, k):
        cols = _build(vec, extra, ua, ub, d, wave_bits)
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
