"""Torch-facing entry points of the kernel library: `matmul`, `rms_norm`, `softmax`, `copy`
(`matmul` and `matmul_fp8` are written in `tegula.kernels.api_matmul`, re-exported here).

    import tegula.kernels as tk
    c = tk.matmul(a, b)              # a (M, K), b (K, N), f16/bf16 -> (M, N)
    y = tk.rms_norm(x, w, 1e-6)      # x (..., N), w (N,)
    p = tk.softmax(x)                # along the last dim
    z = tk.copy(x)

Each call checks its inputs (a clear TypeError/ValueError naming the argument, before any
compilation), allocates the output (or writes `out=`), picks a configuration with the
autotuner (`tegula.runtime.autotune`: the first call in each shape bucket times a few
candidates on the real arguments; later calls and later processes reuse the winner), and
launches on the current torch stream. torch is imported lazily: this module imports
without it.

GEMM operand layout: the kernel computes `a @ bt.T` with `bt` (N, K). When `b` is the
transpose of a K-major (N, K) tensor — `x @ w.T` with an `nn.Linear` weight `w` — `b.T`
is passed as a free view. A row-major (K, N) `b` is N-major for the kernel: the autotuner
compares passing it as is (the kernel specializes on the strides) with copying `b.T` to a
K-major tensor first, a transpose costing 2·K·N·itemsize bytes of traffic per call
(≈ 40 µs at 4096×4096 f16 on an H100, small next to a large GEMM, dominant at decode
sizes), and the timings include that copy. Keep weights as (N, K) to avoid the question.
"""
from __future__ import annotations

import functools
import os
from typing import Any, Callable, Sequence

from tegula.dtypes import DType, bf16, f8e4m3, f16, f32, i8, i32, u8
from tegula.runtime import launcher as _launcher, replay as _replay
from tegula.runtime.autotune import Autotuner, Config

# torch dtype name (str(torch.float16)[6:]) -> tegula dtype, per entry point.
_FLOATS = {"float16": f16, "bfloat16": bf16, "float32": f32}
_GEMM_DTYPES = {"float16": f16, "bfloat16": bf16}
_FP8_DTYPES = {"float8_e4m3fn": f8e4m3}
_SCALE_DTYPES = {"float32": f32}
_COPY_DTYPES = {**_FLOATS, "int8": i8, "uint8": u8, "int32": i32}

# One tuner per entry point: winners are cached per (shape bucket, dtype, GPU name).
TUNERS: dict[str, Autotuner] = {name: Autotuner(name)
                                for name in ("matmul", "matmul_fp8", "rms_norm", "softmax",
                                             "copy")}

# Rows longer than this do not fit one register tile (see tegula.kernels.softmax.MAX_ROW).
_MAX_ROW = 16384


def _torch():
    import torch
    return torch


# --------------------------------------------------------------------------------------
# Argument checks: type, rank and dtype first, then shapes, then the device, so that a
# mistake is named the same way on any machine (and testable without a GPU).
# --------------------------------------------------------------------------------------

def _check_tensor(fn: str, name: str, x: Any, dtypes: dict[str, DType],
                  ndim: int | None = None, min_ndim: int = 0) -> DType:
    """The tegula dtype of tensor argument `name` of `fn`, after checking its type and rank."""
    torch = _torch()
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"tegula.kernels.{fn}: {name} must be a torch.Tensor, got "
                        f"{type(x).__name__}")
    if ndim is not None and x.dim() != ndim:
        raise ValueError(f"tegula.kernels.{fn}: {name} must be {ndim}-D, got shape "
                         f"{tuple(x.shape)}")
    if x.dim() < min_ndim:
        raise ValueError(f"tegula.kernels.{fn}: {name} must have at least {min_ndim} "
                         f"dimension(s), got shape {tuple(x.shape)}")
    dtype = dtypes.get(str(x.dtype)[6:])
    if dtype is None:
        allowed = ", ".join(f"torch.{n}" for n in dtypes)
        raise TypeError(f"tegula.kernels.{fn}: {name} has dtype {x.dtype}; supported: {allowed}")
    return dtype


