"""F2 linear layouts: linear maps between labelled bit spaces (Zhou et al., ASPLOS '26).

A ``LinearLayout`` maps named *input* dimensions (hardware indices: register, lane, warp,
or a memory offset) to named *output* dimensions (tile coordinates, or an offset). Every
size is a power of two, so an index is a bit vector, and the map is linear over F2: the
image of an input is the XOR of the *basis vectors* of its set bits (paper §4.2).

Representation (Triton's conventions, so results can be compared with Triton by hand):

* in dims and out dims are ordered; the order is part of the layout's identity;
* the flattened input concatenates the in dims in order, the FIRST in dim in the LOWEST
  bits; likewise the flattened output (the first out dim is the most minor);
* each basis vector is stored as ONE int over the flattened output bits.

All linear algebra (rank, inverses, pseudo-inverses, kernels, complements) goes through
the single elimination routine of :mod:`tegula.layout.f2`.
"""
from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from tegula.layout import f2
from tegula.layout.errors import LayoutError

DimList = Sequence[tuple[str, int]]


def _dim_list(dims: Mapping[str, int] | DimList, what: str) -> tuple[tuple[str, int], ...]:
    """Normalize ``{name: size}`` or ``[(name, size)]`` to ``((name, log2 size), ...)``."""
    items = list(dims.items()) if isinstance(dims, Mapping) else [tuple(d) for d in dims]
    names = [n for n, _ in items]
    if len(set(names)) != len(names):
        raise LayoutError(f"{what} dims {names} repeat a name")
    return tuple((str(n), f2.log2_exact(int(s), f"{what} dim {n!r} size")) for n, s in items)


def _supremum(a: Sequence[str], b: Sequence[str]) -> list[str]:
    """An order containing both name lists that keeps the relative order of each.

    Used by the product, so that dividing it again (which filters the product's order)
    gives back the factor's order. If the two orders contradict each other, ``a``'s order
    wins and ``b``'s new names follow it.
    """
    out, i, j = [], 0, 0
    sa, sb = set(a), set(b)
    while i < len(a) and j < len(b):
        if a[i] == b[j]:
            out.append(a[i])
            i, j = i + 1, j + 1
        elif a[i] not in sb:
            out.append(a[i])
            i += 1
        elif b[j] not in sa:
            out.append(b[j])
            j += 1
        else:
            return list(a) + [n for n in b if n not in sa]
    return out + list(a[i:]) + list(b[j:])


