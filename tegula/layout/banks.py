"""Shared-memory bank conflicts of a distributed layout against a shared layout (F2).

The question: a warp stores (or loads) its registers of a distributed layout ``D``
(register, lane, warp -> tensor coordinate) to (from) shared memory laid out by ``S``
(offset -> tensor coordinate, bijective). How many shared-memory *wavefronts* does one
access instruction take, and how many would it take at best?

Hardware model (NVIDIA since Volta; documented because the oracle in the tests and this
module must agree on it):

* shared memory has ``banks`` banks of ``bank_bytes`` bytes (32 x 4 B); a *word* is a
  ``bank_bytes``-aligned chunk, its bank is ``word % banks``; a wavefront serves at most
  one word per bank, i.e. ``banks * bank_bytes`` = 128 bytes;
* one instruction moves ``V = vec_elems * elem_bytes`` contiguous, aligned bytes per lane
  (a vector of consecutive offsets, packed from registers);
* the warp is split into *phases* of ``min(lanes, 128 / V)`` consecutive lanes (all 32
  lanes for ``V <= 4``, half-warps for 8 B, quarter-warps for 16 B) that are served one
  after the other;
* within a phase, lanes reading the same word are served together (broadcast; for stores
  the same word is merged), so a phase costs ``max over banks of #distinct words`` of
  that bank it touches; the instruction costs the sum over its phases.

F2 structure (paper §9.2, Lemma 9.4). With ``T = S⁻¹ ∘ D`` (register/lane -> offset),
a vector is a coset of the offset bits ``0..v-1`` (which must lie in ``span(T_reg)``), so
the byte addresses of one phase of one instruction form an affine subspace
``c + Q`` with ``Q = span(byte bits < v + log2 elem_bytes) + span(T(lane_j) << log2
elem_bytes for the phase's lane bits)``. Projecting to words (dropping the
``log2 bank_bytes`` low byte bits) is linear, the words of one bank are a coset of the
"row" subspace ``R`` (word bits ``>= log2 banks``), hence every touched bank sees exactly
``2^c`` distinct words with ``c = dim(π(Q) ∩ R)`` — the same for every bank, phase and
instruction (they are translates). So

    wavefronts per instruction = phases * 2^c,   ideal = phases = ceil(lanes * V / 128).

Limitations of the model: broadcasts *across* phases (every lane reading the same 16 B)
are not merged, and the ``V < 4`` sub-word case counts words, not the bytes of a word.
"""
from __future__ import annotations

from dataclasses import dataclass

from tegula.layout import f2
from tegula.layout.errors import LayoutError
from tegula.layout.linear import LinearLayout

#: The largest vector one shared-memory instruction moves per lane (ld/st.shared.v4.b32).
MAX_VECTOR_BYTES = 16


# ----------------------------------------------------------------------------------------
# Helpers shared with optimal_swizzle.py and conversion.py (same owner).


def log2_bytes(n: int, what: str) -> int:
    """log2 of a byte count that must be a power of two."""
    if not isinstance(n, int) or not f2.is_pow2(n):
        raise LayoutError(f"{what} must be a power of two number of bytes, got {n!r}")
    return n.bit_length() - 1


def log2_elem_bits(elem_bytes: float, what: str = "elem_bytes") -> int:
    """log2 of an element's size in BITS; sub-byte types are given as a fraction of a
    byte (0.5 for 4-bit data, 0.25 for 2-bit), so ``elem_bytes * 8`` must be a power of
    two number of bits."""
    bits = elem_bytes * 8 if isinstance(elem_bytes, (int, float)) else None
    if isinstance(elem_bytes, bool) or bits is None or bits != int(bits) or \
            not f2.is_pow2(int(bits)):
        raise LayoutError(f"{what} must be a power of two number of bytes (a fraction such "
                          f"as 0.5 for sub-byte types), got {elem_bytes!r}")
    return int(bits).bit_length() - 1


def dim_cols(layout: LinearLayout, name: str) -> list[int]:
    """Packed basis vectors of in dim ``name`` (an absent dim is a size-1 dim: no bits)."""
    return list(layout.bases_packed(name)) if name in layout.in_dims else []


