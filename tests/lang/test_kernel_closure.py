"""Kernels defined inside functions that assign variables after the `@tg.kernel` line
(string annotations: this module uses `from __future__ import annotations`). The
decorator evaluates annotations with the closure's values: a body's closure variable with
no value yet is read when the body is traced (it was Python's 'ValueError: Cell is empty'
from inspect.getclosurevars at the decorator), and an annotation naming a variable
assigned later is an error saying so at the kernel's line."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.errors import TraceError


def _scaled_copy_kernel():
    @tg.kernel(threads=64)
    def scaled_copy(x: tg.Tensor[DTYPE], y: tg.Tensor[DTYPE]):
        m, n = tg.block_id(0), tg.block_id(1)
        t = tg.load(x.tile((BM, 32), (m, n)))
        tg.copy(t * SCALE, y.tile((BM, 32), (m, n)))
    SCALE = 3.0  # assigned after the decorator: read when the body is traced
    return scaled_copy


DTYPE, BM = f32, 8


def test_a_closure_variable_assigned_after_the_decorator_is_read_at_trace_time():
    kernel = _scaled_copy_kernel()
    rng = np.random.default_rng(0)
    x = rng.standard_normal((19, 70)).astype(np.float32)
    y = np.full_like(x, np.nan)
    tg.emulate(kernel, (tg.cdiv(19, BM), tg.cdiv(70, 32)), x, y)
    np.testing.assert_array_equal(y, x * np.float32(3.0))


def test_an_annotation_naming_a_variable_assigned_later_is_a_clear_error():
    def make():
        @tg.kernel(threads=64)
        def late(x: tg.Tensor[ELEMENT], y: tg.Tensor[ELEMENT]):
            tg.copy(tg.load(x.tile((8, 32), (0, 0))), y.tile((8, 32), (0, 0)))
        ELEMENT = f16
        return late, ELEMENT

    with pytest.raises(TraceError, match=r"names 'ELEMENT', which the enclosing function "
                                         r"assigns only after the kernel is defined") as e:
        make()
    assert e.value.loc.lineno == make.__code__.co_firstlineno + 1  # the @tg.kernel line


def test_an_annotation_naming_an_unknown_name_keeps_its_message():
    def make():
        @tg.kernel(threads=64)
        def unknown(x: tg.Tensor[NOWHERE]):  # noqa: F821 — the mistake under test
            pass
        return unknown

    with pytest.raises(TraceError, match=r"cannot evaluate the annotation 'tg.Tensor\[NOWHERE\]'"
                                         r" of parameter 'x' \(NameError"):
        make()
