"""`tg.torch_op`: a tegula kernel as a `torch.library` custom op, in one line.

    @tg.kernel(threads=128)
    def silu_mul(x: tg.Tensor[f16], y: tg.Tensor[f16], out: tg.Tensor[f16],
                 BM: tg.constexpr = 16, BN: tg.constexpr = 128): ...

    silu_mul_op = tg.torch_op(silu_mul, out={"out": "x"},
                              grid=lambda x, y: (tg.cdiv(x.shape[0], 16),
                                                 tg.cdiv(x.shape[1], 128)))
    z = silu_mul_op(x, y)            # also torch.ops.tegula_user.silu_mul(x, y)

The op's arguments are the kernel's tensor and `int` parameters that are not outputs, in
the kernel's order; its results are the `out` tensors, allocated
by the op (uninitialized: the kernel must write every element) on the inputs' device, in
the order `out` lists them. Constexprs are fixed when the op is made (`constexprs=`, else
the kernel's defaults), so one op is one specialization family.

* `out`: output parameter name -> its shape, given as the name of an input of the same
  shape or a function of the op's inputs (positionally) returning a shape. The dtype and
  rank come from the kernel's annotation, so nothing else has to be declared.
* `grid`: a tuple, or a function of the op's inputs (positionally) returning one.

What torch gets: a schema (`tegula_user::silu_mul(Tensor x, Tensor y) -> Tensor`), a CUDA
implementation (`kernel[grid](...)` on the current stream), a fake implementation from the
declared shapes (so `torch.compile(fullgraph=True)` traces callers without a graph break,
and `torch.library.opcheck` can check it), and a CPU implementation that runs the same
compiled kernel in tegula's numpy emulator — slow, meant for tests and for developing on a
machine without a GPU.

`backward=` registers an autograd formula (without it the op is forward-only, and
`backward()` through it raises torch's "no autograd formula was registered" error rather
than returning a wrong gradient). It is called by name: each of its parameters is one of
the op's inputs or outputs (saved for the backward; only those it names are kept) or
`grad_<output>` (the incoming gradient of that output). It is either

* another op made by `tg.torch_op` — a backward kernel — whose outputs are named
  `grad_<input>` (incoming gradients reach it contiguous):

      mul_op = tg.torch_op(mul, out={"out": "x"}, grid=grid,
                           backward=tg.torch_op(mul_backward, grid=grid,
                                                out={"grad_x": "x", "grad_y": "y"}))

* or a Python function, returning a dict {input name: gradient}, a tuple with one entry
  per op input (None for `int` inputs and gradients not needed), or a tensor where the op
  has one tensor input:

      silu_op = tg.torch_op(silu, out={"out": "x"}, grid=grid,
                            backward=lambda x, grad_out: grad_out * dsilu(x))

A gradient must have its input's shape (checked, with the op and input named); it is
cast to the input's dtype by torch.
"""
from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from tegula.dtypes import DType
from tegula.errors import TegulaError
# tegula dtype name -> torch dtype name (the runtime's own table, so one place says it).
from tegula.runtime.args import _TORCH_NAMES

DEFAULT_NAMESPACE = "tegula_user"


def torch_dtype(dtype: DType) -> Any:
    """The torch dtype holding a tegula element type (packed 4-bit types have none here)."""
    import torch

    if dtype.is_packed:
        raise TegulaError(f"tg.torch_op: packed {dtype} tensors are not supported as op "
                          f"arguments (their torch storage is uint8 with half the elements)")
    return getattr(torch, _TORCH_NAMES[str(dtype)])


# ------------------------------------------------------------------------------ torch <-> numpy

def to_numpy(t: Any, dtype: DType) -> np.ndarray:
    """A CPU torch tensor as the emulator's storage for `dtype` (bf16 and f8 values live in
    float32 there; the conversion is exact)."""
    from tegula.emulate.values import storage_dtype

    store = storage_dtype(dtype)
    source = t.detach()
    if str(source.dtype) in ("torch.bfloat16", "torch.float8_e4m3fn", "torch.float8_e5m2"):
        source = source.float()
    return np.ascontiguousarray(source.numpy()).astype(store, copy=False)


