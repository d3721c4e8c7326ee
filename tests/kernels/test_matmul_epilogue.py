"""GEMM with a fused epilogue (bias per column, relu / gelu (erf) / gelu_tanh / silu) in
the emulator against float64 numpy, every element, on ragged shapes for each dataflow
(shared pipeline, register-only, split-K), sm_90a and sm_80; `tg.erf` itself; the FP8 and
epilogue kernels compile; bad arguments give clear errors."""
from __future__ import annotations

import math

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.build import build
from tegula.dtypes import bf16, f16, f8e4m3
from tegula.emulate.values import round_to
from tegula.kernels.gemm import ACTIVATIONS, gemm_emulated, gemm_kernel, gemm_registers_kernel
from tegula.runtime.compiler import available_compilers, compile_cuda

_ERF = np.vectorize(math.erf, otypes=[np.float64])

REFERENCE = {
    None: lambda z: z,
    "relu": lambda z: np.where(np.isnan(z), z, np.maximum(z, 0.0)),
    "gelu": lambda z: 0.5 * z * (1.0 + _ERF(z / math.sqrt(2.0))),
    "gelu_tanh": lambda z: 0.5 * z * (1.0 + np.tanh(math.sqrt(2.0 / math.pi)
                                                     * (z + 0.044715 * z ** 3))),
    "silu": lambda z: z / (1.0 + np.exp(-z)),
}
UNIT = {f16: 2.0 ** -11, bf16: 2.0 ** -8}


def operands(rng, m, n, k, dtype, nonfinite=False):
    a = round_to(rng.standard_normal((m, k)).astype(np.float32), dtype)
    b = round_to(rng.standard_normal((n, k)).astype(np.float32), dtype)
    bias = round_to((rng.standard_normal(n) * 3).astype(np.float32), dtype)
    if nonfinite:  # a NaN row of a, an infinite bias column
        a[3, :] = np.nan
        bias[5] = np.inf
        bias[6] = -np.inf
    return a, b, bias


