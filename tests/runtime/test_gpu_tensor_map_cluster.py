"""On a Hopper GPU: real tensor-map encodes (the driver accepts what `tensor_map_fields`
accepts and refuses what it refuses) and a real cluster launch of a trivial kernel, every
output element checked.

Run with `pytest -m gpu tests/runtime` on an sm_90 machine with torch (CUDA) and
cuda-bindings.
"""
from __future__ import annotations

import dataclasses

import pytest

from tegula.codegen import samples
from tegula.dtypes import bf16, f16, f32, u8
from tegula.errors import LaunchError
from tegula.runtime import DiskCache, compile_kernel, launcher
from tegula.runtime.tensor_map import driver_encode, encode_tensor_map

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available()
                       or torch.cuda.get_device_capability()[0] < 9, reason="needs sm_90+"),
]


@pytest.mark.parametrize("dtype,tdtype", [(f16, torch.float16), (bf16, torch.bfloat16),
                                          (f32, torch.float32), (u8, torch.uint8)])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_real_encode_of_a_torch_tensor(dtype, tdtype, swizzle):
    x = torch.empty(300, 208, dtype=tdtype, device="cuda")  # rows of 416/832/208 bytes
    inner = (swizzle or 64) // x.element_size()
    blob = encode_tensor_map(x.data_ptr(), dtype, tuple(x.shape), tuple(x.stride()), (1, 0),
                             (inner, 64), swizzle, name="x")
    assert len(blob) == 128 and any(blob)
    # Another box is another map.
    other = encode_tensor_map(x.data_ptr(), dtype, tuple(x.shape), tuple(x.stride()), (1, 0),
                              (inner, 32), swizzle, name="x")
    assert other != blob


@pytest.mark.parametrize("fields", [
    dict(offset=8),                          # base not 16-byte aligned
    dict(byte_strides=(402,)),               # stride not a multiple of 16
    dict(box=(64, 257)),                     # box extent over 256
    dict(box=(128, 64), swizzle=128),        # inner box 256 B > 128 B swizzle span
    dict(box=(4, 64), swizzle=0),            # inner box 8 B, not a multiple of 16
])
def test_the_driver_refuses_what_tegula_refuses(fields):
    """Each rule `tensor_map_fields` checks is one the driver really enforces (so the
    Python check never refuses a map the hardware would take, for these rules)."""
    x = torch.empty(300, 256, dtype=torch.float16, device="cuda")
    args = dict(offset=0, byte_strides=(512,), box=(64, 64), swizzle=128)
    args.update(fields)
    with pytest.raises(LaunchError, match="cuTensorMapEncodeTiled"):
        driver_encode(x.data_ptr() + args["offset"], f16, (256, 300), args["byte_strides"],
                      args["box"], args["swizzle"])
    good = dict(offset=0, byte_strides=(512,), box=(64, 64), swizzle=128)
    assert len(driver_encode(x.data_ptr(), f16, (256, 300), good["byte_strides"],
                             good["box"], good["swizzle"])) == 128


@pytest.fixture
def cache(tmp_path):
    launcher._LOADED.clear()
    return DiskCache(tmp_path)


def test_cluster_launch_of_a_trivial_kernel(cache):
    kernel = dataclasses.replace(samples.vector_copy(f32, 4), cluster=(2, 1, 1))
    ck = compile_kernel(kernel, target="sm_90a", cache=cache)
    n = 128 * 4 * 6 + 12  # a partial last block; grid 8 = 4 clusters of 2
    x = torch.randn(n, device="cuda")
    y = torch.full_like(x, float("nan"))
    ck[8](x, y)
    torch.cuda.synchronize()
    assert torch.equal(x, y)
    with pytest.raises(LaunchError, match="not a multiple of the kernel's cluster"):
        ck[7](x, y)
