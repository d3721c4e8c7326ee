"""The replay key of `kernel[grid](...)` (`tegula.build`'s fast path) decides which prepared
launch runs: it must never let a launch replay another one's specialization. Each test
launches on the CPU with the driver, the compiler and torch's stream stubbed: tensors are
fakes that read like CUDA torch tensors, `send` records what the driver would get, and
every launch made while earlier launches' replays are cached is compared with the same
launch taken through the full (checking, specializing) path with the replays cleared:
the same compiled variant, grid, device, stream and every parameter byte — or the same
error."""
from __future__ import annotations

import ctypes
import math
import os
import sys

import numpy as np
import pytest

import tegula as tg
import tegula.runtime as runtime
from tegula import build as build_module
from tegula import f16
from tegula.errors import TegulaError
from tegula.runtime import CompiledKernel, args as runtime_args, fastcall, launcher, replay

sys.path.insert(0, os.path.dirname(__file__))
from replay_stubs import recording_send, use_replay_key  # noqa: E402

torch = pytest.importorskip("torch")


class FakeCudaTensor:
    """What the launcher reads of a CUDA torch tensor (no memory: nothing runs)."""

    def __init__(self, shape, strides=None, ptr=0x7F0000100000, dtype=torch.float16,
                 device=0):
        self.shape = torch.Size(shape)
        if strides is None:
            strides, step = [], 1
            for extent in reversed(shape):
                strides.insert(0, step)
                step *= extent
        self._strides, self._ptr, self.dtype, self._device = tuple(strides), ptr, dtype, device

    def data_ptr(self):
        return self._ptr

    def stride(self):
        return self._strides

    def get_device(self):
        return self._device

    def __repr__(self):
        return (f"Fake({tuple(self.shape)}, {self._strides}, 0x{self._ptr:x}, {self.dtype}, "
                f"cuda:{self._device})")


def _view(arg, real=runtime_args.tensor_view):
    if isinstance(arg, FakeCudaTensor):
        return runtime_args.TensorView(arg._ptr, tuple(arg.shape), arg._strides,
                                       str(arg.dtype)[6:], arg._device)
    return real(arg)


@pytest.fixture(params=["python key", "C key"])
def sent(monkeypatch, request):
    """Stub the compiler, the driver call and torch's stream; yields the list of launches
    (compiled kernel, grid, device, stream, parameter bytes per slot) in order. Once with
    the replay key built in Python, once in the C extension (`fastcall.replay_lookup`)."""
    launches = []
    use_replay_key(monkeypatch, request.param)
    send = recording_send(launches)

    monkeypatch.setattr(runtime, "compile_kernel",
                        lambda kernel, target=None, options=(), requirements=None:
                        CompiledKernel(kernel, b"", "", target, requirements))
    monkeypatch.setattr(runtime_args, "tensor_view", _view)
    monkeypatch.setattr(CompiledKernel, "send", send)
    monkeypatch.setattr(launcher, "_CURRENT_STREAM", [lambda device: 0x5000 + device])
    monkeypatch.setattr(launcher.drv, "current_device", lambda: 0)
    monkeypatch.setattr(runtime, "default_target", lambda: "sm_90a")
    yield launches


def make_kernel():
    @tg.kernel(threads=64)
    def shift(x: tg.Tensor[f16], y: tg.Tensor[f16], k: int, BM: tg.constexpr = 16,
              SCALE: tg.constexpr = 1.0):
        """y = x's k-th 32-column block times SCALE."""
        m = tg.block_id(0)
        t = tg.load(x.tile((BM, 32), (m, k)))
        tg.copy(t * SCALE, y.tile((BM, 32), (m, 0)))
    return shift


def outcome(kernel, sent, grid, args, kwargs):
    """What one launch does: ("sent", variant, grid, device, stream, bytes) or ("error",
    type, message)."""
    before = len(sent)
    try:
        kernel[grid](*args, **kwargs)
    except TegulaError as e:
        return ("error", type(e).__name__, str(e).split("\n")[0])
    if len(sent) == before:
        return ("nothing",)
    assert len(sent) == before + 1
    return ("sent",) + sent[-1]


