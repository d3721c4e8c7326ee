"""Host overhead per launch of a cached kernel (issue 14: a replayed `kernel[grid](x, y)`
at or under torch's `y.copy_(x)` on the same host).

    PYTHONPATH=. python3 benchmarks/launch_overhead.py             # on a GPU
    PYTHONPATH=. python3 benchmarks/launch_overhead.py --stubbed   # anywhere, no GPU
    PYTHONPATH=. python3 benchmarks/launch_overhead.py --stubbed --profile

On a GPU: per pair (tegula's call, torch's of the same kind), microseconds of host time
per call: runs of 200 back-to-back calls timed up to the last call's return (before the
synchronize that follows, so the host never waits for the GPU: 200 launches stay below
the launch queue's depth), the two calls' runs interleaved, the best of 40 each; and the
ratio of 2000 calls followed by a synchronize ("synced": host- or GPU-bound, whichever is
slower). The C++ extension (`tegula.runtime.torch_alloc`: output allocation and the
replay key's tensor reads) is built first (once a machine) and in use where it builds.
Rows: `kernel[grid](...)` (and through ctypes), the torch entry points (softmax again with
the key read through torch's Python API), a torch custom op that only allocates
(torch.library's own cost per call), `matmul_w4a16` against `F.linear` on the f16
weight, `attention_forward` against SDPA, and a decode step's replay against its full
path and against SDPA over the whole cache.

`--stubbed`: tegula's own share of a replayed launch, on any machine. The kernel is
compiled for real (NVRTC) and its first launch takes the full path, but the driver call
(a C function with cuLaunchKernel's signature, called through the same C launcher or
ctypes as the real one), the function handle and torch's current-stream lookup are stubs,
and the replays pass CPU torch tensors (same attribute reads as CUDA ones). What remains
is exactly the Python that a GPU launch runs before `cuLaunchKernel`, for
`kernel[grid](x, y)` and for the entry points' replays (whose output allocation is a CPU
`torch.empty` here, timed alone beside them), the softmax replay again with its key read
through torch's Python API (the C++ reader off); `--profile` prints where it goes.
"""
from __future__ import annotations

import sys
import time

from tegula.dtypes import f16
from tegula.kernels.copy import copy_kernel


def host_runs(fns, calls: int = 200, repeats: int = 40) -> list[list[float]]:
    """Per function, µs of host time per call of each of `repeats` runs of `calls`
    back-to-back calls, timed before the synchronize that follows each run (so the clock
    stops when the host has queued the last launch: `calls` stays below the launch queue's
    depth, so the host never waits for the GPU), the functions' runs interleaved."""
    import torch

    for fn in fns:
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    runs = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, runs):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times.append((time.perf_counter() - start) / calls * 1e6)
            torch.cuda.synchronize()
    return runs


def per_call_us(fn, calls: int = 2000, repeats: int = 5) -> float:
    """Microseconds per call of back-to-back calls, the best of `repeats` runs (the host
    is shared with the rest of the machine; the best run is the least disturbed)."""
    return min(per_call_runs([fn], calls, repeats)[0])


def per_call_runs(fns, calls: int = 2000, repeats: int = 5) -> list[list[float]]:
    """Per function, µs per call of each of `repeats` runs of `calls` back-to-back calls,
    the functions' runs interleaved (a, b, a, b, ...) so that a burst of load on a shared
    host falls on both sides of a comparison, not on one."""
    import torch

    for fn in fns:
        for _ in range(200):
            fn()
    torch.cuda.synchronize()
    runs = [[] for _ in fns]
    for _ in range(repeats):
        for fn, times in zip(fns, runs):
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            torch.cuda.synchronize()
            times.append((time.perf_counter() - start) / calls * 1e6)
    return runs


