"""FP8 GEMM's torch side (tegula/kernels/fp8.py through the torch op and the entry point)
on the CPU: the per-tensor op against torch._scaled_mm, the blockwise op against the
float64 reference, argument errors, launch replay keys. Apart from `test_fp8.py` (the
emulator tests), which needs no torch: a module-level skip there hid them without it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from tegula.dtypes import bf16, f32

torch = pytest.importorskip("torch")


def _emulator_tests():
    """`test_fp8.py`, for its reference helpers (loaded by path: tests are no package)."""
    path = Path(__file__).resolve().parent / "test_fp8.py"
    spec = importlib.util.spec_from_file_location("tegula_test_fp8_helpers", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_HELPERS = _emulator_tests()
UNIT, check_close, expanded_scales = _HELPERS.UNIT, _HELPERS.check_close, \
    _HELPERS.expanded_scales


def _fp8_operands(m, n, k, seed):
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, generator=g) * 4).to(torch.float8_e4m3fn)
    return a, w


@pytest.mark.parametrize("out_dtype", [torch.bfloat16, torch.float32])
def test_torch_op_on_cpu_matches_scaled_mm(out_dtype):
    """The per-tensor op (emulated on CPU) against torch._scaled_mm on the same inputs."""
    import tegula.kernels.torch_ops  # noqa: F401

    a, w = _fp8_operands(37, 50, 48, 1)
    sa, sb = torch.tensor(0.75), torch.tensor(1.5)
    c = torch.ops.tegula.matmul_fp8(a, w.T, sa, sb, out_dtype)
    ref = torch._scaled_mm(a, w.T, sa, sb, out_dtype=out_dtype)
    assert c.dtype == out_dtype and c.shape == ref.shape
    exact = (a.double() @ w.double().T) * 1.125
    magnitude = (a.double().abs() @ w.double().abs().T) * 1.125
    check_close(c.float().numpy(), exact.numpy(), magnitude.numpy(), 48,
                bf16 if out_dtype == torch.bfloat16 else f32)
    unit = UNIT[bf16 if out_dtype == torch.bfloat16 else f32]
    assert ((c.double() - ref.double()).abs() <= 2 * unit * exact.abs() + 1e-3).all()


def test_torch_op_blockwise_on_cpu():
    import tegula.kernels.torch_ops  # noqa: F401

    m, n, k = 20, 130, 256
    a, w = _fp8_operands(m, n, k, 2)
    g = torch.Generator().manual_seed(3)
    sa = 10.0 ** (torch.rand(m, 2, generator=g) * 2 - 1)
    sb = 10.0 ** (torch.rand(2, 2, generator=g) * 2 - 1)
    c = torch.ops.tegula.matmul_fp8(a, w.T, sa, sb, torch.float32, True)
    ea, eb = expanded_scales(sa.numpy(), sb.numpy(), m, n, k)
    an, wn = a.float().numpy(), w.float().numpy()
    check_close(c.numpy(), (an * ea) @ (wn * eb).T, np.abs(an * ea) @ np.abs(wn * eb).T, k, f32)
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fake = torch.ops.tegula.matmul_fp8(torch.empty(m, k).to(torch.float8_e4m3fn),
                                           torch.empty(k, n).to(torch.float8_e4m3fn),
                                           torch.empty(m, 2), torch.empty(2, 2), None, True)
        assert fake.shape == (m, n) and fake.dtype == torch.bfloat16


def test_torch_entry_point_argument_errors():
    import tegula.kernels as tk

    a, w = _fp8_operands(16, 32, 256, 4)
    one = torch.tensor(1.0)
    with pytest.raises(TypeError, match=r"matmul_fp8: a has dtype torch.float16"):
        tk.matmul_fp8(a.half(), w.T, one, one)
    with pytest.raises(TypeError, match=r"matmul_fp8: out_dtype must be"):
        tk.matmul_fp8(a, w.T, one, one, torch.int32)
    with pytest.raises(TypeError, match=r"matmul_fp8: scale_a has dtype torch.float16"):
        tk.matmul_fp8(a, w.T, one.half(), one)
    with pytest.raises(ValueError, match=r"matmul_fp8: scale_b has shape \(2,\), expected "
                                         r"\(1, 1\)"):
        tk.matmul_fp8(a, w.T, one, torch.ones(2))
    with pytest.raises(ValueError, match=r"matmul_fp8: scale_a has shape \(16, 1\), "
                                         r"expected \(16, 2\)"):
        tk.matmul_fp8(a, w.T, torch.ones(16, 1), torch.ones(1, 2), block_scales=True)
    with pytest.raises(ValueError, match=r"matmul_fp8: K = 200 .*multiple of 16"):
        tk.matmul_fp8(a[:, :200], w[:, :200].T, torch.ones(16, 2), torch.ones(1, 2),
                      block_scales=True)
    with pytest.raises(ValueError, match=r"matmul_fp8: K = 40 .*multiple of 16"):
        tk.matmul_fp8(a[:, :40], w[:, :40].T, one, one)
    with pytest.raises(ValueError, match=r"a is \(M, K\) and b.T has the same K"):
        tk.matmul_fp8(a, w[:, :128].T, one, one)
    with pytest.raises(ValueError, match=r"matmul_fp8: a is on cpu"):
        tk.matmul_fp8(a, w.T, one, one)


def _replay_harness():
    path = Path(__file__).resolve().parent / "test_api_replay.py"
    spec = importlib.util.spec_from_file_location("tegula_test_api_replay_fp8", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_REPLAY = _replay_harness()
sent = _REPLAY.sent  # the fixture: compile and driver stubbed, launches recorded


def test_fp8_replay_key(sent, monkeypatch):
    """Per-tensor vs blockwise, out dtypes, `block_scales=1` (refused, never a replay of
    True), scale shapes and strides: each call makes exactly its full path's launches.
    (The operands go by TMA: the driver's tensor-map encoder is stubbed by its fields.)"""
    import tegula.kernels as tk
    from tegula.runtime import tensor_map

    monkeypatch.setattr(tensor_map, "driver_encode",
                        lambda ptr, dtype, extents, strides, box, swizzle, name="tensor":
                        repr((ptr, dtype.name, tuple(extents), tuple(strides), tuple(box),
                              swizzle)).encode().ljust(128)[:128])

    a, w = _fp8_operands(40, 48, 256, 6)
    a2, w2 = _fp8_operands(40, 48, 256, 7)
    one, two = torch.tensor(1.0), torch.tensor(2.0)
    sa, sb = torch.rand(40, 2) + 0.5, torch.rand(1, 2) + 0.5
    calls = [lambda: tk.matmul_fp8(a, w.T, one, two), lambda: tk.matmul_fp8(a2, w2.T, two, one),
             lambda: tk.matmul_fp8(a, w.T, one, two, torch.float16),
             lambda: tk.matmul_fp8(a, w.T, one, two, torch.float32),
             lambda: tk.matmul_fp8(a, w.T, sa, sb, None, True),
             lambda: tk.matmul_fp8(a, w.T, sa, sb, None, 1),
             lambda: tk.matmul_fp8(a, w.T, sa.T.contiguous().T, sb, None, True),
             lambda: tk.matmul_fp8(a, w.T, one.reshape(1, 1), two.reshape(1))]
    replayed = _REPLAY.check_sequence(sent, calls + calls)
    assert replayed[1], "new data in a cached layout replays"
    assert not any(replayed[2:len(calls)]), "a variant replayed another's launch"
