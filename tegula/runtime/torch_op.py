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
machine without a GPU. The ops are forward-only: none registers a backward, so
`backward()` through one raises torch's "no autograd formula was registered" error rather
than returning a wrong gradient.
"""
from __future__ import annotations

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
             constexprs: dict | None = None) -> Any:
    """Register `kernel` as the torch custom op `name` (default `tegula_user::KERNEL`) and
    return it (callable like a function; see the module docstring)."""
    import torch

    spec = make_spec(kernel, out, grid, name, constexprs)
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
    op.tegula_spec = spec  # for tests and `explain`: what the op was made from
    return op


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
