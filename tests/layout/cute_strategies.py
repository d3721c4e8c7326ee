"""Hypothesis strategies for random CuTe layouts, shared by the layout tests.

Extents are deliberately small and include non-powers of two (3, 5, 6); shapes are
hierarchical (depth up to 2) so that every algebra routine sees nested modes.
"""
from __future__ import annotations

from hypothesis import strategies as st

from tegula.layout import inttuple as it
from tegula.layout.cute import Layout

EXTENTS = st.sampled_from([1, 2, 3, 4, 5, 6, 8])


@st.composite
def nestings(draw, leaves: int):
    """A random nesting profile for `leaves` leaves: consecutive leaves grouped into
    top-level modes (a group of one may stay a leaf); `None` means an integral shape."""
    if leaves == 1 and draw(st.booleans()):
        return None
    groups: list = []
    remaining = leaves
    while remaining > 0:
        take = draw(st.integers(1, min(remaining, 3)))
        groups.append(0 if take == 1 and draw(st.booleans()) else tuple([0] * take))
        remaining -= take
    return tuple(groups)


def _nest(flat_shape: tuple, flat_stride: tuple, profile) -> Layout:
    if profile is None and len(flat_shape) == 1:
        return Layout(flat_shape[0], flat_stride[0])
    return Layout(it.unflatten(flat_shape, profile), it.unflatten(flat_stride, profile))


@st.composite
def layouts(draw, max_modes: int = 4, max_stride: int = 40):
    """Any layout: random extents and random non-negative strides (often non-injective)."""
    n = draw(st.integers(1, max_modes))
    shape = tuple(draw(EXTENTS) for _ in range(n))
    stride = tuple(draw(st.integers(0, max_stride)) for _ in range(n))
    return _nest(shape, stride, draw(nestings(n)))


@st.composite
def injective_layouts(draw, max_modes: int = 4, compact: bool = False):
    """An injective layout whose sorted strides leave gaps that are whole multiples
    (so it has a complement); with `compact`, a permutation of a column-major layout."""
    n = draw(st.integers(1, max_modes))
    shape = [draw(EXTENTS.filter(lambda e: e > 1)) for _ in range(n)]
    strides = []
    running = 1 if compact else draw(st.sampled_from([1, 1, 2, 3]))
    for s in shape:
        strides.append(running)
        running *= s * (1 if compact else draw(st.sampled_from([1, 1, 2, 3])))
    order = draw(st.permutations(range(n)))
    flat_shape = tuple(shape[k] for k in order)
    flat_stride = tuple(strides[k] for k in order)
    return _nest(flat_shape, flat_stride, draw(nestings(n)))


@st.composite
def compact_layouts(draw, max_modes: int = 3):
    """A bijection onto [0, size): a permutation of the modes of a column-major layout."""
    return draw(injective_layouts(max_modes=max_modes, compact=True))


@st.composite
def permuted_compact(draw, flat_shape: tuple):
    """A bijection onto [0, product(flat_shape)) with exactly these extents, modes in a
    random stride order and a random nesting."""
    n = len(flat_shape)
    order = draw(st.permutations(range(n)))
    strides = [0] * n
    running = 1
    for k in order:
        strides[k] = running
        running *= flat_shape[k]
    return _nest(tuple(flat_shape), tuple(strides), draw(nestings(n)))