class LinearLayout:
    """A linear map over F2 from labelled input bits to labelled output bits.

    ``bases[in_dim][i]`` is the image of bit ``i`` of ``in_dim`` as a tuple with one int
    per out dim (in ``out_dims`` order). ``out_dims`` gives each out dim's size.
    """

    __slots__ = ("_ins", "_outs", "_bases", "_shift", "_hash")

    def __init__(
        self,
        bases: Mapping[str, Sequence[Sequence[int]]],
        out_dims: Mapping[str, int] | DimList,
    ) -> None:
        outs = _dim_list(out_dims, "out")
        shift, s = {}, 0
        for name, nb in outs:
            shift[name] = s
            s += nb
        packed: dict[str, tuple[int, ...]] = {}
        for name, vecs in bases.items():
            cols = []
            for i, vec in enumerate(vecs):
                vec = tuple(vec)
                if len(vec) != len(outs):
                    raise LayoutError(
                        f"basis {i} of in dim {name!r} is {vec}: expected one int per out dim "
                        f"{[n for n, _ in outs]}")
                col = 0
                for (oname, nb), v in zip(outs, vec):
                    if not 0 <= int(v) < (1 << nb):
                        raise LayoutError(
                            f"basis {i} of in dim {name!r} is {vec}: component {v} does not fit "
                            f"out dim {oname!r} of size {1 << nb}")
                    col |= int(v) << shift[oname]
                cols.append(col)
            packed[str(name)] = tuple(cols)
        self._init(tuple((n, len(c)) for n, c in packed.items()), outs, packed)

    def _init(self, ins, outs, packed) -> None:
        self._ins = tuple(ins)
        self._outs = tuple(outs)
        self._bases = dict(packed)
        self._shift, s = {}, 0
        for name, nb in self._outs:
            self._shift[name] = s
            s += nb
        self._hash = None

    @classmethod
    def from_packed(
        cls, bases: Mapping[str, Sequence[int]], out_dims: Mapping[str, int] | DimList
    ) -> LinearLayout:
        """Build from bases already packed over the flattened output bits."""
        outs = _dim_list(out_dims, "out")
        total = sum(nb for _, nb in outs)
        packed = {str(n): tuple(int(c) for c in cols) for n, cols in bases.items()}
        for n, cols in packed.items():
            for i, c in enumerate(cols):
                if not 0 <= c < (1 << total):
                    raise LayoutError(
                        f"packed basis {i} of in dim {n!r} is {c}: it does not fit the "
                        f"{total} output bits of {[d for d, _ in outs]}")
        obj = cls.__new__(cls)
        obj._init(tuple((n, len(c)) for n, c in packed.items()), outs, packed)
        return obj

    # ---------------------------------------------------------------- constructors

    @staticmethod
    def identity_1d(size: int, in_dim: str, out_dim: str) -> LinearLayout:
        """``in_dim -> out_dim``, the identity on ``log2 size`` bits."""
        n = f2.log2_exact(size, f"identity size for {in_dim!r}")
        return LinearLayout.from_packed({in_dim: [1 << i for i in range(n)]}, [(out_dim, size)])

    @staticmethod
    def zeros_1d(size: int, in_dim: str, out_dim: str, out_size: int = 1) -> LinearLayout:
        """Every index of ``in_dim`` maps to 0: a broadcast over ``size`` elements."""
        n = f2.log2_exact(size, f"zeros size for {in_dim!r}")
        return LinearLayout.from_packed({in_dim: [0] * n}, [(out_dim, out_size)])

    @staticmethod
    def strided_1d(size: int, stride: int, in_dim: str, out_dim: str) -> LinearLayout:
        """``i -> i * stride`` over ``size`` indices (stride a power of two, or 0 for a
        broadcast)."""
        n = f2.log2_exact(size, f"strided size for {in_dim!r}")
        if stride == 0:
            return LinearLayout.zeros_1d(size, in_dim, out_dim)
        f2.log2_exact(stride, f"stride for {in_dim!r}")
        return LinearLayout.from_packed(
            {in_dim: [stride << i for i in range(n)]}, [(out_dim, size * stride)])

    @staticmethod
    def identity(dims: Mapping[str, int] | DimList) -> LinearLayout:
        """The identity on several dims (each in dim maps to the out dim of the same name)."""
        d = _dim_list(dims, "identity")
        bases, s = {}, 0
        for name, nb in d:
            bases[name] = [1 << (s + i) for i in range(nb)]
            s += nb
        return LinearLayout.from_packed(bases, [(n, 1 << nb) for n, nb in d])

    @staticmethod
    def empty() -> LinearLayout:
        """The layout with no dims (the unit of the product)."""
        return LinearLayout.from_packed({}, [])

    @staticmethod
    def from_cute(layout, in_dims=None, out_dims=None) -> LinearLayout:
        """See :func:`tegula.layout.cute_bridge.linear_from_cute`."""
        from tegula.layout.cute_bridge import linear_from_cute

        return linear_from_cute(layout, in_dims=in_dims, out_dims=out_dims)

    def to_cute(self):
        """See :func:`tegula.layout.cute_bridge.linear_to_cute`."""
        from tegula.layout.cute_bridge import linear_to_cute

        return linear_to_cute(self)

    # ---------------------------------------------------------------- shape queries

    @property
    def in_dims(self) -> dict[str, int]:
        return {n: 1 << nb for n, nb in self._ins}

    @property
    def out_dims(self) -> dict[str, int]:
        return {n: 1 << nb for n, nb in self._outs}

    @property
    def in_dim_names(self) -> list[str]:
        return [n for n, _ in self._ins]

    @property
    def out_dim_names(self) -> list[str]:
        return [n for n, _ in self._outs]

    def _in_bits(self, name: str) -> int:
        for n, nb in self._ins:
            if n == name:
                return nb
        raise LayoutError(f"in dim {name!r} is not one of {self.in_dim_names} of {self!r}")

    def _out_bits(self, name: str) -> int:
        for n, nb in self._outs:
            if n == name:
                return nb
        raise LayoutError(f"out dim {name!r} is not one of {self.out_dim_names} of {self!r}")

    def in_dim_bits(self, name: str) -> int:
        return self._in_bits(name)

    def out_dim_bits(self, name: str) -> int:
        return self._out_bits(name)

    def in_dim_size(self, name: str) -> int:
        return 1 << self._in_bits(name)

    def out_dim_size(self, name: str) -> int:
        return 1 << self._out_bits(name)

    @property
    def total_in_bits(self) -> int:
        return sum(nb for _, nb in self._ins)

    @property
    def total_out_bits(self) -> int:
        return sum(nb for _, nb in self._outs)

    @property
    def total_in_size(self) -> int:
        return 1 << self.total_in_bits

    @property
    def total_out_size(self) -> int:
        return 1 << self.total_out_bits

    def in_flat_offset(self, name: str) -> int:
        """Position of bit 0 of ``name`` in the flattened input."""
        s = 0
        for n, nb in self._ins:
            if n == name:
                return s
            s += nb
        raise LayoutError(f"in dim {name!r} is not one of {self.in_dim_names}")

    def out_flat_offset(self, name: str) -> int:
        """Position of bit 0 of ``name`` in the flattened output."""
        self._out_bits(name)
        return self._shift[name]

    # ---------------------------------------------------------------- bases and evaluation

    def unpack_out(self, packed: int) -> tuple[int, ...]:
        """A flattened output split into one int per out dim."""
        return tuple((packed >> self._shift[n]) & ((1 << nb) - 1) for n, nb in self._outs)

    def pack_out(self, values: Mapping[str, int]) -> int:
        """Per-out-dim values (missing ones 0) as a flattened output."""
        y = 0
        for n, v in values.items():
            nb = self._out_bits(n)
            if not 0 <= v < (1 << nb):
                raise LayoutError(f"value {v} out of range for out dim {n!r} of size {1 << nb}")
            y |= v << self._shift[n]
        return y

    def pack_in(self, inputs: Mapping[str, int]) -> int:
        """Per-in-dim indices (missing ones 0) as a flattened input."""
        x = 0
        for n, v in inputs.items():
            nb = self._in_bits(n)
            if not 0 <= v < (1 << nb):
                raise LayoutError(f"index {v} out of range for in dim {n!r} of size {1 << nb}")
            x |= v << self.in_flat_offset(n)
        return x

    def unpack_in(self, x: int) -> dict[str, int]:
        out, s = {}, 0
        for n, nb in self._ins:
            out[n] = (x >> s) & ((1 << nb) - 1)
            s += nb
        return out

    def bases_packed(self, in_dim: str) -> tuple[int, ...]:
        """The basis vectors of ``in_dim`` as flattened-output ints."""
        self._in_bits(in_dim)
        return self._bases[in_dim]

    def basis(self, in_dim: str, i: int) -> tuple[int, ...]:
        """Image of bit ``i`` of ``in_dim``, one int per out dim."""
        cols = self.bases_packed(in_dim)
        if not 0 <= i < len(cols):
            raise LayoutError(f"in dim {in_dim!r} has {len(cols)} bits, no bit {i}")
        return self.unpack_out(cols[i])

    def bases(self) -> dict[str, list[tuple[int, ...]]]:
        """All bases in the constructor's format (``LinearLayout(ll.bases(), ll.out_dims)``)."""
        return {n: [self.unpack_out(c) for c in self._bases[n]] for n, _ in self._ins}

    def matrix(self) -> list[int]:
        """The columns, one packed int per flattened input bit."""
        return [c for n, _ in self._ins for c in self._bases[n]]

    def apply_flat(self, x: int) -> int:
        """Flattened input -> flattened output."""
        if not 0 <= x < self.total_in_size:
            raise LayoutError(f"flat input {x} out of range [0, {self.total_in_size})")
        return f2.mat_vec(self.matrix(), x)

    def apply(self, inputs: Mapping[str, int]) -> dict[str, int]:
        """``{in dim: index}`` -> ``{out dim: coordinate}``: XOR of the bases of set bits.
        In dims left out are taken as 0."""
        y = 0
        for n, v in inputs.items():
            nb = self._in_bits(n)
            if not 0 <= v < (1 << nb):
                raise LayoutError(f"index {v} out of range for in dim {n!r} of size {1 << nb}")
            y ^= f2.mat_vec(self._bases[n], v)
        return dict(zip(self.out_dim_names, self.unpack_out(y)))

    # ---------------------------------------------------------------- algebra

    def _embed_outs(self, col: int, dst: LinearLayout, dst_is_in: bool, why: str) -> int:
        """Move a packed output of ``self`` into ``dst``'s flattened in (or out) space,
        matching dims by name (a dim of ``dst`` may be larger: values sit in its low bits)."""
        y = 0
        for n, nb in self._outs:
            v = (col >> self._shift[n]) & ((1 << nb) - 1)
            if dst_is_in:
                has = n in dst._bases
                dbits = len(dst._bases[n]) if has else 0
                off = dst.in_flat_offset(n) if has else 0
            else:
                has = n in dst._shift
                dbits = dst._out_bits(n) if has else 0
                off = dst._shift[n] if has else 0
            if v >> dbits:
                raise LayoutError(
                    f"{why}: out dim {n!r} of {self!r} (size {1 << nb}) does not fit "
                    f"{'in' if dst_is_in else 'out'} dim of size {1 << dbits} of {dst!r}")
            y |= v << off
        return y

    def compose(self, outer: LinearLayout) -> LinearLayout:
        """``outer ∘ self`` (apply ``self`` first): matrix product ``M_outer · M_self``.

        Each out dim of ``self`` must be an in dim of ``outer`` of at least its size; an in
        dim of ``outer`` that ``self`` does not produce is fed zeros.
        """
        ocols = outer.matrix()
        bases = {}
        for n, _ in self._ins:
            bases[n] = [
                f2.mat_vec(ocols, self._embed_outs(c, outer, True, "compose"))
                for c in self._bases[n]]
        return LinearLayout.from_packed(bases, list(outer.out_dims.items()))

    def __mul__(self, other: LinearLayout) -> LinearLayout:
        """Product (paper Def. 4.3, Triton's ``operator*``): label-wise block diagonal.

        A dim present in both concatenates bits: ``self``'s are the low ones, so an out dim
        in both has size ``size_self * size_other`` and ``other``'s values are shifted up.
        Dim orders are merged keeping each operand's relative order.
        """
        if not isinstance(other, LinearLayout):
            return NotImplemented
        so, oo = dict(self._outs), dict(other._outs)
        out_names = _supremum(self.out_dim_names, other.out_dim_names)
        outs = [(n, so.get(n, 0) + oo.get(n, 0)) for n in out_names]
        shift, s = {}, 0
        for n, nb in outs:
            shift[n] = s
            s += nb

        def move(src: LinearLayout, col: int, up: Mapping[str, int]) -> int:
            y = 0
            for n, nb in src._outs:
                y |= ((col >> src._shift[n]) & ((1 << nb) - 1)) << (shift[n] + up.get(n, 0))
            return y

        in_names = _supremum(self.in_dim_names, other.in_dim_names)
        bases = {}
        for n in in_names:
            lo = [move(self, c, {}) for c in self._bases.get(n, ())]
            hi = [move(other, c, so) for c in other._bases.get(n, ())]
            bases[n] = lo + hi
        return LinearLayout.from_packed(bases, [(n, 1 << nb) for n, nb in outs])

    def rank(self) -> int:
        """Dimension of the image."""
        return f2.rank(self.matrix())

    def is_surjective(self) -> bool:
        return self.rank() == self.total_out_bits

    def is_injective(self) -> bool:
        return self.rank() == self.total_in_bits

    def is_invertible(self) -> bool:
        return self.total_in_bits == self.total_out_bits and self.is_surjective()

    def _solve_columns(
        self, targets: Sequence[int], prefer: Sequence[int | None], why: str
    ) -> list[int]:
        """Solve ``self·x_k = targets[k]`` for every k with the free-variable policy of
        :func:`tegula.layout.f2.min_weight_solution`; LayoutError if one has no solution."""
        e = f2.eliminate(self.matrix())
        out = []
        for k, (t, p) in enumerate(zip(targets, prefer)):
            x = f2.min_weight_solution(e, t, p)
            if x is None:
                raise LayoutError(
                    f"{why}: output {self.unpack_out(t)} (over {self.out_dim_names}) is not in "
                    f"the image of {self!r}")
            out.append(x)
        return out

    @staticmethod
    def _split_flat(cols: Sequence[int], dims: Sequence[tuple[str, int]]) -> dict[str, list[int]]:
        """Cut a flat column list into consecutive runs, one per ``(name, nbits)``."""
        out, k = {}, 0
        for n, nb in dims:
            out[n] = list(cols[k:k + nb])
            k += nb
        return out

    def pseudo_inverse(self) -> LinearLayout:
        """A right inverse ``R`` (``self ∘ R`` is the identity) of a surjective layout.

        Free-variable policy (paper §5.4, "promoting broadcasting"): the image of each out
        bit is a minimal-Hamming-weight solution, ties broken toward the lowest input bits
        (see :func:`tegula.layout.f2.min_weight_solution`). For a distributed layout (columns
        distinct powers of two or zero) this picks the one column that produces the bit and
        never a broadcast copy. ``R`` maps the out dims of ``self`` to its in dims.
        """
        if not self.is_surjective():
            raise LayoutError(
                f"pseudo_inverse needs a surjective layout; {self!r} has rank {self.rank()} "
                f"< {self.total_out_bits} output bits")
        n = self.total_out_bits
        cols = self._solve_columns([1 << j for j in range(n)], [None] * n, "pseudo_inverse")
        return LinearLayout.from_packed(
            self._split_flat(cols, self._outs), list(self.in_dims.items()))

    def invert(self) -> LinearLayout:
        """The inverse of a bijective layout (out dims become in dims)."""
        if not self.is_invertible():
            raise LayoutError(
                f"invert needs a bijective layout; {self!r} maps {self.total_in_bits} bits to "
                f"{self.total_out_bits} bits with rank {self.rank()}")
        return self.pseudo_inverse()

    def invert_and_compose(self, other: LinearLayout) -> LinearLayout:
        """``X = other⁻¹ ∘ self``: the layout with ``other ∘ X == self`` (Triton semantics).

        ``X`` maps ``self``'s in dims to ``other``'s in dims: for a conversion from layout
        ``self`` (A) to layout ``other`` (B) over the same tensor, ``X`` says which
        register/lane/warp of B holds what register/lane/warp of A holds. Out dims are
        matched by name; ``self``'s image must lie in ``other``'s image (else LayoutError).

        Free-variable policy: for bit ``i`` of in dim ``d``, if ``other`` has the same bit
        and it produces the same value, ``X`` maps the bit to itself — so where both
        layouts agree no data moves across that dimension. Otherwise a minimal-weight
        solution is taken (see :meth:`pseudo_inverse`).
        """
        targets, prefer = [], []
        for n, _ in self._ins:
            has = n in other._bases
            for i, c in enumerate(self._bases[n]):
                targets.append(self._embed_outs(c, other, False, "invert_and_compose"))
                prefer.append(1 << (other.in_flat_offset(n) + i)
                              if has and i < len(other._bases[n]) else None)
        cols = other._solve_columns(targets, prefer, f"invert_and_compose of {self!r}")
        return LinearLayout.from_packed(
            self._split_flat(cols, self._ins), list(other.in_dims.items()))

    def divide_left(self, divisor: LinearLayout) -> LinearLayout | None:
        """The ``C`` with ``divisor * C == self``, or None (paper Def. 4.4 and §5.3).

        Label-wise: the first bits of each in dim of ``self`` must be exactly ``divisor``'s
        bases (landing in the low bits of each out dim), and the remaining bases must leave
        those low bits zero; ``C`` gets the remaining bases with the low bits dropped.
        As in Triton, ``C`` has exactly ``self``'s in and out dims, in ``self``'s order
        (size 1 where ``divisor`` takes the whole dim), which makes it unique. None also
        when ``divisor`` has a dim ``self`` lacks or orders its dims differently.
        """
        return self._divide(divisor, divisor_is_low=True)

    def divide_right(self, divisor: LinearLayout) -> LinearLayout | None:
        """The ``C`` with ``C * divisor == self``, or None (Triton's ``divideRight``).

        The mirror of :meth:`divide_left`: ``divisor`` must be the LAST bits of each in dim
        of ``self`` and land in the HIGH bits of each out dim, and the first bits must leave
        those high bits zero. ``C`` has exactly ``self``'s in and out dims.
        """
        return self._divide(divisor, divisor_is_low=False)

    def _divide(self, divisor: LinearLayout, divisor_is_low: bool) -> LinearLayout | None:
        """Shared body of the two divisions: read the candidate ``C`` off ``self`` (the
        in dim bits and out dim bits that ``divisor`` does not take), then accept it only
        if multiplying back gives ``self`` exactly, which checks every condition at once."""
        in_b, out_b = dict(divisor._ins), dict(divisor._outs)
        if any(n not in self._bases for n in in_b) or any(n not in self._shift for n in out_b):
            return None
        if any(self._in_bits(n) < nb for n, nb in in_b.items()) or \
                any(self._out_bits(n) < nb for n, nb in out_b.items()):
            return None
        outs = [(n, nb - out_b.get(n, 0)) for n, nb in self._outs]
        shift, s = {}, 0
        for n, nb in outs:
            shift[n] = s
            s += nb

        def keep_c_part(col: int) -> int:
            y = 0
            for n, nb in outs:
                skip = out_b.get(n, 0) if divisor_is_low else 0  # C's bits sit above B's
                y |= ((col >> (self._shift[n] + skip)) & ((1 << nb) - 1)) << shift[n]
            return y

        bases = {}
        for n, nb in self._ins:
            cols = self._bases[n]
            k = in_b.get(n, 0)
            mine = cols[k:] if divisor_is_low else cols[:nb - k]
            bases[n] = [keep_c_part(c) for c in mine]
        c = LinearLayout.from_packed(bases, [(n, 1 << nb) for n, nb in outs])
        product = divisor * c if divisor_is_low else c * divisor
        return c if product == self else None

    def quotient(self, dims: Iterable[str]) -> LinearLayout | None:
        """The layout on the other dims when ``self`` is the identity on ``dims``, else None.

        Triton's ``quotient``: each name in ``dims`` must be both an in dim and an out dim
        of the same size, ``self`` must map it to itself bit for bit, map it to nothing
        else, and map no other in dim into it. Then ``self`` is
        ``identity(dims) x rest`` and the result is ``rest`` (the sublayout without
        ``dims``). A name that is not a dim of ``self`` gives None.
        """
        dims = list(dims)
        chosen = set(dims)
        for n in dims:
            if n not in self._bases or n not in self._shift or \
                    self._in_bits(n) != self._out_bits(n):
                return None
        for n, _ in self._ins:
            for i, col in enumerate(self._bases[n]):
                inside = sum(((col >> self._shift[o]) & ((1 << nb) - 1)) << self._shift[o]
                             for o, nb in self._outs if o in chosen)
                if n in chosen:
                    if col != 1 << (self._shift[n] + i):  # itself, and nothing outside
                        return None
                elif inside:
                    return None
        return self.sublayout([n for n, _ in self._ins if n not in chosen],
                              [n for n, _ in self._outs if n not in chosen])

    # ---------------------------------------------------------------- restructuring

    def sublayout(self, in_dims: Iterable[str], out_dims: Iterable[str]) -> LinearLayout:
        """Restrict to some in dims and project onto some out dims (kept in self's order)."""
        keep_in, keep_out = set(in_dims), set(out_dims)
        for n in keep_in:
            self._in_bits(n)
        for n in keep_out:
            self._out_bits(n)
        outs = [(n, nb) for n, nb in self._outs if n in keep_out]
        shift, s = {}, 0
        for n, nb in outs:
            shift[n] = s
            s += nb

        def project(c: int) -> int:
            return sum(((c >> self._shift[n]) & ((1 << nb) - 1)) << shift[n] for n, nb in outs)

        bases = {n: [project(c) for c in self._bases[n]] for n, _ in self._ins if n in keep_in}
        return LinearLayout.from_packed(bases, [(n, 1 << nb) for n, nb in outs])

    def reshape_ins(self, new_in_dims: DimList) -> LinearLayout:
        """Re-split the flattened input into new dims (same total size)."""
        dims = _dim_list(new_in_dims, "in")
        if sum(nb for _, nb in dims) != self.total_in_bits:
            raise LayoutError(
                f"reshape_ins to {list(new_in_dims)}: total size must stay {self.total_in_size}")
        return LinearLayout.from_packed(
            self._split_flat(self.matrix(), dims), list(self.out_dims.items()))

    def reshape_outs(self, new_out_dims: DimList) -> LinearLayout:
        """Re-split the flattened output into new dims (same total size); bases unchanged."""
        dims = _dim_list(new_out_dims, "out")
        if sum(nb for _, nb in dims) != self.total_out_bits:
            raise LayoutError(
                f"reshape_outs to {list(new_out_dims)}: total size must stay {self.total_out_size}")
        return LinearLayout.from_packed(
            {n: self._bases[n] for n, _ in self._ins}, [(n, 1 << nb) for n, nb in dims])

    def transpose_ins(self, order: Sequence[str]) -> LinearLayout:
        """Reorder the in dims (a permutation of their names)."""
        if sorted(order) != sorted(self.in_dim_names):
            raise LayoutError(f"transpose_ins order {list(order)} is not a permutation of "
                              f"{self.in_dim_names}")
        return LinearLayout.from_packed(
            {n: self._bases[n] for n in order}, list(self.out_dims.items()))

    def transpose_outs(self, order: Sequence[str]) -> LinearLayout:
        """Reorder the out dims (a permutation of their names); bases are repacked."""
        if sorted(order) != sorted(self.out_dim_names):
            raise LayoutError(f"transpose_outs order {list(order)} is not a permutation of "
                              f"{self.out_dim_names}")
        outs = dict(self._outs)
        target = LinearLayout.from_packed({}, [(n, 1 << outs[n]) for n in order])
        bases = {n: [self._embed_outs(c, target, False, "transpose_outs") for c in self._bases[n]]
                 for n, _ in self._ins}
        return LinearLayout.from_packed(bases, list(target.out_dims.items()))

    def flatten_ins(self, name: str | None = None) -> LinearLayout:
        """All in dims as one (named ``name``, default the first in dim's name).

        A layout without in dims is returned unchanged: there is nothing to flatten, and
        inventing a dim would change which inputs it takes (Triton does the same).
        """
        if not self._ins:
            return self
        return self.reshape_ins([(name or self.in_dim_names[0], self.total_in_size)])

    def flatten_outs(self, name: str | None = None) -> LinearLayout:
        """All out dims as one (named ``name``, default the first out dim's name).

        A layout without out dims is returned unchanged (see :meth:`flatten_ins`).
        """
        if not self._outs:
            return self
        return self.reshape_outs([(name or self.out_dim_names[0], self.total_out_size)])

    def remove_zero_bases(self, in_dim: str) -> LinearLayout:
        """Drop the broadcast bits of ``in_dim`` (the in dim shrinks)."""
        bases = {n: ([c for c in self._bases[n] if c] if n == in_dim else self._bases[n])
                 for n, _ in self._ins}
        self._in_bits(in_dim)
        return LinearLayout.from_packed(bases, list(self.out_dims.items()))

    # ---------------------------------------------------------------- properties (§5.1)

    def zero_bases(self, in_dim: str) -> list[int]:
        """Indices of the zero basis vectors of ``in_dim``: its broadcast bits (§5.1)."""
        return [i for i, c in enumerate(self.bases_packed(in_dim)) if c == 0]

    def free_variable_masks(self) -> dict[str, int]:
        """Per in dim, a mask of its bits whose basis is an XOR of earlier bases (in the
        flattened order): those bits add nothing new, so they are free in ``self·x = y``."""
        e = f2.eliminate(self.matrix())
        indep = set(e.independent)
        out, k = {}, 0
        for n, nb in self._ins:
            out[n] = sum(1 << i for i in range(nb) if (k + i) not in indep)
            k += nb
        return out

    def num_consecutive(self, in_dim: str) -> int:
        """Contiguity (§5.1, Triton's ``getNumConsecutiveInOut``): the largest ``2^k``
        such that EVERY aligned run of ``2^k`` consecutive indices of ``in_dim`` (whatever
        the other inputs) lands on ``2^k`` consecutive flattened outputs, in order. That is
        what a vector access of ``2^k`` elements needs. 1 means no vectorization.

        Bits ``0..k-1`` of ``in_dim`` must map to flattened outputs ``1, 2, 4, ...``, and
        every other basis (higher bits of ``in_dim``, all bits of the other in dims) must
        leave output bits ``0..k-1`` alone: ``L(x + j) = L(x) XOR j`` equals
        ``L(x) + j`` only when ``L(x)`` has those bits clear.

        "Consecutive" is along the flattened output with the FIRST out dim most minor
        (Triton only looks at the first out dim); :meth:`transpose_outs` first if the
        contiguous tensor dim is another one.
        """
        cols = self.bases_packed(in_dim)
        k = 0
        while k < len(cols) and cols[k] == 1 << k:
            k += 1
        others = 0
        for n, _ in self._ins:
            for i, c in enumerate(self._bases[n]):
                if n != in_dim or i >= k:
                    others |= c
        while k and others & ((1 << k) - 1):
            k -= 1
        return 1 << k

    def is_distributed(self) -> bool:
        """Paper Def. 4.10: surjective, every column has at most one set bit, and no two
        nonzero columns repeat (a permutation matrix with zero columns interleaved)."""
        nonzero = [c for c in self.matrix() if c]
        return (all(f2.is_pow2(c) for c in nonzero) and len(set(nonzero)) == len(nonzero)
                and self.is_surjective())

    def is_memory_layout(self) -> bool:
        """Paper Def. 4.14: invertible, and every column has one or two set bits."""
        return self.is_invertible() and all(1 <= f2.popcount(c) <= 2 for c in self.matrix())

    def is_identity(self) -> bool:
        """Whether in dims equal out dims (names, sizes, order) and every bit maps to itself."""
        return list(self._ins) == list(self._outs) and self.matrix() == [
            1 << k for k in range(self.total_in_bits)]

    def nullspace(self) -> list[int]:
        """A basis of the kernel, as flattened inputs (``apply_flat(v) == 0``)."""
        return f2.nullspace(self.matrix())

    def image_basis(self) -> list[int]:
        """A basis of the image (flattened outputs), chosen among the columns."""
        return f2.span_basis(self.matrix())

    def image_complement(self) -> list[int]:
        """Unit flattened outputs completing the image to the whole output space."""
        return f2.complement(self.matrix(), self.total_out_bits)

    # ---------------------------------------------------------------- dunder

    def _key(self):
        return (self._ins, self._outs, tuple(self._bases[n] for n, _ in self._ins))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, LinearLayout):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        if self._hash is None:
            self._hash = hash(self._key())
        return self._hash

    def __repr__(self) -> str:
        return f"LinearLayout({self.bases()!r}, {list(self.out_dims.items())!r})"

    def __str__(self) -> str:
        if not self._ins and not self._outs:
            return "LinearLayout(empty)"
        lines = []
        for n, nb in self._ins:
            if nb == 0:
                lines.append(f" - {n} (size 1)")
            for i, c in enumerate(self._bases[n]):
                head = " - " if i == 0 else "   "
                lines.append(f"{head}{n}={1 << i} -> {self.unpack_out(c)}")
        outs = ", ".join(f"{n} (size {1 << nb})" for n, nb in self._outs)
        lines.append(f"where out dims are: [{outs}]")
        return "\n".join(lines)