def main() -> None:
    import torch
    import torch.nn.functional as F

    from tegula.runtime import torch_alloc
    torch_alloc.start()  # the C++ allocator: from the cache, or built (once a machine)
    x = torch.randn(64, 64, device="cuda", dtype=torch.float16)
    y = torch.empty_like(x)
    w = torch.randn(64, device="cuda", dtype=torch.float16)
    import tegula.kernels as tk
    import tegula.kernels.torch_ops  # noqa: F401 — registers torch.ops.tegula.*

    kernel, scaled = copy_kernel(f16), scaled_copy_kernel()
    allocate_op = empty_like_op()  # torch.library's own cost per call of a custom op
    # The matrix entry points at sizes where the host decides: a 64³ GEMM, a decode GEMV
    # (4 tokens), a 64x128x256 FP8 GEMM with per-tensor scales.
    a, b = torch.randn(64, 64, device="cuda", dtype=torch.float16), x.T  # b: K-major
    tokens = torch.randn(4, 512, device="cuda", dtype=torch.float16)
    weight = torch.randn(256, 512, device="cuda", dtype=torch.float16)
    a8 = torch.randn(64, 256, device="cuda").to(torch.float8_e4m3fn)
    w8 = torch.randn(128, 256, device="cuda").to(torch.float8_e4m3fn)
    sa, sb = torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda")
    w4 = tk.quantize_w4(weight, 128, True)  # (packed, scales, zeros) of the same weight
    # (what, tegula's call, torch's call of the same kind): the targets.
    pairs = [
        ("kernel[grid](x, y) (64x64 copy)", lambda: kernel[(2, 1)](x, y, BM=32, BN=64),
         "y.copy_(x)", lambda: y.copy_(x)),
        ("kernel[grid](x, y, SCALE=0.5)", lambda: scaled[(2,)](x, y, SCALE=0.5),
         "torch.mul(x, 0.5, out=y)", lambda: torch.mul(x, 0.5, out=y)),
        ("tegula.kernels.copy(x, out=y)", lambda: tk.copy(x, out=y),
         "y.copy_(x)", lambda: y.copy_(x)),
        ("tegula.kernels.copy(x)", lambda: tk.copy(x), "x.clone()", lambda: x.clone()),
        ("tegula.kernels.rms_norm(x, w)", lambda: tk.rms_norm(x, w),
         "F.rms_norm(x, (64,), w)", lambda: F.rms_norm(x, (64,), w)),
        ("tegula.kernels.softmax(x)", lambda: tk.softmax(x),
         "torch.softmax(x, -1)", lambda: torch.softmax(x, -1)),
        ("torch.ops.tegula.softmax(x)", lambda: torch.ops.tegula.softmax(x),
         "torch.softmax(x, -1)", lambda: torch.softmax(x, -1)),
        ("  a torch custom op: empty_like only", lambda: allocate_op(x),
         "torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("tegula.kernels.matmul(a, b) (64^3)", lambda: tk.matmul(a, b),
         "a @ b", lambda: a @ b),
        ("tegula.kernels.gemv(x, w) (4x256x512)", lambda: tk.gemv(tokens, weight),
         "F.linear(x, w)", lambda: F.linear(tokens, weight)),
        ("tk.matmul_w4a16 (4x256x512, g128)", lambda: tk.matmul_w4a16(tokens, *w4, 128),
         "F.linear(x, w) (f16 w)", lambda: F.linear(tokens, weight)),
        ("tegula.kernels.matmul_fp8 (64x128x256)", lambda: tk.matmul_fp8(a8, w8.T, sa, sb),
         "torch._scaled_mm", lambda: torch._scaled_mm(a8, w8.T, sa, sb,
                                                     out_dtype=torch.bfloat16)),
    ]
    # Attention at a size where the host decides, and a decode step (its replay against
    # its own full path: torch has no op of the kind).
    qa = torch.randn(1, 8, 128, 64, device="cuda", dtype=torch.float16)
    ka, va = torch.randn_like(qa), torch.randn_like(qa)
    pairs.append(("tegula.kernels.attention_forward", lambda: tk.attention_forward(qa, ka, va),
                  "F.scaled_dot_product_attn", lambda: F.scaled_dot_product_attention(qa, ka, va)))
    q1 = torch.randn(4, 32, 1, 128, device="cuda", dtype=torch.float16)
    kcache = torch.randn(4, 8, 2048, 128, device="cuda", dtype=torch.float16)
    vcache = torch.randn_like(kcache)
    lengths = torch.full((4,), 1500, device="cuda", dtype=torch.int32)
    from tegula.kernels import api

    def decode_step():
        return tk.attention_decode(q1, kcache, vcache, lengths)

    decode_step()
    decode_key = api._signature("attention_decode", (q1, kcache, vcache, lengths), True,
                                type(None), None, bool, False, False, type(None), None,
                                type(None), None)
    if type(api._REPLAYS.get(decode_key)) is not api.PlanReplay:
        print("attention_decode kept no replay: its row times the full path twice")

    def decode_full_path():  # the step as before its replay: checks, configuration, launches
        api._REPLAYS.pop(decode_key, None)
        return decode_step()

    def sdpa_decode():  # torch's op of the kind: the whole cache, GQA, no length mask
        return F.scaled_dot_product_attention(q1, kcache, vcache, enable_gqa=True)

    decode = [("tk.attention_decode (4x32/8, 2048)", decode_step,
               "its full path (before)", decode_full_path),
              ("tk.attention_decode (same)", decode_step,
               "F.sdpa(q, k, v, enable_gqa)", sdpa_decode)]
    failed = {}
    for name, ours, _, theirs in pairs + decode:  # compile (and tune) while it builds
        try:
            ours(), theirs()
        except Exception as e:  # the row is left out, the table goes on
            failed[name] = f"{type(e).__name__}: {e}"
    cxx = torch_alloc.wait(120)  # then every replay allocates through it
    rows = []
    for name, ours, peer, theirs in pairs + decode:
        if name in failed:
            continue
        mine, torch_s = host_runs([ours, theirs])
        synced = per_call_runs([ours, theirs], repeats=3)
        rows.append((name, min(mine), peer, min(torch_s), min(synced[0]) / min(synced[1])))
    from tegula.runtime import fastcall, launcher, replay
    if launcher._C_LAUNCH and launcher._C_LAUNCH[0] is not None:
        # The same replay with the driver called through ctypes instead (the fallback).
        saved = (launcher._C_LAUNCH[0], launcher._C_POINTERS[0], replay.C_LOOKUP[0],
                 replay.C_KEYWORDS[0], replay.C_LAUNCH[0])
        launcher._C_LAUNCH[0] = launcher._C_POINTERS[0] = None
        replay.C_LOOKUP[0] = replay.C_KEYWORDS[0] = replay.C_LAUNCH[0] = None
        for prepared in kernel._fast_launch.values():
            prepared.direct = launcher._NOT_YET  # decided again, without the C launcher
        ctypes_us = min(host_runs([lambda: kernel[(2, 1)](x, y, BM=32, BN=64)])[0])
        rows.insert(1, ("  ... in Python, through ctypes", ctypes_us, "y.copy_(x)", rows[0][3],
                        float("nan")))
        (launcher._C_LAUNCH[0], launcher._C_POINTERS[0], replay.C_LOOKUP[0],
         replay.C_KEYWORDS[0], replay.C_LAUNCH[0]) = saved
        for prepared in kernel._fast_launch.values():
            prepared.direct = launcher._NOT_YET
    else:
        print(f"C launcher not in use: {fastcall.unavailable}")
    if fastcall.use_tensor_reader():
        # The softmax replay with the key's tensor reads through torch's Python bindings
        # (the path without the C++ extension), against torch beside it again.
        softmax_at = next(i for i, row in enumerate(rows) if row[0].startswith(
            "tegula.kernels.softmax"))
        fastcall.use_tensor_reader(False)
        mine, torch_s = host_runs([lambda: tk.softmax(x), lambda: torch.softmax(x, -1)])
        fastcall.use_tensor_reader()
        rows.insert(softmax_at + 1, ("  ... key read through Python", min(mine),
                                     "torch.softmax(x, -1)", min(torch_s), float("nan")))
    entries = [r for r in api._REPLAYS.values() if type(r) is api.EntryReplay
               and r.allocate is not None]
    in_cxx = sum(api._output_of(r.allocate) is None for r in entries)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, C++ allocator "
          f"{'in use' if cxx else 'not in use: ' + str(torch_alloc.unavailable)} "
          f"({in_cxx} of {len(entries)} allocating replays through it): host us per "
          f"call, best of 40 runs of 200 back-to-back calls timed before their sync, "
          f"tegula's and torch's interleaved; 'synced': the ratio of 2000 calls + sync "
          f"(host or GPU bound, whichever is slower)")
    print(f"{'tegula':36s} {'us':>6s}   {'torch peer':26s} {'us':>6s}  ratio  synced")
    for name, ours, peer, theirs, synced in rows:
        print(f"{name:36s} {ours:6.2f}   {peer:26s} {theirs:6.2f}  {ours / theirs:5.2f}  "
              f"{synced:5.2f}")
    for name, error in failed.items():
        print(f"{name}: FAILED {error[:200]}")