def _check_same_dtype(fn: str, tensors: dict[str, Any]) -> None:
    dtypes = {name: t.dtype for name, t in tensors.items()}
    if len(set(dtypes.values())) > 1:
        listed = ", ".join(f"{n}: {d}" for n, d in dtypes.items())
        raise TypeError(f"tegula.kernels.{fn}: arguments must share one dtype ({listed}); "
                        f"convert with .to(...)")


def _check_cuda(fn: str, tensors: dict[str, Any]) -> None:
    """Every tensor on one CUDA device."""
    devices = {name: t.device for name, t in tensors.items()}
    for name, dev in devices.items():
        if dev.type != "cuda":
            raise ValueError(f"tegula.kernels.{fn}: {name} is on {dev}; tegula kernels run on "
                             f"a CUDA device (move it with .cuda())")
    if len(set(devices.values())) > 1:
        listed = ", ".join(f"{n}: {d}" for n, d in devices.items())
        raise ValueError(f"tegula.kernels.{fn}: arguments are on different devices ({listed})")


def _check_out(fn: str, out: Any, shape: tuple, like: Any) -> None:
    """`out=` must be a contiguous tensor of the result's shape, dtype and device."""
    torch = _torch()
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"tegula.kernels.{fn}: out must be a torch.Tensor, got "
                        f"{type(out).__name__}")
    if tuple(out.shape) != tuple(shape) or out.dtype != like.dtype:
        raise ValueError(f"tegula.kernels.{fn}: out must have shape {tuple(shape)} and dtype "
                         f"{like.dtype}, got {tuple(out.shape)} {out.dtype}")
    if out.device != like.device:
        raise ValueError(f"tegula.kernels.{fn}: out is on {out.device}, inputs on {like.device}")
    if not out.is_contiguous():
        raise ValueError(f"tegula.kernels.{fn}: out must be contiguous")


# --------------------------------------------------------------------------------------
# Launching one configuration
# --------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _device_name(index: int) -> str:
    return _torch().cuda.get_device_name(index)


def _launch(kernel, grid: tuple, args: Sequence[Any], constexprs: dict,
            threads: int | None) -> Any:
    """`kernel[grid](*args, **constexprs)` with the block-size override when set (a tegula
    without the override reports the unknown parameter, and the tuner skips the config)."""
    from tegula.build import launch

    extra = {} if threads is None or threads == kernel.threads else {"threads": threads}
    return launch(kernel, grid, *args, **constexprs, **extra)


def _tune_and_run(tuner_name: str, device_index: int, configs: tuple[Config, ...],
                  dims: Sequence[int], extra: str, run: Callable[[Config], Any]) -> Any:
    """Pick the best of `configs` (cached per bucket of `dims`), then launch it once;
    returns what `run` returned for it (the CompiledKernel that ran). The launch needs no
    device context (it runs on the tensors' device); only tuning does, for its CUDA
    events."""
    tuner, gpu = TUNERS[tuner_name], _device_name(device_index)
    best = tuner.lookup(configs, dims, extra=extra, device_name=gpu)
    if best is None:
        with _torch().cuda.device(device_index):
            best = tuner.select(configs, dims, run, extra=extra, device_name=gpu, rank=None,
                                top_k=_top_k())
    return run(best)


@functools.lru_cache(maxsize=None)
def _configs(family: str, *bucket: Any) -> tuple[Config, ...]:
    """The candidates of a family for one shape bucket, built once (a launch only looks
    them up): "gemm" (M, N, K, b layouts), "row" (N,), "copy" (M, N)."""
    if family == "gemm":
        from tegula.kernels.api_matmul import gemm_candidates
        *dims, layouts = bucket
        specs = [dict(c, B=layout) for layout in layouts for c in gemm_candidates(*dims)]
    elif family == "row":
        specs = row_candidates(*bucket)
    elif family == "looped":
        specs = looped_candidates(*bucket)
    else:
        specs = copy_candidates(*bucket)
    return tuple(Config.of(s) for s in specs)


def _top_k() -> int | None:
    """`$TEGULA_AUTOTUNE_TOPK`: measure only the first k candidates (a quick-tuning knob)."""
    value = os.environ.get("TEGULA_AUTOTUNE_TOPK", "").strip()
    return int(value) if value.isdigit() and int(value) > 0 else None


