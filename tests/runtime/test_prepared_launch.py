"""A replayed launch (`PreparedLaunch`) hands the driver exactly the bytes a full launch
with the same arguments would: its own buffer holds the changing values first and the
extents and strides packed once, so every slot is compared with a fresh flatten, on
kernels with pointers only, with scalars, with 64-bit strides, and with tensor maps."""
from __future__ import annotations

import dataclasses
import struct

import pytest

from tegula.codegen.samples import elementwise_zoo, mma_ldmatrix, shared_transpose
from tegula.dtypes import f16, u8
from tegula.errors import LaunchError
from tegula.lower.thread_ir import TensorParam
from tegula.runtime import CompiledKernel, PreparedLaunch, launcher

from .test_tensor_map import BASE, FakeCudaArray, RecordingEncoder, tma_kernel
from tegula.runtime.tensor_map import TensorMapCache


def with_scalar(index_bits=64):
    """A signature with a scalar between tensors (elementwise_zoo's, its outputs retyped
    to what `__cuda_array_interface__` can describe: only the signature matters here), with
    64-bit or 32-bit strides (the two parameter layouts)."""
    kernel = elementwise_zoo()
    params = [dataclasses.replace(p, dtype=f16 if p.name == "y" else u8,
                                  index_bits=index_bits) if p.name in ("y", "q") else
              dataclasses.replace(p, index_bits=index_bits) if isinstance(p, TensorParam)
              else p for p in kernel.params]
    return dataclasses.replace(kernel, params=params)


def arrays(kernel, base):
    """One argument per parameter: (37, 53)-ish arrays at distinct 64 KiB-aligned addresses
    for tensors (shape by rank), a number for scalars."""
    typestr = {"f16": "<f2", "f32": "<f4", "u8": "|u1"}
    out = []
    for i, p in enumerate(launcher.ArgumentPlan(kernel).params):
        if isinstance(p, TensorParam):
            shape = (37, 56)[:p.rank] if p.rank == 2 else (4000,)
            out.append(FakeCudaArray(shape, typestr[p.dtype.name], base + i * 0x10000))
        else:
            out.append(0.75)
    return out


class Recorder:
    """Stands in for CompiledKernel.send: every launch's parameter bytes, per slot."""

    def __init__(self, ck):
        self.ck, self.launches = ck, []

    def __call__(self, gx, gy, gz, device, handle, params):
        pointers = (launcher.ctypes.c_void_p * len(self.ck.params)).from_address(params.address_value)
        self.launches.append(((gx, gy, gz), device, handle,
                              [launcher.ctypes.string_at(pointers[slot], spec.size)
                               for slot, spec in enumerate(self.ck.params)]))


def expected_bytes(ck, values):
    return [struct.pack("<" + spec.fmt, v) for spec, v in zip(ck.params, values)]


@pytest.mark.parametrize("make", [shared_transpose, mma_ldmatrix, with_scalar,
                                  lambda: with_scalar(32), tma_kernel])
def test_a_replay_sends_what_a_full_launch_would(make, monkeypatch):
    kernel = make()
    ck = CompiledKernel(kernel, b"", "", "sm_90a")
    ck.plan.map_cache = TensorMapCache(encode=RecordingEncoder())
    recorder = Recorder(ck)
    monkeypatch.setattr(ck, "send", recorder)
    monkeypatch.setattr(launcher, "_CURRENT_STREAM", [lambda device: 0x5000 + device])
    first = arrays(kernel, BASE)
    values, _ = ck.plan.flatten(first)
    prepared = PreparedLaunch(ck, values, device=1)
    for round_, base in enumerate([BASE, BASE + 0x100000, BASE + 0x200000]):
        args = arrays(kernel, base)
        pointers = [getattr(a, "__cuda_array_interface__", {"data": (None,)})["data"][0]
                    for a in args]
        prepared((3, 2, 1), args, pointers)
        grid, device, handle, sent = recorder.launches[-1]
        assert grid == (3, 2, 1) and device == 1 and handle == 0x5001  # torch's stream
        assert sent == expected_bytes(ck, ck.plan.flatten(args)[0]), round_
    prepared((1, 1, 1), args, pointers, stream=0x77)
    assert recorder.launches[-1][2] == 0x77


def test_a_replay_rechecks_scalars(monkeypatch):
    ck = CompiledKernel(with_scalar(), b"", "", "sm_90a")
    monkeypatch.setattr(ck, "send", Recorder(ck))
    args = arrays(with_scalar(), BASE)
    prepared = PreparedLaunch(ck, ck.plan.flatten(args)[0], device=0)
    scalar = next(i for i, a in enumerate(args) if isinstance(a, float))
    args[scalar] = "0.5"
    pointers = [getattr(a, "__cuda_array_interface__", {"data": (None,)})["data"][0]
                for a in args]
    with pytest.raises(LaunchError, match="alpha.*must be a number"):
        prepared((1, 1, 1), args, pointers, stream=0)


def test_one_tensor_kernel_replays(monkeypatch):
    """A single pointer (itemgetter of one index returns a bare value, not a tuple)."""
    from tegula.codegen.samples import warp_sum_of_squares
    kernel = warp_sum_of_squares()
    kernel = dataclasses.replace(kernel, params=kernel.params[:1] + [
        dataclasses.replace(kernel.params[1], name="out")])
    ck = CompiledKernel(kernel, b"", "", "sm_90a")
    recorder = Recorder(ck)
    monkeypatch.setattr(ck, "send", recorder)
    args = [FakeCudaArray((4000,), "<f2", BASE), FakeCudaArray((1,), "<f4", BASE + 8192)]
    prepared = PreparedLaunch(ck, ck.plan.flatten(args)[0], device=0, arg_index={"x": 0,
                                                                                "out": 1})
    prepared((2, 1, 1), args, [BASE + 64, BASE + 8192], stream=0)
    assert recorder.launches[-1][3][0] == struct.pack("<Q", BASE + 64)
