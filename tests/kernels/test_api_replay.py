"""The entry points' replay signature (`tegula.kernels.api._signature`) decides which
prepared launch a call replays: a call must replay only a launch its own full path would
make. On the CPU, with the compiler and the driver call stubbed, the device check and the
tuner bypassed (the first candidate runs) and CPU tensors read as cuda:0, each call made
with earlier calls' replays cached is compared with the same call through the full path
(replays cleared, compiled variants kept): the same compiled variant, grid and every
non-pointer parameter byte (outputs are fresh allocations, so pointers differ) — or the
same error."""
from __future__ import annotations

import ctypes
import os
import sys

import pytest

torch = pytest.importorskip("torch")

import tegula.kernels as tk  # noqa: E402
import tegula.runtime as runtime  # noqa: E402
from tegula.kernels import api  # noqa: E402
from tegula.runtime import CompiledKernel, fastcall, launcher, replay  # noqa: E402
from tegula.runtime.args import ArgumentPlan  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "runtime"))
from replay_stubs import RecordingDriver, recording_send, use_replay_key  # noqa: E402


@pytest.fixture(params=["python key", "C key"])
def sent(monkeypatch, request):
    launches = []
    use_replay_key(monkeypatch, request.param)
    send = recording_send(launches, with_pointers=False)

    def cpu_tensor(plan, p, arg, values):  # CPU tensors pass the full path's checks as cuda:0
        plan._append(p, arg.data_ptr(), arg.shape, arg.stride(), values)
        return 0

    monkeypatch.setattr(runtime, "compile_kernel",
                        lambda kernel, target=None, options=(), requirements=None:
                        CompiledKernel(kernel, b"", "", target, requirements))
    monkeypatch.setattr(runtime, "default_target", lambda: "sm_90a")
    monkeypatch.setattr(CompiledKernel, "send", send)
    monkeypatch.setattr(ArgumentPlan, "_tensor", cpu_tensor)
    monkeypatch.setattr(launcher, "_CURRENT_STREAM", [lambda device: 0x5000 + device])
    monkeypatch.setattr(launcher.drv, "current_device", lambda: 0)
    monkeypatch.setattr(api, "_check_cuda", lambda fn, tensors: None)
    monkeypatch.setattr(api, "_tune_and_run",
                        lambda name, device, configs, dims, extra, run: run(configs[0]))
    monkeypatch.setattr(api, "_REPLAYS", {})
    yield launches


def outcome(sent, call):
    before = len(sent)
    try:
        result = call()
    except (TypeError, ValueError) as e:
        return ("error", type(e).__name__, str(e))
    return ("sent", tuple(result.shape), result.dtype, result.stride()) + tuple(
        tuple(launch) for launch in sent[before:])


def check_sequence(sent, calls):
    """Each call with the earlier calls' replays cached, then through the full path."""
    replayed, checks, real_check = [], [], api._check_tensor

    def spy(*args, **kwargs):  # the full path's first step
        checks.append(1)
        return real_check(*args, **kwargs)

    api._check_tensor = spy
    try:
        for i, call in enumerate(calls):
            del checks[:]
            warm = outcome(sent, call)
            replayed.append(not checks)
            saved = dict(api._REPLAYS)
            api._REPLAYS.clear()
            fresh = outcome(sent, call)
            api._REPLAYS.clear()
            api._REPLAYS.update(saved)
            assert warm == fresh, f"call {i}"
    finally:
        api._check_tensor = real_check
    return replayed


