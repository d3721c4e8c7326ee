"""TMA tensor maps on CPU: the hardware's rules checked in Python with errors naming the
tensor, the bounded encode cache, and a TensorMapParam flattened and packed as 128 bytes at
a 64-byte-aligned address (the driver's encode is replaced by a recording fake)."""
from __future__ import annotations

import struct

import pytest

from tegula.codegen import param_list
from tegula.codegen.samples import vector_copy
from tegula.dtypes import bf16, f16, f32, i4, u8
from tegula.errors import LaunchError, TegulaError
from tegula.lower.async_ir import TensorMapParam
from tegula.lower.thread_ir import ScalarParam, TensorParam, ThreadKernel
from tegula.runtime import ArgumentPlan, CompiledKernel, PreparedLaunch, launcher
from tegula.runtime.tensor_map import TensorMapCache, tensor_map_fields

BASE = 0x7F00_0000_0000  # a 16-byte (and 1024-byte) aligned fake device address


def fields(**changes):
    """tensor_map_fields of a 2-D f16 row-major (300, 200) tensor, 64x64 box, with changes."""
    args = dict(name="a", ptr=BASE, dtype=f16, shape=(300, 200), strides=(200, 1),
                dims=(1, 0), box=(64, 64), swizzle=128)
    args.update(changes)
    return tensor_map_fields(**args)


def test_fields_are_innermost_first_with_byte_strides():
    assert fields() == ((200, 300), (400,))
    # A 3-D tensor whose contiguous dim is the middle one (a permuted view).
    extents, strides = fields(shape=(5, 24, 7), strides=(24 * 7, 1, 24), dims=(1, 2, 0),
                              box=(8, 7, 1), swizzle=0)
    assert extents == (24, 7, 5) and strides == (48, 336)


@pytest.mark.parametrize("changes,words", [
    (dict(ptr=BASE + 8), ["'a'", "0x7f0000000008", "16-byte aligned"]),
    (dict(shape=(300, 201), strides=(201, 1)), ["'a'", "402 bytes", "multiple of 16"]),
    (dict(strides=(1, 300), dims=(1, 0)), ["'a'", "dimension 1 must have stride 1"]),
    (dict(box=(64, 257)), ["'a'", "box (64, 257)", "1 to 256"]),
    (dict(box=(128, 64)), ["'a'", "256 bytes", "128-byte swizzle"]),
    (dict(box=(64, 64), swizzle=64), ["'a'", "128 bytes", "64-byte swizzle"]),
    (dict(box=(4, 64), swizzle=0), ["'a'", "8 bytes", "multiple of 16"]),
    (dict(swizzle=96), ["'a'", "swizzle must be one of"]),
    (dict(shape=(2,) * 6, strides=(32, 16, 8, 4, 2, 1), dims=tuple(range(5, -1, -1)),
          box=(8,) * 6), ["'a'", "1 to 5 dimensions, got 6"]),
    (dict(dims=(0,), box=(64,)), ["'a'", "must order all 2 dimensions"]),
    (dict(box=(64,)), ["'a'", "one extent per dimension"]),
    (dict(dtype=i4), ["'a'", "cannot copy i4"]),
    (dict(strides=(0, 1)), ["'a'", "stride 0", "positive strides"]),
    (dict(shape=(0, 200)), ["'a'", "1 to 2^32"]),
])
def test_what_the_hardware_refuses_is_a_clear_error(changes, words):
    with pytest.raises(LaunchError) as info:
        fields(**changes)
    assert isinstance(info.value, TegulaError)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


def test_size_one_dims_take_any_stride():
    # torch gives a (1, 7) slice of a (5, 7) f16 tensor strides (7, 1): 14 bytes apart, which
    # TMA could not encode, but the only index of dim 0 is 0, so the stride is irrelevant.
    extents, strides = fields(shape=(1, 8), strides=(7, 1), box=(8, 1), swizzle=0)
    assert extents == (8, 1) and strides[0] % 16 == 0 and strides[0] >= 16


class RecordingEncoder:
    """Stands in for `encode_tensor_map`: records calls, returns distinct 128-byte maps."""

    def __init__(self):
        self.calls = []

    def __call__(self, ptr, dtype, shape, strides, dims, box, swizzle, name="tensor"):
        tensor_map_fields(name, ptr, dtype, shape, strides, dims, box, swizzle)
        self.calls.append((ptr, shape, strides, box, swizzle))
        return len(self.calls).to_bytes(8, "little") * 16


def test_cache_encodes_once_per_distinct_key_and_stays_bounded():
    encoder = RecordingEncoder()
    cache = TensorMapCache(capacity=3, encode=encoder)
    get = lambda ptr, box=(64, 64), sw=128: cache.get(  # noqa: E731
        ptr, f16, (300, 200), (200, 1), (1, 0), box, sw)
    first = get(BASE)
    assert get(BASE) is first and len(encoder.calls) == 1
    assert get(BASE, box=(32, 64)) != first and len(encoder.calls) == 2
    assert get(BASE, sw=64, box=(32, 64)) and len(encoder.calls) == 3
    get(BASE + 1024)
    assert len(encoder.calls) == 4 and len(cache) == 3  # the oldest was dropped
    get(BASE)
    assert len(encoder.calls) == 5  # ... and is encoded again when needed
    with pytest.raises(LaunchError):
        get(BASE + 8)
    assert len(cache) == 3  # a refused map is not cached


