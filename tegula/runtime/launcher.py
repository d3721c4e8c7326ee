"""Compile a ThreadKernel (through the caches) and launch it on torch tensors.

`compile_kernel(kernel)` emits CUDA, compiles (or finds the cubin in the disk cache) and
returns a `CompiledKernel`; the same kernel compiled again in one process returns the same
object. `CompiledKernel.launch(grid, args)` (or `ck[grid](*args)`) checks the arguments,
packs them and calls `cuLaunchKernel` on the caller's current torch stream; a kernel with
a thread-block cluster goes through `cuLaunchKernelEx` with the cluster attribute.

Host overhead is kept small by doing everything possible once. Parameter values live in a
preallocated `ParamBuffer` (`packing.py`) handed to the driver by address; the CUfunction
and stream handle objects are cached. A `PreparedLaunch` (the replay of a checked launch)
owns its own buffer with the extents and strides already written, so a replay packs only
the data pointers (and scalars and tensor maps, if any) and calls the driver.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from functools import partial
from operator import itemgetter
from typing import Any, Sequence

from tegula.errors import LaunchError
from tegula.lower.thread_ir import ScalarParam, TensorParam, ThreadKernel

from tegula.codegen import emit_cuda, param_list
from tegula.runtime import driver as drv
from tegula.runtime.aliasing import AliasCheck
from tegula.runtime.args import EMPTY_TENSOR_MAP, ArgumentPlan, TensorRequirement
from tegula.runtime.cache import DiskCache, cache_key
from tegula.runtime.compiler import compile_cuda, default_compiler
from tegula.runtime.packing import ParamBuffer, param_layout

__all__ = ["CompiledKernel", "PreparedLaunch", "compile_kernel", "default_target",
           "param_layout"]


class CompiledKernel:
    """A compiled kernel with its signature; loads lazily on the first launch per device."""

    def __init__(self, kernel: ThreadKernel, cubin: bytes, source: str, target: str,
                 requirements: dict[str, TensorRequirement] | None = None, key: str = ""):
        self.kernel = kernel
        self.name = kernel.name
        self.cubin = cubin
        self.source = source
        self.target = target
        self.key = key
        self.threads = kernel.threads
        self.shared_bytes = kernel.shared_bytes
        self.params = param_list(kernel)
        self.plan = ArgumentPlan(kernel, requirements)
        self.cluster = _checked_cluster(kernel)
        self._clustered = self.cluster != (1, 1, 1)
        self._args = ParamBuffer(self.params)  # what `launch` packs (shared: locked)
        self._map_slots = [slot for slot, *_ in self.plan.map_slots]
        self._cluster_configs: dict = {}  # (grid, stream) -> cuda-bindings CUlaunchConfig
        self._library: drv.LoadedLibrary | None = None
        self._functions: dict[int, Any] = {}
        self._function_handles: dict[int, int] = {}  # CUfunction as an int, per device
        # Handles as the ctypes launcher takes them (ctypes.c_void_p), per device / stream.
        self._raw_functions: dict[int, ctypes.c_void_p] = {}
        self._streams: dict[int, ctypes.c_void_p] = {}
        self._cu_streams: dict[int, Any] = {}  # cuda-bindings CUstream objects (fallback)

    def __repr__(self) -> str:
        return (f"CompiledKernel({self.name}, {self.target}, threads={self.threads}, "
                f"shared={self.shared_bytes} B)")

    def pack(self, values: Sequence) -> bytes:
        """The parameter bytes for `values` (what `launch` hands the driver; for tests)."""
        return self._args.struct.pack(*values)

    def function(self, device: int):
        """The CUfunction on `device`, loading the cubin on first use."""
        fn = self._functions.get(device)
        if fn is None:
            if self._library is None:
                self._library = drv.LoadedLibrary(self.cubin, self.name, self.shared_bytes)
            fn = self._library.function(device)
            self._functions[device] = fn
        return fn

    def launch(self, grid: int | Sequence[int], args: Sequence[Any], stream: Any = None) -> None:
        """Run the kernel on a grid of blocks with `args` (tensors and numbers, in signature
        order) on `stream` (default: torch's current stream of the tensors' device)."""
        values, device = self.plan.flatten(args)
        self.launch_values(grid, values, device, stream)

    def launch_values(self, grid: int | Sequence[int], values: Sequence, device: int,
                      stream: Any = None) -> None:
        """Launch with parameter values already checked and flattened (`plan.flatten`'s
        output, or a copy of it with new data pointers)."""
        gx, gy, gz = _grid(grid)
        if gx == 0 or gy == 0 or gz == 0:
            return  # an empty grid (empty tensors): nothing to do
        if device < 0:
            device = drv.current_device()
        self.launch_raw(gx, gy, gz, values, device, _stream_handle(stream, device))

    def launch_raw(self, gx: int, gy: int, gz: int, values: Sequence, device: int,
                   handle: int) -> None:
        """Pack `values` (param_list order) and launch: a positive grid, checked values, a
        device ≥ 0, a raw stream handle."""
        if self._map_slots:
            self.check_tensor_maps([values[slot] for slot in self._map_slots])
        args = self._args
        with args.lock:
            args.pack(values)
            self.send(gx, gy, gz, device, handle, args)

    def send(self, gx: int, gy: int, gz: int, device: int, handle: int,
             params: ParamBuffer) -> None:
        """The driver call, on parameters already packed in `params` (whose lock the
        caller holds until this returns): `cuLaunchKernel` through the C extension
        (`fastcall.py`), else through ctypes, else through cuda-bindings; a cluster
        kernel through `cuLaunchKernelEx`."""
        if self._clustered:
            self._launch_cluster(gx, gy, gz, device, handle, params.address)
            return
        fast = _C_LAUNCH[0] if _C_LAUNCH else _load_c_launcher()
        if fast is not None:
            fn = self._function_handles.get(device)
            if fn is None:
                fn = self._function_handles[device] = int(self.function(device))
            code = fast(fn, gx, gy, gz, self.threads, self.shared_bytes, handle,
                        params.address_value)
        else:
            code = self._launch_ctypes(gx, gy, gz, device, handle, params.address)
        if code != 0:
            self.check_result(code, gx, gy, gz)

    def check_result(self, code: int, gx: int, gy: int, gz: int) -> None:
        """Raise the driver's error for a non-zero CUresult of cuLaunchKernel."""
        driver = drv.cuda_driver()
        drv.check((driver.CUresult(code),), f"cuLaunchKernel({self.name}, grid={(gx, gy, gz)})")

    def _launch_ctypes(self, gx: int, gy: int, gz: int, device: int, handle: int,
                       params: ctypes.c_void_p) -> int:
        """`cuLaunchKernel` as a ctypes foreign call (handles wrapped once, cached), or
        through cuda-bindings where libcuda cannot be opened; the CUresult."""
        raw = _RAW_LAUNCH[0] if _RAW_LAUNCH else _load_raw_launcher()
        if raw is None:
            self._launch_bindings(gx, gy, gz, device, handle, params)
            return 0
        fn = self._raw_functions.get(device)
        if fn is None:
            fn = self._raw_functions[device] = ctypes.c_void_p(int(self.function(device)))
        stream = self._streams.get(handle)
        if stream is None:
            stream = self._streams[handle] = ctypes.c_void_p(handle)
        return raw(fn, gx, gy, gz, self.threads, 1, 1, self.shared_bytes, stream, params, None)

    def _launch_bindings(self, gx: int, gy: int, gz: int, device: int, handle: int,
                         params: ctypes.c_void_p) -> None:
        """`cuLaunchKernel` through cuda-bindings (where libcuda cannot be opened by ctypes)."""
        driver = drv.cuda_driver()
        cu_stream = self._cu_streams.get(handle)
        if cu_stream is None:
            cu_stream = self._cu_streams[handle] = driver.CUstream(handle)
        err = driver.cuLaunchKernel(self.function(device), gx, gy, gz, self.threads, 1, 1,
                                    self.shared_bytes, cu_stream, params.value, 0)
        if err[0] != driver.CUresult.CUDA_SUCCESS:
            drv.check(err, f"cuLaunchKernel({self.name}, grid={(gx, gy, gz)})")

    def check_tensor_maps(self, maps: Sequence) -> None:
        """Refuse to run with the placeholder map of an empty tensor (`maps`: the values of
        the tensor-map slots, in slot order)."""
        for (_, tmap, _, _), value in zip(self.plan.map_slots, maps):
            if value is EMPTY_TENSOR_MAP:
                raise LaunchError(f"{self.name}: tensor {tmap.tensor!r} is empty, and its TMA "
                                  f"tensor map {tmap.name!r} cannot describe a zero extent; "
                                  f"a kernel reading it must not be launched on a non-empty "
                                  f"grid")

    def _launch_cluster(self, gx: int, gy: int, gz: int, device: int, handle: int,
                        params: ctypes.c_void_p) -> None:
        """`cuLaunchKernelEx` with the cluster-dimension attribute (through cuda-bindings;
        the launch configuration object is built once per grid and stream)."""
        cx, cy, cz = self.cluster
        if gx % cx or gy % cy or gz % cz:
            raise LaunchError(f"{self.name}: grid {(gx, gy, gz)} is not a multiple of the "
                              f"kernel's cluster {self.cluster} in every dimension")
        driver = drv.cuda_driver()
        config = self._cluster_configs.get((gx, gy, gz, handle))
        if config is None:
            if len(self._cluster_configs) > 256:
                self._cluster_configs.clear()
            config = self._cluster_configs[(gx, gy, gz, handle)] = cluster_launch_config(
                driver, (gx, gy, gz), self.threads, self.shared_bytes, handle, self.cluster)
        err = driver.cuLaunchKernelEx(config, self.function(device), params.value, 0)
        if err[0] != driver.CUresult.CUDA_SUCCESS:
            drv.check(err, f"cuLaunchKernelEx({self.name}, grid={(gx, gy, gz)}, "
                           f"cluster={self.cluster})")

    def __getitem__(self, grid):
        """`kernel[grid](*args)`: launch on the current stream."""
        return lambda *args: self.launch(grid, args)