def from_numpy(array: np.ndarray, dtype: DType) -> Any:
    """The emulator's array back as a torch tensor of `dtype` (exact: the emulator rounds
    every stored value to `dtype`)."""
    import torch

    return torch.from_numpy(np.ascontiguousarray(array)).to(torch_dtype(dtype))


def poisoned_output(shape: tuple, dtype: DType) -> np.ndarray:
    """An emulator output array filled with a value a kernel writes only by coincidence
    (NaN for floats), so an element the kernel misses cannot pass for a result."""
    from tegula.emulate.values import storage_dtype

    store = storage_dtype(dtype)
    if dtype.is_float:
        fill = np.nan
    elif store.kind in "iu":
        fill = np.iinfo(store).max
    else:
        fill = True  # bool: nothing is unlikely; the emulator's coverage check still tells
    return np.full(shape, fill, dtype=store)


# ------------------------------------------------------------------------------ the op spec

@dataclass(frozen=True)
class OpSpec:
    """What a kernel-backed op needs: which kernel parameters are inputs and outputs, how
    to size the outputs and the grid, and the constexprs."""

    kernel: Any
    qualname: str
    inputs: tuple[Any, ...]            # kernel Params (tensors and scalars), kernel order
    outputs: tuple[Any, ...]           # kernel Params, in `out`'s order
    shapes: dict[str, Callable[..., Sequence[int]]]
    grid: Any
    constexprs: dict

    @property
    def schema(self) -> str:
        args = ", ".join(f"{'Tensor' if p.kind == 'tensor' else 'SymInt'} {p.name}"
                         for p in self.inputs)
        results = "Tensor" if len(self.outputs) == 1 else \
            "(" + ", ".join("Tensor" for _ in self.outputs) + ")"
        return f"({args}) -> {results}"

    def check_inputs(self, values: Sequence[Any]) -> None:
        """Tensor inputs have the kernel's dtype and rank (named in the error), checked the
        same way on fake, CPU and CUDA tensors."""
        for param, value in zip(self.inputs, values):
            if param.kind != "tensor":
                continue
            want = torch_dtype(param.spec.dtype)
            if value.dtype != want or value.dim() != param.spec.rank:
                raise TegulaError(
                    f"{self.qualname}: {param.name} must be a {param.spec.rank}-D "
                    f"{want} tensor (the kernel {self.kernel.name} declares "
                    f"{param.spec}), got {value.dim()}-D {value.dtype}")

    def output_shapes(self, values: Sequence[Any]) -> list[tuple[int, ...]]:
        shapes = []
        for param in self.outputs:
            shape = tuple(self.shapes[param.name](*values))
            if len(shape) != param.spec.rank:
                raise TegulaError(f"{self.qualname}: out[{param.name!r}] gave shape {shape}, "
                                  f"but the kernel declares {param.spec} (rank "
                                  f"{param.spec.rank})")
            shapes.append(shape)
        return shapes

    def grid_of(self, values: Sequence[Any]) -> tuple:
        return tuple(self.grid(*values)) if callable(self.grid) else tuple(self.grid)

    def device_of(self, values: Sequence[Any]) -> Any:
        tensors = [v for p, v in zip(self.inputs, values) if p.kind == "tensor"]
        if not tensors:
            raise TegulaError(f"{self.qualname}: the op needs at least one tensor input to "
                              f"know its device")
        return tensors[0].device

    def kernel_arguments(self, values: Sequence[Any], outputs: Sequence[Any]) -> list[Any]:
        """Inputs and outputs interleaved back into the kernel's parameter order."""
        by_name = {p.name: v for p, v in zip(self.inputs, values)}
        by_name.update({p.name: v for p, v in zip(self.outputs, outputs)})
        return [by_name[p.name] for p in self.kernel.params if p.kind != "constexpr"]