def align_outs(layout: LinearLayout, ref: LinearLayout, what: str) -> LinearLayout:
    """``layout`` with its out dims in ``ref``'s order, so packed vectors are comparable.

    Both must describe the same tensor: same out dim names and sizes.
    """
    if layout.out_dims != ref.out_dims:
        raise LayoutError(
            f"{what}: tensor shapes differ: out dims {layout.out_dims} vs {ref.out_dims}")
    if layout.out_dim_names != ref.out_dim_names:
        layout = layout.transpose_outs(ref.out_dim_names)
    return layout


def shared_solver(shared: LinearLayout) -> f2.Elimination:
    """Elimination of a shared layout's columns: ``solve(t)`` is the offset of tensor ``t``.

    The shared layout must be a bijection offset -> tensor (one in dim, any name).
    """
    if len(shared.in_dims) != 1:
        raise LayoutError(
            f"a shared layout has one in dim (the offset); got {shared.in_dim_names}")
    if not shared.is_invertible():
        raise LayoutError(
            f"a shared layout must be a bijection offset -> tensor; {shared!r} is not")
    return f2.eliminate(shared.matrix())


def to_offsets(solver: f2.Elimination, cols: list[int], what: str) -> list[int]:
    """Tensor vectors -> shared offsets (``S⁻¹`` applied to each)."""
    out = []
    for c in cols:
        o = solver.solve(c)
        if o is None:  # cannot happen for a bijective S; kept as a clear error
            raise LayoutError(f"{what}: tensor vector {c} has no shared offset")
        out.append(o)
    return out


def leading_units_in_span(cols: list[int], limit: int) -> int:
    """Largest ``k <= limit`` with unit vectors ``1, 2, .., 1 << (k-1)`` all in span(cols).

    Offsets ``0..2^k-1`` are then held by registers of one thread (some register
    permutation packs them into one vector, paper §5.3 "generalized vectorization").
    """
    e = f2.eliminate(cols)
    k = 0
    while k < limit and e.solve(1 << k) is not None:
        k += 1
    return k


# ----------------------------------------------------------------------------------------
# The wavefront count.


@dataclass(frozen=True)
class Instruction:
    """One vector access of one thread: the registers packed (slot j holds offset
    ``base + j``) and the wavefronts the warp needs for it."""

    registers: tuple[int, ...]
    base_offset: int
    wavefronts: int


@dataclass(frozen=True)
class BankReport:
    """Per-instruction bank behaviour of a distributed <-> shared access.

    ``instructions`` lists every access of one thread (for warp 0; other warps access
    translates of the same pattern). All instructions cost ``wavefronts`` (linearity).
    ``aligned`` is False when some lane or warp offset has a bit below the vector width:
    those threads then see their vector's slots XOR-permuted (same aligned block, so the
    wavefront count is unchanged, but codegen needs register selects to pack it).
    """

    elem_bytes: int
    vec_elems: int
    phases: int
    wavefronts: int
    ideal_wavefronts: int
    instructions: tuple[Instruction, ...]
    aligned: bool = True

    @property
    def vec_bytes(self) -> int:
        return self.vec_elems * self.elem_bytes

    @property
    def conflict_factor(self) -> int:
        """Wavefronts over the ideal: 1 means conflict-free (an n-way conflict gives n)."""
        return self.wavefronts // self.ideal_wavefronts

    @property
    def total_wavefronts(self) -> int:
        """Wavefronts of all of one warp's instructions."""
        return self.wavefronts * len(self.instructions)