def empty_like_op():
    """A torch custom op (torch.library.custom_op, as tegula's) whose CUDA implementation
    is `torch.empty_like`: what a custom op costs beyond its own work."""
    import torch

    @torch.library.custom_op("tegula_bench::empty_like", mutates_args=(), device_types="cuda",
                             schema="(Tensor x) -> Tensor")  # (string annotations here)
    def empty_like(x):
        return torch.empty_like(x)

    empty_like.register_fake(lambda x: torch.empty_like(x))
    return torch.ops.tegula_bench.empty_like


def scaled_copy_kernel():
    """`y = x * SCALE` on 32x64 tiles of a 64x64 tensor: a launch keyed on a float
    constexpr."""
    import tegula as tg

    @tg.kernel(threads=128)
    def scaled_copy(x: tg.Tensor[f16], y: tg.Tensor[f16], SCALE: tg.constexpr = 1.0):
        m = tg.block_id(0)
        tg.copy(tg.load(x.tile((32, 64), (m, 0))) * SCALE, y.tile((32, 64), (m, 0)))
    return scaled_copy


class _FakeCudaTensor:
    """A device tensor as the launcher's first (checking) launch reads it."""

    def __init__(self, t):
        self.t = t
        self.shape = t.shape
        self.dtype = t.dtype
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape), "typestr": "<f2", "data": (t.data_ptr(), False),
            "version": 3, "strides": tuple(s * t.element_size() for s in t.stride())}

    def data_ptr(self):
        return self.t.data_ptr()

    def stride(self):
        return self.t.stride()

    def get_device(self):
        return 0


