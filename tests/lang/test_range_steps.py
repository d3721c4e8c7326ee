"""tg.range with a negative constant step runs as Python's range does (it once emitted
`for (i = start; i < stop; i += -1)`, which never runs on the GPU: a silent unwritten
output), and tg.pipeline refuses one at the user's line."""
import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.build import build
from tegula.errors import TraceError


@tg.kernel(threads=32)
def reverse_rows(x: tg.Tensor[f32], y: tg.Tensor[f32]):
    n = x.shape[0]
    for i in tg.range(n - 1, -1, -1):
        tg.copy(tg.load(x.tile((1, 32), (i, 0))), y.tile((1, 32), (n - 1 - i, 0)))


@tg.kernel(threads=32)
def every_other_down(x: tg.Tensor[f32], y: tg.Tensor[f32], START: tg.constexpr = 6,
                     STOP: tg.constexpr = 0):
    for i in tg.range(START, STOP, -2):
        tg.copy(tg.load(x.tile((1, 32), (i, 0))), y.tile((1, 32), ((START - i) // 2, 0)))


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("rows", [1, 2, 7])
def test_a_descending_run_time_range_visits_every_row(target, rows):
    x = np.random.default_rng(rows).standard_normal((rows, 32)).astype(np.float32)
    y = np.full((rows, 32), np.nan, np.float32)
    tg.emulate(reverse_rows, (1,), x, y, target=target)
    assert np.array_equal(y, x[::-1])


@pytest.mark.parametrize("start,stop", [(6, 0), (6, -1), (5, 0), (0, 0), (0, 3)])
def test_constant_bounds_with_a_negative_step_count_like_python(start, stop):
    visits = list(range(start, stop, -2))
    x = np.random.default_rng(start).standard_normal((8, 32)).astype(np.float32)
    y = np.full((max(1, len(visits)), 32), np.nan, np.float32)
    tg.emulate(every_other_down, (1,), x, y, START=start, STOP=stop, check_coverage=False)
    for j, i in enumerate(visits):
        assert np.array_equal(y[j], x[i])
    if not visits:
        assert np.isnan(y).all()


def test_every_emitted_loop_counts_up():
    for kernel, constexprs in ((reverse_rows, {}), (every_other_down, {})):
        src = build(kernel, constexprs, None, "sm_80").cuda_source()
        loops = [line for line in src.splitlines() if "for (int" in line]
        assert loops and all(line.rstrip().endswith("+= 1) {") for line in loops), loops


def test_a_pipeline_with_a_negative_step_is_refused_at_its_line():
    @tg.kernel(threads=32)
    def descending_pipeline(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        for i in tg.pipeline(3, -1, -1, stages=2):
            tg.copy(tg.load(x.tile((1, 32), (i, 0))), y.tile((1, 32), (i, 0)))

    with pytest.raises(TraceError, match="the step must be positive") as err:
        descending_pipeline.trace()
    assert "test_range_steps.py" in str(err.value)
