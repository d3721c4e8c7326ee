"""Code generation: thread IR → CUDA C++ source with inline PTX.

`emit_cuda(kernel, target)` prints a `ThreadKernel` as one self-contained
`extern "C" __global__` function; `param_list(kernel)` describes its parameters (the
runtime packs launch arguments from the same list). See `cuda.py`, `expr.py`, `ptx.py`.
"""
from __future__ import annotations

from tegula.codegen.cuda import emit_cuda, target_sm
from tegula.codegen.expr import CodegenError, element_bits, element_value, storage_type
from tegula.codegen.params import (
    ParamSpec, global_access_bytes, param_list, vectorized_tensors,
)
from tegula.codegen.ptx import mma_instr

__all__ = ["emit_cuda", "param_list", "ParamSpec", "CodegenError", "mma_instr",
           "global_access_bytes", "vectorized_tensors", "storage_type", "element_bits", "element_value", "target_sm"]
