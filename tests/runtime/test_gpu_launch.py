"""On a GPU: hand-written thread-IR kernels compiled, loaded and launched on torch tensors,
every output element checked (outputs are poisoned first, inputs random — never zeros).

Run with `pytest -m gpu tests/runtime` on a machine with an NVIDIA GPU, torch (CUDA build)
and cuda-bindings.
"""
from __future__ import annotations

import dataclasses
import time

import pytest

from tegula.codegen import samples
from tegula.dtypes import bf16, f16, f32
from tegula.lower.thread_ir import SharedBuffer
from tegula.runtime import DiskCache, compile_kernel, launcher

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


@pytest.fixture
def cache(tmp_path):
    """A private disk cache, and a clean in-memory cache, per test."""
    launcher._LOADED.clear()
    return DiskCache(tmp_path)


def _poison(t):
    """Fill with NaN (floats) or 0x5A bytes so an unwritten element cannot pass."""
    if t.dtype.is_floating_point:
        return t.fill_(float("nan"))
    return t.fill_(0x5A)


@pytest.mark.parametrize("dtype,vec", [(torch.float16, 8), (torch.float32, 4)])
def test_vector_copy_every_element(cache, dtype, vec):
    tdtype = {torch.float16: f16, torch.float32: f32}[dtype]
    ck = compile_kernel(samples.vector_copy(tdtype, vec), cache=cache)
    n = 128 * vec * 37 + vec * 5  # a partial last block
    x = torch.randn(n, device="cuda", dtype=dtype)
    y = _poison(torch.empty_like(x))
    ck[cdiv(n, 128 * vec)](x, y)
    torch.cuda.synchronize()
    assert torch.equal(x.view(torch.int16 if vec == 8 else torch.int32),
                       y.view(torch.int16 if vec == 8 else torch.int32))


def test_transpose_odd_shape_and_stream(cache):
    ck = compile_kernel(samples.shared_transpose(), cache=cache)
    x = torch.randn(37, 53, device="cuda")
    y = _poison(torch.empty(53, 37, device="cuda"))
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        ck[(cdiv(53, 32), cdiv(37, 32))](x, y)
    stream.synchronize()
    assert torch.equal(y, x.T)
    # A non-contiguous input (a transposed view) works too: scalar accesses, strides passed.
    y2 = _poison(torch.empty(37, 53, device="cuda"))
    ck[(cdiv(37, 32), cdiv(53, 32))](x.T, y2)
    torch.cuda.synchronize()
    assert torch.equal(y2, x)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_ldmatrix_against_matmul(cache, dtype):
    tg_dtype = bf16 if dtype == "bf16" else f16
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float16
    ck = compile_kernel(samples.mma_ldmatrix(tg_dtype), cache=cache)
    a = torch.randn(16, 16, device="cuda").to(tdtype)
    b = torch.randn(8, 16, device="cuda").to(tdtype)
    c = _poison(torch.empty(16, 8, device="cuda"))
    ck[1](a, b, c)
    torch.cuda.synchronize()
    ref = a.float() @ b.float().T
    torch.testing.assert_close(c, ref, rtol=1e-5, atol=1e-5)


def test_cp_async_pipeline_colsum(cache):
    ck = compile_kernel(samples.cp_async_pipeline(), cache=cache)
    for tiles in (1, 4, 5):  # odd counts exercise the guarded second stage
        x = torch.randn(64, 64 * tiles, device="cuda", dtype=torch.float16)
        y = _poison(torch.empty(64, 64, device="cuda"))
        ck[1](x, y)
        torch.cuda.synchronize()
        ref = x.float().view(64, tiles, 64).sum(1)
        torch.testing.assert_close(y, ref, rtol=1e-5, atol=1e-4)


def test_warp_shuffle_reduction_and_atomic(cache):
    ck = compile_kernel(samples.warp_sum_of_squares(), cache=cache)
    x = torch.randn(256 * 9 + 77, device="cuda", dtype=torch.float16)
    out = torch.zeros(1, device="cuda")
    ck[cdiv(x.numel(), 256)](x, out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out[0], (x.float() ** 2).sum(), rtol=1e-4, atol=1e-3)