_STUB_SOURCE = """
int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                   unsigned bz, unsigned shared, void *stream, void **params, void **extra)
{ return (params == 0 || extra != 0) ? 1 : 0; }
"""


def _c_stub_launcher():
    """A C function with cuLaunchKernel's signature that returns success, loaded through
    ctypes like the real one (so the ctypes call's own cost is measured), or a Python
    stand-in where no C compiler is found."""
    import ctypes
    import os
    import shutil
    import subprocess
    import tempfile

    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return lambda *args: 0
    folder = tempfile.mkdtemp(prefix="tegula-stub-")
    source, library = os.path.join(folder, "stub.c"), os.path.join(folder, "libstub.so")
    with open(source, "w") as f:
        f.write(_STUB_SOURCE)
    subprocess.run([cc, "-O2", "-shared", "-fPIC", source, "-o", library], check=True)
    fn = ctypes.CDLL(library).cuLaunchKernel
    fn.restype = ctypes.c_int
    return fn


def _stub_driver() -> None:
    """Replace the driver call, the function handle, the current device and torch's
    current-stream lookup with stubs (the C stub through the same launcher path)."""
    from tegula.runtime import launcher

    launcher._RAW_LAUNCH[:] = [_c_stub_launcher()]      # cuLaunchKernel
    launcher._C_LAUNCH[:] = []  # derived from the stub: the C launcher unless turned off
    launcher._CURRENT_STREAM[:] = [lambda device: 0]    # torch's current raw stream
    launcher.CompiledKernel.function = lambda self, device: 0
    launcher.drv.current_device = lambda: 0