def check_epilogue(c, a, b, bias, activation, dtype):
    """Every element of c against activation(a @ b.T + bias) in f64: the f32 accumulation
    error (k ulps of Σ|a·b|) carried through the activation's slope (≤ 1.13), a few f32
    ulps of the activation's own evaluation, then one rounding to c's type."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    z = a64 @ b64.T + (0.0 if bias is None else bias.astype(np.float64))
    k = a.shape[1]
    with np.errstate(invalid="ignore", over="ignore"):  # NaN and ±inf cases: nan is right
        ref = REFERENCE[activation](z)
        dz = (k + 2) * 2.0 ** -24 * (np.abs(a64) @ np.abs(b64).T + np.abs(z))
        bound = 1.13 * dz + 8 * 2.0 ** -24 * (np.abs(z) + np.abs(ref)) \
            + UNIT[dtype] * np.abs(ref) + 2.0 ** -24
    c64 = c.astype(np.float64)
    same_special = (np.isnan(c64) & np.isnan(ref)) | (np.isinf(ref) & (c64 == ref))
    with np.errstate(invalid="ignore"):
        ok = same_special | (np.abs(c64 - ref) <= bound)
    bad = np.argwhere(~ok)
    assert not len(bad), (f"{len(bad)} elements wrong, first {tuple(bad[0])}: got "
                          f"{c64[tuple(bad[0])]}, expected {ref[tuple(bad[0])]}")


DATAFLOWS = {"shared": dict(shared=True, BM=32, BN=64, BK=32, STAGES=2),
             "registers": dict(shared=False, BM=32, BN=64, BK=32),
             "split": dict(split=3, BM=32, BN=64, BK=16, STAGES=2)}


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dataflow", sorted(DATAFLOWS))
def test_bias_and_activation(activation, dataflow):
    rng = np.random.default_rng(hash((activation, dataflow)) % 2 ** 32)
    m, n, k = 37, 70, 56                         # no dim divides a tile; M < BM
    a, b, bias = operands(rng, m, n, k, f16)
    c = gemm_emulated(a, b, bias=bias, activation=activation, **DATAFLOWS[dataflow])
    check_epilogue(c, a, b, bias, activation, f16)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_activation_without_bias_bf16(activation, target):
    rng = np.random.default_rng(7)
    m, n, k = 65, 33, 40
    a, b, _ = operands(rng, m, n, k, bf16)
    c = gemm_emulated(a, b, bf16, activation=activation, target=target, BM=64, BN=32, BK=32,
                      STAGES=2)
    check_epilogue(c, a, b, None, activation, bf16)


@pytest.mark.parametrize("activation", ACTIVATIONS)
def test_sm80_bias_and_nonfinite_values(activation):
    """A NaN row of a stays NaN in every column; ±inf bias columns give the activation's
    value at ±inf (relu(-inf) = 0, gelu(-inf) = NaN in f64 as on the GPU: -inf · 0)."""
    rng = np.random.default_rng(11)
    m, n, k = 19, 40, 24
    a, b, bias = operands(rng, m, n, k, f16, nonfinite=True)
    c = gemm_emulated(a, b, bias=bias, activation=activation, target="sm_80", BM=32, BN=32,
                      BK=16, STAGES=2)
    assert np.isnan(c[3, :]).all()
    check_epilogue(c, a, b, bias, activation, f16)


def test_plain_kernel_is_unchanged_by_the_epilogue_machinery():
    """No bias, no activation: bit-identical to the plain GEMM (the epilogue adds nothing)."""
    rng = np.random.default_rng(5)
    a, b, bias = operands(rng, 40, 50, 32, f16)
    plain = gemm_emulated(a, b, BM=32, BN=64, BK=32, STAGES=2)
    zero = gemm_emulated(a, b, bias=np.zeros_like(bias), BM=32, BN=64, BK=32, STAGES=2)
    np.testing.assert_array_equal(plain, zero)
    check_epilogue(plain, a, b, None, None, f16)


def test_epilogue_argument_errors():
    a = np.ones((16, 32), np.float16)
    with pytest.raises(ValueError, match=r"unknown activation 'tanh'"):
        gemm_emulated(a, a, activation="tanh")
    with pytest.raises(ValueError, match=r"bias must have one value per column of c \(N = 16\)"):
        gemm_emulated(a, a, bias=np.ones(8, np.float16))
    with pytest.raises(TypeError, match=r"bias"):
        gemm_emulated(a, a, bias=np.ones(16, np.float32))
    i8 = np.ones((16, 32), np.int8)
    with pytest.raises(ValueError, match=r"i8 GEMMs have no epilogue"):
        gemm_emulated(i8, i8, activation="relu")


@tg.kernel(threads=64)
def _erf_rows(x: tg.Tensor[f32], y: tg.Tensor[f32], BN: tg.constexpr = 128):
    tg.copy(tg.erf(tg.load(x.tile((1, BN), (0, 0)))), y.tile((1, BN), (0, 0)))


def test_erf_matches_math_erf_with_specials():
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((1, 100)) * 2.5).astype(np.float32)
    x[0, :4] = [np.nan, np.inf, -np.inf, -0.0]
    y = np.full_like(x, np.nan)
    tg.emulate(_erf_rows, (1,), x, y)
    ref = _ERF(x.astype(np.float64))
    np.testing.assert_array_equal(np.isnan(y), np.isnan(ref))
    finite = ~np.isnan(ref)
    np.testing.assert_allclose(y[finite], ref[finite], rtol=2 ** -22, atol=2 ** -30)
    assert np.signbit(y[0, 3])  # erf(-0) = -0


def test_erf_prints_cuda_erff():
    assert "erff(" in build(_erf_rows, {}, target="sm_90a").cuda_source()


def _compile_cases():
    from tegula.kernels.fp8 import fp8_blockwise_gemm_kernel, fp8_gemm_kernel
    small = dict(BM=64, BN=64)
    return [("gemm_bias_gelu-f16", gemm_kernel(f16, "gelu", True), small, ("sm_80", "sm_90a")),
            ("gemm_registers_bias_silu-bf16", gemm_registers_kernel(bf16, "silu", True), small,
             ("sm_80", "sm_90a")),
            ("fp8_gemm-bf16", fp8_gemm_kernel(bf16), small, ("sm_89", "sm_90a")),
            ("fp8_blockwise-bf16", fp8_blockwise_gemm_kernel(bf16), small, ("sm_89", "sm_90a"))]


@pytest.mark.skipif(not available_compilers(), reason="no CUDA compiler (NVRTC or nvcc)")
@pytest.mark.parametrize("name,kernel,constexprs,targets", _compile_cases(),
                         ids=[c[0] for c in _compile_cases()])
def test_new_kernels_compile(name, kernel, constexprs, targets):
    for target in targets:
        source = build(kernel, constexprs, target=target).cuda_source()
        assert compile_cuda(source, kernel.name, target)


def test_f8_dtype_is_not_an_epilogue_dtype():
    """The float GEMM's epilogue path takes f16/bf16; f8 goes through tegula.kernels.fp8."""
    a = round_to(np.ones((16, 32), np.float32), f8e4m3).astype(np.float32)
    with pytest.raises(TypeError, match=r"f8e4m3 are not supported.*matmul_fp8_emulated"):
        gemm_emulated(a, a, f8e4m3, activation="relu")


