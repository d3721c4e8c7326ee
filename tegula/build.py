"""From a `@tg.kernel` to thread IR (and CUDA): the compiler's one entry point.

`build(kernel, constexprs, facts, target)` traces the kernel, synthesizes its layouts and
instructions, and lowers it to thread IR; the result is cached on the kernel per
(constexprs, facts, target). The emulator (`tg.emulate`), the GPU runtime, `explain` and
the `tegula compile` command all start here, so every path compiles the same way.

This module sits above the pipeline modules (like `tegula.cli`) and may import them all.
"""
from __future__ import annotations

import numbers
from dataclasses import dataclass, field
from typing import Any, Iterable

from tegula.arch.targets import Target, get_target
from tegula.errors import LaunchError, SynthesisError, TegulaError
from tegula.ir.ops import TracedKernel
from tegula.layout.errors import LayoutError
from tegula.lower.lower import lower
from tegula.lower.thread_ir import ThreadKernel
from tegula.synth.facts import TensorFacts
from tegula.synth.cost_roles import grid_sm_blocks
from tegula.synth.roles import CONSUMER_SCHEDULES
from tegula.synth.synthesize import SynthesisResult, synthesize

DEFAULT_TARGET = "sm_90a"

#: Keywords of a build, launch or `tg.emulate` call that are compile options of the kernel
#: rather than constexprs: the block size (`threads=`), whether a TMA + wgmma pipeline
#: gets producer/consumer warp roles (`warp_specialize=`, `synth/roles.py`), and the load
#: path of pipelined copies into wgmma operands (`load_path=`: None or "tma" for TMA where
#: it qualifies, "cp.async" for never; a decision `tg.recommend` searches), and the consumer
#: schedule of a warp-specialized pipeline (`consumers=`: None, "cooperative" or
#: "pingpong", `synth/roles.py`), and how many blocks of the kernel an SM must be able to
#: hold at once (`blocks_per_sm=`: `__launch_bounds__`'s second argument, which caps each
#: thread's registers at the register file's share of that many blocks; None: no minimum),
#: and the path of `tg.atomic_add`s of register tiles (`atomic_path=`: None for TMA
#: reduce-adds staged in shared memory where they qualify, sm_90, and the staging costs no
#: blocks per SM; "bulk" where they qualify even if it does; "red" for a `red.global.add`
#: per element always; `synth/copies.py: plan_bulk_adds`), and the launch grid's block
#: count where the caller knows it when building (`grid_blocks=`: the warp-roles decision
#: counts the blocks each SM gets, `synth/cost_roles.py`; None: priced as a full grid;
#: every launch and `emulate` pass their grid's count unless given one).
BUILD_OPTIONS = ("threads", "warp_specialize", "load_path", "consumers", "blocks_per_sm",
                 "atomic_path", "grid_blocks")

#: The values of the `load_path` build option.
LOAD_PATHS = (None, "tma", "cp.async")
#: The values of the `atomic_path` build option.
ATOMIC_PATHS = (None, "bulk", "red")


@dataclass
class Build:
    """One compiled configuration of a kernel: its tile IR (with every decision recorded),
    the synthesis record, and the thread IR."""

    kernel: Any
    constexprs: dict
    facts: dict
    target: Target
    traced: TracedKernel
    synthesis: SynthesisResult
    thread_kernel: ThreadKernel
    _cuda: dict = field(default_factory=dict)

    def cuda_source(self) -> str:
        """The CUDA C++ source of this build (generated once)."""
        if "source" not in self._cuda:
            from tegula.codegen.cuda import emit_cuda
            self._cuda["source"] = emit_cuda(self.thread_kernel, self.target.sm)
        return self._cuda["source"]

    def explain(self) -> str:
        from tegula.explain import explain_build
        return explain_build(self)


def _facts_key(facts: dict) -> tuple:
    return tuple(sorted((name, f.key()) for name, f in facts.items()))


