"""On an sm_90 GPU: the Hopper samples emitted by `codegen/async_stmts.py` (TMA both ways,
mbarrier phases, wgmma from descriptors, producer/consumer roles with setmaxnreg) give
numpy's results on every element, at shapes that do not divide their tiles; the emulator
agrees on the same inputs (`test_async_samples.py` checks it against numpy on the CPU)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.codegen.samples import tma_round_trip, warp_specialized_gemm

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs an sm_90 GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_async_samples import gemm_case, gemm_tolerance, round_trip_case  # noqa: E402


def _launch(kernel, grid, *arrays):
    """Launch on copies of `arrays` (numpy) and return the copies back on the host."""
    from tegula.runtime import compile_kernel
    tensors = [torch.from_numpy(np.ascontiguousarray(a)).cuda() for a in arrays]
    compile_kernel(kernel, "sm_90a")[grid](*tensors)
    torch.cuda.synchronize()
    return [t.cpu().numpy() for t in tensors]


@pytest.mark.parametrize("rows, cols", [(64, 32), (70, 36), (1, 4), (1000, 260)])
def test_tma_round_trip_gpu(rows, cols):
    x, y, grid = round_trip_case(rows, cols)
    _, y_gpu = _launch(tma_round_trip(), grid, x, y)
    np.testing.assert_array_equal(y_gpu, x + np.float32(1))


@pytest.mark.parametrize("block_n", [64, 128, 256])
@pytest.mark.parametrize("m, n, k", [(64, 64, 64), (70, 100, 72), (1, 9, 8), (300, 520, 1032)])
def test_warp_specialized_gemm_gpu(m, n, k, block_n):
    a, b, c, grid = gemm_case(m, n, k, block_n)
    _, _, c_gpu = _launch(warp_specialized_gemm(block_n), grid, a, b, c)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    bad = ~(np.abs(c_gpu - ref) <= gemm_tolerance(a, b))
    assert not bad.any(), (f"{int(bad.sum())} of {bad.size} elements wrong, first at "
                           f"{np.argwhere(bad)[0].tolist()}: {c_gpu[bad][0]} vs {ref[bad][0]}")
