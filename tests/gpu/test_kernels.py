"""Every library kernel on the GPU against torch: fresh random inputs over many shapes
(including ones that do not divide the tiles), outputs poisoned before each run, every
element checked. The kernels are launched through their `@tg.kernel`s
(`kernel[grid](*tensors, **constexprs)`), as users launch them.
"""
from __future__ import annotations

import sys
import importlib.util
import zlib
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import bf16, f16, f32, i8
from tegula.kernels.common import random_input
from tegula.kernels.copy import COPY_DTYPES, TRANSPOSE_DTYPES, copy_config, copy_kernel
from tegula.kernels.copy import transpose_config, transpose_kernel

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import bits_of, poison, storage_bits, to_device, torch_dtype  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def _load_example(name: str):
    spec = importlib.util.spec_from_file_location(f"tegula_example_{name}",
                                                  ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def rng(request):
    """Random data per test, different for every test (seeded by the test id)."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def _empty(shape, dtype):
    return poison(torch.empty(shape, dtype=torch_dtype(dtype), device="cuda"))


def _ulp_rtol(dtype) -> float:
    """Relative size of one unit in the last place of `dtype` (f32: 2^-23)."""
    return 2.0 ** -dtype.mantissa_bits


# ---------------------------------------------------------------------- DESIGN GEMM

GEMM_SHAPES = [(128, 128, 64), (256, 384, 128), (70, 50, 40), (257, 129, 72), (33, 17, 96),
               (1, 300, 64), (200, 8, 256), (31, 45, 37), (64, 64, 7)]
GEMM_CONFIGS = [dict(), dict(BM=64, BN=64, BK=32, STAGES=2), dict(BM=64, BN=128, BK=64,
                                                                  STAGES=4)]


@pytest.fixture(scope="module")
def design_gemm():
    return _load_example("gemm").gemm


@pytest.mark.parametrize("config", GEMM_CONFIGS, ids=lambda c: "-".join(
    f"{k}{v}" for k, v in c.items()) or "default")
@pytest.mark.parametrize("m,n,k", GEMM_SHAPES)
def test_design_gemm_matches_torch(design_gemm, rng, m, n, k, config):
    a = torch.randn(m, k, device="cuda").half()
    b = torch.randn(n, k, device="cuda").half()
    c = _empty((m, n), f16)
    bm, bn = config.get("BM", 128), config.get("BN", 128)
    design_gemm[(tg.cdiv(m, bm), tg.cdiv(n, bn))](a, b, c, **config)
    torch.cuda.synchronize()
    ref = a.double() @ b.double().T
    scale = a.double().abs() @ b.double().abs().T
    err = (c.double() - ref).abs()
    # f32 accumulation (a few f32 ulps of sum |a||b|), then one f16 rounding of the result.
    bound = 2.0 ** -11 * ref.abs() + 2.0 ** -20 * scale + 2.0 ** -24
    assert not torch.isnan(c).any(), "unwritten (poisoned) elements remain"
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}"


def test_design_gemm_on_strided_views(design_gemm):
    """Operands that are row slices of larger tensors (leading stride > K)."""
    big_a = torch.randn(96, 160, device="cuda").half()
    big_b = torch.randn(80, 160, device="cuda").half()
    a, b = big_a[:, 16:80], big_b[:, 32:96]
    c = _empty((96, 80), f16)
    design_gemm[(tg.cdiv(96, 64), tg.cdiv(80, 64))](a, b, c, BM=64, BN=64)
    torch.cuda.synchronize()
    ref = (a.float() @ b.float().T)
    torch.testing.assert_close(c.float(), ref, rtol=2e-3, atol=2e-3)


# ---------------------------------------------------------------------- copy / transpose

COPY_SHAPES = [(32, 64), (131, 78), (1, 1000), (67, 130), (300, 2)]


@pytest.mark.parametrize("shape", COPY_SHAPES)
@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=str)
def test_copy_every_dtype_bit_exact(rng, dtype, shape):
    if dtype.is_packed and shape[1] % 2:
        shape = (shape[0], shape[1] + 1)  # two elements per byte
    x = random_input(rng, shape, dtype, 4.0)
    tx = to_device(x, dtype)
    ty = poison(torch.empty_like(tx))
    grid, constexprs = copy_config(shape, dtype)
    copy_kernel(dtype)[grid](tx, ty, **constexprs)
    torch.cuda.synchronize()
    assert np.array_equal(bits_of(ty, dtype), storage_bits(x, dtype))


@pytest.mark.parametrize("shape", COPY_SHAPES)
@pytest.mark.parametrize("dtype", TRANSPOSE_DTYPES, ids=str)
def test_transpose_every_dtype_bit_exact(rng, dtype, shape):
    x = random_input(rng, shape, dtype, 4.0)
    tx = to_device(x, dtype)
    ty = _empty((shape[1], shape[0]), dtype)
    grid, constexprs = transpose_config(shape, dtype)
    transpose_kernel(dtype)[grid](tx, ty, **constexprs)
    torch.cuda.synchronize()
    assert np.array_equal(bits_of(ty, dtype), storage_bits(np.ascontiguousarray(x.T), dtype))


# ---------------------------------------------------------------------- SiLU(x) * y

ROW_SHAPES = [(16, 128), (37, 300), (5, 1000), (64, 4096), (3, 77), (1, 5000)]


@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("dtype", [f32, f16, bf16], ids=str)
def test_silu_mul_matches_torch(rng, dtype, shape):
    from tegula.kernels.elementwise import silu_mul_config, silu_mul_kernel
    x = torch.randn(shape, device="cuda").mul(3).to(torch_dtype(dtype))
    y = torch.randn(shape, device="cuda").to(torch_dtype(dtype))
    out = _empty(shape, dtype)
    grid, constexprs = silu_mul_config(shape)
    silu_mul_kernel(dtype)[grid](x, y, out, **constexprs)
    torch.cuda.synchronize()
    xd, yd = x.double(), y.double()
    ref = xd * torch.sigmoid(xd) * yd
    # f32 arithmetic (a few f32 ulps, exp included), then one rounding to the type.
    rtol = _ulp_rtol(dtype) + 2.0 ** -20 if dtype != f32 else 2.0 ** -20
    err = (out.double() - ref).abs()
    atol = 2.0 ** -24 if dtype == f16 else 1e-37  # the type's subnormal spacing (f16)
    assert not torch.isnan(out).any(), "unwritten (poisoned) elements remain"
    assert bool((err <= rtol * ref.abs() + atol).all()), f"max error {err.max().item():.3g}"


# ---------------------------------------------------------------------- softmax

@pytest.mark.parametrize("shape", ROW_SHAPES + [(2, 16384), (9, 129)])
@pytest.mark.parametrize("dtype", [f32, f16, bf16], ids=str)
def test_softmax_matches_torch(rng, dtype, shape):
    from tegula.kernels.softmax import softmax_config
    _check_softmax(dtype, shape, *softmax_config(shape))


# Rows well short of a power of two, on tiles of whole vectors per thread (the tuner's
# "tight" candidates), with 128 to 512 threads.
TIGHT_ROWS = [((37, 3000), dict(BM=1, BN=3072), 128), ((5, 5000), dict(BM=1, BN=6144), 256),
              ((9, 5120), dict(BM=1, BN=5120), 128), ((3, 16000), dict(BM=1, BN=16384), 512)]


@pytest.mark.parametrize("shape,constexprs,threads", TIGHT_ROWS)
@pytest.mark.parametrize("dtype", [f32, f16], ids=str)
def test_row_kernels_on_tight_tiles_match_torch(rng, dtype, shape, constexprs, threads):
    grid = (shape[0],)
    _check_softmax(dtype, shape, grid, dict(constexprs, threads=threads))
    _check_rms_norm(dtype, shape, grid, dict(constexprs, threads=threads, N=shape[1],
                                             EPS=1e-6))


def _check_softmax(dtype, shape, grid, constexprs):
    from tegula.kernels.softmax import softmax_kernel
    x = torch.randn(shape, device="cuda").mul(3).to(torch_dtype(dtype))
    y = _empty(shape, dtype)
    softmax_kernel(dtype)[grid](x, y, **constexprs)
    torch.cuda.synchronize()
    ref = torch.softmax(x.double(), dim=1)
    err = (y.double() - ref).abs()
    # f32 max/exp2/sum/reciprocal: relative ~2^-20 on large entries, a few 1e-7 absolute
    # on the tiniest (exp of large negatives); then one rounding to the output type.
    rtol = 2 * max(_ulp_rtol(dtype), 2.0 ** -20)
    assert not torch.isnan(y).any(), "unwritten (poisoned) elements remain"
    assert bool((err <= 1e-7 + rtol * ref).all()), f"max error {err.max().item():.3g}"
    torch.testing.assert_close(y.double().sum(1), torch.ones(shape[0], dtype=torch.float64,
                                                              device="cuda"),
                               rtol=0, atol=shape[1] * 2 * _ulp_rtol(dtype) + 1e-6)


# ---------------------------------------------------------------------- RMSNorm

@pytest.mark.parametrize("shape", ROW_SHAPES)
@pytest.mark.parametrize("dtype", [f32, f16, bf16], ids=str)
def test_rms_norm_matches_torch(rng, dtype, shape):
    from tegula.kernels.norm import rms_norm_config
    _check_rms_norm(dtype, shape, *rms_norm_config(shape, 1e-6))


def _check_rms_norm(dtype, shape, grid, constexprs):
    from tegula.kernels.norm import rms_norm_kernel
    eps = constexprs["EPS"]
    x = torch.randn(shape, device="cuda").mul(2).to(torch_dtype(dtype))
    w = torch.randn(1, shape[1], device="cuda").to(torch_dtype(dtype))
    y = _empty(shape, dtype)
    rms_norm_kernel(dtype)[grid](x, w, y, **constexprs)
    torch.cuda.synchronize()
    xd, wd = x.double(), w.double()
    ref = xd * torch.rsqrt((xd * xd).mean(1, keepdim=True) + eps) * wd
    err = (y.double() - ref).abs()
    rtol = 2 * max(_ulp_rtol(dtype), 2.0 ** -20)
    assert not torch.isnan(y).any(), "unwritten (poisoned) elements remain"
    assert bool((err <= 1e-6 + rtol * ref.abs()).all()), f"max error {err.max().item():.3g}"


# ---------------------------------------------------------------------- library GEMMs

LIB_GEMM_SHAPES = [(128, 128, 64), (70, 50, 40), (257, 129, 72), (33, 17, 96), (31, 45, 37),
                   (1, 200, 128)]


@pytest.mark.parametrize("shared", [True, False], ids=["pipelined", "registers"])
@pytest.mark.parametrize("m,n,k", LIB_GEMM_SHAPES)
@pytest.mark.parametrize("dtype", [f16, bf16, i8], ids=str)
def test_library_gemm_matches_torch(rng, dtype, m, n, k, shared):
    from tegula.kernels.gemm import (gemm_config, gemm_kernel, gemm_registers_kernel,
                                     output_type)
    a_np, b_np = random_input(rng, (m, k), dtype), random_input(rng, (n, k), dtype)
    a, b = to_device(a_np, dtype), to_device(b_np, dtype)
    out_t = output_type(dtype)
    c = _empty((m, n), out_t)
    grid, constexprs = gemm_config(m, n, k, dtype, shared)
    kernel = gemm_kernel(dtype) if shared else gemm_registers_kernel(dtype)
    kernel[grid](a, b, c, **constexprs)
    torch.cuda.synchronize()
    _check_library_gemm(dtype, a_np, b_np, a, b, c)


@pytest.mark.parametrize("m,n,k,split", [(70, 130, 700, 2), (16, 256, 2048, 4),
                                         (33, 200, 1100, 3), (128, 128, 64, 2)])
@pytest.mark.parametrize("dtype", [f16, bf16, i8], ids=str)
def test_split_k_gemm_matches_torch(rng, dtype, m, n, k, split):
    """K split 2-4 ways into a poisoned workspace, then reduced: every k-tile counted
    once (K = 64, one k-tile, split 2 ways leaves the second split only a tile past K)."""
    from tegula.kernels import gemm
    a_np, b_np = random_input(rng, (m, k), dtype), random_input(rng, (n, k), dtype)
    a, b = to_device(a_np, dtype), to_device(b_np, dtype)
    acc_t, out_t = gemm.accumulator_type(dtype), gemm.output_type(dtype)
    bm, bk = (64, 128) if dtype == i8 else (64, 64)
    rows = gemm.split_k_rows(m, bm)
    partial, c = _empty((split * rows, n), acc_t), _empty((m, n), out_t)
    gemm.gemm_split_k_kernel(dtype)[(tg.cdiv(m, bm), tg.cdiv(n, 128), split)](
        a, b, partial, BM=bm, BN=128, BK=bk, STAGES=4, SPLIT=split)
    gemm.split_k_reduce_kernel(dtype)[gemm.split_k_reduce_grid(m, n)](
        partial, c, ROWS=rows, SPLIT=split)
    torch.cuda.synchronize()
    _check_library_gemm(dtype, a_np, b_np, a, b, c)


def _check_library_gemm(dtype, a_np, b_np, a, b, c):
    from tegula.kernels.gemm import output_type
    out_t = output_type(dtype)
    if dtype == i8:  # exact: i32 accumulation of i8 products
        ref = a_np.astype(np.int64) @ b_np.astype(np.int64).T
        assert np.array_equal(bits_of(c, out_t).view(np.int32), ref.astype(np.int32))
        return
    ref = a.double() @ b.double().T
    scale = a.double().abs() @ b.double().abs().T
    bound = _ulp_rtol(dtype) * ref.abs() + 2.0 ** -20 * scale + 2.0 ** -24
    err = (c.double() - ref).abs()
    assert not torch.isnan(c).any(), "unwritten (poisoned) elements remain"
    assert bool((err <= bound).all()), f"max error {err.max().item():.3g}"
