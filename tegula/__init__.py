"""tegula: a tile-level GPU kernel language whose compiler synthesizes every layout.

    import tegula as tg
    from tegula import f16, f32

    @tg.kernel(threads=128)
    def kernel(a: tg.Tensor[f16], ..., BM: tg.constexpr = 128): ...

`tg.sum`, `tg.max`, `tg.min`, `tg.abs` and `tg.range` are the language's reductions,
element-wise absolute value and run-time loop; they shadow Python's builtins only inside
the `tg` namespace.
"""
from __future__ import annotations

__version__ = "0.1.0"

from tegula.dtypes import (DType, bf16, bool_, f8e4m3, f8e5m2, f16, f32, i4, i8, i32, u4,
                           u8)
from tegula.errors import ClusterWarning, TegulaError, TraceError
from tegula.lang import arange, argmax, argmin, indices
from tegula.lang import cluster, num_programs, num_sms
from tegula.lang import last_arrival
from tegula.lang import cumsum, scan
from tegula.lang import consumer, producer
from tegula.lang import bitcast, permute, reshape
from tegula.lang import (Kernel, Tensor, atomic_add, block_id, cast, cdiv, constexpr, copy,
                         cos, else_, eq, exp, exp2, fill, full, gemm, if_, kernel, load, log,
                         log2, maximum, minimum, ne, pipeline, rearrange, reduce, register,
                         rsqrt, shared, sigmoid, sin, sqrt, tanh, where, zeros)
from tegula.lang import erf
from tegula.lang import abs_ as abs  # noqa: A001 — tg.abs, by design
from tegula.lang import reduce_max as max  # noqa: A001
from tegula.lang import reduce_min as min  # noqa: A001
from tegula.lang import reduce_sum as sum  # noqa: A001
from tegula.lang import runtime_range as range  # noqa: A001

__all__ = ["__version__", "DType", "f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i8", "u8", "i32",
           "i4", "u4", "bool_", "TegulaError", "TraceError", "Kernel", "kernel", "Tensor",
           "constexpr", "block_id", "num_programs", "num_sms", "cluster", "cdiv", "shared", "register",
           "zeros", "full", "fill",
           "copy", "load", "gemm", "cast", "exp", "exp2", "log", "log2", "sqrt", "rsqrt",
           "abs", "tanh", "sigmoid", "erf", "sin", "cos", "maximum", "minimum", "where", "reduce",
           "sum", "max", "min", "argmax", "argmin", "arange", "indices", "rearrange",
           "atomic_add", "range", "pipeline", "if_", "scan", "cumsum", "reshape", "permute", "bitcast",
           "else_", "eq", "ne", "ClusterWarning", "last_arrival"]

from tegula.explain import explain  # noqa: E402 — tg.explain(kernel, **constexprs) -> str
from tegula.recommend import recommend  # noqa: E402 — tg.recommend(kernel, shapes=...)
from tegula.runtime.tuned_kernel import autotune  # noqa: E402 — @tg.autotune(...)
__all__ += ["explain", "recommend", "autotune"]
__all__ += ["producer", "consumer"]  # warp-role blocks of a tg.pipeline (tegula.lang.roles)

# `tegula.emulate` is also a subpackage, and Python binds a submodule onto its package the
# first time it is imported: import it now, so the name below stays the function.
import tegula.emulate as _emulate_package  # noqa: E402,F401
from tegula.build import emulate  # noqa: E402 — tg.emulate(kernel, grid, *arrays, **constexprs)
__all__.append("emulate")


def torch_op(kernel, *, out, grid, name=None, constexprs=None, backward=None):
    """`tg.torch_op(kernel, out={"y": "x"}, grid=...)`: the kernel as a torch custom op
    (schema, CUDA launch, fake implementation, emulated CPU implementation, and with
    `backward=` — another such op or a Python function — an autograd formula); see
    `tegula.runtime.torch_op`. Imported on first use, so `import tegula` needs no torch."""
    from tegula.runtime.torch_op import torch_op as make_op
    return make_op(kernel, out=out, grid=grid, name=name, constexprs=constexprs,
                   backward=backward)


__all__.append("torch_op")