def make_spec(kernel: Any, out: dict, grid: Any, name: str | None,
              constexprs: dict | None) -> OpSpec:
    """Check `tg.torch_op`'s arguments against the kernel and collect them."""
    from tegula.lang.kernel import Kernel

    if not isinstance(kernel, Kernel):
        raise TegulaError(f"tg.torch_op: expected a @tg.kernel, got {type(kernel).__name__}")
    qualname = name or f"{DEFAULT_NAMESPACE}::{kernel.name}"
    if not re.fullmatch(r"[A-Za-z_]\w*::[A-Za-z_]\w*", qualname):
        raise TegulaError(f"tg.torch_op: name {qualname!r} must look like 'namespace::op'")
    tensors = {p.name: p for p in kernel.params if p.kind == "tensor"}
    if not isinstance(out, dict) or not out:
        raise TegulaError(f"tg.torch_op({kernel.name}): out must name at least one output "
                          f"tensor parameter, e.g. out={{'y': 'x'}}")
    for out_name in out:
        if out_name not in tensors:
            raise TegulaError(f"tg.torch_op({kernel.name}): out names {out_name!r}, which is not "
                              f"a tensor parameter of the kernel ({', '.join(tensors)})")
    inputs = tuple(p for p in kernel.params if p.kind != "constexpr" and p.name not in out)
    input_names = [p.name for p in inputs]
    shapes = {}
    for out_name, shape in out.items():
        if isinstance(shape, str):
            if shape not in input_names or tensors.get(shape) is None:
                raise TegulaError(f"tg.torch_op({kernel.name}): out[{out_name!r}] = {shape!r} "
                                  f"is not a tensor input (inputs: {', '.join(input_names)})")
            index = input_names.index(shape)
            shapes[out_name] = lambda *values, i=index: tuple(values[i].shape)
        elif callable(shape):
            shapes[out_name] = shape
        else:
            raise TegulaError(f"tg.torch_op({kernel.name}): out[{out_name!r}] must be an input's "
                              f"name or a function of the inputs returning a shape")
    for param in (tensors[n] for n in out):
        torch_dtype(param.spec.dtype)  # packed types are refused here, not at first call
    values = kernel.constexpr_values(dict(constexprs or {}))  # unknown names fail now
    return OpSpec(kernel, qualname, inputs, tuple(tensors[n] for n in out), shapes, grid, values)


# ------------------------------------------------------------------------------ registration

def torch_op(kernel: Any, *, out: dict, grid: Any, name: str | None = None,
             constexprs: dict | None = None, backward: Any = None) -> Any:
    """Register `kernel` as the torch custom op `name` (default `tegula_user::KERNEL`) and
    return it (callable like a function; see the module docstring)."""
    import torch

    spec = make_spec(kernel, out, grid, name, constexprs)
    formula = None if backward is None else Backward.of(spec, backward)
    namespace, op_name = spec.qualname.split("::")
    if hasattr(getattr(torch.ops, namespace), op_name):
        raise TegulaError(f"tg.torch_op: an op {spec.qualname} is already registered; pass "
                          f"another name= (e.g. one per dtype of a kernel factory)")

    def cuda_impl(*values: Any) -> Any:
        spec.check_inputs(values)
        device = spec.device_of(values)
        outputs = [torch.empty(shape, dtype=torch_dtype(p.spec.dtype), device=device)
                   for p, shape in zip(spec.outputs, spec.output_shapes(values))]
        kernel[spec.grid_of(values)](*spec.kernel_arguments(values, outputs), **spec.constexprs)
        return _results(outputs)

    def cpu_impl(*values: Any) -> Any:
        spec.check_inputs(values)
        return _results(run_emulated(spec, values))

    def fake_impl(*values: Any) -> Any:
        spec.check_inputs(values)
        device = spec.device_of(values)
        return _results([torch.empty(shape, dtype=torch_dtype(p.spec.dtype), device=device)
                         for p, shape in zip(spec.outputs, spec.output_shapes(values))])

    op = torch.library.custom_op(spec.qualname, cuda_impl, mutates_args=(),
                                 device_types="cuda", schema=spec.schema)
    op.register_kernel("cpu", cpu_impl)
    op.register_fake(fake_impl)
    if formula is not None:
        op.register_autograd(formula.backward, setup_context=formula.setup_context)
    op.tegula_spec = spec  # for tests and `explain`: what the op was made from
    return op


