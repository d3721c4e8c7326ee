"""Copy: tegula against torch and Triton: `python -m tegula.bench copy`.

A copy of an (M, N) tensor into a new one. The floor is 2·M·N·itemsize bytes (each
element read once and written once); reported in TB/s, as a fraction of the
device-to-device copy bandwidth measured in the same run (target ≥ 85%), and as ratios
to torch (`Tensor.clone`, target ≥ 1.0×) and Triton. The result must be exact.
"""
from __future__ import annotations

from typing import Any

from tegula.bench import gpu

SHAPES = [(4096, 4096), (8192, 8192), (16384, 16384), (4096, 11008), (14336, 4096),
          (8191, 3001), (1, 1 << 26)]
QUICK = [(8192, 8192), (8191, 3001)]


def make_case(torch: Any, shape: tuple[int, int], dtype: str, triton_kernels: Any) -> gpu.Case:
    """A fresh random tensor and the implementations for one (M, N)."""
    import tegula.kernels as tk

    m, n = shape
    tdtype = getattr(torch, gpu.TORCH_DTYPES[dtype])
    x = torch.randn(m, n, device="cuda", dtype=tdtype)

    def tegula_check() -> Any:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        return tk.copy(x, out=out)

    impls = [gpu.Impl("tegula", lambda: tk.copy(x), tegula_check, gpu.tuned_note("copy")),
             gpu.Impl("torch", lambda: x.clone())]
    if triton_kernels is not None:
        impls.append(gpu.Impl("triton", lambda: triton_kernels.copy(x)))
    return gpu.Case(label=f"{m}x{n}", dims=shape, flops=0.0,
                    bytes=float(2 * m * n * x.element_size()), reference=lambda: x,
                    tol=0.0, impls=impls)


def main(argv: list[str] | None = None) -> int:
    return gpu.memory_suite_main("copy", __doc__, argv, SHAPES, QUICK, make_case, "copy",
                                 "Tensor.clone")


__all__ = ["main", "make_case", "SHAPES", "QUICK"]
