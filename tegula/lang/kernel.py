"""`@tg.kernel`: the kernel object, its signature, and the tracing driver.

A kernel's parameters are annotated with what they are at run time:

* `tg.Tensor[f16]` (rank 2) or `tg.Tensor[f16, 3]` — a global tensor; inside the body it is
  a `GlobalTensor` handle whose extents are symbolic (`a.shape[1]` is `TensorExtent`);
* `int` — a block-uniform integer argument (`ScalarArg`);
* `tg.constexpr` — a Python value fixed at trace time (its default, or `trace(BM=64)`).

`kernel.trace(**constexprs)` runs the body once on those symbolic values and returns the
`TracedKernel`, cached per constexpr values. Launching (`kernel[grid](...)`) is the job
of `tegula.runtime`; this module only forwards to it.
"""
from __future__ import annotations

import inspect
import linecache
import re
from dataclasses import dataclass
from functools import partial
from typing import Any, Callable

from tegula.dtypes import DType
from tegula.errors import SourceLocation, TegulaError, TraceError
from tegula.errors import call_site as _call_site  # the user's launch line
from tegula.ir.ops import TracedKernel
from tegula.ir.scalar import ScalarArg, TensorExtent
from tegula.ir.values import GlobalArg
from tegula.lang.tensors import GlobalTensor, whole_tensor_tile
from tegula.lang.trace import (TraceContext, innermost_frame_is_machinery, pop_context,
                               push_context, traceback_location, user_frame, user_location)

_NO_DEFAULT = inspect.Parameter.empty


class constexpr:  # noqa: N801 — spelled like a type because it is used as an annotation
    """Annotation for a parameter whose Python value is fixed at trace time
    (`BM: tg.constexpr = 128`). Each distinct set of values is traced separately.
    `tg.constexpr(choices=(64, 128, 256))` declares the values it may take: the ones
    `tg.recommend` and `@tg.autotune` choose among (a value outside them is refused)."""

    def __init__(self, choices: Any = None):
        values = tuple(choices) if isinstance(choices, (list, tuple, range)) else None
        if not values or not all(isinstance(v, (int, float, str)) for v in values):
            raise TraceError(f"tg.constexpr(choices=...) takes a non-empty list of numbers or "
                             f"strings, got {choices!r}", user_location())
        self.choices = values


@dataclass(frozen=True)
class TensorSpec:
    """What `tg.Tensor[dtype, rank]` evaluates to: the type of a global tensor parameter."""

    dtype: DType
    rank: int = 2

    def __repr__(self) -> str:
        return f"tg.Tensor[{self.dtype}, {self.rank}]"


class Tensor:
    """Annotation for a global tensor parameter: `tg.Tensor[f16]` (rank 2) or
    `tg.Tensor[f16, 3]`."""

    def __class_getitem__(cls, params: Any) -> TensorSpec:
        items = params if isinstance(params, tuple) else (params,)
        if not 1 <= len(items) <= 2 or not isinstance(items[0], DType):
            raise TraceError(f"tg.Tensor takes an element type and optionally a rank, as in "
                             f"tg.Tensor[f16] or tg.Tensor[f16, 3]; got tg.Tensor{list(items)}",
                             user_location())
        rank = items[1] if len(items) == 2 else 2
        if isinstance(rank, bool) or not isinstance(rank, int) or not 1 <= rank <= 8:
            raise TraceError(f"the rank in tg.Tensor[{items[0]}, {rank!r}] must be an integer "
                             f"from 1 to 8", user_location())
        return TensorSpec(items[0], rank)


@dataclass(frozen=True)
class Param:
    """One kernel parameter: `kind` is "tensor", "scalar" or "constexpr"."""

    name: str
    kind: str
    spec: TensorSpec | None = None
    default: Any = _NO_DEFAULT
    choices: tuple | None = None   # a constexpr's declared values (tg.constexpr(choices=))


def _definition_location(fn: Callable) -> SourceLocation:
    code = fn.__code__
    line = linecache.getline(code.co_filename, code.co_firstlineno)
    return SourceLocation(code.co_filename, code.co_firstlineno, line.strip(), code.co_name)


def _evaluate_annotation(fn: Callable, name: str, annotation: Any, loc: SourceLocation,
                         scope: dict, later: frozenset = frozenset()) -> Any:
    """String annotations (`from __future__ import annotations`) evaluated in the kernel's
    module, the scope that applied the decorator, and the function's closure. `later`:
    the decorating function's local variables not assigned yet."""
    if not isinstance(annotation, str):
        return annotation
    namespace = dict(fn.__globals__)
    namespace.update(scope)
    closure, unassigned = _closure_values(fn)
    namespace.update(closure)
    try:
        return eval(annotation, namespace)  # noqa: S307 — the user's own annotation text
    except TegulaError:
        raise
    except NameError as e:
        if e.name not in unassigned and e.name not in later:
            raise _annotation_error(fn, name, annotation, e, loc) from None
        raise TraceError(f"kernel {fn.__name__}: the annotation {annotation!r} of parameter "
                         f"{name!r} names {e.name!r}, which the enclosing function assigns "
                         f"only after the kernel is defined; assign it before the "
                         f"@tg.kernel line", loc) from None
    except Exception as e:
        raise _annotation_error(fn, name, annotation, e, loc) from None