# Host overhead per call decides small problems (a 4096x4096 RMSNorm runs in ~17 us on an
# H200), so after the first call for a given argument signature an entry point replays
# the chosen launch directly: allocate, then the prepared launch with new data pointers
# (`_replay_entry` calling an `EntryReplay`: one C call where the extension is built; a
# plan of two launches — split K, a copied operand — is a closure taking the same
# (tensors, pointers), made with `_replayer`; `_replay_of` looks up the closures of
# entry points that call them with the tensors, W4A16's). The signature holds everything
# the first call's checks and choices depended on (shapes, strides, dtypes, devices,
# pointer alignment classes, scalar options), so a replay makes the same choices.
_REPLAYS: dict = {}


def _replay_of(tensors: tuple, *head: Any) -> Callable[..., Any] | None:
    """The replay registered for these tensors and this head (the entry point's name and
    options), or None: `_signature`'s key built and looked up in one call of the runtime's
    replay lookup (C where the extension is built). A mistake in an argument is a miss:
    the full path then names it."""
    lookup = _replay.C_LOOKUP[0]
    try:
        if lookup is not None:
            return lookup(_REPLAYS, head, tensors)[0]
        return _replay._lookup(_REPLAYS, head, tensors, ())[0]
    except (AttributeError, TypeError):
        return None


def _signature(name: str, tensors: Sequence[Any], *options: Any) -> tuple | None:
    """The replay key of a call (the runtime's replay key of the tensors after the name
    and options: per tensor its pointer's alignment class, shape, strides, dtype and
    device), or None when an argument is not a tensor (the full path then reports the
    mistake). Callers pass each option with its type (`type(eps), eps`):
    `False == 0` and `1 == 1.0` in Python, but the full path refuses a bool eps and keys
    constexprs by repr (a float eps's sign of zero is moot: it is added to a mean of
    squares, never negative, and the full path compiles -0.0 as 0.0)."""
    try:
        return _replay._lookup({}, (name,) + options, tuple(tensors), ())[1]
    except (AttributeError, TypeError):
        return None


def _replayer(ck: Any, grid: tuple, args: Sequence[Any]) -> Callable[[Sequence[int]], None]:
    """A launch of `ck` that reuses the values checked for `args` and takes only new data
    pointers (one per tensor argument, in order): valid for tensors with the same shapes,
    strides, dtypes and device, which the replay signature guarantees."""
    from tegula.build import normalize_grid
    from tegula.runtime import PreparedLaunch

    prepared = PreparedLaunch(ck, *ck.plan.flatten(args))
    grid3 = normalize_grid(grid)
    return lambda pointers: prepared(grid3, (), pointers)


def _remember(signature: tuple, replay: Callable[..., Any]) -> None:
    if len(_REPLAYS) > 4096:  # many distinct shapes: start over rather than grow forever
        _REPLAYS.clear()
    _REPLAYS[signature] = replay


def _replay_entry(tensors: tuple, *head: Any) -> Any:
    """`_entry(head, tensors)`."""
    return _entry(head, tensors)


def _entry(head: tuple, tensors: tuple) -> Any:
    """The output of this call replayed, if an earlier call with its replay key (as
    `_signature`'s) remembered an `EntryReplay` (or a closure called the same way:
    `replay(tensors, their data pointers)`); else `(key,)` (a tuple, which no output is),
    key None where an argument is not replayable — the full path then names the
    mistake. In one C call where the extension is built (`fastcall.entry_launch`: the key,
    the lookup, the output and the launch), else the runtime's lookup and the replay.
    The row kernels and `copy` call this directly with a built `head` tuple (one Python
    frame fewer than `_replay_entry`: ~0.2 µs of a ~6 µs replay)."""
    fused = _replay.C_ENTRY[0]
    try:
        if fused is not None:
            current = _launcher._CURRENT_STREAM
            found = fused(_REPLAYS, head, tensors, current[0] if current else None)
            if type(found) is not tuple:
                return found  # launched
            replay, key, pointers = found
        elif _replay.C_LOOKUP[0] is not None:
            replay, key, pointers = _replay.C_LOOKUP[0](_REPLAYS, head, tensors)
        else:
            replay, key, pointers = _replay._lookup(_REPLAYS, head, tensors, ())
    except (AttributeError, TypeError):
        return (None,)
    return (key,) if replay is None else replay(tensors, pointers)


