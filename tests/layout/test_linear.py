"""LinearLayout: algebraic laws (property-based) and the worked examples of the paper."""
from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from tegula.layout import LayoutError, LinearLayout as LL
from tegula.layout import f2

IN_POOL = ["register", "lane", "warp", "block"]
OUT_POOL = ["dim0", "dim1", "dim2"]
FAST = settings(max_examples=30, deadline=None)


@st.composite
def dims(draw, pool, min_bits=0, max_bits=3, min_dims=0):
    names = draw(st.lists(st.sampled_from(pool), unique=True, min_size=min_dims))
    names.sort(key=pool.index)  # one global order keeps products associative
    return [(n, 1 << draw(st.integers(min_bits, max_bits))) for n in names]


@st.composite
def layouts(draw, ins=None, outs=None, min_bits=0):
    ins = draw(dims(IN_POOL, min_bits)) if ins is None else ins
    outs = draw(dims(OUT_POOL, min_bits)) if outs is None else outs
    total = sum(s.bit_length() - 1 for _, s in outs)
    bases = {n: draw(st.lists(st.integers(0, (1 << total) - 1), min_size=s.bit_length() - 1,
                              max_size=s.bit_length() - 1)) for n, s in ins}
    return LL.from_packed(bases, outs)


@st.composite
def surjective_layouts(draw, outs=None):
    """A random layout whose last in dim is extended by the complement of its image."""
    ll = draw(layouts(outs=outs))
    extra = ll.image_complement()
    bases = {n: list(ll.bases_packed(n)) for n in ll.in_dim_names}
    name = ll.in_dim_names[-1] if bases else "register"
    bases[name] = bases.get(name, []) + extra
    return LL.from_packed(bases, list(ll.out_dims.items()))


@st.composite
def bijective_layouts(draw):
    ins = draw(dims(IN_POOL, 0, 3, min_dims=1))
    total = sum(s.bit_length() - 1 for _, s in ins)
    cols = [1 << i for i in range(total)]
    for _ in range(draw(st.integers(0, 12))) if total > 1 else ():
        i, j = draw(st.integers(0, total - 1)), draw(st.integers(0, total - 1))
        if i != j:
            cols[i] ^= cols[j]
    cols = draw(st.permutations(cols))
    outs = draw(dims(OUT_POOL, 0, 3))
    out_bits = sum(s.bit_length() - 1 for _, s in outs)
    outs = outs + ([("dim3", 1 << (total - out_bits))] if total > out_bits else [])
    ll = LL.from_packed({"flat": cols}, [("dim3", 1 << total)]).reshape_ins(ins)
    if out_bits > total:
        return ll
    return ll.reshape_outs(outs)


def brute_apply(ll: LL, inputs: dict[str, int]) -> dict[str, int]:
    """Row-by-row matrix-vector product: bit r of the output is the parity of row r · x."""
    x = ll.pack_in(inputs)
    cols = ll.matrix()
    y = 0
    for r in range(ll.total_out_bits):
        parity = sum(((c >> r) & 1) * ((x >> k) & 1) for k, c in enumerate(cols)) % 2
        y |= parity << r
    return dict(zip(ll.out_dim_names, ll.unpack_out(y)))


# ------------------------------------------------------------------------- properties


@FAST
@given(layouts(), st.data())
def test_apply_matches_matrix_product(ll, data):
    x = data.draw(st.integers(0, ll.total_in_size - 1))
    inputs = ll.unpack_in(x)
    assert ll.apply(inputs) == brute_apply(ll, inputs)
    assert ll.pack_out(ll.apply(inputs)) == ll.apply_flat(x)
    assert LL(ll.bases(), ll.out_dims) == ll
    assert eval(repr(ll), {"LinearLayout": LL}) == ll


@FAST
@given(layouts(), layouts(), layouts())
def test_product_associative_and_divisible(a, b, c):
    assert same_up_to_dim_order((a * b) * c, a * (b * c))
    assert a * LL.empty() == a == LL.empty() * a
    for ll in (a * b, b * c):
        for x in range(min(ll.total_in_size, 16)):
            assert ll.apply_flat(x) == brute_apply_flat(ll, x)


