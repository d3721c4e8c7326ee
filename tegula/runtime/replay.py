"""The replay path of `kernel[grid](...)`: a launch whose arguments look like an earlier
launch's goes straight to that launch's `PreparedLaunch`; any other takes the full path
(`tegula.build.full_launch`: check, specialize, compile, launch, then prepare the replay).

The replay key decides which specialization runs, so it must hold every fact the full
path specializes on or checks — a key that misses one replays a variant compiled for
other facts, a silent wrong result. Per torch tensor it holds the pointer's alignment
class (`ptr & 15`: the facts cap alignment at 16 bytes), the shape and strides (extent and
stride divisibility, the contiguous dim, 32- or 64-bit offsets, extent checks), the dtype
and the device; per number its type (the value is re-checked by the replay); and the
keywords (constexprs and compile options) exactly as the full path's build key tells them
apart, which is by `repr`: `1`, `1.0` and `True` are equal in Python and hash alike, and
`0.0 == -0.0`, yet each compiles a different variant (or is refused). The grid is
re-checked on every launch with the same exactness (a float grid is refused, not
truncated). `tests/runtime/test_replay_key.py` checks all of it against the full path.

Host time per replay is the point of this module, so `launch_call` is one Python frame
doing the key, the lookup, the grid and the prepared launch's call (`kernel[grid]` is
`launch_call` with the kernel and grid bound); with the C extension, a replay whose prepared launch
writes data pointers only, on a plain grid and the current stream, is one C call of
that frame (`fastcall.replay_launch`: the same key, the same grid limits as
`launch_grid`, the stream of the launch's device).
"""
from __future__ import annotations

from typing import Any

from tegula.runtime import launcher as _launcher

#: Keyword value types whose `==` within one type is exactly the build key's `repr`
#: equality (a float is not: `0.0 == -0.0`; a tuple may hold floats).
_PLAIN = frozenset({int, str, bool, type(None)})

#: Prepared launches kept per kernel (each holds a small parameter buffer).
MAX_PREPARED = 4096

_FULL: list = []  # [tegula.build.full_launch], imported on the first miss


def constexpr_key(kwargs: dict) -> tuple | None:
    """The keywords' part of the replay key: the items and their types where every value
    is an int, str, bool or None; else per item (name, type, repr) — the build key's own
    distinction. None where a keyword is a tensor (a run-time argument given by name:
    such launches are not replayed)."""
    types = tuple(map(type, kwargs.values()))
    if _PLAIN.issuperset(types):
        return tuple(kwargs.items()), types
    items = []
    for name, value in kwargs.items():
        if type(value) in _PLAIN:
            items.append((name, type(value), value))
        elif hasattr(value, "data_ptr") or hasattr(value, "__cuda_array_interface__"):
            return None
        else:
            items.append((name, type(value), repr(value)))
    return tuple(items)


def replay_key(args: tuple, kwargs: dict, target: Any) -> tuple[tuple, list] | None:
    """(The replay key of a launch, the arguments' data pointers), or None where the
    launch is not replayable (an argument the key does not read: a non-torch tensor
    object, a tensor given by keyword). The key is one flat tuple: the target, the
    keywords' part (if any), then per argument its parts; it parses one way only, since
    a number's part is a type object, which equals none of a tensor's five parts."""
    kw = constexpr_key(kwargs) if kwargs else ()
    head = (target, kw) if kwargs else (target,)
    _, key, pointers = _lookup({}, head, args, kw)
    return None if key is None else (key, pointers)


def launch_grid(grid: Any) -> tuple[int, int, int]:
    """`grid` as three positive ints where it is one to three plain ints in CUDA's limits
    (checked by type: a bool or float never passes), else `tegula.build.normalize_grid`'s
    answer (numpy integers, zero extents) or error."""
    if type(grid) is tuple:
        n = len(grid)
        if n == 1:
            gx, = grid
            if type(gx) is int and 0 < gx < 2**31:
                return gx, 1, 1
        elif n == 2:
            gx, gy = grid
            if type(gx) is int and type(gy) is int and 0 < gx < 2**31 and 0 < gy <= 65535:
                return gx, gy, 1
        elif n == 3:
            gx, gy, gz = grid
            if type(gx) is int and type(gy) is int and type(gz) is int and \
                    0 < gx < 2**31 and 0 < gy <= 65535 and 0 < gz <= 65535:
                return grid
    elif type(grid) is int and 0 < grid < 2**31:
        return grid, 1, 1
    from tegula.build import normalize_grid
    return normalize_grid(grid)