#: Blocks per cluster every cluster-capable GPU supports (more needs the non-portable
#: cluster-size attribute, which tegula does not set).
MAX_PORTABLE_CLUSTER = 8


def _checked_cluster(kernel: ThreadKernel) -> tuple[int, int, int]:
    """The kernel's cluster dimensions, refused with a clear error unless three positive
    ints of at most `MAX_PORTABLE_CLUSTER` blocks in all."""
    cluster = tuple(kernel.cluster)
    if len(cluster) != 3 or any(not isinstance(c, int) or c < 1 for c in cluster):
        raise LaunchError(f"kernel {kernel.name}: cluster must be three positive ints, got "
                          f"{kernel.cluster!r}")
    if cluster[0] * cluster[1] * cluster[2] > MAX_PORTABLE_CLUSTER:
        raise LaunchError(f"kernel {kernel.name}: cluster {cluster} has "
                          f"{cluster[0] * cluster[1] * cluster[2]} blocks; at most "
                          f"{MAX_PORTABLE_CLUSTER} are portable")
    return cluster


def cluster_launch_config(driver, grid: tuple[int, int, int], threads: int, shared_bytes: int,
                          stream: int, cluster: tuple[int, int, int]):
    """The `CUlaunchConfig` of a cluster launch: grid and block, dynamic shared memory,
    stream, and one attribute, CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION."""
    attribute = driver.CUlaunchAttribute()
    attribute.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attribute.value.clusterDim.x, attribute.value.clusterDim.y, attribute.value.clusterDim.z = \
        cluster
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = shared_bytes
    config.hStream = driver.CUstream(stream)
    config.attrs = [attribute]
    config.numAttrs = 1
    return config


