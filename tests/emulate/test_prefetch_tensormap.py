"""`prefetch.tensormap` (`PrefetchTensorMap`, G's issue-10 core item) in the emulator: a
hint with no memory effect, so the kernel's answer is unchanged; it must name a tensor
map parameter of the kernel (an error naming the statement otherwise)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.emulate import EmulationError, run_thread_kernel
from tegula.lower.async_ir import PrefetchTensorMap, TensorMapParam
from tegula.lower.thread_ir import TID, If

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_kernels import round_trip_kernel, run_with_deadline  # noqa: E402


def _with_prefetch(name: str | None = None):
    kernel = round_trip_kernel()
    maps = [p.name for p in kernel.params if isinstance(p, TensorMapParam)]
    kernel.body[:0] = [If(TID.eq(0), [PrefetchTensorMap(m) for m in ([name] if name else maps)])]
    return kernel, len(maps)


def test_a_prefetch_changes_nothing_and_is_counted():
    kernel, maps = _with_prefetch()
    x = np.random.default_rng(3).standard_normal((70, 45)).astype(np.float32)
    y = np.full(x.shape, np.nan, dtype=np.float32)
    report = run_with_deadline(lambda: run_thread_kernel(kernel, (2, 2), {"x": x, "y": y}))
    assert np.array_equal(y, x + 1)
    assert maps >= 1 and report.kind("PrefetchTensorMap").count == 4 * maps  # a warp a block


def test_a_prefetch_of_no_tensor_map_is_refused():
    kernel, _ = _with_prefetch("y")  # a tensor, not a tensor map
    x = np.zeros((70, 45), dtype=np.float32) + 1
    with pytest.raises(EmulationError, match="no tensor map parameter 'y'"):
        run_thread_kernel(kernel, (2, 2), {"x": x, "y": np.empty_like(x)})