def build(kernel, constexprs: dict | None = None, facts: dict | None = None,
          target: str | Target = DEFAULT_TARGET) -> Build:
    """Compile `kernel` for these constexprs, argument facts and target (cached).
    `constexprs` may hold `threads` (the block size override), `warp_specialize` (None,
    True or False; overrides the kernel's option), `load_path` (`LOAD_PATHS`),
    `consumers` (`CONSUMER_SCHEDULES`), `blocks_per_sm` (`check_blocks_per_sm`),
    `atomic_path` (`ATOMIC_PATHS`) and `grid_blocks` (`check_grid_blocks`)."""
    target = get_target(target)
    constexprs = dict(constexprs or {})
    given = dict(constexprs)
    threads = kernel.check_threads(constexprs.pop("threads", None))
    warp_specialize = constexprs.pop("warp_specialize", getattr(kernel, "warp_specialize", None))
    if not (warp_specialize is None or isinstance(warp_specialize, bool)):
        raise TegulaError(f"kernel {kernel.name}: warp_specialize={warp_specialize!r} must be "
                          f"None (where it applies), True or False")
    load_path = constexprs.pop("load_path", None)
    if load_path not in LOAD_PATHS:
        raise TegulaError(f"kernel {kernel.name}: load_path={load_path!r} must be one of "
                          f"{', '.join(map(repr, LOAD_PATHS))}")
    consumers = constexprs.pop("consumers", None)
    if consumers not in CONSUMER_SCHEDULES:
        raise TegulaError(f"kernel {kernel.name}: consumers={consumers!r} must be one of "
                          f"{', '.join(map(repr, CONSUMER_SCHEDULES))}")
    blocks_per_sm = check_blocks_per_sm(kernel, target, threads,
                                        constexprs.pop("blocks_per_sm", None))
    atomic_path = constexprs.pop("atomic_path", None)
    if atomic_path not in ATOMIC_PATHS:
        raise TegulaError(f"kernel {kernel.name}: atomic_path={atomic_path!r} must be one of "
                          f"{', '.join(map(repr, ATOMIC_PATHS))}")
    grid_blocks = check_grid_blocks(kernel, constexprs.pop("grid_blocks", None))
    values = kernel.constexpr_values(constexprs)
    if facts is None:
        facts = {p.name: TensorFacts.assume_row_major(p.spec.rank,
                                                      elem_bits=p.spec.dtype.bits)
                 for p in kernel.params if p.kind == "tensor"}
    # Grids that give every SM the same number of blocks decide alike: one build.
    grid_class = grid_sm_blocks(grid_blocks, target)
    if grid_class is not None:
        # The grid changes only the warp roles of a pipeline the cost model kept in one
        # role, and only where it gives an SM fewer blocks than one role holds: any other
        # launch is the full grid's build (one build and one compile for all its grids).
        full = build(kernel, {k: v for k, v in given.items() if k != "grid_blocks"},
                     facts, target)
        if grid_class >= full.synthesis.roles_grid_limit:
            return full
    key = (tuple(sorted((k, repr(v)) for k, v in values.items())), threads, warp_specialize,
           load_path, consumers, blocks_per_sm, atomic_path, grid_class, _facts_key(facts),
           target.name)
    cache = kernel.__dict__.setdefault("_builds", {})
    if key not in cache:
        traced = kernel.trace_fresh(threads, **values)
        try:
            result = synthesize(traced, target, facts, warp_specialize, load_path, consumers,
                                atomic_path, grid_blocks)
            thread_kernel = lower(result)
            thread_kernel.blocks_per_sm = blocks_per_sm
            _check_register_budgets(kernel, thread_kernel)
        except LayoutError as e:
            # A layout the algebra refuses is a synthesis failure of this kernel.
            raise SynthesisError(f"kernel {kernel.name}: {e}", loc=kernel.loc) from e
        options = dict(threads=threads)
        if warp_specialize is not None:
            options["warp_specialize"] = warp_specialize
        if load_path is not None:
            options["load_path"] = load_path
        if consumers is not None:
            options["consumers"] = consumers
        if blocks_per_sm is not None:
            options["blocks_per_sm"] = blocks_per_sm
        if atomic_path is not None:
            options["atomic_path"] = atomic_path
        if grid_blocks is not None:
            options["grid_blocks"] = grid_blocks
        cache[key] = Build(kernel, dict(values, **options), facts, target, traced, result,
                           thread_kernel)
    return cache[key]


