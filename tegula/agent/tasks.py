"""Tasks: a PyTorch reference module with an input generator, in KernelBench's file format.

A task file defines `Model` (an `nn.Module` whose `forward` is the reference),
`get_inputs()` and `get_init_inputs()`; module-level constants (`batch_size = 16`) size
the problem. tegula's own tasks add optional `TEGULA_*` constants, which a plain
KernelBench file simply lacks:

    TEGULA_CATEGORY = "elementwise"        # elementwise | reduction | matmul | attention
    TEGULA_SIZES = {"small": {"M": 37}, "real": {"M": 8192}}   # overrides of the constants
    TEGULA_TOLERANCE = (1e-5, 1e-5)        # (atol relative to rms(reference), rtol)
    TEGULA_DISTRIBUTIONS = ("normal", "shifted", "wide")
    def tegula_flops(): return 2 * M * N * K          # for the roofline bound (optional)

Sizes: "small" is for the emulator (a GPU-less machine), "real" for the GPU; a file
without `TEGULA_SIZES` runs at its own constants for both.

Inputs come from `get_inputs()` under a seed, then one of the *distributions* is applied
to every floating-point tensor — "normal" leaves them as generated, "shifted" scales by
2.5 and adds mean(|x|) (mixed signs, non-zero mean), "wide" scales by a random power of ten in
[10^-1.5, 10^1.5] ([10^-1.5, 10^0.5] for 16-bit inputs) with a random sign — so a candidate that returns constants, zeros or
the right values for one distribution only fails on another.
"""
from __future__ import annotations

import math
import os
import types
from dataclasses import dataclass, field
from typing import Any

CATEGORIES = ("elementwise", "reduction", "matmul", "attention")
DISTRIBUTIONS = ("normal", "shifted", "wide")
# Default tolerances (atol relative to the reference's rms, rtol) by output dtype: f32
# kernels reorder sums and use other math libraries (a few ulp); f16/bf16 outputs round.
DEFAULT_TOLERANCE = {"float32": (1e-4, 1e-4), "float16": (2e-3, 2e-3),
                     "bfloat16": (1.6e-2, 1.6e-2), "float64": (1e-9, 1e-9)}


class TaskError(Exception):
    """A task file that cannot be used (no Model, a failing reference, bad TEGULA_* data)."""


@dataclass
class Task:
    """A reference computation: the task file's text plus what the evaluator reads from it."""

    name: str
    source: str
    path: str | None = None
    category: str = "elementwise"
    sizes: dict = field(default_factory=dict)
    tolerance: tuple | None = None
    distributions: tuple = DISTRIBUTIONS
    _modules: dict = field(default_factory=dict, repr=False)
    _specs: dict = field(default_factory=dict, repr=False)

    # ----------------------------------------------------------------- the task's module
    def module(self, size: str = "small") -> types.ModuleType:
        """The task file executed as a module with the size's constants applied (cached)."""
        if size not in self._modules:
            if size not in ("small", "real"):
                raise TaskError(f"task {self.name}: size must be 'small' or 'real', got {size!r}")
            module = types.ModuleType(f"tegula_task_{self.name}")
            module.__file__ = self.path or f"<task {self.name}>"
            code = compile(self.source, module.__file__, "exec")
            exec(code, module.__dict__)  # the task file is trusted code, like a test
            for name, value in self.sizes.get(size, {}).items():
                setattr(module, name, value)
            self._modules[size] = module
        return self._modules[size]

    def model(self, size: str, init_seed: int) -> Any:
        """The reference `Model`, built from `get_init_inputs()` under `init_seed` (the
        candidate's `ModelNew` is built under the same seed, so parameters match)."""
        import torch

        module = self.module(size)
        torch.manual_seed(init_seed)
        init = list(module.get_init_inputs())
        torch.manual_seed(init_seed)
        model = module.Model(*init)
        return model.eval() if hasattr(model, "eval") else model

    def init_inputs(self, size: str, init_seed: int) -> list:
        """`get_init_inputs()` under `init_seed` (passed to `ModelNew` too)."""
        import torch

        torch.manual_seed(init_seed)
        return list(self.module(size).get_init_inputs())

    def make_inputs(self, size: str, seed: int, distribution: str) -> list:
        """Fresh inputs: `get_inputs()` under `seed`, then `distribution` applied."""
        import torch

        torch.manual_seed(seed)
        inputs = list(self.module(size).get_inputs())
        generator = torch.Generator().manual_seed(seed ^ 0x5EED)
        return [_distributed(x, distribution, generator) for x in inputs]

    def input_specs(self, size: str) -> list[tuple]:
        """(shape, dtype name) per tensor input at `size` — (None, value) for the rest —
        generated once and kept (the real size's data is large; its shapes are not)."""
        import torch

        key = f"specs:{size}"
        if key not in self._specs:
            self._specs[key] = [
                (tuple(x.shape), str(x.dtype).removeprefix("torch."))
                if isinstance(x, torch.Tensor) else (None, x)
                for x in self.make_inputs(size, 0, "normal")]
        return self._specs[key]

    def tolerance_for(self, dtype_name: str) -> tuple[float, float]:
        """(atol relative to rms(reference), rtol) for an output of this dtype."""
        if self.tolerance is not None:
            return tuple(self.tolerance)
        return DEFAULT_TOLERANCE.get(dtype_name, (1e-4, 1e-4))

    def flops(self, size: str) -> float:
        """The task's floating-point operations at `size` (0 when it does not say)."""
        fn = getattr(self.module(size), "tegula_flops", None)
        return float(fn()) if callable(fn) else 0.0