def test_elementwise_zoo_rounding(cache):
    ck = compile_kernel(samples.elementwise_zoo(), cache=cache)
    n = 128 * 2 * 3 + 6
    x = (torch.rand(n, device="cuda") * 6 - 3).to(torch.float16)
    y = _poison(torch.empty(n, device="cuda", dtype=torch.bfloat16))
    q = torch.full((n,), 0x5A, device="cuda", dtype=torch.uint8).view(torch.float8_e4m3fn)
    alpha = 0.25
    ck[cdiv(n, 256)](x, alpha, y, q)
    torch.cuda.synchronize()
    xf = x.float()
    val = torch.where(xf > alpha, ((torch.exp(xf).half().float()) * 2).half(), (-x)).float()
    q_ref = x.float().to(torch.float8_e4m3fn)
    n_ref = torch.tanh(xf).half().float().trunc()
    inner = (q_ref.float().bfloat16().float() + n_ref.bfloat16().float()).bfloat16().float()
    y_ref = (val.bfloat16().float() + inner).bfloat16()
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8))
    # expf and torch.exp may differ by an ulp of f32, which can move an f16 rounding.
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=1e-2, atol=1e-2)


def test_large_dynamic_shared_memory(cache):
    """Over 48 KB of dynamic shared memory needs the opt-in attribute."""
    kernel = samples.shared_transpose()
    big = dataclasses.replace(kernel, name="tg_transpose_big_smem",
                              shared=kernel.shared + [SharedBuffer("unused", f32, 24 * 1024,
                                                                   8192)])
    assert big.shared_bytes > 48 * 1024
    ck = compile_kernel(big, cache=cache)
    x = torch.randn(64, 40, device="cuda")
    y = _poison(torch.empty(40, 64, device="cuda"))
    ck[(cdiv(40, 32), cdiv(64, 32))](x, y)
    torch.cuda.synchronize()
    assert torch.equal(y, x.T)


def test_cache_hit_miss_and_corrupt_rebuild(tmp_path):
    kernel = samples.vector_copy(f16, 8)
    launcher._LOADED.clear()
    first = DiskCache(tmp_path)
    ck = compile_kernel(kernel, cache=first)
    assert (first.hits, first.misses) == (0, 1)
    launcher._LOADED.clear()
    second = DiskCache(tmp_path)
    ck2 = compile_kernel(kernel, cache=second)
    assert (second.hits, second.misses) == (1, 0) and ck2.cubin == ck.cubin
    # Corrupt the entry: the next compile notices, rebuilds, and the kernel still runs.
    path = second.path(ck.key)
    path.write_bytes(path.read_bytes()[:-100])
    launcher._LOADED.clear()
    third = DiskCache(tmp_path)
    ck3 = compile_kernel(kernel, cache=third)
    assert third.rebuilt == 1 and third.misses == 1 and ck3.cubin == ck.cubin
    x = torch.randn(1024, device="cuda", dtype=torch.float16)
    y = _poison(torch.empty_like(x))
    ck3[1](x, y)
    torch.cuda.synchronize()
    assert torch.equal(x, y)


def test_launch_overhead(cache):
    """Host time per launch of a cached kernel (printed, not asserted)."""
    ck = compile_kernel(samples.vector_copy(f16, 8), cache=cache)
    x = torch.randn(1024, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    for _ in range(100):
        ck[1](x, y)
    torch.cuda.synchronize()
    n = 20000
    start = time.perf_counter()
    for _ in range(n):
        ck.launch(1, (x, y))
    host = (time.perf_counter() - start) / n * 1e6
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(n):
        y.copy_(x)
    torch_host = (time.perf_counter() - start) / n * 1e6
    torch.cuda.synchronize()
    print(f"\ntegula launch: {host:.2f} us/launch host time; torch copy_: {torch_host:.2f} us")