def tma_kernel() -> ThreadKernel:
    """x: f16 (M, K) read through a map placed between its tensor and a scalar; y: f32
    written through a second map at the end (no body: only the signature matters here)."""
    x, y = TensorParam("x", f16, 2), TensorParam("y", f32, 2, writes=True)
    params = [x, TensorMapParam("x_map", "x", f16, (1, 0), (64, 64), 128),
              ScalarParam("alpha", f32), y,
              TensorMapParam("y_map", "y", f32, (1, 0), (32, 16), 128)]
    return ThreadKernel("tma_sig", 128, params, [], [], [])


class FakeCudaArray:
    def __init__(self, shape, typestr, ptr):
        self.__cuda_array_interface__ = {"shape": tuple(shape), "typestr": typestr,
                                         "data": (ptr, False), "version": 3, "strides": None}


def plan_and_args(encoder):
    plan = ArgumentPlan(tma_kernel(), tensor_maps=TensorMapCache(encode=encoder))
    args = [FakeCudaArray((100, 72), "<f2", BASE), 2.5,
            FakeCudaArray((100, 48), "<f4", BASE + 0x10000)]
    return plan, args


def test_plan_takes_tensors_and_scalars_and_inserts_each_map_at_its_slot():
    encoder = RecordingEncoder()
    plan, args = plan_and_args(encoder)
    assert [p.name for p in plan.params] == ["x", "alpha", "y"]  # maps are not arguments
    values, _ = plan.flatten(args)
    specs = param_list(tma_kernel())
    assert len(values) == len(specs)
    named = dict(zip([s.name for s in specs], values))
    assert named["x"] == BASE and named["y"] == BASE + 0x10000 and named["alpha"] == 2.5
    assert named["x_shape0"] == 100 and named["y_stride0"] == 48
    assert encoder.calls == [(BASE, (100, 72), (72, 1), (64, 64), 128),
                             (BASE + 0x10000, (100, 48), (48, 1), (32, 16), 128)]
    assert named["x_map"] == (1).to_bytes(8, "little") * 16
    assert named["y_map"] == (2).to_bytes(8, "little") * 16
    plan.flatten(args)
    assert len(encoder.calls) == 2  # a second launch with the same tensors encodes nothing


def test_map_errors_name_the_tensor_at_launch():
    plan, args = plan_and_args(RecordingEncoder())
    args[0] = FakeCudaArray((100, 71), "<f2", BASE)  # rows 142 bytes apart
    with pytest.raises(LaunchError, match=r"'x \(x_map\)'.*142 bytes.*multiple of 16"):
        plan.flatten(args)


def test_a_map_of_another_dtype_or_an_unknown_tensor_is_refused():
    kernel = tma_kernel()
    kernel.params[1] = TensorMapParam("x_map", "x", bf16, (1, 0), (64, 64), 128)
    with pytest.raises(LaunchError, match="x_map.*bf16.*'x' is f16"):
        ArgumentPlan(kernel)
    kernel.params[1] = TensorMapParam("x_map", "w", f16, (1, 0), (64, 64), 128)
    with pytest.raises(LaunchError, match="x_map.*'w'.*not a tensor parameter"):
        ArgumentPlan(kernel)


def compiled(kernel, encoder):
    ck = CompiledKernel(kernel, b"", "", "sm_90a")
    ck.plan.map_cache = TensorMapCache(encode=encoder)
    return ck


def test_packing_puts_each_map_128_bytes_at_a_64_byte_aligned_address():
    encoder = RecordingEncoder()
    ck = compiled(tma_kernel(), encoder)
    plan, args = plan_and_args(encoder)
    values, _ = ck.plan.flatten(args)
    ck._args.pack(values)  # what launch_raw does
    # ... and what a prepared launch has in its own buffer (another order: changing first).
    prepared = PreparedLaunch(ck, values, device=0)
    for buffer in (ck._args, prepared.buffer):
        for slot, spec in enumerate(param_list(tma_kernel())):
            if spec.kind == "tensormap":
                assert buffer.pointers[slot] % 64 == 0
            assert buffer.value_bytes(slot, spec.size) == struct.pack("<" + spec.fmt,
                                                                       values[slot])