def launch(kernel, grid, args: tuple, kwargs: dict, target=None, stream=None) -> Any:
    """A replay where the replay key matches an earlier launch of `kernel`, else the full
    path (which prepares the replay for next time)."""
    return launch_call(kernel, grid, *args, target=target, stream=stream, **kwargs)


def launch_call(kernel, grid, /, *args: Any, target=None, stream=None, **kwargs: Any) -> Any:
    """`kernel[grid](*args, **kwargs)` (what `Kernel.__getitem__` returns is this function
    with the kernel and grid bound): `launch`, taking the arguments as the user passed
    them, so the call itself is the only frame (kernel and grid are positional-only: a
    constexpr may be named `kernel`)."""
    table = kernel.__dict__.get("_fast_launch")
    if table is None:
        table = kernel.__dict__["_fast_launch"] = {}
    if kwargs:
        plain = C_KEYWORDS[0]
        kw = plain(kwargs) if plain is not None else None
        if kw is None:
            kw = constexpr_key(kwargs)
        head = (target, kw)
    else:
        kw, head = (), (target,)
    fused = C_LAUNCH[0]
    if fused is not None and kw is not None and stream is None:
        # The key, the lookup and a pointers-only replay on a plain grid, in one C call;
        # anything else comes back as the lookup's answer, finished below.
        current = _launcher._CURRENT_STREAM
        result = fused(table, head, args, grid, current[0] if current else None)
        if type(result) is not tuple:
            return result
        hit, key, pointers = result
    elif C_LOOKUP[0] is not None and kw is not None:  # the key and lookup in C
        hit, key, pointers = C_LOOKUP[0](table, head, args)
    else:
        hit, key, pointers = _lookup(table, head, args, kw)
    if hit is not None:
        grid3 = launch_grid(grid(hit.constexprs) if callable(grid) else grid)
        if 0 not in grid3:  # an empty grid (empty tensors) launches nothing
            hit(grid3, args, pointers, stream)
        return hit.kernel
    full = _FULL[0] if _FULL else _import_full()
    ck, prepared = full(kernel, grid, args, kwargs, target, stream)
    if prepared is not None and key is not None:
        if len(table) >= MAX_PREPARED:  # many distinct shapes: start over, not grow forever
            table.clear()
        table[key] = prepared
    if C_LOOKUP[0] is None and not _C_TRIED:
        _load_c_lookup()
    return ck


def _lookup(table: dict, head: tuple, args: tuple, kw) -> tuple:
    """(Prepared launch or None, key or None, pointers): `replay_key` and the lookup, in
    Python (the C extension's `replay_lookup` does the same)."""
    parts, pointers = list(head), []
    for a in args:
        data_ptr = getattr(a, "data_ptr", None)
        if data_ptr is None:
            if not isinstance(a, (int, float)):
                kw = None
                break
            parts.append(type(a))
            pointers.append(None)
            continue
        ptr = data_ptr()
        parts += (ptr & 15, a.shape, a.stride(), a.dtype, a.get_device())
        pointers.append(ptr)
    if kw is None:
        return None, None, None
    key = tuple(parts)
    return table.get(key), key, pointers


#: [the C extension's replay_lookup, or None]: set after the first full launch (building
#: the extension takes a C compile once), None where it cannot be built, or turned off
#: by TEGULA_C_LAUNCHER=0.
C_LOOKUP: list = [None]
#: [the C extension's plain_keywords, or None]: the first case of `constexpr_key` in C
#: (set with C_LOOKUP; None: that case runs in Python).
C_KEYWORDS: list = [None]
#: [the C extension's replay_launch, or None]: key, lookup and a direct replay (see
#: `PreparedLaunch._direct_spec`) in one call (set with C_LOOKUP; None where Python has
#: no GIL, as the extension then has no pointer launch).
C_LAUNCH: list = [None]
#: [the C extension's entry_launch, or None]: a library entry point's replay in one call
#: (`tegula.kernels.api.EntryReplay`; set and absent like C_LAUNCH).
C_ENTRY: list = [None]
_C_TRIED: list = []


def _load_c_lookup() -> None:
    from tegula.runtime.fastcall import c_extension
    _C_TRIED.append(True)
    module = c_extension()
    C_LOOKUP[0] = None if module is None else module.replay_lookup
    C_KEYWORDS[0] = None if module is None else module.plain_keywords
    C_LAUNCH[0] = getattr(module, "replay_launch", None)
    C_ENTRY[0] = getattr(module, "entry_launch", None)


def _import_full():
    # The compile path sits above the runtime, so it is imported late, and once.
    from tegula.build import full_launch
    _FULL.append(full_launch)
    return full_launch
