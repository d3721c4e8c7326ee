"""GEMM with fused bias + activation on the GPU against a float64 torch reference: every
dataflow (shared pipeline on sm_90a — TMA + wgmma — and on sm_90 — cp.async + mma.sync —,
register-only, split-K with the epilogue in its reduction), f16 and bf16, shapes that
divide no tile, outputs NaN-poisoned, every element checked; then the autotuned
`tegula.kernels.matmul(a, b, bias, activation)` as users call it (first call and replay).
"""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tegula as tg
from tegula.dtypes import bf16, f16
from tegula.kernels.gemm import gemm_kernel, gemm_registers_kernel

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import poison  # noqa: E402

DTYPES = {f16: torch.float16, bf16: torch.bfloat16}
UNIT = {f16: 2.0 ** -11, bf16: 2.0 ** -8}
ACTIVATIONS = [None, "relu", "gelu", "gelu_tanh", "silu"]
SHAPES = [(257, 129, 72), (33, 17, 96), (1, 300, 64), (128, 256, 128), (70, 50, 40)]


def reference(a, w, bias, activation):
    """activation(a @ w.T + bias) in float64, and the pre-activation z."""
    z = a.double() @ w.double().T + (0.0 if bias is None else bias.double())
    f = torch.nn.functional
    act = {None: lambda t: t, "relu": f.relu, "gelu": f.gelu, "silu": f.silu,
           "gelu_tanh": lambda t: f.gelu(t, approximate="tanh")}[activation]
    return act(z), z


def check(c, a, w, bias, activation, dtype):
    """Every element: the f32 accumulation error (k ulps of Σ|a·w| + |z|) through the
    activation's slope (≤ 1.13), a few f32 ulps of the activation itself (CUDA's expf,
    erff, tanhf: ≤ 2 ulps each), one rounding to the output type."""
    assert not torch.isnan(c).any(), "unwritten (poisoned) elements remain"
    ref, z = reference(a, w, bias, activation)
    k = a.shape[1]
    magnitude = a.double().abs() @ w.double().abs().T
    bound = 1.13 * (k + 2) * 2.0 ** -24 * (magnitude + z.abs()) \
        + 8 * 2.0 ** -24 * (z.abs() + ref.abs()) + UNIT[dtype] * ref.abs() + 2.0 ** -24
    err = (c.double() - ref).abs()
    worst = int(torch.argmax(err - bound))
    i, j = divmod(worst, c.shape[1])
    assert bool((err <= bound).all()), (f"({i}, {j}): got {c[i, j].item()}, expected "
                                        f"{ref[i, j].item()}, bound {bound[i, j].item():.3g}")


def operands(m, n, k, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=g).to(DTYPES[dtype])
    w = torch.randn(n, k, device="cuda", generator=g).to(DTYPES[dtype])
    bias = (torch.randn(n, device="cuda", generator=g) * 2).to(DTYPES[dtype])
    return a, w, bias


def poisoned(m, n, dtype):
    return poison(torch.empty((m, n), device="cuda", dtype=DTYPES[dtype]))


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
@pytest.mark.parametrize("target", ["sm_90a", "sm_90"])
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_shared_pipeline_with_bias(m, n, k, target, dtype, activation):
    a, w, bias = operands(m, n, k, dtype, m * n + k)
    c = poisoned(m, n, dtype)
    kernel = gemm_kernel(dtype, activation, True)
    for tiles in (dict(BM=64, BN=64, BK=32, STAGES=2), dict(BM=128, BN=128, BK=64, STAGES=3)):
        c = poison(c)
        grid = (tg.cdiv(m, tiles["BM"]), tg.cdiv(n, tiles["BN"]))
        kernel[grid](a, w, bias.view(1, n), c, target=target, **tiles)
        torch.cuda.synchronize()
        check(c, a, w, bias, activation, dtype)


@pytest.mark.parametrize("activation", ["relu", "gelu", "silu"])
@pytest.mark.parametrize("m,n,k", SHAPES[:3])
def test_warp_specialized_wide_tiles_without_bias(m, n, k, activation):
    """The 128×256 tiles with 256 threads the tuner offers for large shapes, on sm_90a."""
    a, w, _ = operands(m, n, k, bf16, 7 * m + n)
    c = poisoned(m, n, bf16)
    gemm_kernel(bf16, activation)[(tg.cdiv(m, 128), tg.cdiv(n, 256))](
        a, w, c, BM=128, BN=256, BK=64, STAGES=3, threads=256)
    torch.cuda.synchronize()
    check(c, a, w, None, activation, bf16)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("m,n,k", SHAPES)
