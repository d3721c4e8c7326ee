"""Row softmax: tegula against torch and Triton: `python -m tegula.bench softmax`.

Softmax along the last dim of (M, N) tensors, rows up to 16384 (tegula's one-tile limit).
Memory-bound: the floor is 2·M·N·itemsize bytes; reported in TB/s, as a fraction of the
device-to-device copy bandwidth measured in the same run (target ≥ 85%), and as ratios
to torch (`torch.softmax`, target ≥ 1.0×) and Triton.
"""
from __future__ import annotations

from typing import Any

from tegula.bench import gpu

SHAPES = [(16384, 1024), (16384, 2048), (16384, 4096), (8192, 8192), (4096, 16384),
          (32768, 512), (8191, 3000)]
QUICK = [(16384, 4096), (4096, 16384)]


def make_case(torch: Any, shape: tuple[int, int], dtype: str, triton_kernels: Any) -> gpu.Case:
    """Fresh random logits and the implementations for one (M, N)."""
    import tegula.kernels as tk

    m, n = shape
    tdtype = getattr(torch, gpu.TORCH_DTYPES[dtype])
    x = torch.randn(m, n, device="cuda", dtype=tdtype) * 3  # spread: exp's range matters

    def tegula_check() -> Any:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=tdtype)
        return tk.softmax(x, out=out)

    impls = [gpu.Impl("tegula", lambda: tk.softmax(x), tegula_check, gpu.tuned_note("softmax")),
             gpu.Impl("torch", lambda: torch.softmax(x, -1))]
    if triton_kernels is not None:
        impls.append(gpu.Impl("triton", lambda: triton_kernels.softmax(x)))
    return gpu.Case(label=f"{m}x{n}", dims=shape, flops=0.0,
                    bytes=float(2 * m * n * x.element_size()),
                    reference=lambda: torch.softmax(x.double(), -1),
                    tol=gpu.FLOAT_TOLERANCE[dtype], impls=impls,
                    same_size_copy=x.clone)


def main(argv: list[str] | None = None) -> int:
    return gpu.memory_suite_main("softmax", __doc__, argv, SHAPES, QUICK, make_case, "softmax",
                                 "torch.softmax")


__all__ = ["main", "make_case", "SHAPES", "QUICK"]