def _replay_plan(tensors: tuple, *head: Any) -> tuple[bool, Any]:
    """`_replay_entry` for entry points that remember a `PlanReplay` and may return a
    tuple: (True, the replayed call's result), or (False, the replay key: None where an
    argument is not replayable)."""
    lookup = _replay.C_LOOKUP[0]
    try:
        if lookup is not None:
            replay, key, pointers = lookup(_REPLAYS, head, tensors)
        else:
            replay, key, pointers = _replay._lookup(_REPLAYS, head, tensors, ())
    except (AttributeError, TypeError):
        return False, None
    return (False, key) if replay is None else (True, replay(tensors, pointers))


class EntryReplay:
    """An entry point's first call for a replay key, replayed: what the call's checks and
    choices produced (a prepared launch of the chosen kernel on the tensors' views, its
    grid) taking only new data pointers: one per tensor argument, in order, then the
    output's. The key holds everything the checks and choices read (shapes, strides,
    dtypes, devices, pointer alignment classes, options; `out=`'s too), so a replay makes
    the same choices.

    `allocate(first tensor)` makes the output of a call without `out=`: chosen once by
    `fast_empty` (torch.empty with keywords costs ~7 µs of host time on an H100 host,
    empty_like ~2); None where the output is the call's last tensor (`out=`)."""

    __slots__ = ("prepared", "grid", "allocate")

    def __init__(self, ck: Any, grid: tuple, args: Sequence[Any],
                 allocate: Callable[[Any], Any] | None):
        from tegula.build import normalize_grid
        from tegula.runtime import PreparedLaunch

        self.prepared = PreparedLaunch(ck, *ck.plan.flatten(args))
        self.grid = normalize_grid(grid)
        self.allocate = allocate

    def __call__(self, tensors: tuple, pointers: list) -> Any:
        allocate = self.allocate
        if allocate is None:
            out = tensors[-1]  # out=: its pointer was read with the key
        else:
            out = allocate(tensors[0])
            pointers.append(out.data_ptr())
        self.prepared(self.grid, (), pointers)
        return out


class PlanReplay:
    """An entry point's first call for a replay key that ran several launches (or one
    with more than one output), replayed: per launch a prepared launch whose data
    pointers come from the call's tensors or from outputs allocated afresh, then
    `result(outputs)` (the entry point's return value). Made by `plan_replay`, which
    traces every tensor argument of the first call to a call tensor or an output by its
    data pointer, so a replay writes exactly the buffers the first call wrote."""

    __slots__ = ("launches", "allocators", "result")

    def __init__(self, launches: list, allocators: list, result: Callable[[list], Any]):
        self.launches = launches      # (prepared launch, grid, scalar args, pointer sources)
        self.allocators = allocators  # one per output, called with the first call tensor
        self.result = result

    def __call__(self, tensors: tuple, pointers: list) -> Any:
        first = tensors[0]
        outputs = [allocate(first) for allocate in self.allocators]
        made = [out.data_ptr() for out in outputs]
        for prepared, grid, args, sources in self.launches:
            prepared(grid, args, [None if source is None else
                                  pointers[source] if source >= 0 else made[~source]
                                  for source in sources])
        return self.result(outputs)


