"""The CuTe layout algebra: coalesce, composition, complement, inverses, divides, products.

Semantics follow CuTe (see the CuTe "Layout algebra" documentation). Where CuTe's C++
and Python implementations differ, this module follows C++ (e.g. composition reads past
the end of its left operand along `coalesce_x`, not pycute's `coalesce`); where the C++
code accepts operands on which the result is not the mathematical composition, it
follows the mathematics: every operation either returns the exact result or raises
`LayoutError`. Negative strides follow CuTe's convention `L(-i) == -L(i)`; they are
accepted where all of a layout's non-zero strides share a sign. Swizzled layouts
(`ComposedLayout`) are accepted by composition, logical_divide and the inverses; the
other operations refuse them with a `LayoutError`.

Admissibility is explicit. `can_compose`, `can_complement`, `can_divide`, `can_product`
and `can_invert` return `None` when the operation is admissible and otherwise a sentence
saying why not; the operations raise `LayoutError` with that sentence and both operands
in CuTe notation.

A *tiler* (the right operand of composition, the divides and the products) is a Layout,
an integer `n` (meaning the layout `n:1`), `None` (CuTe's `_`: leave this mode alone), or
a tuple of tilers applied mode by mode.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from tegula.layout import inttuple as it
from tegula.layout.cute import Layout
from tegula.layout.errors import LayoutError
from tegula.layout.inttuple import IntTuple
from tegula.layout.swizzle import ComposedLayout, swizzled_left_inverse, swizzled_right_inverse

Tiler = Any  # Layout | leaf | None | tuple of Tiler


class _Inadmissible(Exception):
    """Internal signal: the operands do not admit the operation (the message says why)."""


def _describe(operand: Any) -> str:
    """A tiler or layout in CuTe notation, for error messages."""
    if isinstance(operand, (Layout, ComposedLayout)):
        return str(operand)
    if operand is None:
        return "_"
    if it.is_tuple(operand):
        return "(" + ",".join(_describe(t) for t in operand) + ")"
    return str(operand)


def _checked(operation: str, compute: Callable[[], Any], *operands: Any) -> Any:
    """Run `compute`, turning an inadmissibility into a LayoutError that names the operands."""
    try:
        return compute()
    except _Inadmissible as why:
        shown = ", ".join(_describe(o) for o in operands)
        raise LayoutError(f"{operation}({shown}) is not admissible: {why}") from None


def _reason(compute: Callable[[], Any]) -> str | None:
    """`None` if `compute` succeeds, else why it does not (for the can_* predicates)."""
    try:
        compute()
    except (_Inadmissible, LayoutError) as why:
        return str(why)
    return None


def _as_layout(tiler: Any) -> Layout:
    """A layout tiler as is; an integer extent `n` as the layout `n:1`."""
    return tiler if isinstance(tiler, Layout) else Layout(tiler)


def _known_equal(a: Any, b: Any) -> bool:
    """True only when `a == b` is decided true; undecidable symbolic questions count as no.

    Used where answering "no" is always safe (an optimization such as merging modes).
    """
    try:
        return bool(a == b)
    except LayoutError:
        return False


def _require_plain(operation: str, *operands: Any) -> None:
    """Refuse a swizzled (composed) layout where only plain layouts have a meaning."""
    for o in operands:
        if isinstance(o, ComposedLayout):
            raise LayoutError(
                f"{operation} takes plain layouts, not the swizzled layout {o}: only "
                "composition, logical_divide, left_inverse and right_inverse accept one; "
                f"apply {operation} to its inner layout {o.inner}")


# --------------------------------------------------------------------------- building


def make_layout(*modes: Layout) -> Layout:
    """Concatenate layouts as the top-level modes of a new layout: `(A,B):(dA,dB)`."""
    for m in modes:
        _require_plain("make_layout", m)
    return Layout(tuple(m.shape for m in modes), tuple(m.stride for m in modes))


def append(layout: Layout, extra: Layout | None = None, up_to_rank: int | None = None) -> Layout:
    """Add `extra` as a last mode; or, with `up_to_rank`, pad with `extra` (default `1:0`)
    until the layout has that rank (CuTe's `append<R>`)."""
    extra = Layout(1, 0) if extra is None else extra
    if up_to_rank is None:
        return make_layout(*layout.modes(), extra)
    if layout.rank >= up_to_rank:
        return layout
    return make_layout(*layout.modes(), *([extra] * (up_to_rank - layout.rank)))


def prepend(layout: Layout, extra: Layout) -> Layout:
    """Add `extra` as a new first mode."""
    return make_layout(extra, *layout.modes())


def select(layout: Layout, *indices: int) -> Layout:
    """The layout made of the chosen top-level modes, in the order given."""
    return make_layout(*(layout[i] for i in indices))


def make_ordered_layout(shape: IntTuple, order: Sequence[int] | None = None) -> Layout:
    """A compact layout of `shape` whose top-level modes are laid out in `order`.

    The mode with the smallest `order` value gets the smallest strides (ties go left to
    right); within a mode strides are column-major. `order=None` is column-major.
    """
    shape = it.normalize(shape)
    if not it.is_tuple(shape) or order is None:
        return Layout(shape)
    if len(order) != len(shape):
        raise LayoutError(f"order {tuple(order)} does not have one entry per mode of "
                          f"shape {it.to_str(shape)}")
    strides: list = [None] * len(shape)
    running = 1
    for i in sorted(range(len(shape)), key=lambda k: (order[k], k)):
        strides[i] = it.prefix_product(shape[i], running)
        running = running * it.product(shape[i])
    return Layout(shape, tuple(strides))


# --------------------------------------------------------------------------- coalesce


def coalesce(layout: Layout, profile: IntTuple | None = None) -> Layout:
    """The simplest layout of the same size that is the same function of the 1-D index.

    Drops size-1 modes and merges neighbours `(s0,s1):(d0,s0*d0)` into `s0*s1:d0`. The
    result has depth at most 1 and is an integer layout when one mode remains. With a
    tuple `profile`, each top-level mode is coalesced separately (recursively following
    the profile), which keeps the rank.
    """
    _require_plain("coalesce", layout)
    if profile is not None and it.is_tuple(profile):
        modes = [coalesce(layout[i], profile[i]) if i < len(profile) else layout[i]
                 for i in range(layout.rank)]
        return make_layout(*modes)
    cached = layout.memo.get("coalesce")
    if cached is None:
        cached = layout.memo["coalesce"] = _coalesce_flat(layout)
    return cached


def _coalesce_flat(layout: Layout, keep_trailing_unit: bool = False) -> Layout:
    """Full coalesce (see `coalesce`): one pass over the leaves, merging where possible.

    With `keep_trailing_unit` (CuTe C++'s `coalesce_x`), a trailing size-1 leaf is kept
    as the last mode (with a stand-in extent of 2, merged like any other mode) so that
    its stride survives: the result then equals `layout` at EVERY index, past the end
    included, which is what composition needs when it reads past the end.
    """
    leaves = list(zip(layout.flat_shape, layout.flat_stride))
    if keep_trailing_unit and leaves and _known_equal(leaves[-1][0], 1):
        leaves[-1] = (2, leaves[-1][1])
    shapes: list = []
    strides: list = []
    for s, d in leaves:
        if _known_equal(s, 1):
            continue
        if shapes and _known_equal(shapes[-1] * strides[-1], d):
            shapes[-1] = shapes[-1] * s
            continue
        shapes.append(s)
        strides.append(d)
    if not shapes:
        return Layout(1, 0)
    if len(shapes) == 1:
        return Layout(shapes[0], strides[0])
    return Layout(tuple(shapes), tuple(strides))


def filter_layout(layout: Layout) -> Layout:
    """The layout with stride-0 and size-1 modes removed, coalesced (CuTe's `filter`).

    It has the same image as `layout` and is injective if the image is hit once.
    """
    _require_plain("filter", layout)
    kept = [(s, d) for s, d in zip(layout.flat_shape, layout.flat_stride)
            if not _known_equal(d, 0) and not _known_equal(s, 1)]
    if not kept:
        return Layout(1, 0)
    return coalesce(Layout(tuple(s for s, _ in kept), tuple(d for _, d in kept)))


# CuTe's name for it; the module never needs the builtin `filter`.
filter = filter_layout  # noqa: A001


# --------------------------------------------------------------------------- composition


def _compose_leaf(lhs_shapes: tuple, lhs_strides: tuple, rest_shape: Any, rest_stride: Any,
                  digits_used: list) -> tuple[IntTuple, IntTuple]:
    """Compose a flat lhs with one integral mode `rest_shape:rest_stride` of the rhs.

    The rhs mode takes `rest_shape` steps of `rest_stride` through the 1-D index space of
    the lhs. Walking the lhs modes from the left, a step either jumps over a whole mode
    (the mode extent divides the step), or lands `extent/step` times in it before moving
    on (the step divides the extent), or stays inside it for all remaining steps. Any
    other situation has no layout as its result.

    `digits_used[j]` accumulates the largest coordinate this mode reaches in lhs mode j,
    so the caller can check that the rhs modes together never carry between lhs modes.
    """
    if _known_equal(rest_stride, 0):
        return rest_shape, rest_stride
    out_shapes: list = []
    out_strides: list = []
    for j, (s, d) in enumerate(zip(lhs_shapes[:-1], lhs_strides[:-1])):
        if _known_equal(rest_shape, 1):
            # Nothing left to place; track the stride only to print what CuTe prints.
            rest_stride = it.ceil_div(rest_stride, s)
            continue
        jumps = it.known_divides(s, rest_stride)  # None: undecidable for symbolic extents
        if jumps:
            rest_stride = rest_stride // s
            continue
        if s % rest_stride == 0:
            steps_in_mode = s // rest_stride
            if steps_in_mode < rest_shape:
                if rest_shape % steps_in_mode != 0:
                    raise _Inadmissible(
                        f"shape divisibility: a mode of extent {s} holds {steps_in_mode} steps "
                        f"of stride {rest_stride}, which does not divide the {rest_shape} "
                        "steps still to place")
                placed = steps_in_mode
            else:
                placed = rest_shape
        elif (rest_shape - 1) * rest_stride < s:
            placed = rest_shape
        elif jumps is None:
            raise LayoutError(f"cannot decide whether the extent {s} divides the stride "
                              f"{rest_stride} of the right operand (symbolic facts too weak)")
        else:
            raise _Inadmissible(
                f"stride divisibility: {rest_shape} steps of stride {rest_stride} cross a mode "
                f"of extent {s}, and neither {rest_stride} nor {s} divides the other")
        out_shapes.append(placed)
        out_strides.append(rest_stride * d)
        digits_used[j] = digits_used[j] + (placed - 1) * rest_stride
        rest_shape = rest_shape // placed
        rest_stride = it.ceil_div(rest_stride, s)
    if not out_shapes:
        return rest_shape, rest_stride * lhs_strides[-1]
    if not _known_equal(rest_shape, 1):
        out_shapes.append(rest_shape)
        out_strides.append(rest_stride * lhs_strides[-1])
    if len(out_shapes) == 1:
        return out_shapes[0], out_strides[0]
    return tuple(out_shapes), tuple(out_strides)


def _compose_shape(lhs_shapes: tuple, lhs_strides: tuple, rhs_shape: IntTuple,
                   rhs_stride: IntTuple, digits_used: list) -> tuple[IntTuple, IntTuple]:
    """Composition distributes over the modes of the rhs: compose each leaf separately."""
    if it.is_tuple(rhs_shape):
        parts = [_compose_shape(lhs_shapes, lhs_strides, s, d, digits_used)
                 for s, d in zip(rhs_shape, rhs_stride)]
        return tuple(p[0] for p in parts), tuple(p[1] for p in parts)
    return _compose_leaf(lhs_shapes, lhs_strides, rhs_shape, rhs_stride, digits_used)


def _compose(lhs: Layout | ComposedLayout, rhs: Tiler) -> Layout | ComposedLayout:
    """Composition without the error wrapping (see `composition`)."""
    if isinstance(lhs, ComposedLayout):
        # (f o off o A) o B == f o off o (A o B): the swizzle stays outermost.
        return ComposedLayout(lhs.outer, lhs.offset, _compose(lhs.inner, rhs))
    if rhs is None:
        return lhs
    if isinstance(rhs, ComposedLayout):
        # A o (f o off o B) has no plain form in general (A's carries do not commute with
        # a swizzle's XOR), so it stays a composed function, exactly R(c) = A(rhs(c)).
        return ComposedLayout(lhs, 0, rhs)
    if it.is_tuple(rhs):
        if len(rhs) > lhs.rank:
            raise _Inadmissible(f"the tiler has {len(rhs)} modes but the layout only {lhs.rank}")
        if any(isinstance(t, ComposedLayout) for t in rhs):
            raise _Inadmissible("a swizzled (composed) layout cannot be one mode of a tiler: "
                                "the result would not be a layout of modes")
        return make_layout(*(_compose(lhs[i], t) for i, t in enumerate(rhs)))
    rhs = _as_layout(rhs)
    negate = _uniform_sign_is_negative(rhs)
    if negate:
        # lhs(-x) == -lhs(x) (CuTe's truncating convention), so R == -(lhs o |rhs|).
        rhs = Layout(rhs.shape, _negated(rhs.stride))
    # CuTe C++ extends lhs past its end along coalesce_x(lhs) (see `composition`).
    flat = lhs.memo.get("coalesce_x")
    if flat is None:
        flat = lhs.memo["coalesce_x"] = _coalesce_flat(lhs, keep_trailing_unit=True)
    shapes = flat.shape if it.is_tuple(flat.shape) else (flat.shape,)
    strides = flat.stride if it.is_tuple(flat.stride) else (flat.stride,)
    digits_used = [0] * len(shapes)
    result = Layout(*_compose_shape(shapes, strides, rhs.shape, rhs.stride, digits_used))
    # Distributing over the rhs modes is only right if their coordinates in each lhs mode
    # add up without carrying into the next mode (a carry would move to another stride).
    for s, used in zip(shapes[:-1], digits_used):
        if not used < s:
            raise _Inadmissible(
                f"the modes of the right operand overlap inside a mode of extent {s} of the "
                f"coalesced left operand {flat} (their coordinates there add up to {used}), "
                "so the composition does not distribute over them")
    return Layout(result.shape, _negated(result.stride)) if negate else result


def _negated(stride: IntTuple) -> IntTuple:
    """Every leaf of a stride int-tuple negated."""
    if it.is_tuple(stride):
        return tuple(_negated(d) for d in stride)
    return -stride


def _uniform_sign_is_negative(layout: Layout) -> bool:
    """True when the moving strides are all negative, False when none is; a layout that
    mixes signs is refused (its modes' contributions would not add without carries)."""
    signs = set()
    for d in layout.flat_stride:
        try:
            if d < 0:
                signs.add(-1)
            elif not _known_equal(d, 0):
                signs.add(1)
        except LayoutError:  # an undecidable symbolic stride counts as positive
            signs.add(1)
    if len(signs) == 2:
        raise _Inadmissible(
            f"{layout} mixes negative and positive strides; tegula supports negative "
            "strides only when all of a layout's non-zero strides are negative (CuTe's "
            "tests do the same), since mixed signs do not distribute")
    return signs == {-1}


def composition(lhs: Layout | ComposedLayout, rhs: Tiler) -> Layout | ComposedLayout:
    """The layout `R = lhs ∘ rhs`, with `R(c) = lhs(rhs(c))` for every coordinate c of rhs.

    The result has the shape of `rhs` (refined where a step of rhs splits across modes of
    lhs). Where `rhs` reaches past `size(lhs)`, lhs is extended as CuTe C++ does, along
    the last mode of its `coalesce_x`: `coalesce(lhs)`, except that a trailing size-1
    mode keeps its stride (so `(4,3,1):(3,1,0) o 24:1` extends with stride 0). Then
    `R(c) == lhs(rhs(c))` holds past the end of lhs too, evaluating lhs as `Layout`
    does (the last mode extends).

    With a tuple tiler, mode i of lhs is composed with tiler element i and the modes of
    lhs that the tiler does not reach are dropped (CuTe C++ behaviour); `None` keeps a mode.
    An integer tiler `n` means `n:1`: the first n elements of lhs, reshaped.

    Negative strides: lhs may have any; a layout rhs may have negative strides when all of
    its non-zero strides are negative (evaluation follows CuTe's `L(-i) == -L(i)`).
    Swizzled (`ComposedLayout`) operands: `(f o A) o B` is `f o (A o B)`, and `A o S` for a
    composed `S` is the composed function `A o S` (CuTe folds some of these into one
    swizzle; the function is the same).

    Admissible when, at every mode of lhs that a step of rhs crosses, the step divides
    the mode extent or the extent divides the step (see `can_compose`).
    """
    return _checked("composition", lambda: _compose(lhs, rhs), lhs, rhs)


def can_compose(lhs: Layout, rhs: Tiler) -> str | None:
    """`None` if `composition(lhs, rhs)` is admissible, else the reason it is not."""
    return _reason(lambda: _compose(lhs, rhs))


# --------------------------------------------------------------------------- complement


def _complement(layout: Layout, cotarget: IntTuple) -> Layout:
    """Complement without the error wrapping (see `complement`)."""
    _require_plain("complement", layout)
    filtered = filter_layout(layout)
    if _known_equal(filtered.stride, 0):
        return coalesce(Layout(cotarget))
    modes = list(zip(it.flatten(filtered.shape), it.flatten(filtered.stride)))
    for s, d in modes:
        if d < 0:
            raise _Inadmissible(f"the layout has the negative stride {d}")
    modes.sort(key=lambda sd: sd[1])
    shapes: list = []
    strides: list = [1]
    for s, d in modes:
        covered = strides[-1]  # every offset below this is reached by smaller modes
        if d < covered:
            raise _Inadmissible(f"the mode {s}:{d} overlaps the modes of smaller stride, "
                                "so the layout is not injective")
        if d % covered != 0:
            raise _Inadmissible(f"the stride {d} is not a multiple of {covered}, the span of "
                                "the modes of smaller stride, so no layout fills the gaps")
        shapes.append(d // covered)
        strides.append(d * s)
    rest = it.product(it.ceil_div(cotarget, strides[-1]))
    shapes.append(rest)
    return coalesce(Layout(tuple(shapes), tuple(strides)))


def complement(layout: Layout, cotarget: IntTuple | None = None) -> Layout:
    """The layout `C` of the offsets that `layout` does not reach, ordered, up to `cotarget`.

    `C` has increasing strides, `C(i) != layout(j)` for i > 0, and `(layout, C)` is
    injective and covers `[0, cotarget)` (rounded up to a whole number of `layout`'s
    span). `cotarget` defaults to `cosize(layout)`; a shape is read like CuTe does.

    Admissible when `layout` (without stride-0 modes) is injective and each of its strides,
    in increasing order, is a multiple of the span of the modes below it.
    """
    target = layout.cosize if cotarget is None else it.normalize(cotarget)
    return _checked("complement", lambda: _complement(layout, target), layout, target)


def can_complement(layout: Layout, cotarget: IntTuple | None = None) -> str | None:
    """`None` if `complement(layout, cotarget)` is admissible, else the reason it is not."""
    target = layout.cosize if cotarget is None else it.normalize(cotarget)
    return _reason(lambda: _complement(layout, target))


# --------------------------------------------------------------------------- inverses


def _sorted_modes(layout: Layout) -> tuple[list, list, list[int]]:
    """Flat shapes, strides and column-major prefix products of `coalesce(layout)`, plus
    the mode order by increasing stride."""
    flat = coalesce(layout)
    shapes = list(it.flatten(flat.shape))
    strides = list(it.flatten(flat.stride))
    order = sorted(range(len(shapes)), key=lambda k: strides[k])
    return shapes, strides, order


def _prefix(shapes: list) -> list:
    """Exclusive prefix products of a flat list of extents."""
    return list(it.prefix_product(tuple(shapes)))


def right_inverse(layout: Layout | ComposedLayout) -> Layout | ComposedLayout:
    """The largest `R` with `layout(R(i)) == i` for every `0 <= i < size(R)`.

    `R` follows the offsets 0, 1, 2, ... as long as `layout` reaches them contiguously:
    it chains the modes of stride 1, then of stride equal to the span so far, and so on.
    Always admissible; the result is `1:0` when `layout` does not reach offset 1.

    Negative strides: the chain is followed on `|stride|` (as CuTe does) and stops before
    a mode whose sign differs from the first chained mode's; a negative chain gives `R`
    negative strides (`layout` is then evaluated at negative indices, `L(-i) == -L(i)`).
    A swizzled `S o A` (offset 0, `S` a `Swizzle`) gives `R = A⁻¹ o S` on the longest
    prefix `[0, n)` of offsets that `S` maps into `A⁻¹`'s range.
    """
    if isinstance(layout, ComposedLayout):
        return _checked("right_inverse", lambda: swizzled_right_inverse(layout), layout)
    shapes, strides, order = _sorted_modes(layout)
    index_strides = _prefix(shapes)
    out_shapes: list = []
    out_strides: list = []
    reached = 1
    sign = 0
    for k in order:
        magnitude, mode_sign = _magnitude_and_sign(strides[k])
        if not _known_equal(magnitude, reached):
            continue
        if sign and mode_sign != sign:
            break
        sign = mode_sign
        out_shapes.append(shapes[k])
        out_strides.append(mode_sign * index_strides[k])
        reached = shapes[k] * magnitude
    if not out_shapes:
        return Layout(1, 0)
    return coalesce(Layout(tuple(out_shapes), tuple(out_strides)))


def _magnitude_and_sign(stride: Any) -> tuple[Any, int]:
    """`(|stride|, sign)`; an undecidable symbolic stride counts as positive."""
    try:
        if stride < 0:
            return -stride, -1
    except LayoutError:
        pass
    return stride, 1


def _left_inverse(layout: Layout | ComposedLayout) -> Layout | ComposedLayout:
    """Left inverse without the error wrapping (see `left_inverse`)."""
    if isinstance(layout, ComposedLayout):
        return swizzled_left_inverse(layout)
    if _uniform_sign_is_negative(layout):
        # L == -|L| at every index, so L⁻¹(y) == |L|⁻¹(-y) == (-|L|⁻¹)(y).
        inverse = _left_inverse(Layout(layout.shape, _negated(layout.stride)))
        return Layout(inverse.shape, _negated(inverse.stride))
    shapes, strides, order = _sorted_modes(layout)
    index_strides = _prefix(shapes)
    moving = [k for k in order if not _known_equal(strides[k], 0)]
    if not moving:
        return Layout(1, 0)
    # Offsets are decoded in the mixed radix (d0, d1/d0, d2/d1, ..., rest): digit j+1 is
    # the coordinate of the mode of stride d_j.
    out_shapes: list = [strides[moving[0]]]
    out_strides: list = [0]
    for prev, k in zip(moving, moving[1:]):
        if strides[k] % strides[prev] != 0:
            raise _Inadmissible(f"the stride {strides[k]} is not a multiple of the smaller "
                                f"stride {strides[prev]}")
        if strides[k] < strides[prev] * shapes[prev]:
            raise _Inadmissible(f"the modes {shapes[prev]}:{strides[prev]} and "
                                f"{shapes[k]}:{strides[k]} overlap, so the layout is not injective")
        out_shapes.append(strides[k] // strides[prev])
        out_strides.append(index_strides[prev])
    out_shapes.append(shapes[moving[-1]])
    out_strides.append(index_strides[moving[-1]])
    return coalesce(Layout(tuple(out_shapes), tuple(out_strides)))


def left_inverse(layout: Layout | ComposedLayout) -> Layout | ComposedLayout:
    """A layout `L⁻¹` with `L⁻¹(layout(i)) == i` for every i when `layout` is injective.

    Stride-0 modes are ignored, which makes it a quasi-inverse in general:
    `layout(L⁻¹(layout(i))) == layout(i)`. Admissible when the non-zero strides, sorted,
    each divide the next and their modes do not overlap. Negative strides are admissible
    when all non-zero strides are negative (the inverse then has negative strides too).
    A swizzled `S o off o A` gives the composed `A⁻¹ o (-off) o S` over `[0, cosize)`.
    """
    return _checked("left_inverse", lambda: _left_inverse(layout), layout)


def can_invert(layout: Layout, side: str = "left") -> str | None:
    """`None` if the `side` ("left" or "right") inverse of `layout` is admissible, else why not.

    A right inverse of a plain layout always exists (possibly trivial, `1:0`); use
    `right_inverse(L).size` to see how much of the codomain it covers. A swizzled layout
    with an offset or a non-swizzle outer function has none.
    """
    if side == "right":
        return _reason(lambda: right_inverse(layout))
    if side != "left":
        raise LayoutError(f"can_invert: side must be 'left' or 'right', got {side!r}")
    return _reason(lambda: _left_inverse(layout))


# --------------------------------------------------------------------------- divides


def _logical_divide(layout: Layout, tiler: Tiler) -> Layout:
    """Logical divide without the error wrapping (see `logical_divide`)."""
    if tiler is None:
        return layout
    if it.is_tuple(tiler):
        if len(tiler) > layout.rank:
            raise _Inadmissible(f"the tiler has {len(tiler)} modes but the layout only "
                                f"{layout.rank}")
        return make_layout(*(_logical_divide(layout[i], tiler[i]) if i < len(tiler)
                             else layout[i] for i in range(layout.rank)))
    tile = _as_layout(tiler)
    domain = layout
    while isinstance(domain, ComposedLayout):  # a swizzled layout divides through its domain
        domain = domain.inner
    rest = _complement(tile, coalesce(domain).shape)
    return _compose(layout, make_layout(tile, rest))


def logical_divide(layout: Layout, tiler: Tiler) -> Layout:
    """Split `layout` into `(tile, rest)`: what `tiler` selects, and how the tiles repeat.

    For a layout tiler `T` this is `layout ∘ (T, complement(T, size(layout)))`, a rank-2
    layout whose mode 0 is `layout ∘ T`. A tuple tiler divides mode by mode and keeps the
    modes it does not reach. Admissible when the complement and the composition are. A
    swizzled `S o A` divides through its domain: the result is `S o (A ∘ (T, rest))`.
    """
    return _checked("logical_divide", lambda: _logical_divide(layout, tiler), layout, tiler)


def can_divide(layout: Layout, tiler: Tiler) -> str | None:
    """`None` if dividing `layout` by `tiler` is admissible, else the reason it is not."""
    return _reason(lambda: _logical_divide(layout, tiler))


def _unzip_by(layout: Layout, tiler: Tiler) -> tuple[Layout, Layout]:
    """Gather the (tile, rest) pairs that a divide or product left at the tiler's leaves."""
    _require_plain("a zipped, tiled or flat divide or product", layout)
    if not it.is_tuple(tiler):
        return layout[0], layout[1]
    tiles: list[Layout] = []
    rests: list[Layout] = []
    for i, t in enumerate(tiler):
        if t is None:
            raise LayoutError("a `None` (keep) tiler mode has no tile to gather in a "
                              "zipped/tiled/flat divide or product")
        tile, rest = _unzip_by(layout[i], t)
        tiles.append(tile)
        rests.append(rest)
    rests.extend(layout[i] for i in range(len(tiler), layout.rank))
    return make_layout(*tiles), make_layout(*rests)


def zipped_divide(layout: Layout, tiler: Tiler) -> Layout:
    """`logical_divide` regrouped as `((tile modes...), (rest modes..., untouched modes...))`."""
    return make_layout(*_unzip_by(logical_divide(layout, tiler), tiler))


def tiled_divide(layout: Layout, tiler: Tiler) -> Layout:
    """`zipped_divide` with the rest modes unpacked: `((tile modes...), rest0, rest1, ...)`."""
    tile, rest = _unzip_by(logical_divide(layout, tiler), tiler)
    return make_layout(tile, *rest.modes())


def flat_divide(layout: Layout, tiler: Tiler) -> Layout:
    """`zipped_divide` with both groups unpacked: `(tile0, tile1, ..., rest0, rest1, ...)`."""
    tile, rest = _unzip_by(logical_divide(layout, tiler), tiler)
    return make_layout(*tile.modes(), *rest.modes())


# --------------------------------------------------------------------------- products


def _logical_product(block: Layout, tiler: Tiler) -> Layout:
    """Logical product without the error wrapping (see `logical_product`)."""
    if tiler is None:
        return block
    if it.is_tuple(tiler):
        if len(tiler) > block.rank:
            raise _Inadmissible(f"the tiler has {len(tiler)} modes but the block only "
                                f"{block.rank}")
        return make_layout(*(_logical_product(block[i], tiler[i]) if i < len(tiler)
                             else block[i] for i in range(block.rank)))
    tile = _as_layout(tiler)
    gaps = _complement(block, block.size * tile.cosize)
    return make_layout(block, _compose(gaps, tile))


def logical_product(block: Layout, tiler: Tiler) -> Layout:
    """Repeat `block` as laid out by `tiler`: `(block, complement(block) ∘ tiler)`.

    Mode 0 is `block` itself; mode 1 places copies of it in the offsets `block` leaves
    free, in the pattern of `tiler`. A tuple tiler multiplies mode by mode.
    """
    return _checked("logical_product", lambda: _logical_product(block, tiler), block, tiler)


def can_product(block: Layout, tiler: Tiler) -> str | None:
    """`None` if `logical_product(block, tiler)` is admissible, else the reason it is not."""
    return _reason(lambda: _logical_product(block, tiler))


def zipped_product(block: Layout, tiler: Tiler) -> Layout:
    """`logical_product` regrouped as `((block modes...), (tiler modes...))`."""
    return make_layout(*_unzip_by(logical_product(block, tiler), tiler))


def tiled_product(block: Layout, tiler: Tiler) -> Layout:
    """`zipped_product` with the repetition modes unpacked."""
    tile, rest = _unzip_by(logical_product(block, tiler), tiler)
    return make_layout(tile, *rest.modes())


def flat_product(block: Layout, tiler: Tiler) -> Layout:
    """`zipped_product` with both groups unpacked."""
    tile, rest = _unzip_by(logical_product(block, tiler), tiler)
    return make_layout(*tile.modes(), *rest.modes())


def _rank_sensitive_product(block: Layout, tiler: Layout, block_inner: bool) -> Layout:
    """Pair mode i of the block with mode i of its repetition (both padded to equal rank)."""
    rank = max(block.rank, tiler.rank)
    product = _logical_product(append(block, up_to_rank=rank), append(tiler, up_to_rank=rank))
    inner, outer = product[0], product[1]
    if not block_inner:
        inner, outer = outer, inner
    return make_layout(*(make_layout(inner[i], outer[i]) for i in range(rank)))


def blocked_product(block: Layout, tiler: Layout) -> Layout:
    """Tile `block` over `tiler`: mode i is `(block_i, tiler_i)`, so each block stays whole
    (contiguous in the result's coordinates) and the blocks are arranged as `tiler`."""
    return _checked("blocked_product",
                    lambda: _rank_sensitive_product(block, _as_layout(tiler), True),
                    block, tiler)


def raked_product(block: Layout, tiler: Layout) -> Layout:
    """Interleave `block` over `tiler`: mode i is `(tiler_i, block_i)`, so the copies of the
    block are raked across each other (element j of every copy is adjacent)."""
    return _checked("raked_product",
                    lambda: _rank_sensitive_product(block, _as_layout(tiler), False),
                    block, tiler)


def tile_to_shape(block: Layout, target_shape: IntTuple,
                  order: Sequence[int] | None = None) -> Layout:
    """Repeat `block` (blocked) until it covers `target_shape`, repeating along the modes
    in `order` (column-major by default). Each mode of `target_shape` must be a multiple
    of the block's extent in that mode."""
    target_shape = it.normalize(target_shape)
    rank = it.rank(target_shape)
    if block.rank > rank:
        raise LayoutError(f"tile_to_shape: the block {block} has more modes than the target "
                          f"shape {it.to_str(target_shape)}")
    padded = append(block, up_to_rank=rank)
    block_extents = it.product_each(padded.shape) if rank > 1 else (padded.size,)
    target_extents = it.product_each(target_shape) if rank > 1 else (it.product(target_shape),)
    repeats = []
    for b, t in zip(block_extents, target_extents):
        if t % b != 0:
            raise LayoutError(f"tile_to_shape: the block {block} (extents "
                              f"{it.to_str(tuple(block_extents))}) does not divide the target "
                              f"shape {it.to_str(target_shape)}")
        repeats.append(t // b)
    arrangement = make_ordered_layout(tuple(repeats), order)
    return blocked_product(padded, arrangement)


# --------------------------------------------------------------------------- TV layouts


def make_layout_tv(thr: Layout, val: Layout) -> tuple[IntTuple, Layout]:
    """CuTe's thread-value construction from a thread layout and a value layout.

    `thr` arranges threads over a grid of blocks and `val` the values of one thread within
    its block; `raked_product(thr, val)` is the tile `(m, n) -> thread + size(thr)*value`.
    Inverting it and reshaping to `(size(thr), size(val))` gives the TV layout
    `(thread, value) -> column-major index into the tile`. Returns `(tile_shape, tv)`.
    """
    layout_mn = raked_product(thr, val)
    tile_shape = it.product_each(layout_mn.shape)
    tv = composition(right_inverse(layout_mn), Layout((thr.size, val.size)))
    return tile_shape, tv


# --------------------------------------------------------------------------- vectors


def max_common_layout(a: Layout, b: Layout) -> Layout:
    """The layout `R` of the longest run of offsets 0, 1, ... of `b` that `a` also maps to
    0, 1, ...: `a(R(i)) == i` and `b(R(i)) == i` for `i < size(R)`."""
    inv_b = right_inverse(b)
    common = _common_prefix(a, inv_b)
    if common is None:
        return Layout(1, 0)
    return composition(inv_b, common)


def max_common_vector(a: Layout, b: Layout) -> Any:
    """The number of contiguous elements (in `b`'s offset order) that `a` also stores
    contiguously: the vector width a copy between layouts `b` and `a` can use (>= 1)."""
    common = _common_prefix(a, right_inverse(b))
    return 1 if common is None else common.size


def _common_prefix(a: Layout, inv_b: Layout) -> Layout | None:
    """The stride-1 leading mode `n:1` of `coalesce(a ∘ inv_b)`, or None if there is none.

    Composes mode by mode so that a later, inadmissible mode of `inv_b` does not hide a
    vector found in the earlier ones.
    """
    flat_inv = coalesce(inv_b)
    composed: list[Layout] = []
    for piece in flat_inv.flatten().modes():
        if can_compose(a, piece) is not None:
            break
        composed.append(composition(a, piece))
    if not composed:
        return None
    common = coalesce(make_layout(*composed))
    first_shape = it.flatten(common.shape)[0]
    first_stride = it.flatten(common.stride)[0]
    if not _known_equal(first_stride, 1):
        return None
    return Layout(first_shape, 1)