def same_up_to_dim_order(x: LL, y: LL) -> bool:
    """Products keep each factor's dim order but may merge orders differently."""
    if sorted(x.in_dim_names) != sorted(y.in_dim_names) or \
            sorted(x.out_dim_names) != sorted(y.out_dim_names):
        return False
    return x == y.transpose_ins(x.in_dim_names).transpose_outs(x.out_dim_names)


def brute_apply_flat(ll, x):
    return ll.pack_out(brute_apply(ll, ll.unpack_in(x)))


@FAST
@given(layouts(), st.data())
def test_divide_left_and_right_undo_product(b, data):
    c = data.draw(layouts(min_bits=1))
    a = b * c
    left, right = a.divide_left(b), a.divide_right(c)
    assert left is not None and right is not None
    assert b * left == a and right * c == a  # the defining rules, dim order included
    # the quotient has exactly a's dims (Triton's rule); size 1 where the divisor took all
    for q in (left, right):
        assert q.in_dim_names == a.in_dim_names and q.out_dim_names == a.out_dim_names
    assert left.matrix() == c.matrix() and right.matrix() == b.matrix()


def test_divide_left_keeps_size_one_dims_in_order():
    # regression: C lost the size-1 "lane" dim's place, so divisor * C != self
    a = LL.from_packed({"lane": [], "register": [1, 2, 4]}, [("offset", 8)])
    b = LL.identity_1d(8, "register", "offset")
    c = a.divide_left(b)
    assert c is not None and b * c == a
    assert c.in_dims == {"lane": 1, "register": 1} and c.out_dims == {"offset": 1}
    assert a.divide_right(b) == c and c * b == a
    # a divisor whose dims are ordered against self's cannot divide it
    swapped = LL.from_packed({"x": [1], "y": [2]}, [("o", 4)])
    assert swapped.divide_left(LL.from_packed({"y": [], "x": []}, [("o", 1)])) is None


def test_divide_right_refuses():
    t = LL.identity_1d(4, "register", "offset")
    ll = LL.from_packed({"register": [1, 2, 4]}, [("offset", 8)])
    assert ll.divide_right(LL.identity_1d(2, "register", "offset")) == \
        LL.from_packed({"register": [1, 2]}, [("offset", 4)])
    # the low bases may not touch the divisor's (high) output bits
    assert LL.from_packed({"register": [4, 1, 2]}, [("offset", 8)]).divide_right(
        LL.identity_1d(2, "register", "offset")) is None
    assert LL.identity_1d(2, "register", "offset").divide_right(t) is None
    assert ll.divide_right(LL.identity_1d(2, "lane", "offset")) is None


def test_divide_left_refuses():
    t = LL.identity_1d(4, "register", "offset")
    assert LL.strided_1d(8, 2, "register", "offset").divide_left(t) is None
    assert LL.identity_1d(2, "register", "offset").divide_left(t) is None
    # high bases may not touch the divisor's output bits
    ll = LL.from_packed({"register": [1, 2, 5]}, [("offset", 8)])
    assert ll.divide_left(t) is None
    assert LL.from_packed({"register": [1, 2, 4]}, [("offset", 8)]).divide_left(t) == \
        LL.from_packed({"register": [1]}, [("offset", 2)])


@FAST
@given(bijective_layouts())
def test_invert_round_trip(ll):
    inv = ll.invert()
    assert ll.compose(inv).is_identity()
    assert inv.compose(ll).is_identity()
    assert inv.invert() == ll
    assert ll.is_invertible() and ll.is_injective() and ll.is_surjective()


@FAST
@given(surjective_layouts())
def test_pseudo_inverse_is_right_inverse(ll):
    r = ll.pseudo_inverse()
    assert r.compose(ll).is_identity()
    # minimal weight: each out bit is produced by a lightest possible input combination
    e = f2.eliminate(ll.matrix())
    for j, x in enumerate(r.matrix()):
        assert x == f2.min_weight_solution(e, 1 << j)