def check_sequence(kernel, sent, calls):
    """Launch each call twice: with every earlier call's replay cached, then through the
    full path (replays cleared, compiled variants kept, so variants compare by identity).
    Returns, per call, whether the warm launch replayed (took the fast path)."""
    full_paths = []
    real_split = build_module.split_arguments

    def spy(*a, **k):
        full_paths.append(1)
        return real_split(*a, **k)

    replayed = []
    for i, (grid, args, kwargs) in enumerate(calls):
        build_module.split_arguments = spy
        try:
            del full_paths[:]
            warm = outcome(kernel, sent, grid, args, kwargs)
            replayed.append(not full_paths)
            saved = dict(kernel.__dict__.get("_fast_launch", {}))
            kernel.__dict__.get("_fast_launch", {}).clear()
            fresh = outcome(kernel, sent, grid, args, kwargs)
        finally:
            build_module.split_arguments = real_split
        kernel.__dict__["_fast_launch"].update(saved)  # the warm table as it was
        assert warm == fresh, f"call {i}: {grid} {args} {kwargs}"
    return replayed


BASE = 0x7F0000100000


def x_like(**changes):
    spec = dict(shape=(64, 96), ptr=BASE)
    spec.update(changes)
    return FakeCudaTensor(**spec)


def y_like(**changes):
    spec = dict(shape=(64, 32), ptr=BASE + 0x100000)
    spec.update(changes)
    return FakeCudaTensor(**spec)


# One variant per specialization-relevant property: each differs from the base launch in
# exactly that property (what the full path specializes on, or refuses).
VARIANTS = {
    "dtype f32": ((4,), (x_like(dtype=torch.float32), y_like(), 1), {}),
    "dtype bf16 y": ((4,), (x_like(), y_like(dtype=torch.bfloat16), 1), {}),
    "extent not divisible by 16": ((4,), (x_like(shape=(64, 97)), y_like(), 1), {}),
    "rows not divisible": ((4,), (x_like(shape=(63, 96)), y_like(), 1), {}),
    "padded row stride": ((4,), (x_like(strides=(104, 1)), y_like(), 1), {}),
    "odd row stride": ((4,), (x_like(strides=(97, 1)), y_like(), 1), {}),
    "not contiguous": ((4,), (x_like(strides=(1, 64)), y_like(), 1), {}),
    "64-bit offsets": ((4,), (x_like(strides=(2**26, 1)), y_like(), 1), {}),
    "pointer 2-byte aligned": ((4,), (x_like(ptr=BASE + 2), y_like(), 1), {}),
    "pointer 8-byte aligned": ((4,), (x_like(ptr=BASE + 8), y_like(), 1), {}),
    "pointer odd": ((4,), (x_like(ptr=BASE + 1), y_like(), 1), {}),
    "y pointer 4-byte aligned": ((4,), (x_like(), y_like(ptr=BASE + 0x100004), 1), {}),
    "device 1": ((4,), (x_like(device=1), y_like(device=1), 1), {}),
    "devices differ": ((4,), (x_like(device=1), y_like(), 1), {}),
    "rank 3": ((4,), (FakeCudaTensor((2, 64, 96)), y_like(), 1), {}),
    "rank 1": ((4,), (FakeCudaTensor((96,)), y_like(), 1), {}),
    "scalar bool": ((4,), (x_like(), y_like(), True), {}),
    "scalar float": ((4,), (x_like(), y_like(), 1.0), {}),
    "scalar numpy int": ((4,), (x_like(), y_like(), np.int32(1)), {}),
    "scalar too big": ((4,), (x_like(), y_like(), 2**40), {}),
    "scalar as keyword": ((4,), (x_like(), y_like()), {"k": 1}),
    "constexpr BM": ((2,), (x_like(), y_like(), 1), {"BM": 32}),
    "constexpr BM float": ((4,), (x_like(), y_like(), 1), {"BM": 16.0}),
    "constexpr BM bool": ((4,), (x_like(), y_like(), 1), {"BM": True}),
    "constexpr SCALE int": ((4,), (x_like(), y_like(), 1), {"SCALE": 1}),
    "constexpr SCALE bool": ((4,), (x_like(), y_like(), 1), {"SCALE": True}),
    "constexpr SCALE -0.0": ((4,), (x_like(), y_like(), 1), {"SCALE": -0.0}),
    "constexpr SCALE 0.0": ((4,), (x_like(), y_like(), 1), {"SCALE": 0.0}),
    "constexpr SCALE numpy": ((4,), (x_like(), y_like(), 1), {"SCALE": np.float32(1.0)}),
    "constexpr SCALE nan": ((4,), (x_like(), y_like(), 1), {"SCALE": math.nan}),
    "constexpr list": ((4,), (x_like(), y_like(), 1), {"SCALE": [1.0]}),
    "threads": ((4,), (x_like(), y_like(), 1), {"threads": 128}),
    "grid float": ((4.0,), (x_like(), y_like(), 1), {}),
    "grid bool": ((True,), (x_like(), y_like(), 1), {}),
    "grid 3-D": ((4, 1, 1), (x_like(), y_like(), 1), {}),
    "grid list": ([4], (x_like(), y_like(), 1), {}),
    "grid empty": ((0,), (x_like(), y_like(), 1), {}),
    "not a tensor": ((4,), (np.zeros((64, 96), np.float16), y_like(), 1), {}),
}