def plan_replay(launches: Sequence[tuple], tensors: Sequence[Any], outputs: Sequence[Any],
                result: Callable[[list], Any]) -> PlanReplay | None:
    """The replay of a call that ran `launches` ((CompiledKernel, grid, args) each, in
    order) on views of the call's `tensors` (the replay key's) and of `outputs` (tensors
    it allocated, contiguous, in the shapes to allocate), returning `result(outputs)`;
    None where an argument is neither (a copy the call made, e.g. `.contiguous()` of a
    strided input) or a data pointer does not say which tensor it is (two call tensors
    sharing memory, empty tensors): such calls keep the full path."""
    from tegula.build import normalize_grid
    from tegula.runtime import CompiledKernel, PreparedLaunch

    torch = _torch()
    if not all(isinstance(ck, CompiledKernel) for ck, _, _ in launches):
        return None  # not real launches (the test suite's emulated ones)
    if any(t.numel() == 0 for t in (*tensors, *outputs)) or \
            not all(out.is_contiguous() for out in outputs):
        return None  # empty tensors' pointers say nothing; outputs are made contiguous
    # Source of a pointer: i >= 0 the call's tensor i, ~j (negative) output j.
    named = [(t.data_ptr(), i) for i, t in enumerate(tensors)]
    named += [(out.data_ptr(), ~j) for j, out in enumerate(outputs)]
    owners = dict(named)
    if len(owners) != len(named):
        return None  # tensors sharing memory: a pointer would not say which one it is
    planned = []
    for ck, grid, args in launches:
        sources = []
        for arg in args:
            if isinstance(arg, torch.Tensor):
                source = owners.get(arg.data_ptr())
                if source is None:
                    return None  # a tensor the call made for itself
                sources.append(source)
            else:
                sources.append(None)
        scalars = tuple(None if isinstance(a, torch.Tensor) else a for a in args)
        planned.append((PreparedLaunch(ck, *ck.plan.flatten(args)), normalize_grid(grid),
                        scalars, tuple(sources)))
    allocators = [fast_empty(tensors[0], out.shape, out.dtype) for out in outputs]
    return PlanReplay(planned, allocators, result)


def fast_empty(like: Any, shape: Sequence[int], dtype: Any = None) -> Callable[[Any], Any]:
    """The quickest way to allocate a contiguous tensor of `shape`, `dtype` (default:
    `like`'s) and `like`'s device, called with a tensor of `like`'s shape, strides, dtype
    and device (a replay key fixes all four). Where the C++ allocator is ready
    (`tegula.runtime.torch_alloc`, started here for a CUDA `like`), one of its allocators:
    one C call into `at::empty`. Else `torch.empty_like` where it gives a contiguous
    tensor of that shape and dtype (decided here, once: its layout depends only on the
    shape and strides), else `new_empty` of the argument, or of a kept 0-element tensor of
    the other dtype. Never `torch.empty(shape, dtype=, device=)`: its keyword parsing cost
    ~7 µs of host time on an H100 host, `empty_like` ~2, the C++ allocator well under 1.
    The Python allocators say what they allocate (`_output_of`), so `upgrade_allocations`
    can swap in the C++ one when it becomes ready."""
    from tegula.runtime import torch_alloc
    torch = _torch()
    shape = tuple(shape)
    if like.is_cuda and not _ALLOCATOR_STARTED:
        _ALLOCATOR_STARTED.append(True)
        torch_alloc.start()
        torch_alloc.on_ready(upgrade_allocations)
    same_dtype = dtype is None or dtype == like.dtype
    template = None if same_dtype else like.new_empty((0,), dtype=dtype)  # 0 bytes kept
    built = torch_alloc.allocator(None if tuple(like.shape) == shape else shape, template)
    if built is not None:
        return built
    if same_dtype:
        if tuple(like.shape) == shape and torch.empty_like(like).is_contiguous():
            return torch.empty_like
        allocate = lambda t: t.new_empty(shape)  # noqa: E731
    else:
        allocate = lambda t: template.new_empty(shape)  # noqa: E731
    allocate.tegula_output = (shape, template)
    return allocate


def _output_of(allocate: Any) -> tuple | None:
    """(shape or None, dtype template or None) that a Python allocator of `fast_empty`
    allocates, in `torch_alloc.allocator`'s terms; None for anything else."""
    if allocate is _torch().empty_like:
        return None, None
    return getattr(allocate, "tegula_output", None)


def upgrade_allocations(module: Any = None) -> int:
    """Give every remembered `EntryReplay` allocating through torch's Python API the C++
    allocator of the same output (`torch_alloc`, once ready); the number upgraded. Safe
    from another thread: one attribute store per replay, each allocator equivalent."""
    from tegula.runtime import torch_alloc
    upgraded = 0
    for replay in list(_REPLAYS.values()):
        output = _output_of(getattr(replay, "allocate", None))
        if output is not None:
            built = torch_alloc.allocator(*output)
            if built is not None:
                replay.allocate = built
                upgraded += 1
        allocators = getattr(replay, "allocators", None)  # a PlanReplay's, one per output
        for i, allocate in enumerate(allocators or ()):
            output = _output_of(allocate)
            built = None if output is None else torch_alloc.allocator(*output)
            if built is not None:
                allocators[i] = built
                upgraded += 1
    return upgraded