def _distributed(x: Any, distribution: str, generator: Any) -> Any:
    """Apply an input distribution to one input (floating tensors only)."""
    import torch

    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        return x
    if distribution == "normal":
        return x.contiguous()
    work = x.float()
    if distribution == "shifted":
        # The shift follows the tensor's own magnitude (a 1/sqrt(K)-scaled weight stays
        # small), so f16 matmul references with a non-zero mean do not overflow.
        work = work * 2.5 + work.abs().mean()
    elif distribution == "wide":
        # 16-bit inputs get a narrower range: products of two of them summed over K must
        # stay far from f16's 65504 in the reference too.
        high = 1.5 if x.element_size() >= 4 else 0.5
        power = float(torch.empty(()).uniform_(-1.5, high, generator=generator))
        sign = -1.0 if float(torch.rand((), generator=generator)) < 0.5 else 1.0
        work = work * (sign * 10.0 ** power)
    else:
        raise TaskError(f"unknown input distribution {distribution!r} (known: "
                        f"{', '.join(DISTRIBUTIONS)})")
    return work.to(x.dtype).contiguous()


# --------------------------------------------------------------------------- loading

def load_task(spec: str) -> Task:
    """A task by built-in name (`tegula agent tasks` lists them) or by file path."""
    if os.path.isfile(spec):
        with open(spec, encoding="utf-8") as f:
            source = f.read()
        name = os.path.splitext(os.path.basename(spec))[0]
        return task_from_source(name, source, path=os.path.abspath(spec))
    from tegula.agent.taskset import builtin_task, task_names

    if spec in task_names():
        return builtin_task(spec)
    raise TaskError(f"no task {spec!r}: not a file, nor a built-in task (built-in: "
                    f"{', '.join(task_names())})")


def task_from_source(name: str, source: str, path: str | None = None) -> Task:
    """A Task from a task file's text; reads its TEGULA_* constants, else guesses."""
    task = Task(name=name, source=source, path=path)
    try:
        module = task.module("small")
    except Exception as err:  # the file's own error, whatever it is, names the task
        raise TaskError(f"task {name}: the task file fails to load: "
                        f"{type(err).__name__}: {err}") from err
    for required in ("Model", "get_inputs", "get_init_inputs"):
        if not hasattr(module, required):
            raise TaskError(f"task {name}: the file defines no {required} (KernelBench format: "
                            f"Model, get_inputs, get_init_inputs)")
    task.category = getattr(module, "TEGULA_CATEGORY", None) or guess_category(source)
    if task.category not in CATEGORIES:
        raise TaskError(f"task {name}: TEGULA_CATEGORY {task.category!r} is not one of "
                        f"{', '.join(CATEGORIES)}")
    task.sizes = dict(getattr(module, "TEGULA_SIZES", {}) or {})
    tolerance = getattr(module, "TEGULA_TOLERANCE", None)
    if tolerance is not None:
        if (len(tolerance) != 2 or not all(math.isfinite(t) and t >= 0 for t in tolerance)
                or max(tolerance) <= 0):
            raise TaskError(f"task {name}: TEGULA_TOLERANCE must be (atol, rtol), finite, "
                            f"not both zero; got {tolerance!r}")
        task.tolerance = tuple(float(t) for t in tolerance)
    task.distributions = tuple(getattr(module, "TEGULA_DISTRIBUTIONS", DISTRIBUTIONS))
    unknown = set(task.distributions) - set(DISTRIBUTIONS)
    if unknown or not task.distributions:
        raise TaskError(f"task {name}: TEGULA_DISTRIBUTIONS {task.distributions!r}: use some "
                        f"of {', '.join(DISTRIBUTIONS)}")
    task._modules.clear()  # sizes are applied at the next module(size)
    return task


def guess_category(source: str) -> str:
    """A plain KernelBench file's category, from the ops its source names."""
    text = source.lower()
    if "scaled_dot_product" in text or "attention" in text:
        return "attention"
    if any(op in text for op in ("matmul", "bmm", "nn.linear", "@", "einsum", "conv")):
        return "matmul"
    if any(op in text for op in ("softmax", "norm", "sum(", "mean(", "max(", "argmax",
                                 "logsumexp", "cumsum", "var(", "std(")):
        return "reduction"
    return "elementwise"


__all__ = ["Task", "TaskError", "load_task", "task_from_source", "guess_category",
           "CATEGORIES", "DISTRIBUTIONS", "DEFAULT_TOLERANCE"]