# ------------------------------------------------------------------------------ backward

@dataclass(frozen=True)
class Backward:
    """An op's autograd formula from a user's `backward=` (see the module docstring):
    which forward values it reads (`saved`, by name), and how its result maps to the
    inputs' gradients."""

    spec: OpSpec
    function: Callable[..., Any]
    saved: tuple[str, ...]          # forward inputs and outputs the backward reads
    grads: tuple[str, ...]          # the `grad_<output>` names it reads
    outputs: tuple[str, ...] | None  # a backward op's outputs (`grad_<input>`), else None

    @classmethod
    def of(cls, spec: OpSpec, backward: Any) -> Backward:
        """Check `backward` against the op's names, at `tg.torch_op` time."""
        where = f"tg.torch_op({spec.kernel.name}, backward=...)"
        forward = [p.name for p in spec.inputs] + [p.name for p in spec.outputs]
        grads = {f"grad_{p.name}" for p in spec.outputs}
        available = ", ".join(forward + sorted(grads))
        other = getattr(backward, "tegula_spec", None)
        if other is not None:  # a backward kernel's op
            wanted = [p.name for p in other.inputs]
            outputs = tuple(p.name for p in other.outputs)
            tensor_inputs = {f"grad_{p.name}" for p in spec.inputs if p.kind == "tensor"}
            for name in outputs:
                if name not in tensor_inputs:
                    raise TegulaError(f"{where}: the backward op {other.qualname} has an "
                                      f"output {name!r}; its outputs must be named grad_ and "
                                      f"a tensor input of the op "
                                      f"({', '.join(sorted(tensor_inputs))})")
        elif callable(backward):
            wanted, outputs = _parameters(backward, where, forward, grads), None
        else:
            raise TegulaError(f"{where}: backward must be an op made by tg.torch_op or a "
                              f"Python function, got {type(backward).__name__}")
        for name in wanted:
            if name not in forward and name not in grads:
                raise TegulaError(f"{where}: the backward reads {name!r}, which is neither "
                                  f"an input or output of the op nor an incoming gradient "
                                  f"(available: {available})")
        return cls(spec, backward, tuple(n for n in wanted if n in forward),
                   tuple(n for n in wanted if n in grads), outputs)

    def setup_context(self, ctx: Any, inputs: tuple, output: Any) -> None:
        """Save what the backward reads: tensors through `save_for_backward`, ints (SymInts
        while tracing) as they are."""
        import torch

        outputs = output if isinstance(output, tuple) else (output,)
        values = {p.name: v for p, v in zip(self.spec.inputs, inputs)}
        values.update({p.name: v for p, v in zip(self.spec.outputs, outputs)})
        tensors = [n for n in self.saved if isinstance(values[n], torch.Tensor)]
        ctx.save_for_backward(*(values[n] for n in tensors))
        ctx.tegula_tensors = tensors
        ctx.tegula_ints = {n: values[n] for n in self.saved if n not in tensors}
        ctx.tegula_shapes = [tuple(v.shape) if p.kind == "tensor" else None
                             for p, v in zip(self.spec.inputs, inputs)]

    def backward(self, ctx: Any, *grads: Any) -> tuple:
        """The inputs' gradients, one per op input (None for ints and unneeded ones)."""
        values = dict(zip(ctx.tegula_tensors, ctx.saved_tensors), **ctx.tegula_ints)
        for p, grad in zip(self.spec.outputs, grads):
            if f"grad_{p.name}" in self.grads:
                values[f"grad_{p.name}"] = grad.contiguous() \
                    if self.outputs is not None and grad is not None else grad
        wanted = self.saved + self.grads
        if self.outputs is not None:  # a backward op: positionally, in its input order
            order = [p.name for p in self.function.tegula_spec.inputs]
            result = self.function(*(values[n] for n in order))
            result = dict(zip(self.outputs, result if isinstance(result, tuple) else (result,)))
            result = {name[len("grad_"):]: g for name, g in result.items()}
        else:
            result = self.function(**{n: values[n] for n in wanted})
        return self._per_input(result, ctx.needs_input_grad, ctx.tegula_shapes)

    def _per_input(self, result: Any, needed: Sequence[bool], shapes: list) -> tuple:
        """`result` (dict, tuple or one tensor) as one checked gradient per op input."""
        inputs = self.spec.inputs
        where = f"{self.spec.qualname}'s backward"
        if isinstance(result, dict):
            unknown = [n for n in result if n not in {p.name for p in inputs}]
            if unknown:
                raise TegulaError(f"{where} returned gradients of {unknown}, which are not "
                                  f"inputs of the op ({', '.join(p.name for p in inputs)})")
            grads = [result.get(p.name) for p in inputs]
        elif isinstance(result, (tuple, list)):
            if len(result) != len(inputs):
                raise TegulaError(f"{where} returned {len(result)} gradients; the op has "
                                  f"{len(inputs)} inputs ({', '.join(p.name for p in inputs)})"
                                  f": return one per input (None for ints) or a dict")
            grads = list(result)
        else:
            tensors = [i for i, p in enumerate(inputs) if p.kind == "tensor"]
            if len(tensors) != 1:
                raise TegulaError(f"{where} returned one value; the op has {len(tensors)} "
                                  f"tensor inputs: return a dict or a tuple")
            grads = [result if i == tensors[0] else None for i in range(len(inputs))]
        return tuple(self._checked(p, g, shape) if need else None
                     for p, g, need, shape in zip(inputs, grads, needed, shapes))

    def _checked(self, param: Any, grad: Any, shape: tuple | None) -> Any:
        """A gradient of `param` has its shape (torch would sum a larger one down to it
        where it can, hiding a mistake); an int input has none."""
        if grad is None:
            return None
        where = f"{self.spec.qualname}'s backward"
        if param.kind != "tensor":
            raise TegulaError(f"{where} returned a gradient for the int input "
                              f"{param.name!r}; return None for it")
        if not hasattr(grad, "shape") or tuple(grad.shape) != shape:
            got = tuple(grad.shape) if hasattr(grad, "shape") else type(grad).__name__
            raise TegulaError(f"{where} returned a gradient of {param.name!r} shaped {got}; "
                              f"{param.name} has shape {shape}")
        return grad


