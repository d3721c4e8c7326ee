"""NaN propagates through tg.max / tg.min reductions and tg.maximum / tg.minimum, as in
torch (issue 8, item 6: an all-NaN row gave -inf, because every combine step — in-thread
folds, warp-shuffle butterflies, the cross-warp scratch — used fmaxf semantics).

Layouts are chosen by synthesis; the shapes and thread counts make the reductions use
each level: in-thread only, lanes (shuffles), and warps (shared scratch).
"""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import bf16, f16, f32, f8e5m2
from tegula.kernels.common import poisoned

sys.path.insert(0, str(Path(__file__).resolve().parent))
from regression_kernels import minmax_kernel, minmax_reference, nan_inputs  # noqa: E402

NAMES = ("row_max", "row_min", "col_max", "col_min", "maxi", "mini")
CASES = [((8, 16), 32), ((4, 64), 128), ((16, 128), 256), ((32, 8), 64), ((2, 256), 256)]


@pytest.mark.parametrize("shape,threads", CASES, ids=str)
@pytest.mark.parametrize("dtype", (f32, f16, bf16, f8e5m2), ids=str)
def test_nan_propagates_through_max_and_min(dtype, shape, threads):
    rng = np.random.default_rng(zlib.crc32(repr((dtype, shape, threads)).encode()))
    x, y = nan_inputs(rng, shape, dtype)
    rows, cols = shape
    outs = {"row_max": (rows, 1), "row_min": (rows, 1), "col_max": (1, cols),
            "col_min": (1, cols), "maxi": shape, "mini": shape}
    arrays = {k: poisoned(s, dtype) for k, s in outs.items()}
    report = tg.emulate(minmax_kernel(dtype, shape, threads), (1,), x, y,
                        *(arrays[k] for k in NAMES))
    want = minmax_reference(x, y)
    for name in NAMES:
        assert np.array_equal(arrays[name], want[name], equal_nan=True), name
    if shape == (16, 128):  # 256 threads: column reductions cross lanes and warps
        assert report.kind("Shuffle").count and report.kind("SharedStore").count


def test_an_all_nan_row_is_nan_not_minus_infinity():
    """The issue's example."""
    @tg.kernel(threads=64)
    def row_max(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        tg.copy(tg.max(tg.load(x.tile((8, 16), (0, 0))), 1), y.tile((8, 1), (0, 0)))

    x = np.random.default_rng(3).standard_normal((8, 16)).astype(np.float32)
    x[2] = np.nan
    y = poisoned((8, 1), f32)
    tg.emulate(row_max, (1,), x, y)
    assert np.isnan(y[2, 0]) and np.array_equal(np.delete(y, 2), np.delete(x.max(1), 2))