@FAST
@given(st.data())
def test_compose_associative(data):
    x, y, z, w = (data.draw(dims(OUT_POOL)) for _ in range(4))
    rename = lambda ds, p: [(p + n, s) for n, s in ds]  # noqa: E731
    a = data.draw(layouts(ins=rename(x, "x"), outs=rename(y, "y")))
    b = data.draw(layouts(ins=rename(y, "y"), outs=rename(z, "z")))
    c = data.draw(layouts(ins=rename(z, "z"), outs=rename(w, "w")))
    assert a.compose(b).compose(c) == a.compose(b.compose(c))
    for v in range(min(a.total_in_size, 8)):
        assert a.compose(b).apply_flat(v) == b.apply_flat(a.apply_flat(v))


@FAST
@given(st.data())
def test_invert_and_compose(data):
    other = data.draw(surjective_layouts())
    mine = data.draw(layouts(outs=list(other.out_dims.items())))
    x = mine.invert_and_compose(other)
    assert x.compose(other) == mine
    assert list(x.out_dims.items()) == list(other.in_dims.items())
    # where the two layouts agree, nothing moves: the conversion is the identity there
    shared = [n for n in mine.in_dim_names if n in other.in_dims
              and mine.bases_packed(n) == other.bases_packed(n)]
    for n in shared:
        assert x.sublayout([n], [n]) == LL.identity_1d(mine.in_dim_size(n), n, n)
    assert other.invert_and_compose(other).compose(other) == other


def test_invert_and_compose_prefers_no_movement():
    # Both layouts broadcast the same element over lanes; agreeing dims map to themselves.
    a = LL({"register": [(1,), (2,)], "lane": [(0,), (4,)]}, [("dim0", 8)])
    b = LL({"register": [(1,), (2,)], "lane": [(4,), (0,)]}, [("dim0", 8)])
    x = a.invert_and_compose(b)
    assert x.basis("register", 0) == (1, 0) and x.basis("register", 1) == (2, 0)
    assert x.basis("lane", 0) == (0, 0)  # broadcast stays a broadcast (weight 0)
    assert x.basis("lane", 1) == (0, 1)
    with pytest.raises(LayoutError):
        LL.identity_1d(8, "register", "dim0").invert_and_compose(b.sublayout(["lane"], ["dim0"]))


def brute_consecutive(ll: LL, name: str) -> int:
    """Largest 2^k such that every aligned run of 2^k indices of ``name`` (any other
    inputs) lands on 2^k consecutive flattened outputs, found by evaluating every input."""
    offset = ll.in_flat_offset(name)
    size = ll.in_dim_size(name)
    best = 1
    for k in range(1, size.bit_length()):
        run = 1 << k
        ok = True
        for x in range(ll.total_in_size):
            if (x >> offset) % run == 0:
                start = ll.apply_flat(x)
                if any(ll.apply_flat(x + (j << offset)) != start + j for j in range(run)):
                    ok = False
                    break
        if not ok:
            break
        best = run
    return best


@FAST
@given(layouts(min_bits=1), st.data())
def test_num_consecutive_brute_force(ll, data):
    if not ll.in_dim_names or ll.total_in_bits > 9:
        return
    name = data.draw(st.sampled_from(ll.in_dim_names))
    # bias toward contiguous prefixes, where the bug hid: make `name` start with units
    k = data.draw(st.integers(0, min(ll.in_dim_bits(name), ll.total_out_bits)))
    bases = {n: list(ll.bases_packed(n)) for n in ll.in_dim_names}
    bases[name][:k] = [1 << i for i in range(k)]
    ll = LL.from_packed(bases, list(ll.out_dims.items()))
    assert ll.num_consecutive(name) == brute_consecutive(ll, name)


def test_num_consecutive_high_basis_touching_low_bits():
    # regression: bits 0..2 map to 1, 2, 4 but bit 3 maps to 9, so indices 8..15 land on
    # 9, 8, 11, 10, ... -- not in order; a 2- or more-wide vector would be wrong
    assert LL.from_packed({"in": [1, 2, 4, 9]}, [("out", 16)]).num_consecutive("in") == 1
    assert LL.from_packed({"in": [1, 2, 4], "in2": [8, 18]},
                          [("out", 32)]).num_consecutive("in") == 2


def test_num_consecutive_examples():
    ll = LL.identity_1d(4, "register", "dim1") * LL.identity_1d(8, "lane", "dim1")
    assert ll.num_consecutive("register") == 4 and ll.num_consecutive("lane") == 1
    # a zero (broadcast) register bit stops the run
    assert LL.from_packed({"register": [1, 0, 2]}, [("d", 4)]).num_consecutive("register") == 2


