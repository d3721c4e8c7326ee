"""A reduction whose output layout is fixed elsewhere reduces in its input's layout and
is converted after (issue 8: `rowsum += tg.sum(t, 1)` with `rowsum` laid out like a gemm
accumulator's rows and `t` read from shared memory raised "internal: a reduction's output
layout was fixed elsewhere"). The README promises a conversion where two ops disagree.
"""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.build import build
from tegula.ir.ops import Rearrange, walk_ops
from tegula.kernels.common import poisoned


def _kernel(kind: str, axis: int, threads: int):
    reduce = {"sum": tg.sum, "max": tg.max, "min": tg.min}[kind]
    rows_out = (64, 1) if axis == 1 else (1, 64)

    @tg.kernel(threads=threads)
    def acc_rows(a: tg.Tensor[f16], b: tg.Tensor[f16], x: tg.Tensor[f32],
                 c: tg.Tensor[f32], out: tg.Tensor[f32]):
        acc = tg.zeros((64, 64), f32)
        sa, sb = tg.shared((64, 32), f16), tg.shared((64, 32), f16)
        tg.copy(a.tile((64, 32), (0, 0)), sa)
        tg.copy(b.tile((64, 32), (0, 0)), sb)
        tg.gemm(acc, sa, sb)
        running = reduce(acc, axis)                  # laid out like acc's rows (or columns)
        sx = tg.shared((64, 64), f32)
        tg.copy(x.tile((64, 64), (0, 0)), sx, fill=-2.0)
        t = tg.load(sx)                              # a layout of its own
        if kind == "sum":
            running += reduce(t, axis)
        else:
            running.assign(tg.maximum(running, reduce(t, axis)) if kind == "max"
                           else tg.minimum(running, reduce(t, axis)))
        tg.copy(acc, c.tile((64, 64), (0, 0)))
        tg.copy(running, out.tile(rows_out, (0, 0)))

    return acc_rows


@pytest.mark.parametrize("kind,axis,threads", [("sum", 1, 128), ("sum", 0, 256),
                                                ("max", 1, 256), ("min", 0, 128)])
def test_reduction_into_a_layout_fixed_by_a_gemm(kind, axis, threads):
    rng = np.random.default_rng(7 * threads + axis)
    a = rng.integers(-3, 4, (64, 32)).astype(np.float16)
    b = rng.integers(-3, 4, (64, 32)).astype(np.float16)
    x = rng.integers(-9, 10, (64, 64)).astype(np.float32)
    x[x == 0] = 5
    if kind != "sum":
        x[3, 4] = np.nan
    c, out = poisoned((64, 64), f32), poisoned((64, 1) if axis == 1 else (1, 64), f32)
    kernel = _kernel(kind, axis, threads)
    tg.emulate(kernel, (1,), a, b, x, c, out)
    acc = a.astype(np.float32) @ b.astype(np.float32).T
    full = x
    fn = {"sum": np.sum, "max": np.max, "min": np.min}[kind]
    if kind == "sum":
        want = fn(acc, axis, keepdims=True) + fn(full, axis, keepdims=True)
    else:
        pick = np.maximum if kind == "max" else np.minimum
        want = pick(fn(acc, axis, keepdims=True), fn(full, axis, keepdims=True))
    assert np.array_equal(c, acc)
    assert np.array_equal(out, want, equal_nan=True)  # integer data: every sum is exact
    traced = build(kernel, {}).traced
    assert any(isinstance(op, Rearrange) for op in walk_ops(traced.body))


@pytest.mark.parametrize("axis", (0, 1))
@pytest.mark.parametrize("shape,threads", [((48, 8), 128), ((24, 16), 128), ((12, 8), 32)],
                         ids=str)
def test_reduction_of_a_tile_whose_layout_has_no_projection(shape, threads, axis):
    """A tile nothing else lays out (read from shared memory) is spread over the threads in
    flat order; for 48x8 on 128 threads its registers cross rows irregularly and have no
    projected CuTe layout (the fuzzer found `composition(...) is not admissible`). The
    reduction converts its input into a coalesced partition first."""
    rows, cols = shape
    out_shape = (rows, 1) if axis == 1 else (1, cols)

    @tg.kernel(threads=threads)
    def reduce_loaded(x: tg.Tensor[f32], out: tg.Tensor[f32], total: tg.Tensor[f32]):
        s = tg.shared((rows, cols), f32)
        tg.copy(x.tile((rows, cols), (0, 0)), s)
        t = tg.load(s)
        tg.copy(tg.max(t, axis), out.tile(out_shape, (0, 0)))
        tg.copy(tg.sum(t * 2.0, axis), total.tile(out_shape, (0, 0)))

    rng = np.random.default_rng(rows * cols + axis)
    x = rng.integers(-50, 50, shape).astype(np.float32)
    out, total = poisoned(out_shape, f32), poisoned(out_shape, f32)
    tg.emulate(reduce_loaded, (1,), x, out, total)
    assert np.array_equal(out, x.max(axis, keepdims=True))
    assert np.array_equal(total, (2 * x).sum(axis, keepdims=True))
