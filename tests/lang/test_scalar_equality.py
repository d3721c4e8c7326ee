"""`==`/`!=` on kernel scalars: a condition for tg.if_, and a TraceError at the user's line
when a Python `if` branches on it (it was a plain False: `if tg.block_id(0) == 0:` silently
never ran its body)."""
import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.errors import TraceError


def test_python_if_on_a_scalar_equality_is_an_error_at_the_line():
    @tg.kernel(threads=32)
    def first_block_only(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        if tg.block_id(0) == 0:
            tg.copy(tg.load(x.tile((1, 32), (0, 0))), y.tile((1, 32), (0, 0)))

    with pytest.raises(TraceError, match=r"tg\.if_\(block_id\(0\) == 0\)") as err:
        first_block_only.trace()
    assert "test_scalar_equality.py" in str(err.value)


def test_python_if_on_a_scalar_inequality_is_an_error():
    @tg.kernel(threads=32)
    def not_first(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        if tg.block_id(0) != x.shape[0]:
            tg.copy(tg.load(x.tile((1, 32), (0, 0))), y.tile((1, 32), (0, 0)))

    with pytest.raises(TraceError, match="only known when the kernel runs"):
        not_first.trace()


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_equality_branches_in_tg_if(target):
    @tg.kernel(threads=32)
    def second_block_writes(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        with tg.if_(tg.block_id(0) == 1):
            tg.copy(tg.load(x.tile((1, 32), (0, 0))), y.tile((1, 32), (0, 0)))
        with tg.if_(tg.block_id(0) != 1):
            tg.copy(tg.load(x.tile((1, 32), (1, 0))), y.tile((1, 32), (1 + tg.block_id(0) // 2, 0)))

    x = np.random.default_rng(1).standard_normal((2, 32)).astype(np.float32)
    y = np.full((2, 32), np.nan, np.float32)
    tg.emulate(second_block_writes, (2,), x, y, target=target)
    assert np.array_equal(y, x)


def test_scalars_stay_hashable_by_identity():
    seen = {}
    a, b = tg.ir.scalar.BlockIndex(0), tg.ir.scalar.BlockIndex(0)
    seen[a] = 1
    assert a in seen and b not in seen and len({a, b}) == 2
