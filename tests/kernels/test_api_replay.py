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
from replay_stubs import recording_send, use_replay_key  # noqa: E402


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
    return ("sent", tuple(result.shape), result.dtype) + tuple(
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
