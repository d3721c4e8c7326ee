"""RMSNorm: tegula against torch and Triton: `python -m tegula.bench norm`.

`y = x / sqrt(mean(x², -1) + eps) * w` over rows of LLM hidden sizes. Memory-bound: the
floor is (2·M·N + N)·itemsize bytes (x read, y written, w read once); reported in TB/s,
as a fraction of the device-to-device copy bandwidth measured in the same run (target
≥ 85%), and as ratios to torch (`torch.nn.functional.rms_norm`, target ≥ 1.0×) and Triton.
"""
from __future__ import annotations

from typing import Any

from tegula.bench import gpu

SHAPES = [(4096, 4096), (16384, 1024), (16384, 2048), (16384, 4096), (16384, 5120),
          (16384, 8192), (8192, 16384), (8191, 3000)]
QUICK = [(16384, 4096), (4096, 8192)]
EPS = 1e-6


def make_case(torch: Any, shape: tuple[int, int], dtype: str, triton_kernels: Any) -> gpu.Case:
    """Fresh random x and w and the implementations for one (M, N)."""
    import tegula.kernels as tk

    m, n = shape
    tdtype = getattr(torch, gpu.TORCH_DTYPES[dtype])
    x = torch.randn(m, n, device="cuda", dtype=tdtype)
    w = torch.rand(n, device="cuda", dtype=tdtype) + 0.5

    def reference() -> Any:
        xd = x.double()
        return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * w.double()

    def tegula_check() -> Any:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        return tk.rms_norm(x, w, EPS, out=out)

    impls = [gpu.Impl("tegula", lambda: tk.rms_norm(x, w, EPS), tegula_check,
                      gpu.tuned_note("rms_norm")),
             gpu.Impl("torch", lambda: torch.nn.functional.rms_norm(x, (n,), w, EPS))]
    if triton_kernels is not None:
        impls.append(gpu.Impl("triton", lambda: triton_kernels.rms_norm(x, w, EPS)))
    return gpu.Case(label=f"{m}x{n}", dims=shape, flops=0.0,
                    bytes=float((2 * m * n + n) * x.element_size()), reference=reference,
                    tol=gpu.FLOAT_TOLERANCE[dtype], impls=impls,
                    same_size_copy=x.clone)


def main(argv: list[str] | None = None) -> int:
    return gpu.memory_suite_main("norm", __doc__, argv, SHAPES, QUICK, make_case, "rms_norm",
                                 "torch.nn.functional.rms_norm")


__all__ = ["main", "make_case", "SHAPES", "QUICK"]