BASE_CALL = ((4,), (x_like(), y_like(), 1), {})

#: Variants that differ from the base only in what a replay re-reads or re-checks itself
#: (a scalar's value, the grid): they may replay the base's prepared launch.
SAME_SPECIALIZATION = {"scalar too big", "grid float", "grid bool", "grid 3-D", "grid list",
                       "grid empty"}


@pytest.mark.parametrize("name", list(VARIANTS))
def test_a_launch_differing_in_one_property_is_not_a_replay_of_the_other(sent, name):
    """Base, variant, base, variant: the variant never replays the base's prepared launch
    (nor the base the variant's), and each matches its own full path."""
    kernel = make_kernel()
    variant = VARIANTS[name]
    again = (variant[0], tuple(variant[1]), dict(variant[2]))
    replayed = check_sequence(kernel, sent, [BASE_CALL, variant, BASE_CALL, again])
    assert not replayed[0]
    assert not replayed[1] or name in SAME_SPECIALIZATION


#: Values Python calls equal (same hash) that the full path tells apart: by type (1, 1.0,
#: True) or by sign (0.0, -0.0). A key comparing them with == would replay one for the other.
LOOKALIKES = {
    "SCALE": [1.0, 1, True, np.float64(1.0)],
    "SCALE zero": [0.0, -0.0, 0, False],
    "BM": [16, 16.0, np.int64(16)],
    "grid": [(4,), (4.0,), (np.int64(4),)],
    "grid one": [(1,), (True,), (1.0,)],
    "scalar": [1, True, 1.0, np.int64(1)],
}


@pytest.mark.parametrize("name", list(LOOKALIKES))
def test_values_equal_in_python_but_not_to_the_compiler_do_not_replay_each_other(sent, name):
    kernel = make_kernel()
    calls = []
    for value in LOOKALIKES[name] * 2:
        if name.startswith("grid"):
            calls.append((value, (x_like(), y_like(), 1), {}))
        elif name == "scalar":
            calls.append(((4,), (x_like(), y_like(), value), {}))
        else:
            calls.append(((4,), (x_like(), y_like(), 1), {name.split()[0]: value}))
    check_sequence(kernel, sent, calls)


def test_same_properties_new_pointers_replay(sent):
    """The fast path is taken where it should be: new data pointers of the same alignment
    class and a new scalar value replay, and send exactly what the full path sends."""
    kernel = make_kernel()
    calls = [((4,), (x_like(ptr=BASE + 0x1000 * i), y_like(ptr=BASE + 0x100000 + 0x40 * i),
                     i), {"BM": 16}) for i in range(4)]
    assert check_sequence(kernel, sent, calls) == [False, True, True, True]
    assert len(kernel._fast_launch) == 1


