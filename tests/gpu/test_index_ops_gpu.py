"""On the GPU: tile coordinates, broadcasts, kernel scalars in tile arithmetic and
argmax/argmin give the emulator's bytes exactly — except that an f32 multiply-add may be
contracted into an FMA (`gpu_helpers.assert_matches_emulator` says by how much) — and the
arg reductions agree with torch.argmax/argmin (NaN counted as the maximum and the minimum,
first index on ties) on the same data."""
from __future__ import annotations

import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula.dtypes import bf16, f16, f32, i8, i32

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "emulate"))
from gpu_helpers import assert_matches_emulator, poison, to_device, torch_dtype  # noqa: E402
from index_kernels import (arg_case, broadcast_case, causal_mask_case,  # noqa: E402
                           indices_case, looped_argmax, scalar_operands_case,
                           special_values)


@pytest.fixture
def rng(request):
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


def run_both(case, fma_scales=()):
    """Emulate the case and launch it on the GPU on the same inputs; each output must equal
    the numpy reference in the emulator and the emulator's bits on the GPU (within FMA
    contraction where `fma_scales` names an output's magnitude bound). Returns the device
    arguments."""
    kernel, grid, inputs, outputs, constexprs, refs = case
    values = inputs + outputs
    tensors = [p for p in kernel.params if p.kind in ("tensor", "scalar")]
    device_args, pairs = [], []
    for param, value in zip(tensors, values):
        if param.kind == "scalar":
            device_args.append(value)
            continue
        dt = param.spec.dtype
        tensor = to_device(value, dt)
        if any(value is o for o in outputs):
            poison(tensor)
            pairs.append((value, tensor, dt))
        device_args.append(tensor)
    tg.emulate(kernel, grid, *values, **constexprs)
    kernel[grid](*device_args, **constexprs)
    torch.cuda.synchronize()
    scales = list(fma_scales) + [None] * (len(pairs) - len(fma_scales))
    for k, ((host, tensor, dt), ref, scale) in enumerate(zip(pairs, refs, scales)):
        assert np.array_equal(host, ref)   # (no output of these cases is NaN)
        assert_matches_emulator(host, tensor, dt, fma_scale=scale, what=f"output {k}")
    return device_args


@pytest.mark.parametrize("shape,threads,BM,BN", [((50, 70), 128, 16, 64), ((7, 5), 128, 4, 8),
                                                 ((33, 130), 96, 16, 32)])
def test_masks_and_coordinates_match_the_emulator(rng, shape, threads, BM, BN):
    run_both(causal_mask_case(rng, shape, threads, BM, BN))
    run_both(indices_case(rng, shape, threads, BM, BN))


def test_broadcasts_and_scalar_operands_match_the_emulator(rng):
    case = broadcast_case(rng, (37, 100), 64, 8, 128)
    x, w, b = case[2]
    # out = x * w + b - rowmax(x): the CUDA may fuse x * w + b (1-2 ulps of the result seen
    # on an H100); the products and partial sums are bounded by |x w| + |b| + |rowmax|.
    bound = np.abs(x * w[None, :]) + np.abs(b[:, None]) + np.abs(x.max(axis=1))[:, None]
    run_both(case, fma_scales=[bound])
    run_both(scalar_operands_case(rng, 20, 37))


@pytest.mark.parametrize("dtype", [f32, f16, bf16, i8], ids=str)
@pytest.mark.parametrize("kind", ["argmax", "argmin"])
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("shape,threads,BM,BN", [((50, 70), 128, 16, 32),
                                                 ((40, 96), 256, 32, 32), ((5, 7), 128, 2, 8)])
def test_arg_reductions_match_torch_and_the_emulator(rng, dtype, kind, axis, shape, threads,
                                                     BM, BN):
    case = arg_case(rng, shape, kind, axis, dtype, threads, BM, BN)
    x_dev, out_dev = run_both(case)
    fn = getattr(torch, kind)
    x_dev = x_dev if dtype != i8 else x_dev.to(torch.int32)
    grid = case[1]
    if axis == 1:
        expected = torch.stack([fn(x_dev[:, n * BN:(n + 1) * BN], dim=1) + n * BN
                                for n in range(grid[1])], dim=1)
    else:
        expected = torch.stack([fn(x_dev[m * BM:(m + 1) * BM], dim=0) + m * BM
                                for m in range(grid[0])], dim=0)
    assert torch.equal(out_dev.to(torch.int64), expected.to(torch.int64))
    assert torch_dtype(i32) == out_dev.dtype


def test_looped_argmax_matches_torch(rng):
    x = special_values(rng, (9, 1000), f32)
    x[1, 5:] = np.nan
    out = torch.full((9, 1), -1, dtype=torch.int32, device="cuda")
    x_dev = to_device(x, f32)
    looped_argmax[(tg.cdiv(9, 4),)](x_dev, out)
    torch.cuda.synchronize()
    assert torch.equal(out[:, 0].long(), torch.argmax(x_dev, dim=1))
