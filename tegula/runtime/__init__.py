"""Runtime: compile generated CUDA to cubins (NVRTC or nvcc), cache them on disk, load and
launch them on torch tensors.

    ck = compile_kernel(thread_kernel)          # emit + compile (disk-cached) + wrap
    ck.launch(grid, (x, y))                     # or ck[grid](x, y); current torch stream

Kernels with TMA tensor maps take them from their tensor arguments (`tensor_map.py`:
checked, encoded once per distinct tensor and box, cached); kernels with a cluster launch
through `cuLaunchKernelEx`. `compile_cuda` is the bare source → cubin step;
`specialization_key(args)` reports the divisibility facts of arguments for specialized
compiles.
"""
from __future__ import annotations

from tegula.runtime.args import (
    ArgumentPlan, TensorRequirement, default_requirements, divisibility, specialization_key,
    tensor_view,
)
from tegula.runtime.cache import DiskCache, cache_key, default_cache_dir
from tegula.runtime.compiler import (
    Compiler, available_compilers, compile_cuda, default_compiler, disassemble,
)
from tegula.runtime.launcher import (
    CompiledKernel, PreparedLaunch, compile_kernel, default_target, param_layout,
)
from tegula.runtime.tensor_map import TENSOR_MAPS, TensorMapCache, encode_tensor_map

__all__ = ["compile_kernel", "CompiledKernel", "compile_cuda", "specialization_key",
           "DiskCache", "cache_key", "default_cache_dir", "Compiler", "available_compilers",
           "default_compiler", "disassemble", "TensorRequirement", "ArgumentPlan",
           "default_requirements", "divisibility", "tensor_view", "default_target",
           "param_layout", "PreparedLaunch", "encode_tensor_map", "TensorMapCache",
           "TENSOR_MAPS"]