def _annotation_error(fn: Callable, name: str, annotation: str, e: Exception,
                      loc: SourceLocation) -> TraceError:
    return TraceError(f"kernel {fn.__name__}: cannot evaluate the annotation {annotation!r} "
                      f"of parameter {name!r} ({type(e).__name__}: {e}); make the names it "
                      f"uses visible where the kernel is defined", loc)


def _closure_values(fn: Callable) -> tuple[dict, set]:
    """The function's closure variables that hold a value, and the names of those that do
    not yet: a variable the enclosing function assigns after the `@tg.kernel` line has an
    empty cell while the decorator runs (`inspect.getclosurevars` raises 'Cell is empty'
    for it); the body reads it when traced, after it is assigned."""
    values, unassigned = {}, set()
    for var, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        try:
            values[var] = cell.cell_contents
        except ValueError:
            unassigned.add(var)
    return values, unassigned


def _classify(fn: Callable, p: inspect.Parameter, loc: SourceLocation, scope: dict,
              later: frozenset = frozenset()) -> Param:
    where = f"kernel {fn.__name__}, parameter {p.name!r}"
    if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
        raise TraceError(f"{where}: *args and **kwargs are not supported in kernel signatures",
                         loc)
    ann = _evaluate_annotation(fn, p.name, p.annotation, loc, scope, later)
    if ann is constexpr:
        return Param(p.name, "constexpr", default=p.default)
    if isinstance(ann, constexpr):
        if p.default is not _NO_DEFAULT and p.default not in ann.choices:
            raise TraceError(f"{where}: its default {p.default!r} is not one of its choices "
                             f"{ann.choices}", loc)
        return Param(p.name, "constexpr", default=p.default, choices=ann.choices)
    if isinstance(ann, TensorSpec):
        kind, spec = "tensor", ann
    elif ann is int:
        kind, spec = "scalar", None
    elif ann is Tensor:
        raise TraceError(f"{where}: tg.Tensor needs its element type, e.g. tg.Tensor[f16]", loc)
    elif ann is _NO_DEFAULT:
        raise TraceError(f"{where} has no annotation; annotate it as tg.Tensor[dtype], int or "
                         f"tg.constexpr", loc)
    else:
        hint = " (float arguments are not supported; make it a tg.constexpr)" \
            if ann is float else ""
        raise TraceError(f"{where}: unsupported annotation {ann!r}; use tg.Tensor[dtype], int "
                         f"or tg.constexpr{hint}", loc)
    if p.default is not _NO_DEFAULT:
        raise TraceError(f"{where}: only tg.constexpr parameters can have default values", loc)
    return Param(p.name, kind, spec)


#: Names the compiler gives its own values in the thread IR, the emulator's environment and
#: the CUDA source: the thread and block indices, loop counters (i0, i1, …), register
#: arrays (r0, …), shared buffers (s0, …, and their `_saddr` addresses), coordinate bases
#: (c0_0, …), hoisted sums (inv0, …), tensor extents and strides (x_shape0, x_stride1),
#: and the emitter's `tg_` prefix. A parameter with one of these names would be silently
#: shadowed (a scalar `tid` read the thread index in the emulator), so it is refused.
_COMPILER_NAMES = re.compile(r"tid|bid_[xyz]|smem|tg_\w*|[irs]\d+|c\d+_\d+|inv\d+|"
                             r"\w+_saddr|\w+_(shape|stride)\d+")


def _check_name(fn: Callable, name: str, loc: SourceLocation) -> None:
    if _COMPILER_NAMES.fullmatch(name):
        raise TraceError(f"kernel {fn.__name__}, parameter {name!r}: the compiler names its "
                         f"own values like this (thread and block indices, loop counters "
                         f"i0…, registers r0…, shared buffers s0…, tensor extents "
                         f"x_shape0…, the tg_ prefix); rename the parameter", loc)
    # A C++ keyword (`do`, `int`, …) emulates fine but cannot name a CUDA parameter: refuse
    # it here, not when the kernel first meets a GPU. One list: the emitter's.
    from tegula.codegen.cuda import _RESERVED
    if name in _RESERVED:
        raise TraceError(f"kernel {fn.__name__}, parameter {name!r}: a C++ keyword or a name "
                         f"the generated CUDA defines, so it cannot name a parameter there; "
                         f"rename the parameter", loc)