def _x(shape=(8, 96), dtype=torch.float32, offset=0, transpose=False, seed=0):
    """Random data (never zeros) as a view `offset` elements into a larger buffer."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for e in shape:
        n *= e
    base = torch.randn(n + offset + 8, generator=g).to(dtype)
    x = base[offset:offset + n].view(*shape)
    return x.T if transpose else x


class OnDevice1(torch.Tensor):
    """A CPU tensor that reports itself on device 1 to the replay key (the fixture reads
    every tensor as cuda:0 for the full path's checks)."""

    def get_device(self):
        return 1


X_VARIANTS = {
    "base": lambda: _x(),
    "new data": lambda: _x(seed=3),
    "f16": lambda: _x(dtype=torch.float16),
    "bf16": lambda: _x(dtype=torch.bfloat16),
    "odd row length": lambda: _x((8, 97)),
    "rows": lambda: _x((3, 96)),
    "rank 3": lambda: _x((2, 4, 96)),
    "pointer 4-byte aligned": lambda: _x(offset=1),
    "pointer 8-byte aligned": lambda: _x(offset=2),
    "transposed": lambda: _x((96, 8), transpose=True),
    "row gaps": lambda: _x((8, 192))[:, :96],
    "device 1": lambda: _x().as_subclass(OnDevice1),
}


@pytest.mark.parametrize("entry", ["rms_norm", "softmax", "copy"])
def test_row_entry_points_replay_only_their_own_specialization(sent, entry):
    def call(make):
        x = make()
        if entry == "rms_norm":
            w = _x((x.shape[-1],), dtype=x.dtype, seed=1)
            return lambda: tk.rms_norm(x, w, 1e-5)
        return lambda: getattr(tk, entry)(x)

    calls = [call(make) for make in X_VARIANTS.values()]
    replayed = check_sequence(sent, calls + calls)
    assert replayed[1], "new data in the base's layout replays"
    assert not any(replayed[2:len(calls)]), "a variant replayed another's launch"


def test_rms_norm_weight_and_eps_variants(sent):
    x = _x((8, 96), dtype=torch.float16)
    w = _x((96,), dtype=torch.float16, seed=1)
    w_shifted = _x((96,), dtype=torch.float16, seed=1, offset=1)
    w_strided = _x((192,), dtype=torch.float16, seed=1)[::2]
    calls = [lambda: tk.rms_norm(x, w, 1e-5), lambda: tk.rms_norm(x, w_shifted, 1e-5),
             lambda: tk.rms_norm(x, w_strided, 1e-5), lambda: tk.rms_norm(x, w, 0),
             lambda: tk.rms_norm(x, w, 0.0), lambda: tk.rms_norm(x, w, -0.0),
             lambda: tk.rms_norm(x, w, False), lambda: tk.rms_norm(x, w, 1),
             lambda: tk.rms_norm(x, w, True), lambda: tk.rms_norm(x, w, 1.0)]
    check_sequence(sent, calls + calls)


def test_a_bool_eps_is_refused_after_an_equal_int_eps_replayed(sent):
    x, w = _x((8, 96)), _x((96,), seed=1)
    tk.rms_norm(x, w, 0)
    tk.rms_norm(x, w, 0)  # replayed
    with pytest.raises(ValueError, match="eps must be a non-negative number"):
        tk.rms_norm(x, w, False)


def _out_like(x, offset=0, dtype=None, shape=None, transpose=False, seed=5):
    """An `out=` tensor for x: random (never zeros), `offset` elements into a buffer."""
    shape = tuple(x.shape) if shape is None else shape
    made = _x(shape[::-1] if transpose else shape, dtype=dtype or x.dtype, offset=offset,
              seed=seed)
    return made.T if transpose else made


OUT_VARIANTS = {
    "base": lambda x: _out_like(x),
    "new buffer": lambda x: _out_like(x, seed=6),
    "pointer 4-byte aligned": lambda x: _out_like(x, offset=1),
    "pointer 8-byte aligned": lambda x: _out_like(x, offset=2),
    "wrong dtype": lambda x: _out_like(x, dtype=torch.float16),
    "wrong shape": lambda x: _out_like(x, shape=(x.shape[0] + 1, x.shape[1])),
    "transposed (not contiguous)": lambda x: _out_like(x, transpose=True),
}


@pytest.mark.parametrize("entry", ["rms_norm", "softmax", "copy"])
def test_out_is_part_of_the_replay_key(sent, entry):
    """`out=` calls replay too (`tk.copy(x, out=y)` is `y.copy_(x)`'s peer): a new out in
    the same layout replays and is what the call returns; an out of another alignment
    class, dtype, shape or layout does not replay a launch made for another (the full
    path specializes on its alignment and refuses the others), and a call without out=
    does not replay an out= call's launch or the reverse."""
    x = _x((8, 96))
    w = _x((96,), seed=1)

    def call(out):
        if entry == "rms_norm":
            return lambda: tk.rms_norm(x, w, 1e-5, out=out)
        return lambda: getattr(tk, entry)(x, out=out)

    calls = [call(make(x)) for make in OUT_VARIANTS.values()] + [call(None)]
    replayed = check_sequence(sent, calls + calls)
    assert replayed[1], "a new out= tensor in the base's layout replays"
    assert not any(replayed[2:len(calls)]), "a variant replayed another's launch"
    given = _out_like(x, seed=7)
    assert call(given)() is given  # replayed: writes and returns the caller's tensor


@pytest.mark.parametrize("entry", ["rms_norm", "softmax", "copy"])
def test_replayed_outputs_are_fresh_contiguous_tensors(sent, entry):
    """The replay allocates with `torch.empty_like` where that is contiguous (chosen once
    per key): every call returns a new contiguous tensor of x's shape and dtype, also for
    an x with row gaps (whose empty_like would not be laid out like x)."""
    for make in (lambda: _x((8, 96)), lambda: _x((8, 192))[:, :96],
                 lambda: _x((2, 1, 96)).transpose(0, 1)):
        x, w = make(), _x((96,), seed=1)
        results = [tk.rms_norm(x, w) if entry == "rms_norm" else getattr(tk, entry)(x)
                   for _ in range(3)]
        for y in results:
            assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
        assert len({y.data_ptr() for y in results}) == 3


@pytest.mark.parametrize("cxx", [False, True])
def test_fast_empty_is_contiguous_whatever_the_template_layout(cxx, monkeypatch):
    """`fast_empty` in Python takes `torch.empty_like` only where that is contiguous: a
    channels-last template (dense, permuted: empty_like keeps its strides) gets
    `new_empty` instead; an output of another shape never comes from empty_like. With the
    C++ allocator ready (tests/runtime/test_torch_alloc.py builds it), the same holds."""
    from tegula.runtime import torch_alloc
    if not cxx:
        monkeypatch.setattr(torch_alloc, "allocator", lambda shape, like=None: None)
    elif torch_alloc.module() is None:
        pytest.skip("the C++ allocator is not built in this process")
    x = _x((2, 3, 4, 5)).contiguous(memory_format=torch.channels_last)
    assert not torch.empty_like(x).is_contiguous()  # the case this guards against
    y = api.fast_empty(x, x.shape)(x)
    assert y.shape == x.shape and y.dtype == x.dtype and y.is_contiguous()
    z = api.fast_empty(x, (7, 3))(x)
    assert z.shape == (7, 3) and z.dtype == x.dtype and z.is_contiguous()
    plain = _x((8, 96))
    assert (api.fast_empty(plain, plain.shape) is torch.empty_like) is not cxx


@pytest.fixture
def driver(monkeypatch):
    """The entry points with the driver (not `send`) recorded, as the C replay sees it:
    (the RecordingDriver, the list Python's PreparedLaunch.__call__ appends to)."""
    module = fastcall.c_extension()
    if module is None or not hasattr(module, "entry_launch"):
        pytest.skip(f"no entry_launch here: {fastcall.unavailable or 'Python without a GIL'}")
    use_replay_key(monkeypatch, "C key")

    def cpu_tensor(plan, p, arg, values):
        plan._append(p, arg.data_ptr(), arg.shape, arg.stride(), values)
        return 0

    monkeypatch.setattr(runtime, "compile_kernel",
                        lambda kernel, target=None, options=(), requirements=None:
                        CompiledKernel(kernel, b"", "", target, requirements))
    monkeypatch.setattr(runtime, "default_target", lambda: "sm_90a")
    monkeypatch.setattr(ArgumentPlan, "_tensor", cpu_tensor)
    monkeypatch.setattr(launcher.drv, "current_device", lambda: 0)
    monkeypatch.setattr(api, "_check_cuda", lambda fn, tensors: None)
    monkeypatch.setattr(api, "_tune_and_run",
                        lambda name, device, configs, dims, extra, run: run(configs[0]))
    monkeypatch.setattr(api, "_REPLAYS", {})
    recording = RecordingDriver()
    recording.install(monkeypatch, module)
    python_calls = []
    real_call = runtime.PreparedLaunch.__call__
    monkeypatch.setattr(runtime.PreparedLaunch, "__call__",
                        lambda self, *a, **k: python_calls.append(1) or real_call(self, *a, **k))
    yield recording, python_calls


@pytest.mark.parametrize("with_out", [False, True])
@pytest.mark.parametrize("entry", ["rms_norm", "softmax", "copy"])
def test_replays_in_one_c_call_write_the_call_s_own_pointers(driver, entry, with_out):
    """The third call of a layout (full path, Python replay, then `fastcall.entry_launch`)
    sends, with no Python launch, the full path's bytes except the data pointers, which
    are this call's tensors' and the output it returns (`out` itself with out=)."""
    recording, python_calls = driver
    for call in range(4):
        x = _x((8, 96), seed=call)
        w = _x((96,), seed=10 + call)
        out = _out_like(x, seed=20 + call) if with_out else None
        del python_calls[:]
        if entry == "rms_norm":
            y = tk.rms_norm(x, w, 1e-5, out=out)
            inputs = [x, w]
        else:
            y = getattr(tk, entry)(x, out=out)
            inputs = [x]
        ck, device, *launch, sent = recording.launches[-1]
        pointers = [int.from_bytes(b, "little") for b, spec in zip(sent, ck.params)
                    if spec.kind == "pointer"]
        assert pointers == [t.data_ptr() for t in inputs] + [y.data_ptr()], call
        assert (y is out) if with_out else (y.is_contiguous() and y.shape == x.shape)
        values = [b for b, spec in zip(sent, ck.params) if spec.kind != "pointer"]
        if call == 0:
            first = (ck, device, launch, values)
        assert (ck, device, launch, values) == first, call
        assert bool(python_calls) == (call < 2), call  # from the third call on: C only
