"""Tile coordinates (tg.arange, tg.indices), kernel scalars in tile arithmetic, 1-D/2-D
broadcasting (t[None, :], t[:, None], rank promotion, t[:, 0]) and tg.argmax/tg.argmin in
the emulator, every element checked against numpy: ragged shapes, tiles smaller than the
thread count, thread counts that are not powers of two where no reduction crosses threads,
NaN/±inf and ties for the arg reductions."""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import bf16, f8e4m3, f8e5m2, f16, f32, i8, i32, u8
from tegula.errors import TegulaError
from tegula.layout.cute import Layout
from tegula.lower.thread_ir import Barrier, SharedStore, Shuffle, walk

sys.path.insert(0, str(Path(__file__).resolve().parent))
from index_kernels import (arg_case, arg_kernel, broadcast_case, causal_mask_case,  # noqa: E402
                           indices_case, looped_argmax, scalar_operands_case,
                           special_values)


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def run(case) -> None:
    """Emulate one case and compare every output element exactly with its reference."""
    kernel, grid, inputs, outputs, constexprs, refs = case
    tg.emulate(kernel, grid, *inputs, *outputs, **constexprs)
    arrays = [o for o in outputs if isinstance(o, np.ndarray)]
    for got, ref in zip(arrays, refs):
        assert got.shape == ref.shape
        bad = ~((got == ref) | (np.isnan(got) & np.isnan(ref)) if got.dtype.kind == "f"
                else got == ref)
        assert not bad.any(), f"{np.count_nonzero(bad)} of {got.size} differ, first at " \
                              f"{np.argwhere(bad)[0]}: {got[bad][:5]} vs {ref[bad][:5]}"


# (shape, threads, BM, BN): ragged edges, a tile smaller than the thread count (4x8 = 32
# elements over 128 threads), non-power-of-two thread counts (96, 160).
MASK_CASES = [((50, 70), 128, 16, 64), ((7, 5), 128, 4, 8), ((33, 130), 96, 16, 32),
              ((64, 64), 32, 16, 64), ((9, 40), 160, 8, 16)]


@pytest.mark.parametrize("shape,threads,BM,BN", MASK_CASES)
def test_causal_mask_from_arange_offsets_and_kernel_scalars(rng, shape, threads, BM, BN):
    run(causal_mask_case(rng, shape, threads, BM, BN))


@pytest.mark.parametrize("shape,threads,BM,BN", MASK_CASES)
def test_indices_along_both_axes_with_offsets_and_an_int_parameter(rng, shape, threads, BM,
                                                                   BN):
    run(indices_case(rng, shape, threads, BM, BN))


@pytest.mark.parametrize("rows,n", [(20, 37), (8, -5), (3, 200)])
def test_kernel_scalars_as_where_values_maximum_and_in_place_operands(rng, rows, n):
    run(scalar_operands_case(rng, rows, n))


@pytest.mark.parametrize("shape,threads,BM,BN", [((50, 70), 128, 16, 128), ((5, 3), 128, 8, 4),
                                                 ((37, 100), 64, 8, 128)])
def test_one_dim_tiles_broadcast_against_two_dim_ones(rng, shape, threads, BM, BN):
    run(broadcast_case(rng, shape, threads, BM, BN))


ARG_CASES = [  # (shape, threads, BM, BN)
    ((16, 64), 128, 16, 64),    # one block
    ((50, 70), 128, 16, 32),    # ragged edges: the fill must never win
    ((5, 7), 128, 2, 8),        # 16 elements over 128 threads
    ((40, 96), 256, 32, 32),    # 8 warps: the cross-warp step through shared memory
    ((24, 33), 32, 8, 16),      # one warp
]


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("shape,threads,BM,BN", ARG_CASES)
def test_argmax_argmin_f32_with_nan_inf_and_ties(rng, kind, axis, shape, threads, BM, BN):
    run(arg_case(rng, shape, kind, axis, f32, threads, BM, BN))


@pytest.mark.parametrize("dtype", [f16, bf16, f8e4m3, f8e5m2, i32, i8, u8], ids=str)
@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_argmax_argmin_other_types(rng, dtype, kind):
    for axis in (0, 1):
        run(arg_case(rng, (37, 45), kind, axis, dtype, 128, 16, 32))


def test_nan_is_the_maximum_and_the_minimum_first_one_wins(rng):
    """Rows of exact patterns: all NaN, NaN after the maximum, all -inf, all equal."""
    rows = np.array([[np.nan] * 8,
                     [1, 9, 2, np.nan, 9, np.nan, 0, 0],
                     [-np.inf] * 8,
                     [2.5] * 8,
                     [np.inf, 3, np.inf, -np.inf, 0, 0, 0, -np.inf]], np.float32)
    for kind in ("argmax", "argmin"):
        out = np.full((5, 1), -1, np.int32)
        tg.emulate(arg_kernel(kind, 1, f32, 32), (1, 1), rows, out, BM=8, BN=8)
        expected = {"argmax": [0, 3, 0, 0, 0], "argmin": [0, 3, 0, 0, 3]}[kind]
        assert out.ravel().tolist() == expected, kind


