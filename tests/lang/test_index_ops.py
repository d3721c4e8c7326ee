"""Tracing tile coordinates, size-1 dims, kernel scalars in tile arithmetic and arg
reductions: the IR they record, and a clear TraceError at the user's line for every
misuse."""
from __future__ import annotations

import os
import sys

import pytest

import tegula as tg
from tegula import f16, f32, i32
from tegula.ir.ops import Elementwise, Indices, Reduce, Reshape
from tegula.ir.printer import format_kernel
from tegula.ir.scalar import Scalar
from tegula.ir.verify import verify

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from source_lines import marked_line  # noqa: E402


def line_of(marker: str) -> int:
    return marked_line(__file__, marker)


def expect(body, marker: str, *words: str) -> None:
    """Tracing a kernel running `body(x, n)` fails at `marker`'s line with all `words`."""
    @tg.kernel(threads=128)
    def k(x: tg.Tensor[f32], n: int):
        body(x, n)
    with pytest.raises(tg.TraceError) as info:
        k.trace()
    text = str(info.value)
    assert info.value.loc.lineno == line_of(marker), text
    for w in words:
        assert w in text, (w, text)


def traced(body):
    @tg.kernel(threads=128)
    def k(x: tg.Tensor[f32], n: int):
        body(x, n)
    kernel = k.trace()
    verify(kernel)
    return kernel


def test_arange_and_indices_record_one_op_with_the_offset():
    seen = {}

    def body(x, n):
        seen["cols"] = tg.arange(64, offset=tg.block_id(1) * 64)
        seen["rows"] = tg.indices((16, 64), 0)
    kernel = traced(body)
    ops = [op for op in kernel.body if isinstance(op, Indices)]
    assert [(op.axis, op.out.shape, op.out.dtype) for op in ops] == [(0, (64,), i32),
                                                                     (0, (16, 64), i32)]
    assert isinstance(ops[0].offset, Scalar) and ops[1].offset == 0
    assert "indices axis=0 + (block_id(1) * 64)" in format_kernel(kernel)
    assert seen["cols"].shape == (64,) and seen["rows"].dtype == i32


def test_none_inserts_and_zero_drops_size_one_dims():
    shapes = {}

    def body(x, n):
        r = tg.arange(8)
        shapes["row"] = r[None, :].shape
        shapes["col"] = r[:, None].shape
        shapes["ellipsis"] = r[..., None].shape
        shapes["same"] = r[:].shape
        shapes["dropped"] = tg.max(tg.zeros((8, 4), f32), 1)[:, 0].shape
        shapes["dropped_first"] = tg.sum(tg.zeros((8, 4), f32), 0)[0].shape
    kernel = traced(body)
    assert shapes == {"row": (1, 8), "col": (8, 1), "ellipsis": (8, 1), "same": (8,),
                      "dropped": (8,), "dropped_first": (4,)}
    assert sum(isinstance(op, Reshape) for op in kernel.body) == 5  # r[:] is r itself


def test_lower_rank_operands_are_promoted_the_numpy_way():
    def body(x, n):
        acc = tg.zeros((16, 8), f32)
        acc += tg.zeros((8,), f32)                     # in place, (8,) as (1, 8)
        tg.zeros((16, 8), f32) * tg.arange(8).to(f32)
    kernel = traced(body)
    reshapes = [op for op in kernel.body if isinstance(op, Reshape)]
    assert [op.out.shape for op in reshapes] == [(1, 8), (1, 8)]
    adds = [op for op in kernel.body if isinstance(op, Elementwise) and op.op in ("add", "mul")]
    assert all(len({t.rank for t in op.inputs}) == 1 for op in adds)


def test_kernel_scalars_enter_tile_arithmetic_on_either_side():
    def body(x, n):
        cols = tg.arange(8)
        cols < n
        n > cols                                       # Scalar.__gt__ defers to the tile
        tg.block_id(0) * 8 + cols
        tg.zeros((8,), f32) * x.shape[1]
    kernel = traced(body)
    scalars = [op.scalars for op in kernel.body if isinstance(op, Elementwise) and op.scalars]
    assert len(scalars) == 4 and all(isinstance(v, Scalar) for s in scalars for v in s.values())
    compares = [op for op in kernel.body if isinstance(op, Elementwise) and op.op in ("lt", "gt")]
    assert [op.op for op in compares] == ["lt", "lt"]   # n > cols is cols < n
    assert [list(op.scalars) for op in compares] == [[1], [1]]


def test_argmax_and_argmin_give_i32_positions_keeping_the_axis():
    def body(x, n):
        t = tg.zeros((16, 8), f16)
        tg.argmax(t, 1)
        tg.argmin(t, -2)
    kernel = traced(body)
    reds = [op for op in kernel.body if isinstance(op, Reduce)]
    assert [(op.kind, op.axis, op.out.shape, op.out.dtype) for op in reds] == [
        ("argmax", 1, (16, 1), i32), ("argmin", 0, (1, 8), i32)]


def test_slicing_a_register_tile_is_an_error():
    def body(x, n):
        tg.arange(8)[2:4]  # @slice
    expect(body, "@slice", "register[...]", "cannot be sliced", "2:4", "slice the global view")


def test_indexing_an_element_is_an_error():
    def body(x, n):
        tg.zeros((8, 4), f32)[:, 3]  # @element
    expect(body, "@element", "only drop a dim of extent 1", "dim 1 has extent 4", "tg.where")


def test_indexing_by_a_kernel_scalar_is_an_error():
    def body(x, n):
        tg.zeros((1, 4), f32)[n]  # @scalar-index
    expect(body, "@scalar-index", "cannot be indexed by", "tg.indices")


def test_too_many_indices_is_an_error():
    def body(x, n):
        tg.arange(8)[:, :]  # @too-many
    expect(body, "@too-many", "2 indices", "rank 1")


def test_arange_needs_one_static_extent():
    def body(x, n):
        tg.arange(n)  # @arange-scalar
    expect(body, "@arange-scalar", "tg.arange", "known at trace time")

    def body2(x, n):
        tg.arange((4, 4))  # @arange-2d
    expect(body2, "@arange-2d", "tg.indices(shape, axis)")


def test_indices_axis_and_offset_are_checked():
    def body(x, n):
        tg.indices((8, 4), 2)  # @axis
    expect(body, "@axis", "tg.indices", "axis", "(8, 4)")

    def body2(x, n):
        tg.indices((8, 4), 0, offset=1.5)  # @offset
    expect(body2, "@offset", "offset", "integer or a kernel scalar")


def test_a_kernel_scalar_cannot_meet_a_bool_tile_or_stand_alone():
    def body(x, n):
        (tg.arange(8) < 3) & n  # @bool
    expect(body, "@bool", "kernel scalar", "bool tiles")

    def body2(x, n):
        tg.exp(n)  # @alone
    expect(body2, "@alone", "block-uniform kernel scalar, not a register tile", "cols < n")


def test_shapes_that_do_not_broadcast_name_the_numpy_alignment():
    def body(x, n):
        tg.zeros((16, 8), f32) + tg.zeros((16,), f32)  # @mismatch
    expect(body, "@mismatch", "do not broadcast", "(1, 16)", "t[:, None]")


def test_argmax_of_bool_or_with_a_tile_axis_is_an_error():
    def body(x, n):
        tg.argmax(tg.arange(8) < 3, 0)  # @bool-arg
    expect(body, "@bool-arg", "tg.argmax", "convert it with .to()")

    def body2(x, n):
        t = tg.zeros((8, 4), f32)
        tg.argmax(t, t)  # @tile-axis
    expect(body2, "@tile-axis", "axis must be an integer")
