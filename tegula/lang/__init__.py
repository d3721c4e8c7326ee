"""The user-facing kernel language: `@tg.kernel`, tile handles, ops, run-time control flow.

A kernel body is plain Python run once at trace time on symbolic values; each language call
records a tile IR op (tegula.ir). The pieces, one job per file:

* `kernel`      — `@kernel`, `Tensor[...]` / `constexpr` annotations, the tracing driver;
* `trace`       — the tracing context (op-list stack, names, the user's source lines);
* `tensors`     — handles: global tensors and views, shared buffers, register tiles;
* `elementwise` — operators, math functions, `where`, casts, `assign`;
* `ops`         — making tiles, `copy`, `load`, `gemm`, reductions, `rearrange`, atomics;
* `indexing`    — coordinates (`arange`, `indices`), `t[None, :]`, rank promotion;
* `scalars`     — grid sizes, the SM count, scalar `min`/`max`, scalar loads (`offsets[e]`);
* `arrivals`    — `last_arrival`: the block of a group that finishes last (a global counter);
* `control`     — `range`, `pipeline`, `if_`, `else_`;
* `roles`       — `producer` / `consumer` blocks of a `pipeline` (warp roles, sm_90a);
* `carry`       — names rebound inside those blocks: carried values, and the errors.

Updating a value across iterations of a run-time loop: the body is traced once, yet both
ways of writing an update work. In-place ops write the tile (`acc += x`, `acc.assign(e)`,
`tg.gemm(acc, …)`, `tg.copy(src, acc)`, `tg.fill(acc, v)`), and a name rebound with `=`
(`acc = acc * alpha + x`) is carried to the next iteration and out of the loop by
`carry` (also through `tg.if_` / `tg.else_` blocks).

Launching: `kernel[grid](*args)` forwards to `tegula.runtime.launch(kernel, grid, *args,
**kwargs)`; the language itself only traces.
"""
from __future__ import annotations

from tegula.ir.scalar import cdiv
from tegula.lang.control import else_, eq, if_, ne, pipeline, runtime_range
from tegula.lang.elementwise import (abs_, cast, cos, exp, exp2, log, log2, maximum, minimum,
                                     erf, rsqrt, sigmoid, sin, sqrt, tanh,
                                     where)
from tegula.lang.kernel import Kernel, Tensor, TensorSpec, constexpr, kernel
from tegula.lang.indexing import arange, bitcast, indices, permute, reshape
from tegula.lang.roles import consumer, producer
from tegula.lang.scalars import cluster, num_programs, num_sms
from tegula.lang.arrivals import last_arrival
from tegula.lang.scan import cumsum, scan
from tegula.lang.ops import (argmax, argmin, atomic_add, block_id, copy, fill, full, gemm, load,
                             rearrange, reduce, reduce_max, reduce_min, reduce_sum, register,
                             shared, zeros)
from tegula.lang.tensors import (GlobalTensor, GlobalView, RegisterValue, SharedBuffer,
                                 SharedView)

__all__ = ["kernel", "Kernel", "Tensor", "TensorSpec", "constexpr", "block_id",
           "num_programs", "num_sms", "cluster", "cdiv",
           "shared", "register", "zeros", "full", "fill", "copy", "load", "gemm", "cast",
           "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "abs_", "tanh", "sigmoid", "erf", "sin",
           "cos", "maximum", "minimum", "where", "reduce", "reduce_sum", "reduce_max",
           "reduce_min", "argmax", "argmin", "arange", "indices", "reshape", "permute", "bitcast", "rearrange", "atomic_add", "runtime_range", "pipeline", "if_",
           "else_", "eq", "ne", "GlobalTensor", "GlobalView", "SharedBuffer", "SharedView",
           "RegisterValue", "scan", "cumsum", "producer", "consumer", "last_arrival"]