@FAST
@given(layouts())
def test_structure_queries(ll):
    r = ll.rank()
    assert len(ll.nullspace()) == ll.total_in_bits - r
    for v in ll.nullspace():
        assert ll.apply_flat(v) == 0
    assert len(ll.image_basis()) == r
    assert f2.rank(ll.image_basis() + ll.image_complement()) == ll.total_out_bits
    masks = ll.free_variable_masks()
    assert sum(f2.popcount(m) for m in masks.values()) == ll.total_in_bits - r
    for n in ll.in_dim_names:
        assert all(ll.bases_packed(n)[i] == 0 for i in ll.zero_bases(n))
        assert all((masks[n] >> i) & 1 for i in ll.zero_bases(n))


@FAST
@given(layouts(), st.data())
def test_restructuring(ll, data):
    ins = data.draw(st.permutations(ll.in_dim_names))
    outs = data.draw(st.permutations(ll.out_dim_names))
    t = ll.transpose_ins(ins).transpose_outs(outs)
    for x in range(min(ll.total_in_size, 16)):
        inputs = ll.unpack_in(x)
        assert t.apply(inputs) == ll.apply(inputs)
    assert t.transpose_ins(ll.in_dim_names).transpose_outs(ll.out_dim_names) == ll
    flat = ll.flatten_ins("x").flatten_outs("y")
    assert flat.matrix() == ll.matrix()
    assert flat.reshape_ins(list(ll.in_dims.items())).reshape_outs(list(ll.out_dims.items())) == ll
    keep_in = [n for n in ll.in_dim_names if data.draw(st.booleans())]
    keep_out = [n for n in ll.out_dim_names if data.draw(st.booleans())]
    sub = ll.sublayout(keep_in, keep_out)
    for n in keep_in:
        for i in range(ll.in_dim_bits(n)):
            full = dict(zip(ll.out_dim_names, ll.basis(n, i)))
            assert sub.basis(n, i) == tuple(full[o] for o in keep_out)


# ------------------------------------------------------------------------- paper examples


def layout_a() -> LL:
    """§4.1 layout A: 16x16 tile, 2x2 registers, 4x8 threads, 2x1 warps; out j then i."""
    cols = [0b0000_0001, 0b0001_0000,                                      # Reg
            0b0000_0010, 0b0000_0100, 0b0000_1000, 0b0010_0000, 0b0100_0000,  # Thr
            0b1000_0000]                                                   # Wrp
    ll = LL.from_packed({"flat": cols}, [("j", 16), ("i", 16)])
    return ll.reshape_ins([("register", 4), ("lane", 32), ("warp", 2)])


def test_paper_layout_a_matrix_and_table1():
    a = layout_a()
    # rows of the paper's matrix: row r has a 1 in column c iff bit r of column c is set
    rows = [[(c >> r) & 1 for c in a.matrix()] for r in range(8)]
    assert rows == [[1, 0, 0, 0, 0, 0, 0, 0], [0, 0, 1, 0, 0, 0, 0, 0],
                    [0, 0, 0, 1, 0, 0, 0, 0], [0, 0, 0, 0, 1, 0, 0, 0],
                    [0, 1, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 1, 0, 0],
                    [0, 0, 0, 0, 0, 0, 1, 0], [0, 0, 0, 0, 0, 0, 0, 1]]
    # the worked example: r1 of t9 of w0 is at (i, j) = (2, 3)
    assert a.apply({"register": 1, "lane": 9, "warp": 0}) == {"j": 3, "i": 2}
    # Table 1, through the inverse (location -> hardware index)
    inv = a.invert()
    table = {(0, 0): (0, 0), (0, 1): (1, 0), (0, 2): (0, 1), (0, 3): (1, 1),
             (1, 0): (2, 0), (1, 1): (3, 0), (2, 2): (0, 9), (2, 3): (1, 9),
             (3, 2): (2, 9), (3, 3): (3, 9)}
    for (i, j), (r, t) in table.items():
        assert inv.apply({"i": i, "j": j}) == {"register": r, "lane": t, "warp": 0}
    # Def. 4.10: a distributed layout (columns one-hot and distinct, surjective)
    assert a.is_surjective() and all(f2.popcount(c) == 1 for c in a.matrix())
    assert a.is_distributed()
    # §5.1 broadcast: an extra zero register column duplicates registers 4-7 onto 0-3
    b = LL.from_packed({"register": list(a.bases_packed("register")) + [0]}, a.out_dims) * \
        a.sublayout(["lane", "warp"], ["j", "i"])
    assert b.zero_bases("register") == [2]
    assert b.apply({"register": 5, "lane": 3}) == b.apply({"register": 1, "lane": 3})


