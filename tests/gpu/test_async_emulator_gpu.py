"""On an sm_90 GPU: the emulator's model of asynchronous thread IR agrees with the
hardware. The Hopper samples (TMA both ways, mbarrier rings, wgmma, producer/consumer
roles) and two roles handing data over a named barrier give the emulator's results on the
same inputs: bit for bit where the computation is exact; for wgmma sums, within the
rounding that summation order allows (the hardware's order inside a wgmma is not
specified; the emulator rounds once per instruction)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.codegen.samples import tma_round_trip, warp_specialized_gemm
from tegula.dtypes import f32
from tegula.emulate import run_thread_kernel

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 GPU")]

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "emulate"))
from gpu_helpers import assert_matches_emulator  # noqa: E402
from test_async_roles import _handoff_kernel  # noqa: E402


def _on_gpu(kernel, grid, *arrays):
    from tegula.runtime import compile_kernel
    tensors = [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in arrays]
    compile_kernel(kernel, "sm_90a")[grid](*tensors)
    torch.cuda.synchronize()
    return [t.cpu().numpy() for t in tensors]


# TMA needs every stride a multiple of 16 bytes: 44 f32 columns are 176 bytes (45 would be
# refused at launch with the tensor named, as tests/runtime check).
@pytest.mark.parametrize("rows, cols", [(70, 44), (1, 4), (200, 96)])
def test_tma_round_trip_matches_the_emulator(rows, cols):
    rng = np.random.default_rng(rows)
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    x.flat[:3] = [np.nan, np.inf, -np.inf]
    grid = (-(-cols // 32), -(-rows // 64))
    y_emu = np.full_like(x, np.nan)
    run_thread_kernel(tma_round_trip(), grid, {"x": x, "y": y_emu})
    _, y_gpu = _on_gpu(tma_round_trip(), grid, x, np.full_like(x, np.nan))
    assert_matches_emulator(y_emu, torch.from_numpy(y_gpu), f32, what="y")


@pytest.mark.parametrize("role_order", ["listed", "reversed"])
@pytest.mark.parametrize("m, n, k, block_n, stages", [(97, 130, 200, 64, 2),
                                                      (300, 256, 520, 128, 3)])
def test_warp_specialized_gemm_matches_the_emulator(m, n, k, block_n, stages, role_order):
    rng = np.random.default_rng(m + k)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    grid = (-(-n // block_n), -(-m // 64))
    kernel = warp_specialized_gemm(block_n, stages)
    c_emu = np.full((m, n), np.nan, np.float32)
    run_thread_kernel(kernel, grid, {"a": a, "b": b, "c": c_emu}, role_order=role_order)
    _, _, c_gpu = _on_gpu(kernel, grid, a, b, np.full((m, n), np.nan, np.float32))
    # Both sum exact f16 products in f32; their orders differ: K ulps of sum |a b| each.
    scale = np.abs(a.astype(np.float64)) @ np.abs(b.astype(np.float64)).T
    bound = 2 * k * 2.0 ** -23 * scale + 1e-30
    bad = ~(np.abs(c_gpu.astype(np.float64) - c_emu) <= bound)
    assert not bad.any(), (f"{int(bad.sum())} elements differ, first at "
                           f"{np.argwhere(bad)[0].tolist()}: GPU {c_gpu[bad][0]}, "
                           f"emulator {c_emu[bad][0]}")


def test_named_barrier_handoff_matches_the_emulator():
    x = np.random.default_rng(4).standard_normal(128).astype(np.float32)
    y_emu = np.full(128, np.nan, dtype=np.float32)
    run_thread_kernel(_handoff_kernel(), 1, {"x": x, "y": y_emu})
    _, y_gpu = _on_gpu(_handoff_kernel(), (1,), x, np.full(128, np.nan, dtype=np.float32))
    assert np.array_equal(y_emu, x[::-1])
    assert_matches_emulator(y_emu, torch.from_numpy(y_gpu), f32, what="y")
