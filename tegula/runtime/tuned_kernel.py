"""`@tg.autotune`: autotuning for user kernels, with the library's tuner (`autotune.py`).

    @tg.autotune(space={"BM": [64, 128], "BN": [64, 128, 256]}, key=["a", "b"])
    @tg.kernel(threads=128)
    def gemm(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f16],
             BM: tg.constexpr = 128, BN: tg.constexpr = 128): ...

    gemm[lambda meta: (tg.cdiv(M, meta["BM"]), tg.cdiv(N, meta["BN"]))](a, b, c)

The candidates are, in order of precedence:
* `configs=[{...}, ...]`: exactly these (each a dict of constexprs, `threads` optional);
* `space={"BM": [...], ...}`: every combination, ranked by the cost model, the `top_k`
  (default 5) best measured;
* neither: the tile recommendation's `top_k` (`tegula.recommend`: the constexprs the
  kernel leaves open — no default, or `tg.constexpr(choices=...)`).
Before measuring, each candidate is built (no GPU needed) and one the compiler refuses or
whose shared memory or registers exceed the target's limits is skipped, its reason kept
in the record (`tuned.report()`). The rest are launched on the call's own arguments and
timed (CUDA events, L2 emptied, median), with a progress line on stderr; the winner is
cached per GPU and `key` bucket (each key dimension rounded up to a power of two) in
memory and on disk, like the library's, so a later process reuses it unmeasured.

`key` names what the choice depends on: a scalar parameter (its value), a tensor (its
shape) or `"x.shape[1]"` (one dim); default: every tensor's shape. The element types and
the constexprs fixed by the call are part of the key as well.

The kernel runs several times on the real arguments while it is measured: a kernel that
reads what it writes (an accumulating output) must be tuned on copies.
"""
from __future__ import annotations

import itertools
import re
from typing import Any, Callable, Mapping, Sequence

from tegula.errors import TegulaError
from tegula.runtime.autotune import Autotuner, Config, Timer


def autotune(configs: Sequence[Mapping[str, Any]] | None = None, *,
             space: Mapping[str, Sequence[Any]] | None = None,
             key: Sequence[str] | None = None, top_k: int = 5, progress: bool = True,
             timer: Timer | None = None, launch: Callable | None = None,
             cache_dir: str | None = None, persist: bool = True) -> Callable:
    """Decorator over `@tg.kernel` (module docstring). `timer` (seconds per launch of a
    callable) and `launch(kernel, grid, args, kwargs)` replace CUDA-event timing and the
    GPU launch (tests, or tuning through another launcher); `cache_dir`/`persist` as for
    `Autotuner`."""
    if configs is not None and space is not None:
        raise TegulaError("tg.autotune: give configs= or space=, not both")
    if top_k <= 0:
        raise TegulaError(f"tg.autotune: top_k must be positive, got {top_k}")

    def wrap(kernel: Any) -> TunedKernel:
        if not hasattr(kernel, "params") or not hasattr(kernel, "constexpr_names"):
            raise TegulaError(f"tg.autotune goes above @tg.kernel (on a kernel), not on "
                              f"{kernel!r}")
        return TunedKernel(kernel, configs, space, key, top_k, progress, timer, launch,
                           cache_dir, persist)

    return wrap