def blocked_a_by_products() -> LL:
    """Prop. 9.1: the same layout A as a product of identities (j is the fastest dim)."""
    return (LL.identity_1d(2, "register", "j") * LL.identity_1d(2, "register", "i")
            * LL.identity_1d(8, "lane", "j") * LL.identity_1d(4, "lane", "i")
            * LL.identity_1d(2, "warp", "i"))


def test_blocked_layout_is_product_of_identities():
    assert blocked_a_by_products() == layout_a()


@pytest.mark.parametrize("vec,per_phase,max_phase,m,n",
                         [(8, 1, 8, 4, 6), (4, 2, 4, 5, 5), (2, 4, 2, 3, 4), (1, 1, 1, 2, 2)])
def test_paper_mma_swizzling_def_4_11(vec, per_phase, max_phase, m, n):
    def offset(i: int, j: int) -> int:
        col = (((i // per_phase) % max_phase) ^ (j // vec)) * vec ^ (j % vec)
        return i * (1 << n) + col

    # Linear: the map is determined by the images of unit vectors, and agrees everywhere.
    bases = {"j": [(offset(0, 1 << k),) for k in range(n)],
             "i": [(offset(1 << k, 0),) for k in range(m)]}
    swz = LL(bases, [("offset", 1 << (m + n))])
    for i in range(1 << m):
        for j in range(1 << n):
            assert swz.apply({"j": j, "i": i}) == {"offset": offset(i, j)}
    # The matrix is [[I_n, C], [0, I_m]] with c_k = vec * ((2^k / per_phase) mod max_phase) mod 2^n
    cols = swz.matrix()
    assert cols[:n] == [1 << k for k in range(n)]
    for k in range(m):
        c = (vec * (((1 << k) // per_phase) % max_phase)) % (1 << n)
        assert cols[n + k] == (1 << (n + k)) | c
    # Its inverse (offset -> location) is a memory layout (Def. 4.14): invertible, 1-2 bits a column
    mem = swz.invert()
    assert mem.is_invertible() and all(1 <= f2.popcount(c) <= 2 for c in mem.matrix())
    assert mem.is_memory_layout()
    assert mem.matrix() == cols  # [[I, C], [0, I]] is its own inverse over F2


def mma_lhs(bits: int = 16) -> LL:
    """Prop. 9.2: the mma lhs (and output) tile for an input of ``bits`` bits."""
    return (LL.identity_1d(32 // bits, "register", "dim1") * LL.identity_1d(4, "lane", "dim1")
            * LL.identity_1d(8, "lane", "dim0") * LL.identity_1d(2, "register", "dim0")
            * LL.identity_1d(2, "register", "dim1")).transpose_outs(["dim0", "dim1"])


def test_paper_mma_lhs_matches_ptx_fragment():
    # PTX m16n8k16 A fragment (16-bit): a_r of lane l is at row g + 8*((r>>1)&1),
    # column 2*(l%4) + (r&1) + 8*(r>>2) with g = l >> 2.
    a = mma_lhs(16)
    assert a.in_dims == {"register": 8, "lane": 32} and a.out_dims == {"dim0": 16, "dim1": 16}
    for lane in range(32):
        for r in range(8):
            row = (lane >> 2) + 8 * ((r >> 1) & 1)
            col = 2 * (lane % 4) + (r & 1) + 8 * (r >> 2)
            assert a.apply({"register": r, "lane": lane}) == {"dim0": row, "dim1": col}
    assert a.num_consecutive("register") == 1  # dim0 is the minor out dim here
    assert a.transpose_outs(["dim1", "dim0"]).num_consecutive("register") == 2


def test_paper_ldmatrix_tile_divides_shared_to_mma():
    """§5.3: L = A^-1 ∘ B for row-major shared A; ldmatrix applies iff L /_l T exists."""
    b = mma_lhs(16)
    row_major = LL.identity_1d(16, "offset", "dim1") * LL.identity_1d(16, "offset", "dim0")
    col_major = LL.identity_1d(16, "offset", "dim0") * LL.identity_1d(16, "offset", "dim1")
    k = 1  # log2(4 / w) for w = 2 bytes
    tile = LL.identity_1d(1 << k, "register", "offset") * LL.identity_1d(4, "lane", "offset")
    lrow = b.invert_and_compose(row_major.transpose_outs(["dim0", "dim1"]))
    lcol = b.invert_and_compose(col_major.transpose_outs(["dim0", "dim1"]))
    assert lrow.compose(row_major) == b.transpose_outs(["dim1", "dim0"])
    quotient = lrow.divide_left(tile)
    assert quotient is not None and tile * quotient == lrow
    assert lcol.divide_left(tile) is None
    # vectorized ld.shared of 2 elements: the register identity tile divides too
    assert lrow.divide_left(LL.identity_1d(2, "register", "offset")) is not None


def test_errors_name_the_layouts():
    with pytest.raises(LayoutError, match="power of two"):
        LL({"register": [(1,)]}, [("dim0", 3)])
    with pytest.raises(LayoutError, match="does not fit"):
        LL({"register": [(4,)]}, [("dim0", 4)])
    with pytest.raises(LayoutError, match="one int per out dim"):
        LL({"register": [(1, 0)]}, [("dim0", 4)])
    with pytest.raises(LayoutError, match="bijective"):
        LL.zeros_1d(4, "register", "dim0").invert()
    with pytest.raises(LayoutError, match="surjective"):
        LL.zeros_1d(4, "register", "dim0", 2).pseudo_inverse()
    with pytest.raises(LayoutError, match="not one of"):
        LL.identity_1d(4, "register", "dim0").apply({"lane": 1})
    with pytest.raises(LayoutError, match="out of range"):
        LL.identity_1d(4, "register", "dim0").apply({"register": 4})
    with pytest.raises(LayoutError, match="permutation"):
        layout_a().transpose_ins(["register"])


def test_str_and_hash():
    a = layout_a()
    s = str(a)
    assert "register=1 -> (1, 0)" in s and "lane=16 -> (0, 4)" in s and "j (size 16)" in s
    assert hash(a) == hash(layout_a()) and a != a.transpose_outs(["i", "j"])
    assert str(LL.empty()) == "LinearLayout(empty)"
    assert LL.strided_1d(4, 2, "r", "o").matrix() == [2, 4]
    assert LL.strided_1d(4, 0, "r", "o") == LL.zeros_1d(4, "r", "o")
    assert not LL.from_packed({"r": [1, 1]}, [("o", 2)]).is_distributed()
    assert LL.identity({"a": 4, "b": 2}).is_identity()


@FAST
@given(layouts(), st.data())
def test_quotient_undoes_identity_factor(rest, data):
    """identity(dims) x rest is trivial over dims, and the quotient gives rest back."""
    names = data.draw(st.lists(st.sampled_from(["q0", "q1"]), unique=True))
    ident = LL.identity({n: 1 << data.draw(st.integers(0, 3)) for n in names})
    whole = ident * rest
    assert whole.quotient(names) == rest.transpose_ins(
        [n for n in whole.in_dim_names if n not in names]).transpose_outs(
        [n for n in whole.out_dim_names if n not in names])
    if names:  # anything mapped into a quotiented dim spoils it
        n = names[0]
        if whole.in_dim_bits(n) and rest.in_dim_names:
            bases = {k: list(whole.bases_packed(k)) for k in whole.in_dim_names}
            other = next((k for k in rest.in_dim_names if bases[k]), None)
            if other is not None:
                bases[other][0] ^= 1 << whole.out_flat_offset(n)
                spoiled = LL.from_packed(bases, list(whole.out_dims.items()))
                assert spoiled.quotient(names) is None