def test_register_dataflow_with_bias(m, n, k, activation):
    a, w, bias = operands(m, n, k, f16, 3 * m + k)
    c = poisoned(m, n, f16)
    gemm_registers_kernel(f16, activation, True)[(tg.cdiv(m, 64), tg.cdiv(n, 64))](
        a, w, bias.view(1, n), c, BM=64, BN=64, BK=32)
    torch.cuda.synchronize()
    check(c, a, w, bias, activation, f16)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
@pytest.mark.parametrize("m,n,k", [(16, 4096, 4096), (33, 300, 1000), (1, 130, 520)])
def test_split_k_runs_the_epilogue_in_its_reduction(m, n, k, dtype, activation):
    from tegula.kernels.api import _gemm_launches

    a, w, bias = operands(m, n, k, dtype, m + n + k)
    c = poisoned(m, n, dtype)
    values = dict(kernel="shared", BM=16, BN=64, BK=64, STAGES=4, SPLIT=4)
    _gemm_launches(dtype, values, None, a, w, c, (activation, bias.view(1, n)))
    torch.cuda.synchronize()
    check(c, a, w, bias, activation, dtype)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("dtype", [f16, bf16], ids=str)
@pytest.mark.parametrize("m,n,k", [(257, 129, 72), (64, 4096, 4096), (1024, 1024, 512)])
def test_autotuned_entry_point(m, n, k, dtype, activation):
    """`tk.matmul(a, w.T, bias, activation)`: into a poisoned `out`, then twice without
    (the second call replays the chosen launch), each checked; against torch's unfused
    expression too (which rounds after the matmul: allowed one more rounding)."""
    import tegula.kernels as tk

    a, w, bias = operands(m, n, k, dtype, 11 * m + k)
    out = poisoned(m, n, dtype)
    assert tk.matmul(a, w.T, bias, activation, out=out) is out
    torch.cuda.synchronize()
    check(out, a, w, bias, activation, dtype)
    for _ in range(2):
        c = tk.matmul(a, w.T, bias, activation)
        torch.cuda.synchronize()
        check(c, a, w, bias, activation, dtype)
    f = torch.nn.functional
    act = {None: lambda t: t, "relu": f.relu, "gelu": f.gelu, "silu": f.silu,
           "gelu_tanh": lambda t: f.gelu(t, approximate="tanh")}[activation]
    unfused = act(a @ w.T + bias)
    ref, _ = reference(a, w, bias, activation)
    slack = 4 * UNIT[dtype] * (ref.abs() + (a.double() @ w.double().T).abs()) + 1e-3
    assert bool(((c.double() - unfused.double()).abs() <= slack).all())


def test_bias_only_and_k_zero():
    import tegula.kernels as tk

    a, w, bias = operands(40, 70, 0, f16, 5)
    c = tk.matmul(a, w.T, bias, "gelu")
    assert torch.equal(c, torch.nn.functional.gelu(bias.float()).half().expand(40, 70))
    a, w, bias = operands(40, 70, 24, f16, 6)
    check(tk.matmul(a, w.T, bias), a, w, bias, None, f16)
    # A NaN row and infinite bias columns: NaN stays in its row, ±inf follow IEEE.
    a[3] = float("nan")
    bias[5], bias[6] = float("inf"), float("-inf")
    c = tk.matmul(a, w.T, bias, "relu")
    assert torch.isnan(c[3]).all()
    keep = torch.ones(40, dtype=torch.bool, device="cuda")
    keep[3] = False
    assert bool((c[keep, 5] == float("inf")).all()) and bool((c[keep, 6] == 0).all())


def test_gelu_is_torchs_exact_gelu():
    """Exact GELU (erf) differs from the tanh form by up to ~3e-4·|x| near |x| ≈ 2: the
    fused "gelu" must match torch's default F.gelu there, not the tanh approximation."""
    import tegula.kernels as tk

    x = torch.linspace(-4, 4, 256, device="cuda").half()
    a = torch.zeros(1, 16, device="cuda", dtype=torch.float16)  # a @ w.T = 0: c = gelu(bias)
    w = torch.zeros(256, 16, device="cuda", dtype=torch.float16)
    c = tk.matmul(a, w.T, x, "gelu").double()[0]
    exact = torch.nn.functional.gelu(x.double())
    tanh = torch.nn.functional.gelu(x.double(), approximate="tanh")
    assert float((exact - tanh).abs().max()) > 2e-4        # the two forms are distinguishable
    # One f16 rounding, plus erff's 2 ulps of (1 + erf) times x/2 (cancellation for x < 0).
    bound = 2.0 ** -11 * exact.abs() + 2.0 ** -22 * x.double().abs() + 2.0 ** -24
    assert bool(((c - exact).abs() <= bound).all())