def phase_lane_bits(lane_bits: int, vec_bytes: float, banks: int, bank_bytes: int) -> int:
    """Lane bits of one phase: ``min(lanes, banks*bank_bytes / V)`` consecutive lanes.

    ``vec_bytes`` may be a fraction of a byte (a sub-byte vector)."""
    wave_bits = banks * bank_bytes * 8
    vec_bits = int(vec_bytes * 8)
    if vec_bits >= wave_bits:
        return 0
    return min(lane_bits, (wave_bits // vec_bits).bit_length() - 1)


def conflict_log2(lane_offsets: list[int], vec_bits: int, elem_bytes: float, banks: int,
                  bank_bytes: int) -> int:
    """``c = dim(π(Q) ∩ R)``: log2 of the distinct words per touched bank in one phase.

    ``lane_offsets`` are the offsets ``T(lane_j)`` of the phase's lane bits. Addresses are
    taken in bits, so sub-byte elements (``elem_bytes`` 0.5, ...) work the same way: a
    vector narrower than a word still occupies its word's bank.
    """
    e = log2_elem_bits(elem_bytes)
    wb = log2_bytes(bank_bytes, "bank_bytes") + 3
    bb = log2_bytes(banks, "banks")
    q = [1 << i for i in range(vec_bits + e)] + [o << e for o in lane_offsets]
    words = f2.span_basis(v >> wb for v in q if v >> wb)
    low = (1 << bb) - 1
    # π(Q) ∩ R = kernel of "keep the bank bits" on π(Q): dim π(Q) - rank(bank bits).
    return len(words) - f2.rank(w & low for w in words)


def _vector_slots(t_reg: list[int], vec_bits: int) -> list[tuple[int, tuple[int, ...]]]:
    """Group registers into vectors: ``(base offset, registers for slots 0..2^v-1)``.

    Broadcast registers (holding an offset another register already holds) are skipped:
    the value is stored once. Enumerates registers, which are few per thread.
    """
    seen: dict[int, int] = {}
    for r in range(1 << len(t_reg)):
        seen.setdefault(f2.mat_vec(t_reg, r), r)
    groups: dict[int, list[int]] = {}
    mask = (1 << vec_bits) - 1
    for off, r in sorted(seen.items()):
        groups.setdefault(off & ~mask, [-1] * (1 << vec_bits))[off & mask] = r
    return [(base, tuple(regs)) for base, regs in sorted(groups.items())]


def vector_cap_bits(elem_bytes: float) -> int:
    """Offset bits of the widest vector (16 bytes) of elements of ``elem_bytes`` bytes
    (a fraction for sub-byte types)."""
    return max(0, (MAX_VECTOR_BYTES * 8).bit_length() - 1 - log2_elem_bits(elem_bytes))


def bank_report(shared: LinearLayout, distributed: LinearLayout, elem_bytes: float, *,
                vec_elems: int | None = None, banks: int = 32,
                bank_bytes: int = 4) -> BankReport:
    """The full per-instruction breakdown of :func:`bank_conflicts` (see module doc).

    ``elem_bytes`` may be a fraction of a byte for sub-byte types (0.5 for 4-bit)."""
    cap = vector_cap_bits(elem_bytes)
    distributed = align_outs(distributed, shared, "bank_conflicts")
    solver = shared_solver(shared)
    t_reg = to_offsets(solver, dim_cols(distributed, "register"), "bank_conflicts")
    t_lane = to_offsets(solver, dim_cols(distributed, "lane"), "bank_conflicts")
    best = leading_units_in_span(t_reg, cap)
    if vec_elems is None:
        v = best
    else:
        if not isinstance(vec_elems, int) or not f2.is_pow2(vec_elems):
            raise LayoutError(f"vec_elems must be a power of two, got {vec_elems!r}")
        v = vec_elems.bit_length() - 1
        if v > leading_units_in_span(t_reg, len(t_reg)):
            raise LayoutError(
                f"vec_elems={vec_elems}: offsets 0..{vec_elems - 1} are not all held by the "
                f"registers of one thread (largest vector is {1 << best})")
    vbytes = (1 << v) * elem_bytes
    lane_bits = len(t_lane)
    pbits = phase_lane_bits(lane_bits, vbytes, banks, bank_bytes)
    phases = 1 << (lane_bits - pbits)
    c = conflict_log2(t_lane[:pbits], v, elem_bytes, banks, bank_bytes)
    wf = phases << c
    instrs = tuple(Instruction(regs, base, wf) for base, regs in _vector_slots(t_reg, v))
    # Lane/warp offsets with vector bits set permute the slots of their vector (see doc).
    t_warp = to_offsets(solver, dim_cols(distributed, "warp"), "bank_conflicts")
    aligned = all(o & ((1 << v) - 1) == 0 for o in t_lane + t_warp)
    return BankReport(elem_bytes, 1 << v, phases, wf, phases, instrs, aligned)


def bank_conflicts(shared: LinearLayout, distributed: LinearLayout, elem_bytes: float, *,
                   vec_elems: int | None = None, banks: int = 32, bank_bytes: int = 4) -> int:
    """Wavefronts one warp needs per shared-memory access instruction (paper §9.2).

    ``vec_elems`` defaults to the largest vector the two layouts allow: offsets
    ``0..2^k-1`` all held by one thread's registers, capped at 16 bytes.
    """
    return bank_report(shared, distributed, elem_bytes, vec_elems=vec_elems, banks=banks,
                       bank_bytes=bank_bytes).wavefronts
