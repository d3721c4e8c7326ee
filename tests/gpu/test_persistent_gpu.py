"""On the GPU: the persistent-kernel scalars give the emulator's results exactly (grid sizes,
run-time steps, scalar min/max/floor division, scalar loads), `tg.num_sms()` is the
device's SM count, and the persistent GEMM (examples/persistent_gemm.py) matches torch on
shapes that do not divide the tiles, with more tiles than blocks."""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import f16, f32, i32

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "gpu"))
sys.path.insert(0, str(ROOT / "tests" / "lang"))
from gpu_helpers import assert_matches_emulator, poison, to_device  # noqa: E402
from test_persistent_scalars import (W, gather_rows, grid_sizes, grid_stride_rows,  # noqa: E402
                                     scalar_ops, segments, visit)
from test_sliced_views import copy_col_slice, copy_row_slice  # noqa: E402

RNG = np.random.default_rng(90)


def _sms() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _example():
    spec = importlib.util.spec_from_file_location("persistent_gemm_example",
                                                  ROOT / "examples" / "persistent_gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_grid_sizes_and_num_sms_match_the_launch_and_the_device():
    grid = (3, 2, 2)
    y = poison(torch.empty((12, 32), dtype=torch.int32, device="cuda"))
    grid_sizes[grid](y)
    torch.cuda.synchronize()
    expect = np.tile(np.repeat([3, 2, 2, _sms()], 8), (12, 1))
    np.testing.assert_array_equal(y.cpu().numpy(), expect)


@pytest.mark.parametrize("a,b", [(7, 2), (-7, 2), (7, -2), (-7, -2), (5, 0), (-5, 0)])
def test_scalar_min_max_floordiv_mod_match_the_emulator(a, b):
    emulated = np.empty((9, 8), np.int32)
    tg.emulate(scalar_ops, (1,), emulated, a, b)
    y = poison(torch.empty((9, 8), dtype=torch.int32, device="cuda"))
    scalar_ops[(1,)](y, a, b)
    torch.cuda.synchronize()
    assert_matches_emulator(emulated, y, i32)


@pytest.mark.parametrize("start,stop,step", [(0, 20, 3), (19, 0, -4), (9, 2, 3), (3, 9, 0)])
def test_runtime_steps_match_the_emulator(start, stop, step):
    x = RNG.standard_normal((20, W)).astype(np.float32)
    emulated = np.full_like(x, -7.0)
    tg.emulate(visit, (1,), x, emulated, start, stop, step, check_coverage=False)
    y = torch.full((20, W), -7.0, device="cuda")
    visit[(1,)](to_device(x, f32), y, start, stop, step)
    torch.cuda.synchronize()
    assert_matches_emulator(emulated, y, f32)


@pytest.mark.parametrize("grid", [1, 4, 40])
def test_grid_stride_loop_matches_the_emulator(grid):
    x = RNG.standard_normal((31, W)).astype(np.float32)
    emulated = np.empty_like(x)
    tg.emulate(grid_stride_rows, (grid,), x, emulated)
    y = poison(torch.empty((31, W), device="cuda"))
    grid_stride_rows[(grid,)](to_device(x, f32), y)
    torch.cuda.synchronize()
    assert_matches_emulator(emulated, y, f32, fma_scale=np.abs(x) * 2 + 40000)


def test_scalar_loads_match_the_emulator():
    x = RNG.standard_normal((23, W)).astype(np.float32)
    offsets = np.array([0, 4, 4, 11, 23, 40], np.int32)
    emulated = np.empty_like(x)
    tg.emulate(segments, (5,), x, offsets, emulated)
    y = poison(torch.empty((23, W), device="cuda"))
    segments[(5,)](to_device(x, f32), to_device(offsets, i32), y)
    torch.cuda.synchronize()
    assert_matches_emulator(emulated, y, f32)

    index = RNG.integers(-2, 9, size=(2, 12)).astype(np.int8)
    x = RNG.standard_normal((9, W)).astype(np.float32)
    emulated = np.empty((12, W), np.float32)
    tg.emulate(gather_rows, (1,), x, index, emulated)
    y = poison(torch.empty((12, W), device="cuda"))
    gather_rows[(1,)](to_device(x, f32), torch.from_numpy(index).cuda(), y)
    torch.cuda.synchronize()
    assert_matches_emulator(emulated, y, f32)


@pytest.mark.parametrize("n", [3, 9])
def test_row_and_column_slices_bound_tiles_as_in_the_emulator(n):
    x = RNG.standard_normal((12, 32)).astype(np.float32)
    emulated = np.full_like(x, 9.0)
    tg.emulate(copy_row_slice, (1,), x, emulated, n, check_coverage=False)
    y = torch.full((12, 32), 9.0, device="cuda")
    copy_row_slice[(1,)](to_device(x, f32), y, n)
    torch.cuda.synchronize()
    assert_matches_emulator(emulated, y, f32)
    for lo, hi in ((0, 5), (3, 13)):
        x = RNG.standard_normal((4, 20)).astype(np.float32)
        emulated = np.full_like(x, 9.0)
        tg.emulate(copy_col_slice, (1,), x, emulated, lo=lo, hi=hi, check_coverage=False)
        y = torch.full((4, 20), 9.0, device="cuda")
        copy_col_slice[(1,)](to_device(x, f32), y, lo=lo, hi=hi)
        torch.cuda.synchronize()
        assert_matches_emulator(emulated, y, f32)


@pytest.mark.parametrize("m,n,k,blocks", [(97, 130, 72, None), (1000, 777, 264, None),
                                          (513, 2050, 128, 7), (4096, 4096, 512, None)])
def test_persistent_gemm_matches_torch(m, n, k, blocks):
    example = _example()
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, k, device="cuda").half()
    c = poison(torch.empty(m, n, dtype=torch.float16, device="cuda"))
    grid = example.persistent_grid(m, n, blocks or _sms())
    example.persistent_gemm[grid](a, b, c)
    ref = a.double() @ b.double().T
    bound = 2.0 ** -10 * ref.abs() + k * 2.0 ** -24 * (a.double().abs() @ b.double().abs().T)
    err = (c.double() - ref).abs()
    assert bool((err <= bound).all()), f"max error {err.max().item()}, grid {grid}"