def check_blocks_per_sm(kernel, target: Target, threads: int, blocks: Any) -> int | None:
    """The `blocks_per_sm` build option, validated: None, or a positive int with that many
    blocks of `threads` fitting an SM's thread and block limits."""
    if blocks is None:
        return None
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise TegulaError(f"kernel {kernel.name}: blocks_per_sm={blocks!r} must be None or a "
                          f"positive int (the blocks an SM must hold at once)")
    most = min(target.max_blocks_per_sm, target.max_threads_per_sm // threads)
    if blocks > most:
        raise TegulaError(f"kernel {kernel.name}: blocks_per_sm={blocks} blocks of {threads} "
                          f"threads do not fit an SM of {target.name} (at most {most}: "
                          f"{target.max_threads_per_sm} threads, {target.max_blocks_per_sm} "
                          f"blocks)")
    return blocks


def check_grid_blocks(kernel, blocks: Any) -> int | None:
    """The `grid_blocks` build option, validated: None, or the launch grid's positive block
    count."""
    if blocks is None:
        return None
    if isinstance(blocks, bool) or not isinstance(blocks, int) or blocks < 1:
        raise TegulaError(f"kernel {kernel.name}: grid_blocks={blocks!r} must be None or a "
                          f"positive int (the blocks the kernel will be launched with)")
    return blocks


def _check_register_budgets(kernel, thread_kernel) -> None:
    """A kernel whose warp roles set their register budgets (setmaxnreg) is compiled for one
    block per SM (its budgets are shares of the whole register file): a `blocks_per_sm`
    above 1 contradicts them."""
    from tegula.synth.uses import _sets_registers

    if (thread_kernel.blocks_per_sm or 1) > 1 and _sets_registers(thread_kernel):
        raise SynthesisError(
            f"kernel {kernel.name}: blocks_per_sm={thread_kernel.blocks_per_sm}, but its warp "
            f"roles set their register budgets (setmaxnreg), which needs one block per SM; "
            f"drop blocks_per_sm, or pass warp_specialize=False", loc=kernel.loc)


def split_arguments(kernel, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
    """(tensors by name, scalars by name, constexprs) from a call's arguments: positional
    arguments fill the run-time parameters in order; keywords may name any parameter."""
    runtime = [p for p in kernel.params if p.kind in ("tensor", "scalar")]
    if len(args) > len(runtime):
        raise LaunchError(f"kernel {kernel.name} takes {len(runtime)} run-time arguments "
                          f"({', '.join(p.name for p in runtime)}), got {len(args)}")
    bound = {p.name: a for p, a in zip(runtime, args)}
    constexprs = {}
    for name, value in kwargs.items():
        if name in BUILD_OPTIONS:  # compile options travel with the constexprs
            constexprs[name] = value
            continue
        param = next((p for p in kernel.params if p.name == name), None)
        if param is None:
            raise LaunchError(f"kernel {kernel.name} has no parameter {name!r}")
        if param.kind == "constexpr":
            constexprs[name] = value
        elif name in bound:
            raise LaunchError(f"kernel {kernel.name}: {name!r} given twice")
        else:
            bound[name] = value
    missing = [p.name for p in runtime if p.name not in bound]
    if missing:
        raise LaunchError(f"kernel {kernel.name}: missing argument(s) {', '.join(missing)}")
    tensors = {p.name: bound[p.name] for p in runtime if p.kind == "tensor"}
    scalars = {p.name: bound[p.name] for p in runtime if p.kind == "scalar"}
    return tensors, scalars, constexprs


def normalize_grid(grid) -> tuple[int, int, int]:
    """A grid as three non-negative ints (a callable grid gets the kernel's constexprs
    later). A zero extent is an empty grid — `cdiv(0, BM)` blocks for an empty tensor —
    which launches nothing. Extents must be ints (numpy integers too): a float is refused
    rather than truncated, since `M / BM` where `cdiv(M, BM)` was meant drops blocks."""
    if type(grid) is tuple and len(grid) == 3 and all(type(g) is int and g > 0 for g in grid) \
            and grid[1] <= 65535 and grid[2] <= 65535 and grid[0] < 2**31:
        return grid  # the common case, checked cheaply (launch overhead)
    dims = (grid,) if _is_int(grid) else grid
    if type(dims).__module__ == "numpy" and getattr(dims, "ndim", None) == 1:
        dims = tuple(dims)  # a numpy array of block counts: its elements are checked below
    if not isinstance(dims, (tuple, list)) or not all(_is_int(d) for d in dims):
        raise LaunchError(f"a grid is an int or a tuple of up to three ints (block counts, "
                          f"e.g. tg.cdiv(M, BM)), got {grid!r}")
    dims = tuple(int(d) for d in dims)
    if not 1 <= len(dims) <= 3 or any(d < 0 for d in dims):
        raise LaunchError(f"a grid is one to three non-negative block counts, got {grid!r}")
    dims = dims + (1,) * (3 - len(dims))
    if dims[0] >= 2**31 or dims[1] > 65535 or dims[2] > 65535:
        raise LaunchError(f"grid {dims} exceeds CUDA's limits (x < 2^31, y and z <= 65535); "
                          f"put the largest extent on axis 0")
    return dims


def _is_int(x) -> bool:
    """An int or numpy integer, not a bool (nor a float with an integral value)."""
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def emulate(kernel, grid, *args, target: str | Target = DEFAULT_TARGET, check_races: bool = True,
            check_coverage: bool | Iterable[str] = True, num_sms: int | None = None,
            role_order: str = "listed", **kwargs):
    """Run `kernel` on the CPU: numpy arrays in, results written into them in place.

    `tg.emulate(gemm, (2, 3), a, b, c, BM=64)` traces, synthesizes and lowers the kernel
    exactly as for the GPU (a launch on that grid: its block count is the `grid_blocks`
    build fact there too), then executes the thread IR for every block with numpy.
    Returns the emulator's report (instructions, bytes moved, bank conflicts).

    `check_coverage` (default on): every output — a tensor the kernel stores to or adds
    to atomically — must have each element written by some block, else `EmulationError`
    names the tensor, the count and a few coordinates (a grid too small for the output is
    found here, not by a test that happens to start from zeros). Write-only outputs are
    poisoned (NaN / 0xA5 bytes) before the run; tensors the kernel also reads are left
    as given. `check_coverage=False` turns this off for a kernel that writes part of an
    output on purpose (the array is then neither poisoned nor checked); a list of names
    checks only those outputs. Two blocks (clusters) storing different values to one
    element, or one reading an element another stores, is an `EmulationError` (with race
    checking on, `check_races`): on the GPU the answer depends on which block ran first.
    An output sharing memory with another argument is a `LaunchError` as at launch
    (`tegula/runtime/aliasing.py`), except the identical array of an element-wise
    in-place kernel.

    `num_sms` is what `tg.num_sms()` reads in the kernel: by default the target's SM count
    (132 for sm_90a), or any positive int to emulate another variant of the device.

    `role_order` ("listed" or "reversed"): the order in which the warp roles of a
    warp-specialized kernel first run (each runs until it blocks), two interleavings of
    the same block; a correct kernel is right under both. "random:SEED" (SEED an int):
    every asynchronous statement is a scheduling point where the next role (or block of
    a cluster) is drawn from a stream seeded by SEED — one more interleaving per seed,
    which finds a stage released too early (`tegula/emulate/roles.py`).
    """
    import numpy as np

    from tegula.emulate import run_thread_kernel
    from tegula.emulate.coverage import check_written, poison, tensor_roles
    from tegula.lower.thread_ir import ScalarParam
    from tegula.runtime.args import scalar_value

    tensors, scalars, constexprs = split_arguments(kernel, args, kwargs)
    facts, shapes = _array_facts(kernel, tensors)
    grid3 = normalize_grid(grid)
    result = build(kernel, _with_grid(constexprs, grid3), facts, target)  # as a launch builds
    check_extents(kernel, result.traced, shapes)
    if num_sms is None:
        num_sms = result.target.sm_count
    elif not _is_int(num_sms) or num_sms < 1:
        raise TegulaError(f"tg.emulate({kernel.name}, ...): num_sms must be a positive int "
                          f"(the emulated device's SM count), got {num_sms!r}")
    scalars = {p.name: scalar_value(p, scalars[p.name]) for p in result.thread_kernel.params
               if isinstance(p, ScalarParam) and p.name in scalars}  # as a launch checks them
    same_memory = _emulated_aliases(result.thread_kernel, tensors)
    # Every argument is checked: from here on the arrays may be changed.
    written, read = tensor_roles(result.thread_kernel)
    checked = _coverage_names(kernel, check_coverage, written)
    # Poison only what no other argument can see: an output passed as a view of an input
    # (an in-place kernel with separate parameters) is the input's memory too.
    poisoned = {name for name in checked if name not in read and not any(
        other != name and np.may_share_memory(tensors[name], array)
        for other, array in tensors.items())}
    for name in poisoned:
        poison(tensors[name])
    report = run_thread_kernel(result.thread_kernel, grid3, tensors, scalars,
                               check_races=check_races, track_writes=checked,
                               num_sms=int(num_sms), role_order=role_order,
                               same_memory=same_memory)
    check_written(result.thread_kernel, grid3, tensors, report.written, poisoned)
    return report


def _emulated_aliases(thread_kernel, tensors: dict) -> dict[str, str]:
    """`tg.emulate`'s arrays checked as a launch checks tensors (`runtime/aliasing.py`:
    an output sharing memory with another argument is a `LaunchError`, except the
    identical array of an element-wise in-place kernel); returns those identical pairs
    (other name -> written name) for the emulator's shared race records."""
    from tegula.runtime.aliasing import alias_rules, check_views

    rules = alias_rules(thread_kernel)
    if not rules:
        return {}
    views = {name: (a.__array_interface__["data"][0], a.shape,
                    tuple(st // a.itemsize for st in a.strides)) for name, a in tensors.items()}
    check_views(thread_kernel.name, rules, views,
                {name: 8 * a.itemsize for name, a in tensors.items()}, where="tg.emulate")
    return {r.other: r.written for r in rules if views[r.other] == views[r.written]
            and tensors[r.other].dtype == tensors[r.written].dtype}


def _array_facts(kernel, tensors: dict) -> tuple[dict, dict]:
    """Facts and logical shapes of `tg.emulate`'s numpy arrays, checked against the
    kernel's signature."""
    import numpy as np

    facts, shapes = {}, {}
    for name, array in tensors.items():
        if not isinstance(array, np.ndarray):
            raise LaunchError(f"tg.emulate: argument {name!r} must be a numpy array, got "
                              f"{type(array).__name__}")
        param = next(p for p in kernel.params if p.name == name)
        if array.ndim != param.spec.rank:
            raise LaunchError(f"tg.emulate: argument {name!r} has rank {array.ndim}, but the "
                              f"kernel declares tg.Tensor[{param.spec.dtype}, {param.spec.rank}]")
        strides = tuple(s // array.itemsize for s in array.strides)
        shape = tuple(array.shape)
        if param.spec.dtype.is_packed:
            # Bytes of two 4-bit elements: the kernel sees twice the elements along the
            # last dim and strides counted in elements, and its facts must say so.
            shape = shape[:-1] + (2 * shape[-1],)
            strides = tuple(2 * s if d < len(strides) - 1 else s for d, s in enumerate(strides))
        facts[name] = TensorFacts.of(shape, strides, 0, param.spec.dtype.bits / 8)
        shapes[name] = shape
    return facts, shapes


def _coverage_names(kernel, check_coverage, written: set[str]) -> list[str]:
    """The outputs whose coverage `emulate` checks (see its docstring)."""
    if check_coverage is True:
        return sorted(written)
    if check_coverage is False or check_coverage is None:
        return []
    names = [check_coverage] if isinstance(check_coverage, str) else list(check_coverage)
    tensors = {p.name for p in kernel.params if p.kind == "tensor"}
    for name in names:
        if name not in tensors:
            raise LaunchError(f"tg.emulate({kernel.name}): check_coverage names {name!r}, "
                              f"which is not a tensor parameter")
        if name not in written:
            raise LaunchError(f"tg.emulate({kernel.name}): check_coverage names {name!r}, "
                              f"which the kernel never writes")
    return sorted(set(names))


def check_extents(kernel, traced: TracedKernel, shapes: dict) -> None:
    """Raise `LaunchError` where these tensor shapes break an extent equality the kernel
    assumes (a gemm's K, tensors read at the same coordinates and combined element by
    element: `tegula.ir.extents`)."""
    from tegula.ir.extents import mismatch

    found = mismatch(kernel.name, traced, shapes)
    if found is not None:
        raise LaunchError(*found)


def _launch_facts(kernel, tensors: dict) -> tuple[dict, dict]:
    """Specialization facts of the launch's tensors (pointer alignment, unit strides,
    divisibility of extents and strides), read through the runtime's tensor views, and
    the tensors' logical shapes."""
    from tegula.runtime.args import tensor_view

    facts, shapes = {}, {}
    for p in kernel.params:
        if p.kind != "tensor":
            continue
        view = tensor_view(tensors[p.name])
        if view is None:
            raise LaunchError(f"kernel {kernel.name}: argument {p.name!r} must be a CUDA tensor "
                              f"(torch, __cuda_array_interface__ or DLPack), got "
                              f"{type(tensors[p.name]).__name__}")
        if len(view.shape) != p.spec.rank:
            raise LaunchError(f"kernel {kernel.name}: argument {p.name!r} has rank "
                              f"{len(view.shape)}, but the kernel declares "
                              f"tg.Tensor[{p.spec.dtype}, {p.spec.rank}]")
        shape, strides = tuple(view.shape), tuple(view.strides)
        if p.spec.dtype.is_packed and shape:
            # Bytes of two 4-bit elements: facts count elements along the last dim (twice
            # the bytes; other strides doubled), as emulate() and the launcher's packing do.
            shape = shape[:-1] + (2 * shape[-1],)
            strides = tuple(2 * s if d < len(strides) - 1 else s for d, s in enumerate(strides))
        facts[p.name] = TensorFacts.of(shape, strides, view.ptr, p.spec.dtype.bits / 8)
        shapes[p.name] = shape
    return facts, shapes


def _with_grid(options: dict, grid3: tuple) -> dict:
    """The build options of a launch on `grid3`: its block count is a build fact (the
    `grid_blocks` option, unless the caller gave one; an empty grid builds as unknown)."""
    if "grid_blocks" in options or 0 in grid3:
        return options
    return dict(options, grid_blocks=grid3[0] * grid3[1] * grid3[2])


def _grid_of(built: Build) -> dict:
    """`built`'s grid_blocks option, as a dict of it (empty where the build is the full
    grid's: no decision of it depended on the grid)."""
    blocks = built.constexprs.get("grid_blocks")
    return {} if blocks is None else dict(grid_blocks=blocks)


def compiled(kernel, constexprs: dict, facts: dict, target: str | Target):
    """The runtime's `CompiledKernel` for one specialization (cached on the kernel)."""
    from tegula.runtime import TensorRequirement, compile_kernel

    target = get_target(target)
    key = (tuple(sorted((k, repr(v)) for k, v in constexprs.items())), _facts_key(facts),
           target.name)
    cache = kernel.__dict__.setdefault("_compiled", {})
    found = cache.get(key)
    if found is None:
        result = build(kernel, constexprs, facts, target)
        # The variant was specialized on these facts, so the launch must hold them: the
        # contiguous dim and pointer alignment come from the facts, not from a default.
        requirements = {name: TensorRequirement(f.align_bytes, f.contiguous_dim)
                        for name, f in facts.items()}
        found = cache[key] = compile_kernel(result.thread_kernel, target.sm,
                                            requirements=requirements)
    return found


def launch(kernel, grid, *args, target: str | Target | None = None, stream=None, **kwargs):
    """`kernel[grid](*args)`: compile for the arguments' facts (cached) and launch on the
    current torch stream (or `stream`). A callable grid receives the constexpr values. The
    grid's block count is a build fact (`grid_blocks`, for the warp-roles price); a replay
    (`tegula.runtime.replay`: same argument shapes and constexprs) reuses the build of the
    first launch it replays, whatever its grid (correct either way: only the roles' price
    reads the grid)."""
    return launch_arguments(kernel, grid, args, kwargs, target, stream)


def launch_arguments(kernel, grid, args: tuple, kwargs: dict, target=None, stream=None):
    """`launch` with the arguments as a tuple and a dict.

    Host overhead matters for small kernels, so a launch whose arguments look like an
    earlier launch's (same replay key: `tegula.runtime.replay`) replays that launch's
    checked arguments; only a new specialization takes the full path (`full_launch`)."""
    from tegula.runtime.replay import launch as replay_or_launch
    return replay_or_launch(kernel, grid, args, kwargs, target, stream)


def full_launch(kernel, grid, args: tuple, kwargs: dict, target, stream):
    """Check, specialize, compile (cached) and launch; returns the `CompiledKernel` and the
    launch prepared for replays (None where the call cannot be replayed: a run-time
    argument given by keyword)."""
    from tegula.runtime import PreparedLaunch, default_target

    tensors, scalars, constexprs = split_arguments(kernel, args, kwargs)
    options = {k: constexprs.pop(k) for k in BUILD_OPTIONS if k in constexprs}
    values = kernel.constexpr_values(constexprs)
    grid3 = normalize_grid(grid(values) if callable(grid) else grid)  # a bad grid: before compiling
    facts, shapes = _launch_facts(kernel, tensors)
    target = target or default_target()
    built = build(kernel, dict(values, **_with_grid(options, grid3)), facts, target)
    check_extents(kernel, built.traced, shapes)
    # the launches one build serves (grid_blocks) share its compiled kernel
    options.pop("grid_blocks", None)
    ck = compiled(kernel, dict(values, **options, **_grid_of(built)), facts, target)
    names = [p.name for p in kernel.params if p.kind == "tensor"]
    names += [p.name for p in kernel.params if p.kind == "scalar"]
    ordered = [tensors.get(n, scalars.get(n)) for n in names]
    flat, device = ck.plan.flatten(ordered)
    ck.launch_values(grid3, flat, device, stream)
    runtime = [p.name for p in kernel.params if p.kind in ("tensor", "scalar")]
    if len(args) != len(runtime):  # a run-time argument given by keyword: not replayed
        return ck, None
    arg_index = {name: i for i, name in enumerate(runtime)}  # positions as the user passes
    return ck, PreparedLaunch(ck, flat, device, values, arg_index)