@pytest.mark.parametrize("shape", [(10, 300), (3, 64), (9, 1000)])
def test_argmax_of_long_rows_chunk_by_chunk_with_the_loop_index_as_offset(rng, shape):
    x = special_values(rng, shape, f32)
    x[0] = -np.inf                            # a row of only -inf: position 0
    x[1, 5:] = np.nan                         # NaNs in every chunk: the first one
    out = np.full((shape[0], 1), -1, np.int32)
    tg.emulate(looped_argmax, (tg.cdiv(shape[0], 4),), x, out)
    assert out[:, 0].tolist() == np.argmax(x, axis=1).tolist()


def test_arg_reductions_use_shuffles_and_shared_memory_across_warps():
    """The three levels are really exercised by the cases above: 256 threads reducing a
    32x32 tile along axis 0 shuffles across lanes and merges across warps in shared
    memory; along axis 1 the rows stay within a warp."""
    across = build(arg_kernel("argmax", 0, f32, 256), dict(BM=32, BN=32)).thread_kernel
    stmts = list(walk(across.body))
    assert any(isinstance(s, Shuffle) for s in stmts)
    assert any(isinstance(s, SharedStore) for s in stmts)
    assert any(isinstance(s, Barrier) for s in stmts)


@pytest.mark.parametrize("kind", ["argmax", "max"])
def test_a_reduction_over_a_thread_count_that_is_not_a_power_of_two_names_the_line(kind):
    kernel = arg_kernel("argmax", 1, f32, 96)
    if kind == "max":
        @tg.kernel(threads=96)
        def kernel(x: tg.Tensor[f32], out: tg.Tensor[f32], BM: tg.constexpr = 16,
                   BN: tg.constexpr = 32):
            t = tg.load(x.tile((BM, BN), (0, 0)))
            tg.copy(tg.max(t, 1), out.tile((BM, 1), (0, 0)))
    with pytest.raises(TegulaError, match="power-of-two thread count") as info:
        build(kernel, dict(BM=16, BN=32))
    assert f"tg.{kind} of" in str(info.value) and info.value.loc is not None
    assert ("tg.argmax(t, axis)" if kind == "argmax" else "tg.max(t, 1)") in info.value.loc.line


@tg.kernel(threads=32)
def pinned_then_reshaped_into_a_gemm_operand(a: tg.Tensor[f16, 3], b: tg.Tensor[f16],
                                             c: tg.Tensor[f32]):
    x = tg.register((16, 1, 16), f16, layout=Layout((32, 8), (1, 32)))
    tg.copy(a.tile((16, 1, 16), (0, 0, 0)), x)
    sb = tg.shared((8, 16), f16)
    tg.copy(b.tile((8, 16), (0, 0)), sb)
    acc = tg.zeros((16, 8), f32)
    tg.gemm(acc, x[:, 0, :], sb)      # the MMA fixes the reshaped tile's layout
    tg.copy(acc, c.tile((16, 8), (0, 0)))


def test_a_reshape_between_two_fixed_layouts_gets_a_conversion(rng):
    """The pinned (16, 1, 16) tile and the MMA's A fragment disagree: synthesis converts
    the reshape's input into the fragment layout, and the product is exact."""
    a = rng.integers(-3, 4, (16, 1, 16)).astype(np.float16)
    b = rng.integers(-3, 4, (8, 16)).astype(np.float16)
    c = np.full((16, 8), np.nan, np.float32)
    tg.emulate(pinned_then_reshaped_into_a_gemm_operand, (1,), a, b, c)
    assert np.array_equal(c, a[:, 0, :].astype(np.float32) @ b.astype(np.float32).T)
    body = build(pinned_then_reshaped_into_a_gemm_operand, {}).synthesis.kernel.body
    kinds = [type(op).__name__ for op in body]
    assert kinds.index("Rearrange") == kinds.index("Reshape") - 1


@tg.kernel(threads=128)
def row_sums_of_coordinates(out: tg.Tensor[f32], BM: tg.constexpr = 3, BN: tg.constexpr = 5):
    unused = tg.arange(BN)                              # constrained by nothing at all
    grid = tg.indices((BM, BN), 0) * 10 + tg.indices((BM, BN), 1)
    tg.copy(tg.sum(grid.to(f32), 1), out.tile((BM, 1), (0, 0)))


def test_coordinate_tiles_nothing_constrains_get_a_layout_of_any_size():
    """Tiles of 5 and 15 elements over 128 threads with no anchor (only a reduction of
    them is stored) take the coalesced partition instead of failing to "spread evenly"."""
    out = np.full((3, 1), np.nan, np.float32)
    tg.emulate(row_sums_of_coordinates, (1,), out)
    r, c = np.indices((3, 5))
    assert np.array_equal(out[:, 0], (r * 10 + c).sum(axis=1).astype(np.float32))