# ----------------------------------------------------------------------------- torch side

torch = pytest.importorskip("torch")


def _torch_operands(m, n, k, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(m, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)            # an nn.Linear weight
    bias = (torch.randn(n, generator=g) * 2).to(dtype)
    return a, w, bias


def _np(t):
    return t.float().numpy()


@pytest.mark.parametrize("activation", ["relu", "gelu", "gelu_tanh", "silu"])
def test_torch_op_on_cpu_runs_the_fused_kernel(activation):
    import tegula.kernels.torch_ops  # noqa: F401 — registers torch.ops.tegula

    a, w, bias = _torch_operands(33, 40, 24, torch.float16, 1)
    c = torch.ops.tegula.matmul(a, w.T, bias, activation)
    assert c.dtype == torch.float16 and c.shape == (33, 40)
    check_epilogue(_np(c), _np(a), _np(w), _np(bias), activation, f16)


def test_torch_op_fake_and_k_zero():
    import tegula.kernels.torch_ops  # noqa: F401

    a, w, bias = _torch_operands(3, 5, 0, torch.bfloat16, 2)
    c = torch.ops.tegula.matmul(a, w.T, bias, "relu")       # an empty sum: relu(bias)
    assert torch.equal(c, torch.relu(bias).expand(3, 5))
    with torch._subclasses.fake_tensor.FakeTensorMode():
        fa, fw, fb = torch.empty(7, 16), torch.empty(9, 16), torch.empty(9)
        out = torch.ops.tegula.matmul(fa.half(), fw.half().T, fb.half(), "silu")
        assert out.shape == (7, 9) and out.dtype == torch.float16
        with pytest.raises(ValueError, match=r"bias must have one value per output column"):
            torch.ops.tegula.matmul(fa.half(), fw.half().T, fb[:4].half(), None)


@pytest.mark.parametrize("activation", [None, "gelu", "silu"])
def test_torch_op_backward_matches_torch(activation):
    """Gradients of a, b and bias through the fused op against torch's autograd of the
    unfused expression in float64 (tolerance: a few f16 roundings of each product)."""
    import tegula.kernels.torch_ops  # noqa: F401

    a, w, bias = _torch_operands(17, 20, 16, torch.float16, 3)
    g = torch.randn(17, 20, generator=torch.Generator().manual_seed(4)).half()
    leaves = [t.clone().requires_grad_() for t in (a, w, bias)]
    torch.ops.tegula.matmul(leaves[0], leaves[1].T, leaves[2], activation).backward(g)
    ref_leaves = [t.double().requires_grad_() for t in (a, w, bias)]
    z = ref_leaves[0] @ ref_leaves[1].T + ref_leaves[2]
    act = {None: lambda t: t, "gelu": torch.nn.functional.gelu,
           "silu": torch.nn.functional.silu}[activation]
    act(z).backward(g.double())
    for got, want, name in zip(leaves, ref_leaves, ("a", "b", "bias")):
        scale = want.grad.abs().max().item()
        err = (got.grad.double() - want.grad).abs().max().item()
        assert err <= 2e-2 * scale, f"grad of {name}: error {err} of {scale}"


def test_torch_entry_point_argument_errors():
    import tegula.kernels as tk

    a, w, bias = _torch_operands(8, 16, 32, torch.float16, 5)
    with pytest.raises(ValueError, match=r"matmul: activation must be one of .*got 'tanh'"):
        tk.matmul(a, w.T, activation="tanh")
    with pytest.raises(ValueError, match=r"matmul: bias must have one value per output "
                                         r"column \(N = 16\), got shape \(8,\)"):
        tk.matmul(a, w.T, bias[:8])
    with pytest.raises(TypeError, match=r"matmul: bias has dtype torch.float32"):
        tk.matmul(a, w.T, bias.float())
    with pytest.raises(TypeError, match=r"matmul: arguments must share one dtype.*bias"):
        tk.matmul(a, w.T, bias.bfloat16())
    with pytest.raises(ValueError, match=r"matmul: bias must be 1-D"):
        tk.matmul(a, w.T, bias[None, :])
    with pytest.raises(ValueError, match=r"matmul: a is on cpu"):
        tk.matmul(a, w.T, bias, "relu")   # every argument right: the device is the mistake


@pytest.mark.parametrize("mode", ["epilogue", "fp8"])
def test_bench_modes_run_end_to_end_on_a_fake_gpu(mode, tmp_path, monkeypatch, capsys):
    """`tegula bench gemm --mode epilogue|fp8`: cases, checks, table, peak fractions, JSON
    (on the CPU, tegula's entry points refuse the tensors: an ERROR row, torch's rows ok)."""
    import importlib.util
    import json
    from pathlib import Path

    from tegula.bench import gpu
    from tegula.bench.__main__ import main as bench_main

    path = Path(__file__).resolve().parents[1] / "bench" / "test_gpu_suites.py"
    spec = importlib.util.spec_from_file_location("tegula_test_gpu_suites", path)
    suites = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(suites)
    monkeypatch.setattr(gpu, "load_torch", lambda name: (suites._FakeTorch(torch), None))
    monkeypatch.setattr(gpu, "time_ms", lambda fn, flush, **_: (fn(), 0.05)[1])
    assert bench_main(["gemm", "--mode", mode, "--shapes", "64x32x256,16x40x128",
                       "--out", str(tmp_path), "--dtype", "bf16"]) == 0
    printed = capsys.readouterr().out
    assert "dense peak" in printed and "geomean" in printed.splitlines()[-1]
    (record_path,) = tmp_path.glob(f"gemm-{mode}-*fake-gpu-*.json")
    record = json.loads(record_path.read_text())
    peer = "unfused" if mode == "epilogue" else "scaled_mm"
    for case in record["cases"]:
        assert case["results"][peer]["status"] == "ok", case["results"][peer]
        assert "CUDA device" in case["results"]["tegula"]["error"]


def _replay_harness():
    """tests/kernels/test_api_replay.py's stubbed-launch fixture and sequence check."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent / "test_api_replay.py"
    spec = importlib.util.spec_from_file_location("tegula_test_api_replay", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_REPLAY = _replay_harness()
sent = _REPLAY.sent  # the fixture: compile and driver stubbed, launches recorded


def test_matmul_replays_only_its_own_epilogue(sent):
    """A replayed matmul call makes exactly the launches its full path makes: bias or not,
    each activation, bias views, dtypes and shapes are distinct specializations (a replay
    of relu's launch for gelu would be a silent wrong answer)."""
    a, w, bias = _torch_operands(40, 48, 64, torch.float16, 8)
    a2, w2, bias2 = _torch_operands(40, 48, 64, torch.float16, 9)     # new data, same layout
    big = _torch_operands(40, 96, 64, torch.float16, 10)[2]
    ab, wb, bb = _torch_operands(40, 48, 64, torch.bfloat16, 11)
    decode = _torch_operands(16, 48, 1024, torch.float16, 12)
    calls = [lambda: tk_matmul(a, w.T), lambda: tk_matmul(a2, w2.T),
             lambda: tk_matmul(a, w.T, bias), lambda: tk_matmul(a2, w2.T, bias2),
             lambda: tk_matmul(a, w.T, bias, "relu"), lambda: tk_matmul(a, w.T, bias, "gelu"),
             lambda: tk_matmul(a, w.T, None, "gelu"), lambda: tk_matmul(a, w.T, bias, "silu"),
             lambda: tk_matmul(a, w.T, bias, "gelu_tanh"),
             lambda: tk_matmul(a, w.T, big[::2], "relu"),         # a strided bias view
             lambda: tk_matmul(a, w.T, big[1::2], "relu"),
             lambda: tk_matmul(ab, wb.T, bb, "gelu"),
             lambda: tk_matmul(a, w.T, bb, "gelu"),                # dtype mismatch: error
             lambda: tk_matmul(a, w.T, bias, "tanh"),              # unknown: error
             lambda: tk_matmul(decode[0], decode[1].T, decode[2], "silu")]
    replayed = _REPLAY.check_sequence(sent, calls + calls)
    assert replayed[1] and replayed[3], "new data in a cached layout replays"
    assert not any(replayed[2:3] + replayed[4:len(calls)]), "a variant replayed another's"


def tk_matmul(*args):
    import tegula.kernels as tk
    return tk.matmul(*args)
