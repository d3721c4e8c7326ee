"""Where the host microseconds of a replayed entry point go, on a GPU (issue 14: profile
before optimizing). Prints µs per call of each piece a replay of `tegula.kernels.softmax(x)`
runs, beside torch's own calls of the same kind, in one process:

    PYTHONPATH=. TEGULA_AUTOTUNE=0 python3 benchmarks/launch_breakdown.py

- allocation: `torch.empty_like`, `new_empty`, `torch.empty(..., device=)`, `empty_strided`;
- the replay key and lookup alone (`fastcall.replay_lookup`), torch's current-stream lookup;
- the driver alone: `cuLaunchKernel` in a C loop (no Python), with the parameters as a
  `void*[]` (what tegula passes) and as one packed buffer (`CU_LAUNCH_PARAM_BUFFER_POINTER`),
  for the copy and softmax kernels; the packed buffer's launch is checked against torch;
- the whole replay (`tk.softmax(x)`, with and without `out=`, without its allocation,
  without the Python frames) and torch's softmax, clone and copy_, all interleaved.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
import tempfile

_LOOP_SOURCE = r"""
#include <time.h>
typedef int (*launch_t)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, void *, void **, void **);
/* n back-to-back launches; returns nanoseconds, or -code on the first failure */
long long launch_loop(void *launch, void *f, unsigned gx, unsigned gy, unsigned gz,
                      unsigned threads, unsigned shared, void *stream, void **params,
                      void **extra, int n)
{
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (int i = 0; i < n; i++) {
        int code = ((launch_t)launch)(f, gx, gy, gz, threads, 1, 1, shared, stream, params, extra);
        if (code)
            return -code;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    return (b.tv_sec - a.tv_sec) * 1000000000LL + (b.tv_nsec - a.tv_nsec);
}
"""


def _loop_function():
    cc = shutil.which("cc") or shutil.which("gcc")
    folder = tempfile.mkdtemp(prefix="tegula-breakdown-")
    source, library = os.path.join(folder, "loop.c"), os.path.join(folder, "libloop.so")
    with open(source, "w") as f:
        f.write(_LOOP_SOURCE)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", source, "-o", library], check=True)
    fn = ctypes.CDLL(library).launch_loop
    fn.restype = ctypes.c_longlong
    fn.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_uint] * 5 + [ctypes.c_void_p] * 3 + \
        [ctypes.c_int]
    return fn


def packed_extra(prepared):
    """`extra` for cuLaunchKernel: the prepared launch's values in the kernel's own layout
    (kept alive by the returned tuple)."""
    from tegula.runtime.packing import param_layout

    specs = prepared.kernel.params
    layout, offsets = param_layout(specs)
    blob = ctypes.create_string_buffer(max(1, layout.size))
    for slot, (spec, offset) in enumerate(zip(specs, offsets)):
        ctypes.memmove(ctypes.addressof(blob) + offset,
                       prepared.buffer.value_bytes(slot, spec.size), spec.size)
    size = ctypes.c_size_t(layout.size)
    extra = (ctypes.c_void_p * 5)(1, ctypes.addressof(blob), 2, ctypes.addressof(size), 0)
    return extra, (blob, size)


def driver_rows(loop, entry, name, x, reference):
    """µs per cuLaunchKernel of an entry point's prepared launch in a C loop, parameter
    array vs packed buffer, each checked first: one launch into a NaN-filled y against
    `reference`."""
    import torch

    y = torch.empty_like(x)
    prepared, grid = entry.prepared, entry.grid
    prepared(entry.grid, (), [x.data_ptr(), y.data_ptr()])  # the buffer now holds x, y
    spec = prepared.direct
    if not isinstance(spec, tuple):
        return [(f"{name}: no direct spec ({spec!r})", float("nan"))]
    address, function, threads, shared, params = spec[:5]
    stream = torch.cuda.current_stream().cuda_stream
    extra, keep = packed_extra(prepared)
    rows = []
    for how, p, e in (("void*[] params", params, None), ("packed buffer", None, extra)):
        y.fill_(float("nan"))
        ns = loop(address, function, *grid, threads, shared, stream, p, e, 1)
        torch.cuda.synchronize()
        check = " ok" if torch.allclose(y.float(), reference, atol=2e-3) else " WRONG"
        best = float("inf")
        for _ in range(10):  # 500 at a time: fewer than the launch queue holds, so the
            # loop measures the host's cost, not the GPU's rate of tiny kernels
            ns = loop(address, function, *grid, threads, shared, stream, p, e, 500)
            torch.cuda.synchronize()
            best = min(best, ns / 500 / 1e3 if ns > 0 else float("nan"))
        rows.append((f"cuLaunchKernel {name}, {how}{check} ({len(prepared.kernel.params)} "
                     f"params)", best))
    del keep
    return rows


def _rank1_copy(x):
    """A prepared launch of a copy kernel on rank-1 views (6 parameters where the 2-D
    kernels take 10), shaped like an entry point's replay (`.prepared`, `.grid`)."""
    from types import SimpleNamespace

    import tegula as tg
    from tegula.dtypes import f16

    @tg.kernel(threads=128)
    def copy_1d(src: tg.Tensor[f16, 1], dst: tg.Tensor[f16, 1], BN: tg.constexpr = 1024):
        i = tg.block_id(0)
        tg.copy(tg.load(src.tile((BN,), (i,))), dst.tile((BN,), (i,)))

    flat, out = x.view(-1), x.new_empty(x.numel())
    grid = (x.numel() // 1024, 1, 1)
    for _ in range(2):  # full path, then the replay that decides the C launch
        copy_1d[grid](flat, out)
    prepared = next(iter(copy_1d.__dict__["_fast_launch"].values()))
    return SimpleNamespace(prepared=prepared, grid=grid)


def main() -> None:
    import torch

    import tegula.kernels as tk
    from tegula.kernels import api
    from launch_overhead import per_call_runs, per_call_us
    from tegula.runtime import fastcall, launcher, replay

    x = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    for _ in range(3):  # full path, Python replay, C replay: prepared and decided
        tk.softmax(x), tk.copy(x), tk.softmax(x, out=y)
    torch.cuda.synchronize()
    entry = api._REPLAYS[api._signature("softmax", (x,), int, -1, True)]
    lookup = replay.C_LOOKUP[0]
    head = ("softmax", int, -1, True)
    raw_stream = torch._C._cuda_getCurrentRawStream
    loop = _loop_function()
    # A second replay (x2: another pointer alignment class, so another key) whose output
    # is a kept tensor: the replay without its allocation.
    x2 = torch.randn(64 * 64 + 8, device="cuda", dtype=torch.float16)[4:4 + 64 * 64].view(64, 64)
    y2 = torch.empty_like(x2)
    for _ in range(3):
        tk.softmax(x2)
    api._REPLAYS[api._signature("softmax", (x2,), int, -1, True)].allocate = lambda t: y2
    small = torch.randn(4, 64, device="cuda", dtype=torch.float16)
    for _ in range(3):
        tk.softmax(small)
    fused, current = replay.C_ENTRY[0], launcher._CURRENT_STREAM[0]
    # Interleaved (each run of one, then of the next, ...): a burst of load on the shared
    # host falls on every row.
    interleaved = {
        "torch.softmax(x, -1)": lambda: torch.softmax(x, -1),
        "tk.softmax(x)": lambda: tk.softmax(x),
        "tk.softmax(x, out=y)": lambda: tk.softmax(x, out=y),
        "tk.softmax(x2), its output a kept y2 (no allocation)": lambda: tk.softmax(x2),
        "entry_launch(...) called directly (no Python frames)":
            lambda: fused(api._REPLAYS, head, (x,), current),
        "torch.empty_like(x)": lambda: torch.empty_like(x),
        "tk.softmax(x, out=torch.empty_like(x))": lambda: tk.softmax(x, out=torch.empty_like(x)),
        "torch.softmax(small, -1) (4x64)": lambda: torch.softmax(small, -1),
        "tk.softmax(small) (4x64)": lambda: tk.softmax(small),
        "x.clone()": lambda: x.clone(),
        "tk.copy(x)": lambda: tk.copy(x),
        "y.copy_(x)": lambda: y.copy_(x),
        "replay key + lookup (C), 1 tensor": lambda: lookup(api._REPLAYS, head, (x,)),
    }
    runs = per_call_runs(list(interleaved.values()), repeats=7)
    rows = [(name, min(times)) for name, times in zip(interleaved, runs)]
    rows += [
        ("x.new_empty((64, 64))", per_call_us(lambda: x.new_empty((64, 64)))),
        ("torch.empty((64,64), dtype=, device=)", per_call_us(
            lambda: torch.empty((64, 64), dtype=x.dtype, device=x.device))),
        ("x.data_ptr()", per_call_us(lambda: x.data_ptr())),
        ("_cuda_getCurrentRawStream(0)", per_call_us(lambda: raw_stream(0))),
        ("python call of a no-op", per_call_us(lambda: None)),
    ]
    rows += driver_rows(loop, entry, "softmax", x, torch.softmax(x.float(), -1))
    rows += driver_rows(loop, _rank1_copy(x), "1-D copy", x, x.float())
    rows += driver_rows(loop, api._REPLAYS[api._signature("copy", (x,), True)], "copy", x,
                        x.float())
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, C launcher "
          f"{'in use' if replay.C_ENTRY[0] else fastcall.unavailable}: host us per call")
    for name, us in rows:
        print(f"{name:58s} {us:6.2f}")


if __name__ == "__main__":
    sys.exit(main())
