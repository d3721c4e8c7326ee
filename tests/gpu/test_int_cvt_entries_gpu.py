"""Hardware check (`pytest -m gpu`) of the catalogue's conversions between f32 and s32
(`arch.convert.FLOAT_TO_INT` = cvt.rzi.s32.f32, `INT_TO_FLOAT` = cvt.rn.f32.s32), which the
emitter prints for every float <-> int cast: f32 -> i32 -> f32 and i32 -> f32 -> i32 on
the values they get wrong (NaN, ±inf, past the s32 range, halves, ±0, 2^31 - 128, ties
of 2^24 + odd), random ones, and f32 -> i8 / u8 (the clamp after cvt.rzi), against the
emulator (`round_to` through the same entries) bit for bit, outputs poisoned."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.dtypes import f32, i8, i32, u8
from tegula.emulate import run_thread_kernel
from tegula.lower.thread_ir import (BLOCK_IDS, TID, Assign, Cast, Const, GlobalLoad, GlobalStore,
                                    Reg, RegArray, RegRead, TensorParam, ThreadKernel)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import bits_of, launch, poison, to_device, torch_dtype  # noqa: E402
from test_cvt_entries import round_trip_kernel  # noqa: E402  (y = mid(x), z = src(y))

N = 4096


def float_inputs(rng) -> np.ndarray:
    x = (rng.standard_normal(N) * np.exp2(rng.uniform(-4, 34, N))).astype(np.float32)
    edges = np.array([np.nan, np.inf, -np.inf, 3e9, -3e9, 2147483520.0, -2147483648.0,
                      2147483648.0, 0.5, -0.5, 1.5, -1.5, 0.0, -0.0, 127.9, 128.0, -128.5,
                      255.5, 256.0, -1.0, 1e-45, 16777217.0], np.float32)
    x[-len(edges):] = edges
    return x


def int_inputs(rng) -> np.ndarray:
    x = rng.integers(-2**31, 2**31, N, dtype=np.int64).astype(np.int32)
    x[:512] = rng.integers(-2**25, 2**25, 512)       # around f32's last exact integers
    edges = np.array([2**31 - 1, -2**31, 16777217, 16777219, -16777217, 33554435, 0, -1, 1,
                      2**31 - 64, 2**31 - 65], np.int64).astype(np.int32)
    x[-len(edges):] = edges
    return x


@pytest.mark.parametrize("src,mid", [(f32, i32), (i32, f32), (f32, i8), (f32, u8)], ids=str)
def test_integer_conversions_like_the_emulator(src, mid):
    rng = np.random.default_rng(sum(map(ord, src.name + mid.name)))
    x = int_inputs(rng) if src == i32 else float_inputs(rng)
    kernel = round_trip_kernel(mid, src)
    y = poison(torch.empty(N, dtype=torch_dtype(mid), device="cuda"))
    z = poison(torch.empty(N, dtype=torch_dtype(src), device="cuda"))
    launch(kernel, N // 128, to_device(x, src), y, z)
    emu_y = np.zeros(N, dtype=np.dtype(mid.numpy_name))
    emu_z = np.zeros(N, dtype=np.dtype(src.numpy_name))
    run_thread_kernel(kernel, N // 128, dict(x=x, y=emu_y, z=emu_z))
    got_y, got_z = bits_of(y, mid), bits_of(z, src)
    bad = np.flatnonzero(got_y != emu_y.view(got_y.dtype))
    assert bad.size == 0, [(x[i], got_y[i], emu_y[i]) for i in bad[:5]]
    assert np.array_equal(got_z, emu_z.view(got_z.dtype))
