"""tegula.build: the one compile path, tg.emulate, and argument binding."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.build import build, normalize_grid, split_arguments
from tegula.errors import LaunchError


@tg.kernel(threads=64)
def scale(x: tg.Tensor[f32], y: tg.Tensor[f32], factor: int, BM: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((BM, 32), (m, 0))) * 2.0, y.tile((BM, 32), (m, 0)))


def test_emulate_is_exported_and_runs_a_kernel_on_numpy_arrays():
    x = np.random.default_rng(5).standard_normal((37, 32)).astype(np.float32)
    y = np.full_like(x, np.nan)
    report = tg.emulate(scale, (3,), x, y, 7)
    assert np.array_equal(y, x * 2)
    assert "GlobalStore" in str(report)


def test_builds_are_cached_per_constexprs_and_threads():
    assert build(scale, {"BM": 16}) is build(scale, {"BM": 16})
    assert build(scale, {"BM": 16}) is not build(scale, {"BM": 8})
    assert build(scale, {"BM": 16, "threads": 128}).thread_kernel.threads == 128


def test_arguments_bind_positionally_and_by_name():
    tensors, scalars, constexprs = split_arguments(scale, ("X", "Y"), {"factor": 3, "BM": 8})
    assert tensors == {"x": "X", "y": "Y"} and scalars == {"factor": 3}
    assert constexprs == {"BM": 8}


@pytest.mark.parametrize("args,kwargs,message", [
    (("X", "Y", 1, 2), {}, "takes 3 run-time arguments"),
    (("X",), {}, "missing argument"),
    (("X", "Y", 1), {"nope": 1}, "no parameter 'nope'"),
    (("X", "Y"), {"x": 1, "factor": 2}, "given twice"),
])
def test_bad_arguments_are_launch_errors(args, kwargs, message):
    with pytest.raises(LaunchError, match=message):
        split_arguments(scale, args, kwargs)


def test_emulate_checks_ranks():
    with pytest.raises(LaunchError, match="rank 1"):
        tg.emulate(scale, (1,), np.zeros(4, np.float32), np.zeros((4, 32), np.float32), 1)


@pytest.mark.parametrize("grid,expected", [(3, (3, 1, 1)), ((2, 5), (2, 5, 1)),
                                           ((1, 2, 3), (1, 2, 3))])
def test_grids_normalize_to_three_extents(grid, expected):
    assert normalize_grid(grid) == expected


@pytest.mark.parametrize("grid", [0, (1, 70000), (2, 0), "x"])
def test_bad_grids_are_launch_errors(grid):
    with pytest.raises(LaunchError):
        normalize_grid(grid)
