"""The emulator and the GPU agree bit for bit where the result is exact: copies and
transposes of every element type, and the DESIGN GEMM on small-integer data (every partial
sum exact in f32 and the result exact in f16, so any difference is a bug in one of the
two, not rounding). The same kernel, the same inputs: `tg.emulate` (numpy) vs
`kernel[grid]` (CUDA); the bytes must be equal.
"""
from __future__ import annotations

import sys
import importlib.util
import zlib
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.build import emulate
from tegula.dtypes import f16
from tegula.kernels.common import poisoned, random_input
from tegula.kernels.copy import (COPY_DTYPES, TRANSPOSE_DTYPES, copy_config, copy_kernel,
                                 transpose_config, transpose_kernel)

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import bits_of, poison, storage_bits, to_device, torch_dtype  # noqa: E402

SHAPES = [(67, 130), (33, 64), (5, 258)]


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _both(kernel, grid, inputs, out_shape, dtype, constexprs):
    """(emulator output bits, GPU output bits) of one launch on the same inputs."""
    out = poisoned(out_shape, dtype)
    gpu_in = [to_device(x, dtype) for x in inputs]
    gpu_out = poison(torch.empty(out.shape, dtype=torch_dtype(dtype), device="cuda"))
    emulate(kernel, grid, *inputs, out, **constexprs)
    kernel[grid](*gpu_in, gpu_out, **constexprs)
    torch.cuda.synchronize()
    return storage_bits(out, dtype), bits_of(gpu_out, dtype)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=str)
def test_copy_emulator_and_gpu_bytes_equal(rng, dtype, shape):
    x = random_input(rng, shape, dtype, 4.0)
    grid, constexprs = copy_config(shape, dtype)
    emu, gpu = _both(copy_kernel(dtype), grid, [x], x.shape, dtype, constexprs)
    assert np.array_equal(emu, gpu)
    assert np.array_equal(gpu, storage_bits(x, dtype))


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", TRANSPOSE_DTYPES, ids=str)
def test_transpose_emulator_and_gpu_bytes_equal(rng, dtype, shape):
    x = random_input(rng, shape, dtype, 4.0)
    grid, constexprs = transpose_config(shape, dtype)
    emu, gpu = _both(transpose_kernel(dtype), grid, [x], (shape[1], shape[0]), dtype,
                     constexprs)
    assert np.array_equal(emu, gpu)


@pytest.mark.parametrize("m,n,k", [(70, 50, 40), (128, 128, 64), (33, 17, 96)])
def test_design_gemm_emulator_and_gpu_bytes_equal_on_integer_data(rng, m, n, k):
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("tegula_example_gemm_agree",
                                                  root / "examples" / "gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    a = rng.integers(-3, 4, size=(m, k)).astype(np.float16)
    b = rng.integers(-3, 4, size=(n, k)).astype(np.float16)
    grid = (tg.cdiv(m, 64), tg.cdiv(n, 64))
    emu, gpu = _both(module.gemm, grid, [a, b], (m, n), f16, dict(BM=64, BN=64))
    ref = (a.astype(np.int64) @ b.astype(np.int64).T).astype(np.float16)
    assert np.array_equal(gpu, storage_bits(ref, f16))
    assert np.array_equal(emu, gpu)



@pytest.mark.parametrize("shared", [True, False], ids=["pipelined", "registers"])
@pytest.mark.parametrize("m,n,k", [(70, 50, 72), (33, 17, 128)])
def test_i8_gemm_emulator_and_gpu_bytes_equal(rng, m, n, k, shared):
    from tegula.dtypes import i8, i32
    from tegula.kernels.gemm import gemm_config, gemm_kernel, gemm_registers_kernel
    a, b = random_input(rng, (m, k), i8), random_input(rng, (n, k), i8)
    grid, constexprs = gemm_config(m, n, k, i8, shared, BM=64, BN=64)
    kernel = gemm_kernel(i8) if shared else gemm_registers_kernel(i8)
    out = poisoned((m, n), i32)
    emulate(kernel, grid, a, b, out, **constexprs)
    c = poison(torch.empty((m, n), dtype=torch.int32, device="cuda"))
    kernel[grid](to_device(a, i8), to_device(b, i8), c, **constexprs)
    torch.cuda.synchronize()
    gpu = bits_of(c, i32)
    assert np.array_equal(storage_bits(out, i32), gpu)
    assert np.array_equal(gpu.view(np.int32),
                          (a.astype(np.int64) @ b.astype(np.int64).T).astype(np.int32))
