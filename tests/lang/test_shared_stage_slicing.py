"""Slicing one stage of a shared buffer is a TraceError at the user's line (it was Python's
"'SharedView' object is not subscriptable"); slicing the global view before the copy, as
the message says, works."""
import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.errors import TraceError


@tg.kernel(threads=32)
def sliced_stage(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    s = tg.shared((4, 8), f32, stages=2)
    tg.copy(x.tile((4, 8), (0, 0)), s[0])
    tg.copy(tg.load(s[0][0:1, :]), y.tile((1, 8), (0, 0)))


@tg.kernel(threads=32)
def sliced_global_view(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    part = tg.shared((1, 8), f32)
    tg.copy(x[1:2, :].tile((1, 8), (0, 0)), part)
    tg.copy(tg.load(part), y.tile((1, 8), (0, 0)))


def test_slicing_a_shared_stage_names_the_op_and_the_line():
    x = np.arange(32, dtype=np.float32).reshape(4, 8) + 1
    with pytest.raises(TraceError, match=r"cannot be sliced; slice the global view") as err:
        tg.emulate(sliced_stage, (1,), x, np.zeros((1, 8), np.float32))
    assert "test_shared_stage_slicing.py:16" in str(err.value)


def test_slicing_the_global_view_first_works():
    x = np.arange(32, dtype=np.float32).reshape(4, 8) + 1
    y = np.full((1, 8), np.nan, np.float32)
    tg.emulate(sliced_global_view, (1,), x, y)
    np.testing.assert_array_equal(y, x[1:2])


@tg.kernel(threads=32)
def sliced_buffer(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    s = tg.shared((4, 8), f32)
    tg.copy(x.tile((4, 8), (0, 0)), s)
    tg.copy(tg.load(s[0:1, :]), y.tile((1, 8), (0, 0)))


def test_slicing_a_single_stage_buffer_says_it_cannot_be_sliced():
    # It said "a stage index must be an integer ..., got (slice(0, 1, None), ...)": the
    # user sliced a tile, and was told about stages.
    x = np.arange(32, dtype=np.float32).reshape(4, 8) + 1
    with pytest.raises(TraceError, match=r"shared\[\.\.\.\]: %\w+ is indexed only by a stage "
                       r"\(buf\[k\]\); a shared buffer is used whole .* cannot be sliced") as err:
        tg.emulate(sliced_buffer, (1,), x, np.zeros((1, 8), np.float32))
    assert "test_shared_stage_slicing.py:44" in str(err.value)