def _grid(grid: int | Sequence[int]) -> tuple[int, int, int]:
    dims = (grid,) if isinstance(grid, int) else tuple(grid)
    if not 1 <= len(dims) <= 3 or any(not isinstance(d, int) or d < 0 for d in dims):
        raise LaunchError(f"grid must be 1 to 3 non-negative ints, got {grid!r}")
    return (tuple(dims) + (1, 1))[:3]


_RAW_LAUNCH: list = []  # [cuLaunchKernel through ctypes, or None], filled on first use


def _load_raw_launcher():
    _RAW_LAUNCH.append(drv.raw_launcher())
    return _RAW_LAUNCH[0]


_C_LAUNCH: list = []  # [fastcall.c_launcher of that cuLaunchKernel, or None], on first use
#: [(fastcall's launch_pointers, that cuLaunchKernel's address), or None], set with _C_LAUNCH
#: (None too where Python has no GIL: the extension then has no launch_pointers).
_C_POINTERS: list = [None]

#: Encoded tensor maps a prepared launch keeps per map, by data pointer (the rule:
#: `PreparedLaunch`'s docstring).
MAPS_KEPT_PER_TENSOR = 256


def _load_c_launcher():
    raw = _RAW_LAUNCH[0] if _RAW_LAUNCH else _load_raw_launcher()
    fast = pointers = None
    if isinstance(raw, ctypes._CFuncPtr):  # a C function (not a test's Python stand-in)
        from tegula.runtime.fastcall import c_extension
        module = c_extension()
        if module is not None:
            address = ctypes.cast(raw, ctypes.c_void_p).value
            fast = partial(module.launch, address)
            if hasattr(module, "launch_pointers"):
                pointers = (module.launch_pointers, address)
    _C_LAUNCH.append(fast)
    _C_POINTERS[0] = pointers
    return fast