class TunedKernel:
    """A kernel launched with its tuned configuration: `tuned[grid](*args, **constexprs)`."""

    def __init__(self, kernel: Any, configs, space, key, top_k: int, progress: bool,
                 timer, launch, cache_dir, persist: bool):
        self.kernel = kernel
        self.name = kernel.name
        self.configs = [Config.of(c) for c in configs] if configs is not None else None
        if self.configs is not None and not self.configs:
            raise TegulaError(f"tg.autotune on {kernel.name}: configs= is empty")
        self.space = {k: list(v) for k, v in space.items()} if space is not None else None
        self.key = list(key) if key is not None else None
        # No configs, no space: the candidates are the recommendation's top-k per call shape.
        self.from_recommendation = configs is None and space is None
        self.top_k = top_k
        self.launch = launch or _gpu_launch
        module = getattr(getattr(kernel, "fn", None), "__module__", "") or ""
        self.tuner = Autotuner(f"{module}.{kernel.name}".lstrip("."), timer=timer,
                               cache_dir=cache_dir, persist=persist, progress=progress)
        self._check_names()

    def _check_names(self) -> None:
        known = set(self.kernel.constexpr_names) | {"threads"}
        named = set(self.space or {})
        for c in self.configs or []:
            named |= set(c.as_dict())
        unknown = sorted(named - known)
        if unknown:
            raise TegulaError(f"tg.autotune on {self.name}: {', '.join(unknown)} "
                              f"{'is' if len(unknown) == 1 else 'are'} not a constexpr of the "
                              f"kernel (its constexprs: "
                              f"{', '.join(self.kernel.constexpr_names) or '(none)'})")

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        return lambda *args, **kwargs: self.run(grid, args, kwargs)

    def run(self, grid: Any, args: tuple, kwargs: dict) -> Any:
        """Choose the configuration for these arguments (tuning on first sight of their
        key) and launch it; returns what the launch returns."""
        best = self.choose(grid, args, kwargs)
        return self.launch(self.kernel, grid, args, {**kwargs, **_launch_kwargs(best)})

    def choose(self, grid: Any, args: tuple, kwargs: dict) -> Config:
        """The configuration `run` launches for these arguments."""
        fixed = {k: v for k, v in kwargs.items() if k in self.kernel.constexpr_names}
        target = kwargs.get("target")
        dims = self.key_dims(args)
        extra = _extra_key(self.kernel, args, fixed, target)
        device = _device_name(args)
        key = self.tuner.key(dims, extra, device)
        known = self.tuner.records.get(key)   # the per-launch fast path: no builds
        if known is not None:
            return known.best
        if not self.from_recommendation:       # a static list: a disk record may answer
            found = self.tuner.cached(key, self.static_candidates(fixed))
            if found is not None:
                return found.best
        candidates, scored = self.candidates(args, fixed, grid, target)

        def run_one(config: Config) -> Any:
            return self.launch(self.kernel, grid, args, {**kwargs, **_launch_kwargs(config)})

        rank = (lambda c: scored[c].seconds) if scored else None
        check = (lambda c: scored[c].dropped) if scored else None
        top_k = self.top_k if self.configs is None else None
        return self.tuner.select(candidates, dims, run_one, extra=extra, device_name=device,
                                 rank=rank, top_k=top_k, check=check)

    def candidates(self, args: tuple, fixed: dict, grid: Any,
                   target: Any) -> tuple[list[Config], dict]:
        """(the candidates, their cost-model candidates by Config: the score and why one
        does not fit)."""
        from tegula.build import DEFAULT_TARGET
        from tegula.recommend import recommend, score, shapes_of

        if not self.from_recommendation:
            specs = self.static_candidates(fixed)
        else:
            found = recommend(self.kernel, *_shapes(args), top_k=self.top_k, target=target,
                              grid=_meta_grid(grid), **fixed)
            specs = [Config.of(c.config) for c in found.top] or [Config.of({})]
        shapes, scalars = shapes_of(self.kernel, _shapes(args), None)
        grid_of = _meta_grid(grid)
        scored = {c: score(self.kernel, c.as_dict(), fixed, shapes, scalars, grid_of,
                           target or DEFAULT_TARGET) for c in specs}
        return specs, scored

    def static_candidates(self, fixed: dict) -> list[Config]:
        """The `configs=` list, or every combination of `space=` (sorted values, the
        names the call fixes left out)."""
        if self.configs is not None:
            clash = sorted(set(fixed) & {k for c in self.configs for k in c.kwargs})
            if clash:
                raise TegulaError(f"{self.name}: the call fixes {', '.join(clash)}, which "
                                  f"the autotune configs choose")
            return self.configs
        names = sorted(k for k in self.space if k not in fixed)
        values = [sorted(set(self.space[n]), key=lambda v: (type(v).__name__, v))
                  for n in names]
        return [Config.of(dict(zip(names, combo))) for combo in itertools.product(*values)]

    def key_dims(self, args: tuple) -> tuple[int, ...]:
        """The key's dimensions for these arguments (module docstring)."""
        by_name = {p.name: a for p, a in zip(
            [p for p in self.kernel.params if p.kind != "constexpr"], args)}
        if self.key is None:
            return tuple(int(d) for p in self.kernel.params if p.kind == "tensor"
                         for d in getattr(by_name.get(p.name), "shape", ()))
        dims: list[int] = []
        for item in self.key:
            match = re.fullmatch(r"(\w+)\.shape\[(\d+)\]", item)
            name = match.group(1) if match else item
            if name not in by_name:
                raise TegulaError(f"{self.name}: autotune key {item!r} names no argument of "
                                  f"the call (its parameters: "
                                  f"{', '.join(by_name) or '(none)'})")
            value = by_name[name]
            if match:
                dims.append(int(value.shape[int(match.group(2))]))
            elif hasattr(value, "shape"):
                dims += [int(d) for d in value.shape]
            else:
                dims.append(int(value))
        return tuple(dims)

    def report(self) -> str:
        """Every key tuned in this process: the winner and each trial (or its skip reason)."""
        return self.tuner.report()


def _launch_kwargs(config: Config) -> dict:
    extra = {"threads": config.threads} if config.threads is not None else {}
    return {**config.kwargs, **extra}


def _meta_grid(grid: Any) -> Any:
    """The grid as `recommend` takes it: a tuple, or a function of the config dict."""
    if callable(grid):
        return grid
    return tuple(grid) if isinstance(grid, (tuple, list)) else (int(grid),)


def _shapes(args: tuple) -> tuple:
    """The call's arguments as `recommend` takes them: shapes for tensors, ints for scalars."""
    return tuple(tuple(a.shape) if hasattr(a, "shape") else a for a in args)


def _extra_key(kernel: Any, args: tuple, fixed: dict, target: Any) -> str:
    """The non-shape part of the key: element types of the tensors, the fixed constexprs,
    the target when the call names one."""
    dtypes = ",".join(str(getattr(a, "dtype", type(a).__name__)).replace("torch.", "")
                      for a in args)
    consts = ",".join(f"{k}={fixed[k]!r}" for k in sorted(fixed))
    return f"{dtypes};{consts}" + (f";{target}" if target else "")


def _device_name(args: tuple) -> str:
    """The GPU the call runs on (its first CUDA tensor's), or "" when it has none."""
    for a in args:
        device = getattr(a, "device", None)
        if getattr(device, "type", None) == "cuda":
            import torch
            return torch.cuda.get_device_name(device)
    return ""


def _gpu_launch(kernel: Any, grid: Any, args: tuple, kwargs: dict) -> Any:
    from tegula.build import launch_arguments

    kwargs = dict(kwargs)
    target, stream = kwargs.pop("target", None), kwargs.pop("stream", None)
    return launch_arguments(kernel, grid, args, kwargs, target, stream)


__all__ = ["autotune", "TunedKernel"]