_ALLOCATOR_STARTED: list = []  # [True] once fast_empty has started torch_alloc


def _pow2_at_least(n: int, floor: int) -> int:
    return max(floor, 1 << max(0, n - 1).bit_length())


# --------------------------------------------------------------------------------------
# Row kernels: rms_norm and softmax
# --------------------------------------------------------------------------------------

def _row_bucket(n: int) -> int:
    """Row lengths tuned together: powers of two up to 2048, then multiples of 1024 (so
    a 3000-element row may use a 3072-wide tile, which a 3500-element row may not)."""
    return _pow2_at_least(n, 1) if n <= 2048 else -(-n // 1024) * 1024


def row_candidates(n: int) -> list[dict]:
    """(BM, BN, threads) for kernels that keep BM whole rows of length ≤ BN in registers:
    BN is the row length rounded up to a power of two (≥ 128), or for rows well short of
    one, to whole vectors per thread (3000 → 3072); BM and threads vary so each thread
    holds 8 to 64 values (enough bytes in flight, no spills), or the fewest possible when
    a row is longer than that allows."""
    bn = _pow2_at_least(n, 128)
    options = [dict(BM=bm, BN=bn, threads=t) for t in (128, 256) for bm in (1, 2, 4, 8, 16)]
    # Long rows: 512 or 1024 threads on one or two rows keep 16 to 32 values per thread
    # (fewer registers, more blocks resident) where 256 threads would hold 64.
    options += [dict(BM=bm, BN=bn, threads=t) for t in (512, 1024) for bm in (1, 2)]
    per_thread = {id(c): c["BM"] * bn // c["threads"] for c in options}
    # Rows well short of a power of two (3000 of 4096) leave a quarter of the threads
    # idle: also try BN = the row rounded up to whole 8-element vectors per thread.
    tight = [dict(BM=1, BN=-(-n // (8 * t)) * 8 * t, threads=t) for t in (128, 256, 512)]
    tight = [c for c in tight if c["BN"] < bn and 8 <= c["BN"] // c["threads"] <= 64]
    per_thread.update({id(c): c["BN"] // c["threads"] for c in tight})
    fitting = [c for c in options if 8 <= per_thread[id(c)] <= 64]
    # At most six (each costs a compile): those nearest 32 values per thread first.
    fitting.sort(key=lambda c: (abs(per_thread[id(c)].bit_length() - 6), c["threads"]))
    fitting = fitting[:4] + tight[:2]
    if not any(c["threads"] == 128 for c in fitting):
        # Always offer the kernels' declared block size (128): it runs without the
        # threads override, so the tuner has a fallback when the 256-thread ones fail.
        declared = [c for c in options if c["threads"] == 128]
        fitting.append(min(declared, key=lambda c: per_thread[id(c)]))
    # threads=128 first: the untuned default (TEGULA_AUTOTUNE=0) is the declared size.
    fitting.sort(key=lambda c: c["threads"] != 128)
    return [dict(c, threads=None) if c["threads"] == 128 else c for c in fitting]


def looped_candidates(n: int) -> list[dict]:
    """Chunk sizes for the looped row kernels (softmax, RMSNorm; rows of any length): 1024
    to 4096 elements a chunk, one or two rows a block."""
    options = [dict(BM=1, BN=1024), dict(BM=1, BN=2048), dict(BM=2, BN=2048),
               dict(BM=1, BN=4096, threads=256)]
    return [dict(c, kernel="looped", threads=c.get("threads")) for c in options
            if c["BN"] <= max(1024, n)]


def _views_of(derived: Sequence[Any], originals: Sequence[Any]) -> bool:
    """Whether each derived tensor is a view starting at its original's first element (the
    replay then passes the original's pointer; a reshape that had to copy is not)."""
    return all(d.data_ptr() == o.data_ptr() for d, o in zip(derived, originals))


def _rows_view(x: Any) -> Any:
    """x as a (rows, N) tensor with unit stride along N (a view when possible)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    return x.reshape(-1, x.shape[-1])


def rms_norm(x: Any, weight: Any, eps: float = 1e-6, *, out: Any = None) -> Any:
    """RMSNorm over the last dim: `x / sqrt(mean(x², -1) + eps) * weight`, computed in f32.
    `x` (..., N) and `weight` (N,) share one dtype (f32, f16 or bf16); any N (rows longer
    than one register tile, 16384 elements, run through the chunked kernel)."""
    tensors = (x, weight) if out is None else (x, weight, out)
    found = _entry(("rms_norm", type(eps), eps, out is None), tensors)
    if type(found) is not tuple:
        return found  # replayed
    key = found[0]
    dtype = _check_tensor("rms_norm", "x", x, _FLOATS, min_ndim=1)
    _check_tensor("rms_norm", "weight", weight, _FLOATS, ndim=1)
    _check_same_dtype("rms_norm", {"x": x, "weight": weight})
    if weight.shape[0] != x.shape[-1]:
        raise ValueError(f"tegula.kernels.rms_norm: weight has {weight.shape[0]} elements, x's "
                         f"last dim has {x.shape[-1]} (x has shape {tuple(x.shape)}, weight "
                         f"{tuple(weight.shape)})")
    if not isinstance(eps, (int, float)) or isinstance(eps, bool) or not eps >= 0:
        raise ValueError(f"tegula.kernels.rms_norm: eps must be a non-negative number, got "
                         f"{eps!r}")
    _check_cuda("rms_norm", {"x": x, "weight": weight})
    out = _row_output("rms_norm", x, out)
    if x.numel() == 0:
        return out
    rows, y = _rows_view(x), out.view(-1, x.shape[-1])
    w2 = weight.contiguous().view(1, -1)
    from tegula.kernels.norm import rms_norm_kernel, rms_norm_looped_kernel
    m, n = rows.shape
    bucket = _row_bucket(n)
    configs = _configs("row", bucket) if n <= _MAX_ROW else ()
    configs += _configs("looped", _pow2_at_least(n, 1)) if n > 2048 else ()

    def run(config: Config) -> Any:
        values = dict(config.kwargs, N=n, EPS=float(eps) + 0.0)  # -0.0 + 0.0 is 0.0: one variant
        looped = values.pop("kernel", "tile") == "looped"
        kernel = rms_norm_looped_kernel(dtype) if looped else rms_norm_kernel(dtype)
        grid = (-(-m // values["BM"]),)
        ck = _launch(kernel, grid, (rows, w2, y), values, config.threads)
        return ck, grid

    ck, grid = _tune_and_run("rms_norm", x.device.index, configs, (m, n),
                             f"{dtype}/rows<={bucket}", run)
    if key is not None and _views_of((rows, w2), (x, weight)):
        _remember(key, EntryReplay(ck, grid, (rows, w2, y),
                                   fast_empty(x, x.shape) if len(tensors) == 2 else None))
    return out


def softmax(x: Any, dim: int = -1, *, out: Any = None) -> Any:
    """Softmax along the last dim (`dim` must name it), computed in f32 and returned in
    `x`'s dtype (f32, f16 or bf16); rows of any length (rows longer than one register
    tile, 16384 elements, run through the chunked online-softmax kernel)."""
    tensors = (x,) if out is None else (x, out)
    found = _entry(("softmax", type(dim), dim, out is None), tensors)
    if type(found) is not tuple:
        return found  # replayed
    key = found[0]
    dtype = _check_tensor("softmax", "x", x, _FLOATS, min_ndim=1)
    if dim not in (-1, x.dim() - 1):
        raise ValueError(f"tegula.kernels.softmax: only the last dim is supported (dim=-1), "
                         f"got dim={dim}; move the dim last with .transpose() / .movedim()")
    _check_cuda("softmax", {"x": x})
    out = _row_output("softmax", x, out)
    if x.numel() == 0:
        return out
    rows, y = _rows_view(x), out.view(-1, x.shape[-1])
    from tegula.kernels.softmax import softmax_kernel, softmax_looped_kernel
    m, n = rows.shape
    bucket = _row_bucket(n)
    configs = _configs("row", bucket) if n <= _MAX_ROW else ()
    configs += _configs("looped", _pow2_at_least(n, 1)) if n > 2048 else ()

    def run(config: Config) -> Any:
        values = config.kwargs
        looped = values.pop("kernel", "tile") == "looped"
        kernel = softmax_looped_kernel(dtype) if looped else softmax_kernel(dtype)
        grid = (-(-m // values["BM"]),)
        return _launch(kernel, grid, (rows, y), values, config.threads), grid

    ck, grid = _tune_and_run("softmax", x.device.index, configs, (m, n),
                             f"{dtype}/rows<={bucket}", run)
    if key is not None and _views_of((rows,), (x,)):
        _remember(key, EntryReplay(ck, grid, (rows, y),
                                   fast_empty(x, x.shape) if len(tensors) == 1 else None))
    return out


def _row_output(fn: str, x: Any, out: Any) -> Any:
    if out is None:
        return _torch().empty(x.shape, dtype=x.dtype, device=x.device)
    _check_out(fn, out, tuple(x.shape), x)
    return out


# --------------------------------------------------------------------------------------
# copy
# --------------------------------------------------------------------------------------

def copy_candidates(m: int, n: int) -> list[dict]:
    """(BM, BN) tiles for a 2-D copy: 16 to 64 elements per thread of 128, narrowed to the
    bucket so a thin tensor does not launch mostly-masked tiles."""
    tiles = [(32, 64), (16, 128), (32, 128), (16, 256), (64, 128), (32, 256), (1, 2048),
             (1, 4096)]
    mb, nb = _pow2_at_least(m, 1), _pow2_at_least(n, 1)
    fitting = [(bm, bn) for bm, bn in tiles if (bm <= max(16, mb) or bm == 1)
               and bn <= max(64, nb)]
    return [dict(BM=bm, BN=bn) for bm, bn in (fitting or tiles[:1])]


def _copy_shape(x: Any) -> tuple[int, int]:
    """A 2-D shape for copying contiguous `x` element by element: 4096 columns (or the
    largest power of two ≥ 64 dividing the size), else one long row — whose vectors stay
    16 bytes wide except the last, split at the end — so any rank and any size becomes a
    tensor wide enough for full tiles."""
    total = x.numel()
    for cols in (4096, 2048, 1024, 512, 256, 128, 64):
        if total % cols == 0:
            return total // cols, cols
    return 1, total


def copy(x: Any, *, out: Any = None) -> Any:
    """A copy of `x` (f32, f16, bf16, i8, u8 or i32; any shape) as a new contiguous tensor,
    or written into contiguous `out`. A non-contiguous `x` is first made contiguous by
    torch (so its copy costs two passes)."""
    tensors = (x,) if out is None else (x, out)
    found = _entry(("copy", out is None), tensors)
    if type(found) is not tuple:
        return found  # replayed
    key = found[0]
    dtype = _check_tensor("copy", "x", x, _COPY_DTYPES)
    _check_cuda("copy", {"x": x})
    if out is None:
        out = _torch().empty(x.shape, dtype=x.dtype, device=x.device)
    else:
        _check_out("copy", out, tuple(x.shape), x)
    if x.numel() == 0:
        return out
    src = x if x.is_contiguous() else x.contiguous()
    m, n = _copy_shape(src)
    src2, dst2 = src.view(m, n), out.view(m, n)
    from tegula.kernels.copy import copy_kernel
    kernel = copy_kernel(dtype)

    def run(config: Config) -> Any:
        values = config.kwargs
        grid = (-(-n // values["BN"]), -(-m // values["BM"]), 1)  # column tiles fastest
        return _launch(kernel, grid, (src2, dst2), values, config.threads), grid

    ck, grid = _tune_and_run("copy", x.device.index,
                             _configs("copy", _pow2_at_least(m, 1), _pow2_at_least(n, 1)),
                             (m, n), str(dtype), run)
    if key is not None and x.is_contiguous():
        _remember(key, EntryReplay(ck, grid, (src2, dst2),
                                   fast_empty(x, x.shape) if len(tensors) == 1 else None))
    return out


# The matrix products live in their own module (api_matmul); they are entry points here too.
from tegula.kernels.api_matmul import (_activation_in_torch,  # noqa: E402,F401
                                       _check_epilogue_args, _fp8_scale, _gemm_launches,
                                       fp8_candidates, gemm_candidates, matmul, matmul_fp8)

__all__ = ["matmul", "matmul_fp8", "fp8_candidates", "rms_norm", "softmax", "copy", "gemm_candidates", "row_candidates",
           "copy_candidates", "TUNERS"]