class PreparedLaunch:
    """A launch whose arguments were checked once, replayed for later arguments with the
    same key (shapes, strides, dtypes, devices and pointer alignment classes: everything
    the checks read except the data pointers and the numbers' values).

    It owns a `ParamBuffer` whose tail (extents, strides) was packed once; the values a
    replay changes sit first. Calling it packs the new data pointers, re-checks the
    scalars (a float rounded to its dtype, an int's 32-bit range), takes the tensor maps
    of the new pointers (a cache hit when a pointer was seen before) and calls the
    driver: no argument plan, no facts, no dict of names, no list of every value.

    Tensor maps (the eviction rule): per tensor map, the prepared launch keeps the
    encoded map of each data pointer its tensor had in a Python launch (`map_values`, one
    dict per map). The C launch (`_direct_spec`) copies a kept map and never encodes, so
    a launch goes through C exactly when every mapped tensor's pointer is kept *for that
    map*: a pointer kept for `a`'s map is new to `b`'s. A pointer the C launch does not
    find makes the launch a Python one, which encodes its map and keeps it. When a map
    has `MAPS_KEPT_PER_TENSOR` pointers and a new one comes, it drops them all and starts
    over with the new one (a program streaming through fresh allocations does not grow
    it); a later launch with a dropped pointer is a Python launch again.
    """

    __slots__ = ("kernel", "device", "constexprs", "buffer", "take_pointers", "scalars",
                 "maps", "map_values", "slots", "pointer_indices", "direct", "aliases")

    def __init__(self, kernel: CompiledKernel, values: list, device: int,
                 constexprs: dict | None = None, arg_index: dict[str, int] | None = None):
        """`values`: `kernel.plan.flatten`'s output for the checked arguments; `arg_index`:
        each parameter's position among the arguments later calls pass (default: the
        kernel's signature order)."""
        if arg_index is None:
            arg_index = {p.name: i for i, p in enumerate(kernel.plan.params)}
        self.kernel = kernel
        self.device = device  # -1: no tensor arguments, the current device at each launch
        self.constexprs = constexprs or {}
        specs = kernel.params
        pointers = [(slot, arg_index[spec.source])
                    for slot, spec in enumerate(specs) if spec.kind == "pointer"]
        by_name = {p.name: p for p in kernel.plan.params}
        self.scalars = [(arg_index[spec.source], by_name[spec.source])
                        for spec in specs if spec.kind == "scalar"]
        # Per tensor map: its tensor's argument, the map, and the tensor's extents and
        # strides (fixed for this prepared launch; only the pointer varies).
        pointer_slots = {spec.source: slot for slot, spec in enumerate(specs)
                         if spec.kind == "pointer"}
        self.maps = []
        for _, tmap, _, rank in kernel.plan.map_slots:
            start = pointer_slots[tmap.tensor] + 1
            self.maps.append((arg_index[tmap.tensor], tmap, tuple(values[start:start + rank]),
                              tuple(values[start + rank:start + 2 * rank])))
        # Per map, its encodings by data pointer (everything else it encodes is fixed for
        # this prepared launch), filled by Python launches, read by the C launch.
        self.map_values = [{} for _ in self.maps]
        # Written tensors against the others (runtime/aliasing.py): byte ranges fixed here.
        self.aliases = None
        if kernel.plan.alias_rules:
            tensors = {p.name: p.rank for p in kernel.plan.params if isinstance(p, TensorParam)}
            views = {name: (tuple(values[pointer_slots[name] + 1:pointer_slots[name] + 1 + r]),
                            tuple(values[pointer_slots[name] + 1 + r:
                                         pointer_slots[name] + 1 + 2 * r]))
                     for name, r in tensors.items()}
            check = AliasCheck(kernel.name, kernel.plan.alias_rules,
                               {name: arg_index[name] for name in tensors}, views,
                               kernel.plan.bits)
            self.aliases = check if check.c_pairs else None
        # Buffer order: pointers, scalars, maps (rewritten per launch), then the rest.
        changing = ([slot for slot, _ in pointers]
                    + [slot for slot, spec in enumerate(specs) if spec.kind == "scalar"]
                    + [slot for slot, *_ in kernel.plan.map_slots])
        fixed = [slot for slot in range(len(specs)) if slot not in set(changing)]
        self.slots = changing
        self.buffer = ParamBuffer(specs, changing + fixed, len(changing))
        self.buffer.pack([values[slot] for slot in changing + fixed])
        indices = [i for _, i in pointers]
        self.pointer_indices = tuple(indices)
        self.take_pointers = (itemgetter(*indices) if len(indices) > 1 else
                              (lambda p, i=indices[0]: (p[i],)) if indices else
                              (lambda p: ()))
        self.direct = _NOT_YET  # the C launch of new pointers (`_direct_spec`), on first call

    def __call__(self, grid: tuple[int, int, int], args: Sequence[Any],
                 pointers: Sequence[int | None], stream: Any = None) -> None:
        """Launch on a normalized `grid` with `args` (positional, as first checked) whose
        data pointers the caller has read already (`pointers[i]` for `args[i]`)."""
        direct = self.direct
        if direct is _NOT_YET:
            direct = self.direct = self._direct_spec(args)
        if direct is not None:  # pointers and ints: written and launched in one C call
            device = self.device
            if stream is None and _CURRENT_STREAM:
                handle = _CURRENT_STREAM[0](device)
            else:
                handle = _stream_handle(stream, device)
            code = _C_POINTERS[0][0](direct, grid[0], grid[1], grid[2], handle, pointers,
                                     args)
            if code is not None:  # None: an int out of 32-bit range, refused below
                if code != 0:
                    self.kernel.check_result(code, grid[0], grid[1], grid[2])
                return
        if self.aliases is not None:
            self.aliases.check(pointers)
        changing = self.take_pointers(pointers)
        if self.scalars or self.maps:
            changing = self._with_scalars_and_maps(changing, args, pointers)
        device = self.device if self.device >= 0 else drv.current_device()
        if stream is None and _CURRENT_STREAM:  # the common case, without a call
            handle = _CURRENT_STREAM[0](device)
        else:
            handle = _stream_handle(stream, device)
        buffer = self.buffer
        with buffer.lock:
            buffer.prefix.pack_into(buffer.buffer, buffer.start, *changing)
            self.kernel.send(grid[0], grid[1], grid[2], device, handle, buffer)

    def _direct_spec(self, args: Sequence[Any]) -> tuple | None:
        """What fastcall's `launch_pointers` needs to write this launch's data pointers
        (and 32-bit int and f32 scalars) and call cuLaunchKernel in one C call, holding
        the GIL throughout (so every launch of this buffer goes through it and no lock is
        taken): for a launch whose changing values are data pointers and scalars passed
        as Python ints to int parameters or Python floats to f32 ones (`args`, the first
        replay's arguments: the replay key holds each number's type, so every later one
        passes the same types; the C call checks each value's type and range, and packs a
        float as `struct`'s "f" does), of a kernel without a cluster or tensor maps, on a
        known device, with the C launcher in use and `send` not replaced (tests record
        through it). None otherwise — narrower float parameters (rounded to their dtype
        first), numpy numbers, bools: the launch packs in Python and calls `send`."""
        ck, buffer = self.kernel, self.buffer
        if (len(self.maps) > 16 or ck._clustered or self.device < 0 or
                not 0 < len(self.pointer_indices) <= 64 or len(self.scalars) > 64 or
                _C_POINTERS[0] is None or not (_C_LAUNCH and _C_LAUNCH[0] is not None) or
                type(ck).send is not _SEND or "send" in vars(ck)):
            return None
        kinds = "".join(_direct_kind(param, args[i] if i < len(args) else None)
                        for i, param in self.scalars)
        if len(kinds) != len(self.scalars):
            return None  # a scalar only Python checks and packs
        npointers = len(self.pointer_indices)
        written = npointers + len(kinds)
        if ([ck.params[slot].fmt for slot in self.slots[:written]] != ["Q"] * npointers
                + list(kinds) or buffer.offsets[:written] != [8 * k for k in range(npointers)]
                + [8 * npointers + 4 * k for k in range(len(kinds))]):
            return None  # not 8-byte pointers from the buffer's start, then the scalars
        dest = ctypes.addressof(buffer.buffer) + buffer.start
        spec = (_C_POINTERS[0][1], int(ck.function(self.device)), ck.threads,
                ck.shared_bytes, buffer.address_value, dest, self.pointer_indices)
        aliases = (self.aliases.c_pairs,) if self.aliases is not None else ()
        if not kinds and not self.maps:
            return spec + aliases
        maps = tuple((i, buffer.offsets[written + n], values)  # maps follow the scalars
                     for n, ((i, *_), values) in enumerate(zip(self.maps, self.map_values)))
        return spec + (tuple(i for i, _ in self.scalars), kinds.encode(), maps) + aliases

    def _with_scalars_and_maps(self, pointer_values: tuple, args: Sequence[Any],
                               pointers: Sequence[int | None]) -> list:
        plan = self.kernel.plan
        values = list(pointer_values)
        values += [plan.check_scalar(param, args[i]) for i, param in self.scalars]
        maps = [plan.tensor_map(tmap, pointers[i], shape, strides)
                for i, tmap, shape, strides in self.maps]
        if maps:
            self.kernel.check_tensor_maps(maps)
            for (i, *_), encoded, known in zip(self.maps, maps, self.map_values):
                if pointers[i] in known:
                    continue  # kept already (another map's pointer was new)
                if len(known) >= MAPS_KEPT_PER_TENSOR:  # many distinct pointers: start over
                    known.clear()
                known[pointers[i]] = encoded  # for the C launch of this pointer
        return values + maps