def test_prepared_launch_reencodes_only_new_pointers(monkeypatch):
    encoder = RecordingEncoder()
    ck = compiled(tma_kernel(), encoder)
    _, args = plan_and_args(encoder)
    launched = []  # the parameter values each launch hands the driver, by name

    def send(gx, gy, gz, device, handle, params):
        assert params is prepared.buffer
        launched.append({spec.name: prepared.buffer.value_bytes(slot, spec.size)
                         for slot, spec in enumerate(ck.params)})

    monkeypatch.setattr(ck, "send", send)
    values, _ = ck.plan.flatten(args)
    prepared = PreparedLaunch(ck, values, device=0)
    assert len(encoder.calls) == 2
    prepared((1, 1, 1), args, [BASE, None, BASE + 0x10000], stream=0)
    assert len(encoder.calls) == 2  # same pointers: cache hits
    prepared((1, 1, 1), args, [BASE + 0x100000, None, BASE + 0x10000], stream=0)
    assert len(encoder.calls) == 3 and encoder.calls[-1][0] == BASE + 0x100000
    last = launched[-1]
    assert last["x"] == struct.pack("<Q", BASE + 0x100000)
    assert last["y"] == struct.pack("<Q", BASE + 0x10000)
    assert last["x_map"] == (3).to_bytes(8, "little") * 16
    assert last["y_map"] == (2).to_bytes(8, "little") * 16
    assert last["alpha"] == struct.pack("<f", 2.5) and last["x_shape1"] == struct.pack("<i", 72)
    args[1] = "2.5"  # a scalar is re-checked on each replay
    with pytest.raises(LaunchError, match="alpha"):
        prepared((1, 1, 1), args, [BASE, None, BASE + 0x10000], stream=0)
    args[1] = 2.5
    with pytest.raises(LaunchError, match=r"'x \(x_map\)'.*16-byte aligned"):
        prepared((1, 1, 1), args, [BASE + 0x100008, None, BASE + 0x10000], stream=0)


def test_an_empty_tensor_launches_nothing_and_refuses_a_non_empty_grid(monkeypatch):
    encoder = RecordingEncoder()
    ck = compiled(tma_kernel(), encoder)
    args = [FakeCudaArray((0, 64), "<f2", BASE), 1.0,
            FakeCudaArray((0, 48), "<f4", BASE + 0x10000)]
    ck.launch((0, 1), args)  # an empty grid: nothing to do, nothing encoded
    assert encoder.calls == []
    monkeypatch.setattr(launcher, "_stream_handle", lambda stream, device: 0)
    monkeypatch.setattr(launcher.drv, "current_device", lambda: 0)
    with pytest.raises(LaunchError, match="'x' is empty.*x_map"):
        ck.launch((1, 1), args)


def test_kernels_without_maps_are_unchanged():
    plan = ArgumentPlan(vector_copy(u8, 16))
    assert plan.map_slots == []
    values, _ = plan.flatten([FakeCudaArray((64,), "|u1", BASE),
                              FakeCudaArray((64,), "|u1", BASE + 64)])
    assert values == [BASE, 64, 1, BASE + 64, 64, 1]


def reaches_the_driver(call):
    """Run a cuda-bindings call and check its arguments were accepted: the bindings convert
    them before loading libcuda, so without a driver the call fails at loading it (with a
    driver it succeeds or returns an error code) — never with a conversion TypeError."""
    try:
        return call()
    except TypeError as e:
        pytest.fail(f"the bindings refused the arguments: {e}")
    except Exception as e:  # noqa: BLE001 — no libcuda on this machine
        assert "cuda" in str(e).lower(), e
        return None


def test_encode_hands_the_bindings_types_they_accept():
    # Plain ints for rank, extents, strides and box were refused on the H100 ("Cannot
    # convert int to cuuint32_t"); this fails the same way on a machine with no GPU.
    pytest.importorskip("cuda.bindings.driver")
    from tegula.runtime.tensor_map import driver_encode
    blob = reaches_the_driver(lambda: driver_encode(BASE, f16, (200, 300), (400,), (64, 64),
                                                    128, "a"))
    assert blob is None or len(blob) == 128


def test_a_rank_1_map_hands_the_driver_a_non_empty_stride_list(monkeypatch):
    # The bindings turn an empty list into a null pointer and the driver refuses a rank-1
    # encode with INVALID_VALUE (measured on an H100, 2026-11-24); it reads no stride for
    # rank 1, so one unread entry is passed.
    driver = pytest.importorskip("cuda.bindings.driver")
    import ctypes

    from tegula.runtime import tensor_map as tm
    seen = {}
    storage = ctypes.create_string_buffer(128)

    class FakeMap:
        def getPtr(self):
            return ctypes.addressof(storage)

    def encode(*args):
        seen["strides"] = list(args[4])
        return (driver.CUresult.CUDA_SUCCESS, FakeMap())

    monkeypatch.setattr(driver, "cuTensorMapEncodeTiled", encode)
    blob = tm.driver_encode(BASE, f16, (128,), (), (128,), 0, "y")
    assert len(blob) == 128 and len(seen["strides"]) == 1
    tm.driver_encode(BASE, f16, (200, 300), (400,), (64, 64), 128, "a")
    assert [int(s) for s in seen["strides"]] == [400]