def _best_us(fn, calls: int) -> float:
    """Microseconds of this process's CPU time per call: the best of many short runs (on
    a shared machine wall time and the mean measure the neighbours; CPU time leaves out
    the time the process waits for a core)."""
    for _ in range(1000):
        fn()
    best, chunk = float("inf"), 2000
    for _ in range(max(1, calls // chunk)):
        start = time.process_time()
        for _ in range(chunk):
            fn()
        best = min(best, time.process_time() - start)
    return best / chunk * 1e6


def stubbed_replay(profile: bool = False):
    """A replayed `kernel[grid](x, y)` with the driver stubbed: a callable."""
    import torch

    try:
        from tegula.runtime.replay import replay_key
    except ImportError:  # a tree from before runtime/replay.py (to compare before/after)
        from tegula.build import _fast_key as replay_key

    kernel = copy_kernel(f16)
    x = torch.randn(64, 64, dtype=torch.float16)
    y = torch.empty_like(x)
    kernel[(2, 1)](_FakeCudaTensor(x), _FakeCudaTensor(y), BM=32, BN=64)  # the full path
    # Replays key on the tensors' attributes; file the prepared launch under CPU tensors'.
    fast = kernel.__dict__["_fast_launch"]
    prepared = next(iter(fast.values()))
    key, _ = replay_key((x, y), {"BM": 32, "BN": 64}, None)
    fast[key] = prepared
    prepared.device = 0

    def replay():
        kernel[(2, 1)](x, y, BM=32, BN=64)
    return replay


def stubbed_entry_points() -> dict:
    """The library entry points' replays (`tegula.kernels.copy/rms_norm/softmax`) on CPU
    torch tensors with the driver stubbed: {name: callable}. Their first call takes the
    full path with the device checks and the tuner bypassed (the first candidate runs);
    what is timed is the replay, output allocation included (a CPU `torch.empty` here)."""
    import torch

    import tegula.kernels as tk
    from tegula.kernels import api
    from tegula.runtime.args import ArgumentPlan

    def cpu_tensor(plan, p, arg, values):  # CPU tensors pass the setup's checks as cuda:0
        plan._append(p, arg.data_ptr(), arg.shape, arg.stride(), values)
        return 0

    saved = (api._check_cuda, api._tune_and_run, ArgumentPlan._tensor)
    api._check_cuda = lambda fn, tensors: None
    api._tune_and_run = lambda name, device, configs, dims, extra, run: run(configs[0])
    ArgumentPlan._tensor = cpu_tensor
    x = torch.randn(64, 64, dtype=torch.float16)
    w = torch.randn(64, dtype=torch.float16)
    try:
        tk.copy(x), tk.rms_norm(x, w), tk.softmax(x)  # full paths: prepare the replays
    finally:
        api._check_cuda, api._tune_and_run, ArgumentPlan._tensor = saved
    assert len(api._REPLAYS) == 3, "an entry point did not prepare its replay"
    return {"tegula.kernels.copy(x)": lambda: tk.copy(x),
            "tegula.kernels.rms_norm(x, w)": lambda: tk.rms_norm(x, w),
            "tegula.kernels.softmax(x)": lambda: tk.softmax(x),
            "  torch.empty_like(x) alone (CPU)": lambda: torch.empty_like(x)}


def stubbed(calls: int = 200_000, profile: bool = False) -> dict:
    """Microseconds of host time per call, driver stubbed: {what: us}. The C++ extension
    (built first if need be) reads the keys; the softmax replay is timed once more with
    the key read through torch's Python API."""
    from tegula.runtime import fastcall, torch_alloc
    torch_alloc.start()
    torch_alloc.wait(900)
    _stub_driver()
    rows = {"kernel[grid](x, y) (64x64 copy)": stubbed_replay()}
    rows.update(stubbed_entry_points())

    if profile:
        import cProfile
        import pstats
        for name, fn in rows.items():
            print(f"--- {name}")
            with cProfile.Profile() as prof:
                for _ in range(calls // 10):
                    fn()
            pstats.Stats(prof).sort_stats("tottime").print_stats(12)
    timed = {name: _best_us(fn, calls) for name, fn in rows.items()}
    if fastcall.use_tensor_reader():
        fastcall.use_tensor_reader(False)
        timed["  softmax, key read through Python"] = _best_us(
            rows["tegula.kernels.softmax(x)"], calls)
        fastcall.use_tensor_reader()
    return timed


if __name__ == "__main__":
    if "--stubbed" in sys.argv:
        from tegula.runtime import fastcall, launcher
        results = stubbed(profile="--profile" in sys.argv)
        how = "C launcher" if launcher._C_LAUNCH[0] else f"ctypes ({fastcall.unavailable})"
        print(f"driver stubbed, CPU tensors ({how}); process CPU time, best of 100 runs of "
              f"2000 calls:")
        for name, us in results.items():
            print(f"{name:36s} {us:6.2f} us per call")
    else:
        main()
