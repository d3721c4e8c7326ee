"""Launch-argument checking, flattening, packing and specialization facts (CPU only: the
tensors here are fakes exposing `__cuda_array_interface__`)."""
from __future__ import annotations

import struct

import numpy as np
import pytest

from tegula.codegen import param_list
from tegula.codegen.samples import elementwise_zoo, mma_ldmatrix, shared_transpose, vector_copy
from tegula.dtypes import f16, f32
from tegula.errors import LaunchError
from tegula.runtime import (
    ArgumentPlan, CompiledKernel, TensorRequirement, divisibility, param_layout,
    specialization_key,
)


class FakeCudaArray:
    """A stand-in for a device array: only the CUDA array interface."""

    def __init__(self, shape, typestr="<f2", ptr=0x7F0000000000, strides=None):
        itemsize = int(typestr[2:])
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (ptr, False), "version": 3,
            "strides": None if strides is None else tuple(s * itemsize for s in strides)}


def test_flatten_matches_param_list():
    kernel = mma_ldmatrix()
    plan = ArgumentPlan(kernel)
    a = FakeCudaArray((16, 16), ptr=0x1000)
    b = FakeCudaArray((8, 16), ptr=0x2000)
    c = FakeCudaArray((16, 8), "<f4", ptr=0x3000)
    values, device = plan.flatten([a, b, c])
    names = [p.name for p in param_list(kernel)]
    assert dict(zip(names, values)) == {
        "a": 0x1000, "a_shape0": 16, "a_shape1": 16, "a_stride0": 16, "a_stride1": 1,
        "b": 0x2000, "b_shape0": 8, "b_shape1": 16, "b_stride0": 16, "b_stride1": 1,
        "c": 0x3000, "c_shape0": 16, "c_shape1": 8, "c_stride0": 8, "c_stride1": 1}
    assert device < 0  # unknown: the launcher uses the current device


def test_packing_layout_aligns_each_value():
    kernel = elementwise_zoo()
    specs = param_list(kernel)
    packer, offsets = param_layout(specs)
    # x (8) shape0 (4) pad (4) stride0 (8) alpha (4) pad (4) y (8) ...
    assert offsets[:6] == [0, 8, 16, 24, 32, 40]
    for spec, off in zip(specs, offsets):
        assert off % spec.size == 0
    values = [0x10, 7, 7, 1.5, 0x20, 7, 7, 0x30, 7, 7]
    blob = packer.pack(*values)
    assert struct.unpack_from("<q", blob, 16)[0] == 7
    assert struct.unpack_from("<f", blob, 24)[0] == 1.5


def test_errors_name_the_argument():
    plan = ArgumentPlan(vector_copy(f16, 8))
    good = FakeCudaArray((64,))
    with pytest.raises(LaunchError, match="takes 2 arguments"):
        plan.flatten([good])
    with pytest.raises(LaunchError, match="argument 'y' has dtype <f4"):
        plan.flatten([good, FakeCudaArray((64,), "<f4")])
    with pytest.raises(LaunchError, match="argument 'x' has rank 2"):
        plan.flatten([FakeCudaArray((8, 8)), good])
    with pytest.raises(LaunchError, match="argument 'x': data pointer 0x7f0000000008 is not "
                                          "16-byte aligned"):
        plan.flatten([FakeCudaArray((64,), ptr=0x7F0000000008), good])
    with pytest.raises(LaunchError, match="dimension 0 must have stride 1"):
        plan.flatten([FakeCudaArray((64,), strides=(2,)), good])
    with pytest.raises(LaunchError, match="must be a tensor"):
        plan.flatten([3, good])
    zoo = ArgumentPlan(elementwise_zoo())
    x, y, q = FakeCudaArray((4,)), FakeCudaArray((4,), "<f2"), FakeCudaArray((4,), "|u1")
    with pytest.raises(LaunchError, match="argument 'alpha' must be a number"):
        zoo.flatten([x, "1", y, q])


def test_requirements_can_be_overridden():
    """A kernel that reads with scalar accesses accepts any strides and alignment."""
    plan = ArgumentPlan(shared_transpose())
    x = FakeCudaArray((5, 7), "<f4", ptr=0x1004, strides=(1, 5))  # a transposed view
    y = FakeCudaArray((7, 5), "<f4", ptr=0x2004)
    values, _ = plan.flatten([x, y])
    assert values[3:5] == [1, 5]
    strict = ArgumentPlan(shared_transpose(), {"x": TensorRequirement(16, 1)})
    with pytest.raises(LaunchError, match="not 16-byte aligned"):
        strict.flatten([x, y])


def test_float_scalars_are_rounded_to_their_dtype():
    from tegula.dtypes import bf16
    from tegula.lower.thread_ir import ScalarParam, ThreadKernel
    kernel = ThreadKernel("k", 32, [ScalarParam("s", bf16), ScalarParam("n", f32)], [], [], [])
    values, _ = ArgumentPlan(kernel).flatten([1.0 + 2**-9, 0.1])
    assert values == [1.0, 0.1]


@pytest.mark.parametrize("value,accepted", [
    (7, 7), (np.int64(-3), -3), (np.uint8(200), 200),
    (2.7, None), (np.float32(2.0), None), (True, None), ("3", None), (2**31, None)])
def test_int_scalars_take_ints_only(value, accepted):
    """A float is refused rather than truncated; numpy integers are ints."""
    from tegula.dtypes import i32
    from tegula.lower.thread_ir import ScalarParam, ThreadKernel
    plan = ArgumentPlan(ThreadKernel("k", 32, [ScalarParam("n", i32)], [], [], []))
    if accepted is None:
        with pytest.raises(LaunchError, match="argument 'n'"):
            plan.flatten([value])
    else:
        values, _ = plan.flatten([value])
        assert values == [accepted] and type(values[0]) is int


def test_divisibility_and_specialization_key():
    assert [divisibility(x) for x in (0, 1, 2, 24, 32, 48, 7)] == [16, 1, 2, 8, 16, 16, 1]
    a = FakeCudaArray((64, 24), ptr=0x1000)
    b = FakeCudaArray((64, 24), ptr=0x1008)
    ka, kb = specialization_key([a, 5, 1.0]), specialization_key([b, 5, 1.0])
    assert ka[0] == ("tensor", 16, (16, 8), (8, 1), (1,))
    assert ka[1] == ("int", 1, False)
    assert ka[2] == ("float",)
    assert ka != kb and kb[0][1] == 8
    assert specialization_key([1])[0] == ("int", 1, True)


def test_compiled_kernel_without_gpu_packs(tmp_path):
    """A CompiledKernel can be built (and its packing checked) without a GPU."""
    kernel = vector_copy(f32, 4)
    ck = CompiledKernel(kernel, b"\x7fELF", "source", "sm_90a")
    values, _ = ck.plan.flatten([FakeCudaArray((16,), "<f4"), FakeCudaArray((16,), "<f4", ptr=0x7F0000001000)])
    blob = ck.pack(values)
    assert len(blob) == ck._args.struct.size == 48
    assert ck[(1,)] is not None


def test_torch_arguments_are_checked():
    torch = pytest.importorskip("torch")
    plan = ArgumentPlan(vector_copy(f16, 8))
    x = torch.zeros(64, dtype=torch.float16)
    with pytest.raises(LaunchError, match="argument 'x' is on cpu, not a CUDA device"):
        plan.flatten([x, x])
    assert specialization_key([x[1:]])[0][1] == 2  # an f16 view one element in