def _check_kernel_name(fn: Callable, loc: SourceLocation) -> None:
    """The kernel's name is its CUDA function's (an `extern "C"` symbol): one CUDA already
    declares, or a C++ keyword, does not compile, so it is refused here rather than when
    the kernel first meets a GPU."""
    from tegula.codegen.cuda import _RESERVED, CUDA_C_FUNCTIONS
    if fn.__name__ in CUDA_C_FUNCTIONS or fn.__name__ in _RESERVED:
        raise TraceError(f"kernel {fn.__name__}: CUDA already has a function (or keyword) of "
                         f"this name, and the kernel's CUDA function carries the kernel's "
                         f"name; rename the kernel (e.g. {fn.__name__}_kernel)", loc)


def _cache_key(values: dict) -> tuple:
    def hashable(v: Any) -> Any:
        try:
            hash(v)
            return v
        except TypeError:
            return repr(v)
    return tuple((k, hashable(v)) for k, v in sorted(values.items()))


class Kernel:
    """A kernel function plus its signature; `trace()` turns it into tile IR."""

    def __init__(self, fn: Callable, threads: int, warp_specialize: bool | None = None):
        if isinstance(threads, bool) or not isinstance(threads, int) or \
                not 32 <= threads <= 1024 or threads % 32:
            raise TraceError(f"@tg.kernel(threads={threads!r}): threads must be a multiple of "
                             f"32 from 32 to 1024", _definition_location(fn))
        if not (warp_specialize is None or isinstance(warp_specialize, bool)):
            raise TraceError(f"@tg.kernel(warp_specialize={warp_specialize!r}): it is None "
                             f"(where it applies), True or False", _definition_location(fn))
        self.fn = fn
        self.threads = threads
        #: Split a TMA + wgmma pipeline into producer/consumer warp roles (`synth/roles.py`):
        #: None where the rule applies, True required, False never. A build or launch
        #: keyword `warp_specialize=` overrides it, like `threads=`.
        self.warp_specialize = warp_specialize
        self.name = fn.__name__
        self.loc = _definition_location(fn)
        _check_kernel_name(fn, self.loc)
        # The decorating scope's locals: string annotations may name them (a kernel
        # defined inside a function, with `from __future__ import annotations`).
        # Its variables without a value yet are assigned after the decorator (named in
        # the error if an annotation needs one).
        frame = user_frame()
        scope = dict(frame.f_locals) if frame is not None else {}
        code = frame.f_code if frame is not None else None
        later = frozenset() if code is None else \
            frozenset(code.co_varnames + code.co_cellvars) - set(scope)
        del frame
        self.params = [_classify(fn, p, self.loc, scope, later)
                       for p in inspect.signature(fn).parameters.values()]
        for p in self.params:
            if p.kind != "constexpr":  # constexprs never reach the thread IR
                _check_name(fn, p.name, self.loc)
        self._traces: dict[tuple, TracedKernel] = {}
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn

    @property
    def constexpr_names(self) -> list[str]:
        return [p.name for p in self.params if p.kind == "constexpr"]

    def constexpr_values(self, overrides: dict) -> dict:
        """Every constexpr's value: `overrides`, else the signature default."""
        known = self.constexpr_names
        for name in overrides:
            if name not in known:
                what = "a run-time parameter" if any(p.name == name for p in self.params) \
                    else "not a parameter"
                raise TraceError(f"kernel {self.name}: {name!r} is {what}, not a constexpr; "
                                 f"the constexprs are {', '.join(known) or '(none)'}",
                                 _call_site())
        values = {}
        for p in self.params:
            if p.kind != "constexpr":
                continue
            value = overrides.get(p.name, p.default)
            if value is _NO_DEFAULT:
                raise TraceError(f"kernel {self.name}: constexpr {p.name!r} has no default; "
                                 f"pass it as a keyword, e.g. {self.name}[grid](..., "
                                 f"{p.name}=...) or tg.emulate({self.name}, grid, ..., "
                                 f"{p.name}=...)", _call_site())
            if p.choices is not None and value not in p.choices:
                raise TraceError(f"kernel {self.name}: constexpr {p.name}={value!r} is not one "
                                 f"of its declared choices {p.choices}", _call_site())
            values[p.name] = value
        return values

    def trace(self, threads: int | None = None, **constexprs: Any) -> TracedKernel:
        """The tile IR of this kernel for these constexpr values (cached: the same object
        is returned for the same values, so passes that mutate it should copy it or use
        `trace_fresh`). `threads` overrides the decorator's block size (like Triton's
        num_warps), so one kernel can be tuned over 4 and 8 warps."""
        values = self.constexpr_values(constexprs)
        threads = self.check_threads(threads)
        key = (_cache_key(values), threads)
        if key not in self._traces:
            self._traces[key] = self._run_trace(values, threads)
        return self._traces[key]

    def trace_fresh(self, threads: int | None = None, **constexprs: Any) -> TracedKernel:
        """Like `trace`, but always re-runs the body and returns a new, uncached object."""
        return self._run_trace(self.constexpr_values(constexprs), self.check_threads(threads))

    def check_threads(self, threads: int | None) -> int:
        """The block size to trace with: the override if given (validated), else the default."""
        if threads is None:
            return self.threads
        if isinstance(threads, bool) or not isinstance(threads, int) or \
                not 32 <= threads <= 1024 or threads % 32:
            raise TraceError(f"kernel {self.name}: threads={threads!r} must be a multiple of 32 "
                             f"from 32 to 1024", user_location())
        return threads

    def _run_trace(self, values: dict, threads: int) -> TracedKernel:
        ctx = TraceContext(self.name)
        arguments, tensor_args, scalar_args = {}, [], []
        for p in self.params:
            if p.kind == "tensor":
                arg = GlobalArg(p.name, p.spec.dtype, p.spec.rank)
                extents = tuple(TensorExtent(p.name, d) for d in range(arg.rank))
                arguments[p.name] = GlobalTensor(arg, whole_tensor_tile(arg, extents, self.loc))
                tensor_args.append(arg)
            elif p.kind == "scalar":
                arguments[p.name] = ScalarArg(p.name)
                scalar_args.append(p.name)
            else:
                arguments[p.name] = values[p.name]
        result = self._call_body(ctx, arguments)
        if ctx.deferred_error is not None:
            raise ctx.deferred_error
        if result is not None:
            raise TraceError(f"kernel {self.name} returned {result!r}; a kernel body writes its "
                             f"results with tg.copy and returns nothing", self.loc)
        traced = TracedKernel(name=self.name, threads=threads, args=tensor_args,
                              scalar_args=scalar_args, constexprs=dict(values), body=ctx.body,
                              shared_allocs=ctx.shared_allocs,
                              register_tiles=ctx.register_tiles, loc=self.loc,
                              cluster=ctx.cluster)
        from tegula.ir.verify import verify
        verify(traced)  # a failure here is a tegula bug: the language built bad IR
        return traced

    def _call_body(self, ctx: TraceContext, arguments: dict) -> Any:
        """Run the user's function with the context active; point errors at user lines."""
        push_context(ctx)
        try:
            return self.fn(**arguments)
        except TegulaError as e:
            if e.loc is not None:
                raise
            located = type(e)(e.message, traceback_location(e.__traceback__), e.other_loc)
            raise located from None
        except Exception as e:
            if not innermost_frame_is_machinery(e.__traceback__):
                raise  # the user's own Python error, with the user's own traceback
            raise TraceError(f"internal error while tracing kernel {self.name}: "
                             f"{type(e).__name__}: {e} (a tegula bug; please report it)",
                             traceback_location(e.__traceback__)) from e
        finally:
            pop_context(ctx)

    def __getitem__(self, grid: Any) -> Callable[..., Any]:
        """`kernel[grid](*args, **kwargs)`: launch on `grid` blocks through
        `tegula.runtime.replay.launch_call` (a replay of an earlier launch with the same
        key, else compile, cache, launch; `stream=` and `target=` keywords go to the
        launch, every other keyword is a constexpr). A partial of it, so that calling it
        costs no Python frame of its own."""
        launch = _LAUNCH[0] if _LAUNCH else _import_launch()
        return partial(launch, self, grid)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise TegulaError(f"kernel {self.name} is launched with a grid: "
                          f"{self.name}[grid](...), or traced with {self.name}.trace(...)")

    def __repr__(self) -> str:
        return f"<tegula kernel {self.name} threads={self.threads}>"


_LAUNCH: list = []  # [tegula.runtime.replay.launch_call], imported on the first launch


def _import_launch():
    # The launch path sits above the language, so it is imported late; once, because an
    # import statement per launch costs about a microsecond of host time.
    from tegula.runtime.replay import launch_call
    _LAUNCH.append(launch_call)
    return launch_call


def kernel(fn: Callable | None = None, *, threads: int = 128,
           warp_specialize: bool | None = None) -> Any:
    """`@tg.kernel(threads=128)` (or bare `@tg.kernel`): make a `Kernel` of a function.
    `warp_specialize` (sm_90a): None gives a TMA + wgmma `tg.pipeline` a producer warpgroup
    of its own where the rule applies, True requires it, False keeps one role (a pipeline
    written in `tg.producer` / `tg.consumer` blocks always has the roles: False is an
    error there)."""
    if fn is not None:
        return Kernel(fn, threads, warp_specialize)
    return lambda f: Kernel(f, threads, warp_specialize)


__all__ = ["kernel", "Kernel", "Tensor", "TensorSpec", "constexpr", "Param"]