def _direct_kind(param: ScalarParam, arg: Any) -> str:
    """How the C launch writes a scalar argument: "i" (a Python int for an int
    parameter), "f" (a Python float for an f32 one), or "" (Python's check and packing)."""
    if param.dtype.is_float:
        return "f" if type(arg) is float and param.dtype.name == "f32" else ""
    return "i" if type(arg) is int else ""


_NOT_YET = object()  # PreparedLaunch.direct before its first call
_SEND = CompiledKernel.send  # the real one (tests replace it to record launches)


def _stream_handle(stream: Any, device: int) -> int:
    """A raw CUstream handle: given, or torch's current stream on `device`, or 0."""
    if stream is None:
        current = _CURRENT_STREAM[0] if _CURRENT_STREAM else _find_current_stream()
        return current(device) if current is not None else 0
    if isinstance(stream, int):
        return stream
    if hasattr(stream, "__cuda_stream__"):
        return int(stream.__cuda_stream__()[1])
    if hasattr(stream, "cuda_stream"):
        return int(stream.cuda_stream)
    raise LaunchError(f"stream must be an int handle or a CUDA stream object, got {stream!r}")


_CURRENT_STREAM: list = []  # [device -> torch's current raw stream], once torch is imported


def _find_current_stream():
    """torch's current-stream lookup (device -> raw handle), or None before torch is
    imported (then launches go to the legacy default stream, 0)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is None:
        def raw(device: int) -> int:
            return torch.cuda.current_stream(device).cuda_stream
    _CURRENT_STREAM.append(raw)
    return raw


# --------------------------------------------------------------------------------------
# Compilation through the caches
# --------------------------------------------------------------------------------------

_LOADED: dict[tuple, CompiledKernel] = {}
_LOADED_LOCK = threading.Lock()


def default_target() -> str:
    """The current GPU's target ("sm_90a" on Hopper), or "sm_90a" without a usable GPU."""
    try:
        major, minor = drv.compute_capability(drv.current_device())
    except Exception:
        return "sm_90a"
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def compile_kernel(kernel: ThreadKernel, target: str | None = None,
                   options: tuple[str, ...] = (),
                   requirements: dict[str, TensorRequirement] | None = None,
                   cache: DiskCache | None = None) -> CompiledKernel:
    """Emit, compile (disk-cached) and wrap `kernel`; one object per distinct compile."""
    target = target or default_target()
    source = emit_cuda(kernel, target)
    compiler = default_compiler()
    key = cache_key(source, options, compiler.version, target)
    mem_key = (key, tuple(sorted((requirements or {}).items())))
    with _LOADED_LOCK:
        found = _LOADED.get(mem_key)
    if found is not None:
        return found
    disk = cache if cache is not None else DiskCache()
    cubin = disk.get_or_build(
        key, lambda: compile_cuda(source, kernel.name, target, tuple(options), compiler))
    compiled = CompiledKernel(kernel, cubin, source, target, requirements, key)
    with _LOADED_LOCK:
        return _LOADED.setdefault(mem_key, compiled)