def test_every_variant_in_one_table(sent):
    """All variants launched one after another into one kernel's table, twice over: a
    replay of any of them must still send what its full path sends."""
    kernel = make_kernel()
    calls = [BASE_CALL] + list(VARIANTS.values())
    check_sequence(kernel, sent, calls + calls)


def test_a_float_or_bool_grid_is_refused_after_an_equal_int_one(sent):
    """(4.0,) == (4,) and (True,) == (1,) in Python: a grid memo keyed by value accepted
    them once the int grid had launched, though a float grid is refused, not truncated."""
    kernel = make_kernel()
    for grid, bad in [((4,), (4.0,)), ((1,), (True,)), (4, 4.0), ((4, 1), (4, 1.0))]:
        kernel[grid](x_like(), y_like(), 1)
        with pytest.raises(TegulaError, match="grid"):
            kernel[bad](x_like(), y_like(), 1)
    kernel[(np.int64(4),)](x_like(), y_like(), 1)  # numpy integers are block counts
    assert sent[-1][1] == (4, 1, 1)


def test_the_c_and_python_keys_are_equal():
    """Both lookups build the same key tuple and pointers for every kind of argument, and
    both refuse (None) what is not replayable."""
    module = fastcall.c_extension()
    if module is None:
        pytest.skip(f"C extension cannot be built here: {fastcall.unavailable}")
    t = torch.ones(3, 5, dtype=torch.float16)[:, 1:]
    argument_lists = [(), (1,), (True, 2.5, np.float64(1.5)), (t, 3), (x_like(), y_like(), 1),
                      (x_like(ptr=BASE + 6), t.T), (np.int32(1),), (t, np.zeros(3)),
                      (t, "a"), (None,)]
    for head in [(None,), ("sm_90a", ((("BM", 16),), (int,)))]:
        for args in argument_lists:
            python = replay._lookup({}, head, args, ())
            c = module.replay_lookup({}, head, args)
            assert c == python, args
            if python[1] is not None:
                table = {python[1]: "prepared"}
                assert module.replay_lookup(table, head, args)[0] == "prepared"


def test_the_c_key_passes_on_errors_of_tensor_like_arguments():
    module = fastcall.c_extension()
    if module is None:
        pytest.skip(f"C extension cannot be built here: {fastcall.unavailable}")

    class Broken(FakeCudaTensor):
        def stride(self):
            raise RuntimeError("no strides")

    with pytest.raises(RuntimeError, match="no strides"):
        module.replay_lookup({}, (None,), (Broken((4, 4)),))
    with pytest.raises(TypeError):
        module.replay_lookup({}, [None], ())


def test_the_c_and_python_keywords_parts_are_equal():
    module = fastcall.c_extension()
    if module is None:
        pytest.skip(f"C extension cannot be built here: {fastcall.unavailable}")
    plain = [{}, {"BM": 16}, {"BM": True, "MODE": "a", "X": None, "BN": 1}]
    with_floats = [{"S": 1.0}, {"BM": 16, "S": -0.0}, {"S": 0.0, "MODE": "a", "X": None},
                   {"S": float("nan"), "T": -float("nan")}, {"S": float("-inf")},
                   {"S": 5e-324, "BM": True}]
    for kwargs in plain + with_floats:
        assert module.plain_keywords(kwargs) == replay.constexpr_key(kwargs), kwargs
    assert module.plain_keywords({"S": 0.0}) != module.plain_keywords({"S": -0.0})
    assert module.plain_keywords({"S": 1.0}) != module.plain_keywords({"S": 1})
    for kwargs in [{"L": [1]}, {"N": np.int64(2)}, {"T": (1, 2)}, {"F": np.float64(1.0)},
                   {"S": 1.0, "T": (1.0,)}]:
        assert module.plain_keywords(kwargs) is None, kwargs  # Python's repr case
    with pytest.raises(TypeError):
        module.plain_keywords([("BM", 16)])
