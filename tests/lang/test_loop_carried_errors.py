"""Loop state that cannot be carried is a TraceError at the user's line, naming the
variable, what changed and the loop (never a silently wrong kernel)."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from source_lines import marked_line  # noqa: E402


def line_of(marker: str) -> int:
    return marked_line(__file__, marker)


def expect(body, marker: str, *words: str, also: str | None = None) -> str:
    """Tracing a kernel running `body(x, y, n)` fails at the line marked `marker` (and
    names the line marked `also` second) with all `words` in the message."""
    @tg.kernel(threads=64)
    def k(x: tg.Tensor[f32], y: tg.Tensor[f32], n: int):
        body(x, y, n)

    with pytest.raises(tg.TraceError) as info:
        k.trace()
    text = str(info.value)
    assert f"{__file__}:{line_of(marker)}" in text, text
    assert info.value.loc.lineno == line_of(marker)
    if also is not None:
        assert info.value.other_loc.lineno == line_of(also), text
    for w in words:
        assert w in text, (w, text)
    assert "internal" not in text
    return text


def chunk(x, k):
    return tg.load(x.tile((8, 16), (0, None))[:, :, k])


def test_a_carried_tile_cannot_change_shape_or_type():
    def shape(x, y, n):
        acc = tg.zeros((8, 16), f32)
        for k in tg.range(n):  # @loop-shape
            acc = tg.sum(acc + chunk(x, k), 1)  # @shape
    text = expect(shape, "# @shape", "`acc`", "(8, 16)", "(8, 1)", "changing its shape",
                  f"tg.range loop at line {line_of('# @loop-shape')}")

    def dtype(x, y, n):
        acc = tg.zeros((8, 16), f32)
        for k in tg.range(n):  # @loop-dtype
            acc = (acc + chunk(x, k)).to(f16)  # @dtype
    expect(dtype, "# @dtype", "`acc`", "element type f32 to f16", ".to(f32)",
           f"tg.range loop at line {line_of('# @loop-dtype')}")
    assert "other" not in text


def test_a_tile_made_only_inside_a_loop_is_refused_after_it():
    def after_loop(x, y, n):
        for k in tg.range(n):  # @loop-local
            t = chunk(x, k)
        tg.copy(t * 2.0, y.tile((8, 16), (0, 0)))  # @use
    expect(after_loop, "# @use", "`t`", f"tg.range loop at line {line_of('# @loop-local')}",
           "read after that block ended", "zero times", "Define it before the loop")

    def nested(x, y, n):
        acc = tg.zeros((8, 16), f32)
        for i in tg.range(n):  # @outer
            for j in tg.range(n):
                u = chunk(x, j)
            acc += u  # @inner-use
    expect(nested, "# @inner-use", "`u`", "tg.range loop at line")

    def indexed(x, y, n):
        for k in tg.range(n):
            r = tg.max(chunk(x, k), 1)
        tg.copy(r[:, 0][:, None], y.tile((8, 1), (0, 0)))  # @indexed
    expect(indexed, "# @indexed", "`r`", "read after that block ended")


def test_a_tile_made_only_inside_a_branch_is_refused_after_it():
    def after_if(x, y, n):
        with tg.if_(n > 2):  # @if
            t = chunk(x, 0)
        tg.copy(t, y.tile((8, 16), (0, 0)))  # @if-use
    expect(after_if, "# @if-use", "`t`", f"tg.if_ block at line {line_of('# @if')}",
           "only when that branch ran")

    def in_else(x, y, n):
        with tg.if_(n > 2):
            t = chunk(x, 0)
        with tg.else_():
            u = t + 1.0  # @else-use
    expect(in_else, "# @else-use", "`t`", "tg.if_ block at line")


def test_a_loop_local_tile_overwritten_after_the_loop_is_readable():
    @tg.kernel(threads=64)
    def k(x: tg.Tensor[f32], y: tg.Tensor[f32], n: int):
        for j in tg.range(n):
            t = chunk(x, j)
        tg.fill(t, 3.0)           # a whole new value: t now holds it on every path
        tg.copy(t * 2.0, y.tile((8, 16), (0, 0)))

    x, y = np.ones((8, 16), np.float32), np.zeros((8, 16), np.float32)
    tg.emulate(k, (1,), x, y, 0)
    assert (y == 6.0).all()


def test_kernel_scalars_and_python_values_are_not_carried():
    def python_int(x, y, n):
        off = 0
        for k in tg.range(n):  # @int
            tg.copy(chunk(x, off), y.tile((8, 16), (0, 0)))
            off = off + 1  # @int-rebind
    expect(python_int, "# @int-rebind", "`off`", "was 0 before the loop and is 1 at the end of its body",
           "not carried from one iteration to the next", "loop index", also="# @int")

    def kernel_scalar(x, y, n):
        off = tg.block_id(0) * 2
        for k in tg.range(n):  # @scalar
            tg.copy(chunk(x, off), y.tile((8, 16), (0, 0)))
            off = off + 1  # @scalar-rebind
    expect(kernel_scalar, "# @scalar-rebind", "`off`", "kernel scalar (block_id(0) * 2)",
           "give it a name not used before it", also="# @scalar")

    def flag(x, y, n):
        first = True
        for k in tg.range(n):  # @flag
            first = False  # @flag-rebind
    expect(flag, "# @flag-rebind", "`first`", "True", "False", also="# @flag")

    def number_to_tile(x, y, n):
        acc = 0.0
        for k in tg.range(n):  # @number
            acc = acc + chunk(x, k)  # @number-rebind
    expect(number_to_tile, "# @number-rebind", "`acc`", "0.0", "register tile",
           "register tile defined before the loop", also="# @number")

    def in_branch(x, y, n):
        count = 0
        with tg.if_(n > 2):  # @branch
            count += 1  # @branch-rebind
    expect(in_branch, "# @branch-rebind", "`count`", "run-time condition", "tg.where",
           also="# @branch")


def test_rebinding_that_would_alias_two_names_is_refused():
    def made_before(x, y, n):
        acc = tg.zeros((8, 16), f32)
        first = chunk(x, 0)
        for k in tg.range(n):  # @before
            acc = first  # @before-rebind
    expect(made_before, "# @before-rebind", "`acc`", "a tile made before the block",
           "acc.assign(...)", also="# @before")

    def shared_before(x, y, n):
        a = b = tg.zeros((8, 16), f32)
        for k in tg.range(n):  # @shared
            a = a + chunk(x, k)
            b = b + 1.0  # @shared-rebind
    expect(shared_before, "# @shared-rebind", "`a` and `b` hold the same tile",
           "its own tile", also="# @shared")

    def shared_after(x, y, n):
        a, b = tg.zeros((8, 16), f32), tg.zeros((8, 16), f32)
        for k in tg.range(n):  # @after
            a = a + chunk(x, k)
            b = a  # @after-rebind
    expect(shared_after, "# @after-rebind", "both end it bound to", "b.assign(a)",
           also="# @after")

    def read_alias(x, y, n):
        bias = chunk(x, 0)
        acc = bias
        for k in tg.range(n):  # @alias
            acc = acc + bias  # @alias-rebind
    expect(read_alias, "# @alias-rebind", "`bias` and `acc` hold the same tile", "told apart",
           "acc.assign(bias)", also="# @alias")

    def not_a_tile(x, y, n):
        acc = tg.zeros((8, 16), f32)
        for k in tg.range(n):  # @none
            acc = None  # @none-rebind
    expect(not_a_tile, "# @none-rebind", "`acc`", "NoneType None", "must stay a register tile",
           also="# @none")


def test_a_value_from_before_the_rebinding_is_refused_after_the_loop():
    def prev_after(x, y, n):
        acc = tg.zeros((8, 16), f32)
        for k in tg.range(n):
            prev = acc
            acc = acc + chunk(x, k) * prev   # inside the loop, prev is fine
        tg.copy(prev, y.tile((8, 16), (0, 0)))  # @prev
    expect(prev_after, "# @prev", "`prev` holds the value `acc` had", "only inside the loop")


@tg.kernel(threads=64)
def previous_inside(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    xs = x.tile((8, 16), (0, None))
    acc = tg.full((8, 16), 1.0, f32)
    for k in tg.range(xs.shape[2]):
        prev = acc
        acc = acc * 0.5 + tg.load(xs[:, :, k])
        acc = acc + prev * 0.25
    tg.copy(acc, y.tile((8, 16), (0, 0)))


def test_a_value_from_before_the_rebinding_reads_right_inside_the_loop():
    x, y = np.random.default_rng(3).uniform(0.5, 1, (8, 48)).astype(np.float32), \
        np.full((8, 16), np.nan, np.float32)
    tg.emulate(previous_inside, (1,), x, y)
    acc = np.ones((8, 16))
    for k in range(3):
        acc = acc * 0.5 + x[:, 16 * k:16 * k + 16] + acc * 0.25
    np.testing.assert_allclose(y, acc, rtol=1e-6)


def test_a_loop_index_is_refused_after_its_loop():
    def index_after(x, y, n):
        for k in tg.range(n):  # @index-loop
            last = k * 2
        with tg.if_(last > 3):  # @index-use
            pass
    expect(index_after, "# @index-use", f"tg.range loop at line {line_of('# @index-loop')}",
           "is used after that loop ended", "exists only inside its loop")


def test_a_carried_tile_keeps_one_pinned_layout():
    from tegula.layout import Layout
    col, row = Layout((128, 32), (1, 128)), Layout((128, 32), (32, 1))

    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], c: tg.Tensor[f32]):
        xs = a.tile((64, 64), (0, None))
        acc = tg.zeros((64, 64), f32, layout=col)  # @pin-old
        for j in tg.range(xs.shape[2]):  # @pin-loop
            acc = tg.rearrange(acc + tg.load(xs[:, :, j]), layout=row)  # @pin-new
        tg.copy(acc, c.tile((64, 64), (0, 0)))

    with pytest.raises(tg.TraceError) as info:
        k.trace()
    text = str(info.value)
    assert info.value.loc.lineno == line_of("# @pin-new")
    assert info.value.other_loc.lineno == line_of("# @pin-old")
    for word in ("`acc`", "(128,32):(1,128)", "(128,32):(32,1)", "one layout",
                 f"tg.range loop at line {line_of('# @pin-loop')}"):
        assert word in text, (word, text)


def test_a_rebinding_in_another_layout_is_converted():
    """One side pinned: the carried value is converted, and the answer is right."""
    from tegula.build import build
    from tegula.layout import Layout

    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], c: tg.Tensor[f32]):
        xs = a.tile((64, 64), (0, None))
        acc = tg.full((64, 64), 0.5, f32, layout=Layout((128, 32), (1, 128)))
        for j in tg.range(xs.shape[2]):
            acc = acc * 0.5 + tg.load(xs[:, :, j], layout=Layout((128, 32), (32, 1)))
        tg.copy(acc, c.tile((64, 64), (0, 0)))

    assert build(k).synthesis.conversions
    a = np.random.default_rng(5).uniform(0.5, 1.0, (64, 150)).astype(np.float32)
    c = np.full((64, 64), np.nan, np.float32)
    tg.emulate(k, (1,), a, c)
    want = np.full((64, 64), 0.5)
    for j in range(3):
        part = np.zeros((64, 64))
        part[:, :min(64, 150 - 64 * j)] = a[:, 64 * j:64 * j + 64]
        want = want * 0.5 + part
    np.testing.assert_allclose(c, want, rtol=1e-6)
