"""Kernel scalars for persistent kernels (issue 9 §4), in the emulator against Python/numpy:
`tg.num_programs`, `tg.num_sms`, `tg.range` with run-time start/stop/step, scalar
`tg.minimum`/`tg.maximum`, `//` and `%` with floor semantics on kernel scalars, and scalar
loads from global memory (`offsets[e]`). Every element of every output is checked."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import tegula as tg
from tegula.dtypes import f32, i8, i32
from tegula.errors import TegulaError, TraceError

sys.path.insert(0, str(Path(__file__).resolve().parent))
from source_lines import marked_line  # noqa: E402

RNG = np.random.default_rng(9)
W = 32  # columns of the row tiles below


# ---------------------------------------------------------------- grid-stride loops

@tg.kernel(threads=64)
def grid_stride_rows(x: tg.Tensor[f32], y: tg.Tensor[f32], BR: tg.constexpr = 3):
    """Row tiles of BR rows, visited by a persistent grid-stride loop; each tile also
    records which block did it (so a tile done twice or by the wrong block is seen)."""
    tiles = tg.cdiv(x.shape[0], BR)
    for t in tg.range(tg.block_id(0), tiles, tg.num_programs(0)):
        v = tg.load(x.tile((BR, W), (t, 0)))
        tg.copy(v * 2.0 + tg.block_id(0) * 1000, y.tile((BR, W), (t, 0)))


@pytest.mark.parametrize("rows,grid", [(31, 1), (31, 4), (31, 11), (31, 40), (5, 2)])
def test_grid_stride_loop_covers_every_tile_once_with_its_block(rows, grid):
    x = RNG.standard_normal((rows, W)).astype(np.float32)
    y = np.empty_like(x)
    tg.emulate(grid_stride_rows, (grid,), x, y)
    tile = np.arange(rows) // 3
    owner = tile % grid  # block b does tiles b, b + grid, ...
    np.testing.assert_array_equal(y, x * 2 + (owner * 1000)[:, None].astype(np.float32))


@tg.kernel(threads=32)
def grid_sizes(y: tg.Tensor[i32]):
    """Block b writes (num_programs(0..2), num_sms()) into row b, 8 copies of each."""
    b = tg.block_id(0) + tg.num_programs(0) * (tg.block_id(1) +
                                              tg.num_programs(1) * tg.block_id(2))
    values = [tg.num_programs(0), tg.num_programs(1), tg.num_programs(2), tg.num_sms()]
    for j, v in enumerate(values):
        tg.copy(tg.zeros((1, 8), i32) + v, y.tile((1, 8), (b, j)))


@pytest.mark.parametrize("grid,num_sms,expect_sms", [((2, 3, 1), None, 132), ((1, 2, 2), 7, 7)])
def test_num_programs_and_num_sms(grid, num_sms, expect_sms):
    blocks = int(np.prod(grid))
    y = np.empty((blocks, 32), np.int32)
    tg.emulate(grid_sizes, grid, y, num_sms=num_sms, target="sm_90a")
    np.testing.assert_array_equal(y, np.tile(np.repeat([*grid, expect_sms], 8), (blocks, 1)))


def test_num_sms_defaults_to_the_target_and_refuses_nonsense():
    y = np.empty((1, 32), np.int32)
    tg.emulate(grid_sizes, (1,), y, target="sm_80")
    assert np.all(y[0, 24:] == 108)
    with pytest.raises(TegulaError, match="num_sms must be a positive int"):
        tg.emulate(grid_sizes, (1,), y, num_sms=0)


# ---------------------------------------------------------------- run-time steps

@tg.kernel(threads=32)
def visit(x: tg.Tensor[f32], y: tg.Tensor[f32], start: int, stop: int, step: int):
    """y row k = x row k + 1 for every k of range(start, stop, step)."""
    for k in tg.range(start, stop, step):
        tg.copy(tg.load(x.tile((1, W), (k, 0))) + 1.0, y.tile((1, W), (k, 0)))


@pytest.mark.parametrize("start,stop,step", [(0, 20, 3), (2, 20, 7), (19, 0, -4), (5, 5, 2),
                                             (9, 2, 3), (2, 9, -1), (3, 9, 0), (0, 20, 25)])
def test_runtime_step_visits_what_python_range_visits(start, stop, step):
    x = RNG.standard_normal((20, W)).astype(np.float32)
    y = np.full_like(x, -7.0)
    tg.emulate(visit, (1,), x, y, start, stop, step, check_coverage=False)
    expect = np.full_like(x, -7.0)
    rows = list(range(start, stop, step)) if step else []
    expect[rows] = x[rows] + 1
    np.testing.assert_array_equal(y, expect)


@tg.kernel(threads=64)
def persistent_pipeline(a: tg.Tensor[f32], y: tg.Tensor[f32], BR: tg.constexpr = 4,
                        BK: tg.constexpr = 8):
    """Per row tile (grid-stride), a pipelined loop over K chunks summing a's columns
    through a multi-stage shared buffer: the pipeline restarts for every tile."""
    tiles = tg.cdiv(a.shape[0], BR)
    for t in tg.range(tg.block_id(0), tiles, tg.num_programs(0)):
        ga = a.tile((BR, BK), (t, None))
        sa = tg.shared((BR, BK), f32, stages=3)
        acc = tg.zeros((BR, BK), f32)
        for k in tg.pipeline(ga.shape[2], stages=3):
            tg.copy(ga[:, :, k], sa[k])
            acc += tg.load(sa[k])
        tg.copy(acc, y.tile((BR, BK), (t, 0)))


@pytest.mark.parametrize("rows,cols,grid", [(13, 37, 2), (8, 8, 3), (30, 64, 4)])
def test_pipeline_nested_in_a_persistent_loop_restarts_per_tile(rows, cols, grid):
    a = RNG.standard_normal((rows, cols)).astype(np.float32)
    y = np.empty((rows, 8), np.float32)
    tg.emulate(persistent_pipeline, (grid,), a, y)
    padded = np.zeros((rows, -(-cols // 8) * 8), np.float32)
    padded[:, :cols] = a
    expect = np.zeros((rows, 8), np.float32)
    for k in range(padded.shape[1] // 8):  # the kernel's order of f32 additions
        expect = expect + padded[:, 8 * k:8 * k + 8]
    np.testing.assert_array_equal(y, expect)


# ---------------------------------------------------------------- min, max, //, %

@tg.kernel(threads=32)
def scalar_ops(y: tg.Tensor[i32], a: int, b: int):
    vals = [tg.minimum(a, b), tg.maximum(a, b), tg.minimum(a, 3), tg.maximum(-2, b),
            a // b, a % b, a // 3, a % -3, (a + b) // 2]
    for j, v in enumerate(vals):
        tg.copy(tg.zeros((1, 8), i32) + v, y.tile((1, 8), (j, 0)))


def _floor_div(a, b):
    return -1 if b == 0 else a // b


def _floor_mod(a, b):
    return a if b == 0 else a % b


@pytest.mark.parametrize("a,b", [(7, 2), (-7, 2), (7, -2), (-7, -2), (5, 0), (-5, 0),
                                 (0, 3), (-2147483647, 5)])
def test_scalar_min_max_floordiv_mod(a, b):
    y = np.empty((9, 8), np.int32)
    tg.emulate(scalar_ops, (1,), y, a, b)
    expect = [min(a, b), max(a, b), min(a, 3), max(-2, b), _floor_div(a, b),
              _floor_mod(a, b), a // 3, a % -3, _floor_div(a + b, 2)]
    np.testing.assert_array_equal(y, np.repeat(np.array(expect, np.int32)[:, None], 8, 1))


def test_python_ints_fold_and_literal_zero_divisor_is_refused():
    assert tg.minimum(3, 5) == 3 and tg.maximum(3, 5) == 5

    @tg.kernel(threads=32)
    def by_zero(y: tg.Tensor[i32], a: int):
        tg.copy(tg.zeros((1, 8), i32) + a // 0, y.tile((1, 8), (0, 0)))  # @zero
    with pytest.raises(TraceError, match="divides by a literal zero") as info:
        by_zero.trace()
    assert info.value.loc.lineno == marked_line(__file__, "@zero")


# ---------------------------------------------------------------- scalar loads

@tg.kernel(threads=64)
def segments(x: tg.Tensor[f32], offsets: tg.Tensor[i32, 1], y: tg.Tensor[f32]):
    """Block e scales the rows offsets[e] … offsets[e+1]-1 of x by e + 1 (a MoE-style
    variable-length segment), clamping the segment end to the tensor with tg.minimum."""
    e = tg.block_id(0)
    end = tg.minimum(offsets[e + 1], x.shape[0])
    for r in tg.range(offsets[e], end):
        tg.copy(tg.load(x.tile((1, W), (r, 0))) * (e + 1), y.tile((1, W), (r, 0)))


def test_scalar_loads_give_variable_length_segments():
    x = RNG.standard_normal((23, W)).astype(np.float32)
    offsets = np.array([0, 4, 4, 11, 23, 40], np.int32)  # an empty and an overlong segment
    y = np.empty_like(x)
    tg.emulate(segments, (5,), x, offsets, y)
    scale = np.repeat(np.arange(1, 6), np.diff(np.minimum(offsets, 23)))
    np.testing.assert_array_equal(y, x * scale[:, None].astype(np.float32))


def test_scalar_load_out_of_bounds_is_a_clear_error():
    x = RNG.standard_normal((8, W)).astype(np.float32)
    offsets = np.array([0, 4, 8], np.int32)
    with pytest.raises(TegulaError, match=r"scalar load offsets\[3\] is out of bounds.*"
                                          r"extent 3"):
        tg.emulate(segments, (3,), x, offsets, np.empty_like(x), check_coverage=False)


@tg.kernel(threads=32)
def gather_rows(x: tg.Tensor[f32], index: tg.Tensor[i8], y: tg.Tensor[f32]):
    """y row i = x row index[1, i] (a 2-D i8 index tensor read by scalar loads in a loop:
    the load depends on the loop index, so it must not be hoisted out of the loop)."""
    for i in tg.range(y.shape[0]):
        with tg.if_(index[1, i] >= 0):
            tg.copy(tg.load(x.tile((1, W), (index[1, i], 0))), y.tile((1, W), (i, 0)))
        with tg.else_():
            tg.copy(tg.zeros((1, W), f32) - 1.0, y.tile((1, W), (i, 0)))


def test_scalar_loads_in_loop_and_condition_from_an_i8_tensor():
    x = RNG.standard_normal((9, W)).astype(np.float32)
    index = RNG.integers(-2, 9, size=(2, 12)).astype(np.int8)
    y = np.empty((12, W), np.float32)
    tg.emulate(gather_rows, (1,), x, index, y)
    rows = index[1].astype(int)
    expect = np.where((rows >= 0)[:, None], x[np.maximum(rows, 0)], np.float32(-1))
    np.testing.assert_array_equal(y, expect)


# ---------------------------------------------------------------- misuse

def _expect(fn, marker, *fragments):
    with pytest.raises(TraceError) as info:
        fn.trace()
    text = str(info.value)
    for f in fragments:
        assert f in text, text
    assert info.value.loc is not None and info.value.loc.lineno == marked_line(__file__, marker)


def test_a_float_tensor_cannot_be_loaded_as_a_scalar():
    @tg.kernel(threads=32)
    def k(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        n = x[0, 1]  # @float-load
        tg.copy(tg.load(x.tile((1, W), (n, 0))), y.tile((1, W), (0, 0)))
    _expect(k, "@float-load", "x (f32)", "integer tensor", "floats cannot be tile coordinates")


def test_scalar_min_with_a_float_or_a_tile_where_a_scalar_is_needed():
    @tg.kernel(threads=32)
    def with_float(y: tg.Tensor[f32], n: int):
        m = tg.minimum(n, 2.5)  # @min-float
        tg.copy(tg.zeros((1, W), f32) + m, y.tile((1, W), (0, 0)))
    _expect(with_float, "@min-float", "tg.minimum", "kernel scalars are integers", "2.5")

    @tg.kernel(threads=32)
    def tile_bound(y: tg.Tensor[f32], n: int):
        t = tg.zeros((1, W), i32) + n
        for k in tg.range(0, t, n):  # @tile-bound
            tg.copy(tg.zeros((1, W), f32), y.tile((1, W), (k, 0)))
    _expect(tile_bound, "@tile-bound", "tg.range", "the loop stop must be an integer or a "
                                                   "kernel scalar")


def test_misused_grid_axis_and_pipeline_steps():
    @tg.kernel(threads=32)
    def bad_axis(y: tg.Tensor[f32]):
        tg.copy(tg.zeros((1, W), f32), y.tile((1, W), (tg.num_programs(3), 0)))  # @axis
    _expect(bad_axis, "@axis", "tg.num_programs", "0, 1 or 2")

    @tg.kernel(threads=32)
    def pipeline_step(y: tg.Tensor[f32], n: int):
        for k in tg.pipeline(0, 8, n, stages=2):  # @pipe-step
            tg.copy(tg.zeros((1, W), f32), y.tile((1, W), (k, 0)))
    _expect(pipeline_step, "@pipe-step", "tg.pipeline", "run-time step is for tg.range")

    @tg.kernel(threads=32)
    def float_step(y: tg.Tensor[f32]):
        for k in tg.range(0, 8, 0.5):  # @float-step
            tg.copy(tg.zeros((1, W), f32), y.tile((1, W), (k, 0)))
    _expect(float_step, "@float-step", "tg.range", "an int or a kernel scalar")


def test_runtime_step_index_cannot_escape_its_loop():
    @tg.kernel(threads=32)
    def escape(y: tg.Tensor[f32], n: int):
        for k in tg.range(0, 8, n):
            tg.copy(tg.zeros((1, W), f32), y.tile((1, W), (k, 0)))
        tg.copy(tg.zeros((1, W), f32), y.tile((1, W), (k, 0)))  # @escape
    with pytest.raises(TraceError) as info:
        escape.trace()
    assert info.value.loc.lineno == marked_line(__file__, "@escape")


@tg.kernel(threads=32)
def reused_name(x: tg.Tensor[f32], y: tg.Tensor[f32], s: int):
    """`t` names a kernel scalar before the loop and the loop's index inside it (as with a
    constant step, rebinding a name by `for` is not a carried value)."""
    t = tg.block_id(0)
    for t in tg.range(t, 8, s):
        tg.copy(tg.load(x.tile((1, W), (t, 0))) * 3.0, y.tile((1, W), (t, 0)))


def test_a_runtime_step_loop_may_reuse_a_name_for_its_index():
    x = RNG.standard_normal((8, W)).astype(np.float32)
    y = np.empty_like(x)
    tg.emulate(reused_name, (1,), x, y, 1)
    np.testing.assert_array_equal(y, x * 3)


@tg.kernel(threads=32)
def count_then_read(counts: tg.Tensor[i32, 1], y: tg.Tensor[f32]):
    """Writes counts[1:] (counts[0] + 1) and reads counts[0] as a scalar: a tensor both
    written and scalar-loaded is an input too, which tg.emulate must not poison before
    the run (it poisoned outputs that only tile loads read)."""
    base = counts[0]
    tg.copy(tg.zeros((8,), i32) + (base + 1), counts[1:9].tile((8,), (0,)))
    tg.copy(tg.zeros((1, W), f32) + base, y.tile((1, W), (0, 0)))


def test_a_scalar_loaded_output_is_not_poisoned_before_the_run():
    from tegula.build import build
    from tegula.emulate.coverage import tensor_roles
    written, read = tensor_roles(build(count_then_read, {}).thread_kernel)
    assert "counts" in written and "counts" in read
    counts = np.array([41, 0, 0, 0, 0, 0, 0, 0, 0], np.int32)
    y = np.empty((1, W), np.float32)
    tg.emulate(count_then_read, (1,), counts, y, check_coverage=["y"])
    np.testing.assert_array_equal(counts, [41] + [42] * 8)
    np.testing.assert_array_equal(y, np.full((1, W), 41, np.float32))


@settings(max_examples=300, deadline=None)
@given(st.integers(-50, 50), st.integers(-50, 50), st.integers(-9, 9).filter(bool))
def test_trip_count_formula_counts_like_python_range(start, stop, step):
    """The formula the run-time step is traced with, folded on Python ints (the kernel
    computes the same expression with floor division; emulator cases above)."""
    from tegula.lang.control import _trip_count
    assert _trip_count(start, stop, step) == len(range(start, stop, step))


def test_float_scalars_and_tiles_as_coordinates_are_refused_at_the_line():
    @tg.kernel(threads=32)
    def float_coord(y: tg.Tensor[f32]):
        t = tg.num_programs(0) * 1.5  # @float-scalar
        tg.copy(tg.zeros((1, W), f32), y.tile((1, W), (t, 0)))
    _expect(float_coord, "@float-scalar", "expected an integer or a kernel scalar", "1.5")

    @tg.kernel(threads=32)
    def tile_coord(y: tg.Tensor[f32], idx: tg.Tensor[i32]):
        t = tg.load(idx.tile((1, 8), (0, 0)))
        tg.copy(tg.zeros((1, W), f32), y.tile((1, W), (t, 0)))  # @tile-coord
    _expect(tile_coord, "@tile-coord", "tile()", "a tile coordinate must be an integer or a "
                                                 "kernel scalar")

    @tg.kernel(threads=32)
    def float_index(y: tg.Tensor[f32], idx: tg.Tensor[i32, 1]):
        n = idx[0.5]  # @float-index
        tg.copy(tg.zeros((1, W), f32), y.tile((1, W), (n, 0)))
    _expect(float_index, "@float-index", "an index must be an integer or a kernel scalar")