def _parameters(function: Callable, where: str, forward: list, grads: set) -> list[str]:
    """The names a backward function reads: its parameters (a `**kwargs` reads everything;
    parameters with defaults that are no forward name are left to their defaults)."""
    try:
        parameters = inspect.signature(function).parameters.values()
    except (TypeError, ValueError):
        raise TegulaError(f"{where}: cannot read the backward function's parameters") from None
    names = []
    for p in parameters:
        if p.kind == p.VAR_KEYWORD:
            return forward + sorted(grads)
        if p.kind == p.VAR_POSITIONAL:
            raise TegulaError(f"{where}: the backward function takes *{p.name}; it is called "
                              f"by name (inputs, outputs and grad_<output>), so name them")
        if p.default is not p.empty and p.name not in forward and p.name not in grads:
            continue
        names.append(p.name)
    return names


def run_emulated(spec: OpSpec, values: Sequence[Any]) -> list[Any]:
    """The op on CPU tensors: the same compiled kernel, run by the numpy emulator."""
    from tegula.build import emulate

    arrays = [to_numpy(v, p.spec.dtype) if p.kind == "tensor" else int(v)
              for p, v in zip(spec.inputs, values)]
    outputs = [poisoned_output(shape, p.spec.dtype)
               for p, shape in zip(spec.outputs, spec.output_shapes(values))]
    emulate(spec.kernel, spec.grid_of(values), *spec.kernel_arguments(arrays, outputs),
            **spec.constexprs)
    return [from_numpy(o, p.spec.dtype) for p, o in zip(spec.outputs, outputs)]


def _results(outputs: list[Any]) -> Any:
    return outputs[0] if len(outputs) == 1 else tuple(outputs)


__all__ = ["torch_op", "OpSpec", "make_spec", "to_numpy", "from_numpy", "torch_dtype",
           "poisoned_output", "DEFAULT_NAMESPACE"]
