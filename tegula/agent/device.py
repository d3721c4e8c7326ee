"""How a candidate launches its tegula kernels, on a GPU or in the emulator.

A candidate's `ModelNew.forward` receives torch tensors and calls

    from tegula.agent.device import launch
    launch(kernel, grid, x, out, BM=16)

On CUDA tensors that is `kernel[grid](x, out, BM=16)`; on CPU tensors the same kernel runs
in the numpy emulator (`tg.emulate`) on the tensors' own memory (`Tensor.numpy()` shares
it), so the outputs land in the torch tensors exactly as a GPU launch would leave them.
This module is the only part of `tegula.agent` a candidate may import.

Every launch is recorded in `LAUNCHES` (kernel, grid, constexprs, shapes) so the evaluator
can explain the kernels a candidate ran (`tegula explain`'s analysis as profiling summary);
with `DRY_RUN` set, launches are only recorded (the harness's "explain at the GPU size").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Launches of this process, oldest first (the evaluator's harness reads and clears it).
LAUNCHES: list["LaunchRecord"] = []
MAX_RECORDED = 64
#: When set (by the evaluator's harness only), launches are recorded but not run: how the
#: harness learns which kernels a forward call launches at the GPU size, to explain them,
#: on a machine that could not emulate that size in reasonable time.
DRY_RUN = False


@dataclass(frozen=True)
class LaunchRecord:
    """One kernel launch: enough to rebuild and explain it."""

    kernel: Any
    grid: tuple
    constexprs: dict
    shapes: dict


def gpu_available() -> bool:
    """True when torch sees a CUDA device."""
    try:
        import torch
        return bool(torch.cuda.is_available())
    except ImportError:
        return False


def launch(kernel: Any, grid: Any, *args: Any, **constexprs: Any) -> Any:
    """Run `kernel` on `grid` with these tensor/scalar arguments: on the GPU when the
    tensors live there, else in the emulator on the tensors' memory."""
    import torch

    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    grid = tuple(grid) if isinstance(grid, (tuple, list)) else (grid,)
    _record(kernel, grid, args, constexprs)
    if DRY_RUN:
        return None
    if tensors and all(t.is_cuda for t in tensors):
        return kernel[grid](*args, **constexprs)
    if any(t.is_cuda for t in tensors):
        raise ValueError(f"launch of {getattr(kernel, 'name', kernel)}: tensors on mixed "
                         f"devices ({sorted({str(t.device) for t in tensors})})")
    from tegula.build import emulate

    return emulate(kernel, grid, *(_as_array(a) for a in args), **constexprs)


def _as_array(value: Any) -> Any:
    """A CPU tensor as a numpy array sharing its memory; anything else unchanged."""
    import torch

    if not isinstance(value, torch.Tensor):
        return value
    if not value.is_contiguous():
        # A copy would take the kernel's writes away from the tensor: refuse instead.
        raise ValueError(f"launch: tensor of shape {tuple(value.shape)} and strides "
                         f"{value.stride()} is not contiguous; call .contiguous() first")
    if value.dtype == torch.bfloat16:
        raise ValueError("launch: the emulator holds bf16 in float32; bf16 tensors run "
                         "on the GPU only")
    return value.detach().numpy()


def _record(kernel: Any, grid: tuple, args: tuple, constexprs: dict) -> None:
    """Remember a launch (bounded: a long run keeps the latest MAX_RECORDED)."""
    names = [p.name for p in getattr(kernel, "params", [])]
    shapes = {name: tuple(a.shape) for name, a in zip(names, args) if hasattr(a, "shape")}
    LAUNCHES.append(LaunchRecord(kernel, grid, dict(constexprs), shapes))
    del LAUNCHES[:-MAX_RECORDED]


__all__ = ["launch", "gpu_available", "LAUNCHES", "LaunchRecord"]
