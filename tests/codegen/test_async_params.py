"""Tensor-map parameters: how `param_list` describes them and where the launcher packs them.

A `CUtensorMap` is 128 bytes aligned to 64 inside the kernel's parameter buffer. The
launcher packs values at the offsets the compiler gives them, so aligning the map to its
size (128) instead of 64 would put its bytes where the kernel does not read them."""
from __future__ import annotations

from tegula.codegen import param_list
from tegula.dtypes import f16
from tegula.lower.async_ir import TensorMapParam
from tegula.lower.thread_ir import ScalarParam, TensorParam, ThreadKernel
from tegula.runtime.launcher import param_layout


def _kernel() -> ThreadKernel:
    params = [TensorParam("a", f16, 2, index_bits=32),
              TensorMapParam("a_map", "a", f16, dims=(1, 0), box=(64, 64), swizzle=128),
              ScalarParam("alpha", f16)]
    return ThreadKernel("k", 128, params, [], [], [])


def test_tensor_map_param_spec():
    specs = param_list(_kernel())
    assert [s.kind for s in specs] == ["pointer", "shape", "shape", "stride", "stride",
                                       "tensormap", "scalar"]
    tmap = specs[5]
    assert (tmap.name, tmap.source, tmap.size, tmap.fmt, tmap.alignment) == \
        ("a_map", "a", 128, "128s", 64)
    assert tmap.declaration == "const __grid_constant__ tg_tensor_map a_map"


def test_tensor_map_packed_at_64_byte_alignment():
    # pointer 0..8, two int extents 8..16, two int strides 16..24: the map goes to 64
    # (the next multiple of 64), not 128, and the scalar right after it.
    layout, offsets = param_layout(param_list(_kernel()))
    assert offsets == [0, 8, 12, 16, 20, 64, 192]
    assert layout.size == 196
