"""Issue 9's no-regression check and the sm_90a GEMM's first numbers, in one process.

    PYTHONPATH=. python3 benchmarks/hopper_gemm.py [--pingpong]

For each shape: cuBLAS (torch.matmul), the README GEMM (examples/gemm.py) on sm_90a
(TMA + mbarrier ring + wgmma) in several tile configurations, the persistent GEMM
(examples/persistent_gemm.py: one block per SM, the TMA ring running across its tiles so
the next tile's loads overlap the current one's epilogue; alone and in 2-CTA clusters
that multicast b's boxes), and the README kernel on
sm_90 (the Ampere path — cp.async, ldmatrix, mma.sync — built for Hopper, the path that
ran on H100s before this issue) in the configurations measured earlier. Every result is
checked against an f64 reference of the same f16 inputs (elements beyond the f16 rounding
of an f32-accumulated sum are counted), outputs poisoned with NaN first. Then the compile
time of the GEMM and the copy kernel's bandwidth against torch's copy. A table last;
nothing is asserted about time. `--pingpong`: only the persistent GEMM's consumer schedules
(cooperative, ping-pong) against cuBLAS at 4096^3 and 4096x14336x4096;
`--pingpong-epilogue`: the same with a fused bias + GELU epilogue at 4096^3, and ping-pong
in 2-CTA clusters. `--clusters`: the persistent 128x256 kernel alone and in clusters of 2,
4 and 8 (b multicast to that many row tiles), each on the clusters that fit at once
(`cuOccupancyMaxActiveClusters`); `--decode`: matmul's decode tiles against split-K
(session 8's rounds 1-2, `docs/performance.md`); `--order`: the persistent 128x256 kernel
alone and in 2-CTA clusters at several GROUP band heights on 4096^3, 8192^3 and
4096x14336x4096 (session 9); `--fp8`: per-tensor FP8 persistent (alone, 2-CTA clusters)
and blockwise against torch._scaled_mm on 4096^3, 8192^3 and 4096x7168x2048.
"""
from __future__ import annotations

import importlib.util
import sys
import time
from pathlib import Path

import torch
from triton.testing import do_bench

import tegula as tg
from tegula.build import build

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("tegula_example_gemm", ROOT / "examples" / "gemm.py")
_example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_example)
gemm = _example.gemm
_spec = importlib.util.spec_from_file_location("tegula_example_persistent_gemm",
                                               ROOT / "examples" / "persistent_gemm.py")
_persistent = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_persistent)
persistent_gemm = _persistent.persistent_gemm

CONFIGS = {
    "sm_90a": [dict(BM=128, BN=128, BK=64, STAGES=4),
               dict(BM=128, BN=128, BK=64, STAGES=4, threads=256),
               dict(BM=128, BN=256, BK=64, STAGES=3, threads=256),
               dict(BM=256, BN=128, BK=64, STAGES=3, threads=256)],
    "sm_90": [dict(), dict(STAGES=4)],  # session 3's best mma.sync configurations
}
#: examples/persistent_gemm.py (one block per SM walking the tiles in grouped order; its K
#: pipeline one TMA ring across the tiles, warp-specialized), README-like tiles.
#: CLUSTER=2: 2-CTA clusters, the two blocks' row tiles sharing b's boxes by TMA multicast.
PERSISTENT_CONFIGS = [dict(BM=128, BN=256, BK=64, STAGES=4, threads=256),
                      dict(BM=128, BN=256, BK=64, STAGES=4, threads=256, CLUSTER=2),
                      dict(BM=128, BN=256, BK=64, STAGES=3, threads=256),
                      dict(BM=128, BN=256, BK=64, STAGES=3, threads=256, CLUSTER=2),
                      dict(BM=128, BN=128, BK=64, STAGES=4, threads=256),
                      dict(BM=128, BN=128, BK=64, STAGES=4, threads=256, CLUSTER=2)]
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (2048, 2048, 2048), (4096, 4096, 1024),
          (1000, 1030, 520)]


def wrong_elements(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> int:
    ref = a.double() @ b.double().T
    scale = a.double().abs() @ b.double().abs().T
    k = a.shape[1]
    bound = 2.0 ** -10 * ref.abs() + k * 2.0 ** -23 * scale + 2.0 ** -24
    return int((~((c.double() - ref).abs() <= bound)).sum())


def gemm_rows(m: int, n: int, k: int) -> list[tuple[str, str]]:
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    flops = 2 * m * n * k
    ms = do_bench(lambda: torch.matmul(a, b.T), warmup=25, rep=100, return_mode="median")
    base = flops / ms / 1e9
    rows = [(f"{m}x{n}x{k} cuBLAS", f"{base:.0f} TFLOP/s")]
    for target, configs in CONFIGS.items():
        for cfg in configs:
            grid = (tg.cdiv(m, cfg.get("BM", 128)), tg.cdiv(n, cfg.get("BN", 128)))
            rows.append(measure(f"{m}x{n}x{k} {target} {cfg}", gemm, grid, a, b, base,
                                target=target, **cfg))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for cfg in PERSISTENT_CONFIGS:
        grid = _persistent.persistent_grid(m, n, sms, cfg["BM"], cfg["BN"],
                                           cfg.get("CLUSTER", 1))
        rows.append(measure(f"{m}x{n}x{k} sm_90a persistent {cfg}", persistent_gemm, grid,
                            a, b, base, target="sm_90a", **cfg))
    return rows


#: `--compile-only`: launch each kernel once (filling the disk cache, TEGULA_CACHE_DIR, for
#: a later timed run), time nothing.
COMPILE_ONLY = "--compile-only" in sys.argv


def measure(name: str, kernel, grid: tuple, a, b, base: float, **launch) -> tuple[str, str]:
    """One row: `kernel[grid](a, b, c, **launch)` checked (NaN-poisoned output) and timed."""
    m, n, k = a.shape[0], b.shape[0], a.shape[1]
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    try:
        kernel[grid](a, b, c, **launch)
        torch.cuda.synchronize()
        if COMPILE_ONLY:
            return name, "compiled"
        bad = wrong_elements(c, a, b)
        ms = do_bench(lambda: kernel[grid](a, b, c, **launch), warmup=25, rep=100,
                      return_mode="median")
        tf = 2 * m * n * k / ms / 1e9
        return name, f"{tf:.0f} TFLOP/s = {tf / base:.2f}x cuBLAS, {bad} wrong elements"
    except Exception as e:  # report and go on: one config must not hide the rest
        return name, f"FAILED {type(e).__name__}: {e}"[:160]


def compile_rows() -> list[tuple[str, str]]:
    rows = []
    for target in ("sm_90a", "sm_90"):
        start = time.perf_counter()
        result = build(gemm, dict(BM=128, BN=256, BK=64, STAGES=3, threads=256), None, target)
        result.cuda_source()
        rows.append((f"build + emit GEMM {target}", f"{(time.perf_counter() - start) * 1e3:.0f} ms"))
    return rows


def copy_rows() -> list[tuple[str, str]]:
    from tegula.kernels.api import copy as tg_copy
    x = torch.randn(64 * 1024 * 1024 // 2, device="cuda", dtype=torch.float16)
    nbytes = 2 * x.numel() * 2
    ms_t = do_bench(lambda: x.clone(), warmup=25, rep=100, return_mode="median")
    ms_g = do_bench(lambda: tg_copy(x), warmup=25, rep=100, return_mode="median")
    return [("copy 64 MiB f16: torch clone", f"{nbytes / ms_t / 1e6:.0f} GB/s"),
            ("copy 64 MiB f16: tegula.kernels.copy", f"{nbytes / ms_g / 1e6:.0f} GB/s "
             f"= {ms_t / ms_g:.2f}x torch")]


#: The persistent GEMM's consumer schedules side by side (`--pingpong`): cooperative (two
#: consumer warpgroups share each 128x256 tile) against ping-pong (each consumer warpgroup
#: owns whole tiles, their main loops taking turns; `consumers="pingpong"`, threads=128
#: being one warpgroup's tile).
SCHEDULE_CONFIGS = [dict(BM=128, BN=256, BK=64, STAGES=4, threads=256, consumers="cooperative"),
                    dict(BM=128, BN=128, BK=64, STAGES=4, threads=256, consumers="cooperative"),
                    dict(BM=128, BN=128, BK=64, STAGES=4, threads=128, consumers="cooperative"),
                    dict(BM=128, BN=128, BK=64, STAGES=4, threads=128, consumers="pingpong"),
                    dict(BM=128, BN=128, BK=64, STAGES=6, threads=128, consumers="pingpong"),
                    dict(BM=64, BN=256, BK=64, STAGES=4, threads=128, consumers="pingpong"),
                    dict(BM=64, BN=256, BK=64, STAGES=5, threads=128, consumers="pingpong")]
SCHEDULE_SHAPES = [(4096, 4096, 4096), (4096, 14336, 4096)]


def schedule_rows(m: int, n: int, k: int) -> list[tuple[str, str]]:
    """cuBLAS, then every `SCHEDULE_CONFIGS` entry of the persistent GEMM, checked and timed."""
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    ms = do_bench(lambda: torch.matmul(a, b.T), warmup=25, rep=100, return_mode="median")
    base = 2 * m * n * k / ms / 1e9
    rows = [(f"{m}x{n}x{k} cuBLAS", f"{base:.0f} TFLOP/s")]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for cfg in SCHEDULE_CONFIGS:
        grid = _persistent.persistent_grid(m, n, sms, cfg["BM"], cfg["BN"],
                                           cfg.get("CLUSTER", 1))
        rows.append(measure(f"{m}x{n}x{k} persistent {cfg}", persistent_gemm, grid, a, b,
                            base, target="sm_90a", **cfg))
        print(rows[-1], flush=True)
    return rows


def epilogue_rows() -> list[tuple[str, str]]:
    """`--pingpong-epilogue`: bias + GELU at 4096³, where a consumer's epilogue is long
    (torch's matmul + bias + gelu; the persistent kernel cooperative and ping-pong; one
    block per tile), then plain 4096x14336x4096 ping-pong against cooperative."""
    from tegula.kernels import gemm as library
    m = n = k = 4096
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16)
    bias = torch.randn(n, device="cuda", dtype=torch.float16)
    ref = torch.nn.functional.gelu(a.float() @ b.float().T + bias.float())
    ms = do_bench(lambda: torch.nn.functional.gelu(torch.matmul(a, b.T) + bias), warmup=25,
                  rep=100, return_mode="median")
    base = 2 * m * n * k / ms / 1e9
    rows = [(f"{m}^3 bias+gelu torch", f"{base:.0f} TFLOP/s")]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    persistent = library.persistent_gemm_kernel(tg.f16, "gelu", True)
    runs = [("persistent cooperative 128x256", persistent,
             _persistent.persistent_grid(m, n, sms, 128, 256),
             dict(BM=128, BN=256, BK=64, STAGES=4, threads=256, consumers="cooperative")),
            ("persistent pingpong 64x256", persistent,
             _persistent.persistent_grid(m, n, sms, 64, 256),
             dict(BM=64, BN=256, BK=64, STAGES=4, threads=128, consumers="pingpong")),
            ("one block per tile 128x256", library.gemm_kernel(tg.f16, "gelu", True),
             (m // 128, n // 256), dict(BM=128, BN=256, BK=64, STAGES=3, threads=256))]
    for name, kernel, grid, cfg in runs:
        c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        try:
            kernel[grid](a, b, bias.view(1, n), c, **cfg)
            torch.cuda.synchronize()
            if COMPILE_ONLY:
                continue
            bad = int((~((c.float() - ref).abs() <= 1e-2 * ref.abs() + 1e-2)).sum())
            ms = do_bench(lambda: kernel[grid](a, b, bias.view(1, n), c, **cfg), warmup=25,
                          rep=100, return_mode="median")
            tf = 2 * m * n * k / ms / 1e9
            rows.append((f"{m}^3 bias+gelu {name}", f"{tf:.0f} TFLOP/s = {tf / base:.2f}x "
                         f"torch, {bad} wrong elements"))
        except Exception as e:  # report and go on
            rows.append((f"{m}^3 bias+gelu {name}", f"FAILED {type(e).__name__}: {e}"[:160]))
        print(rows[-1], flush=True)
    for m, n in ((4096, 4096), (4096, 14336)):
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16)
        ms = do_bench(lambda: torch.matmul(a, b.T), warmup=25, rep=100, return_mode="median")
        base = 2 * m * n * k / ms / 1e9
        rows.append((f"{m}x{n}x{k} cuBLAS", f"{base:.0f} TFLOP/s"))
        for cfg in CLUSTER_SCHEDULES:
            grid = _persistent.persistent_grid(m, n, sms, cfg["BM"], cfg["BN"],
                                               cfg.get("CLUSTER", 1))
            rows.append(measure(f"{m}x{n}x{k} {cfg}", persistent_gemm, grid, a, b, base,
                                target="sm_90a", **cfg))
    return rows


#: Ping-pong with 2-CTA clusters multicasting b's boxes (cuBLAS's 128x256 runs as a 2x1
#: cluster), against the cooperative 128x256 and plain ping-pong.
CLUSTER_SCHEDULES = [
    dict(BM=128, BN=256, BK=64, STAGES=4, threads=256),
    dict(BM=64, BN=256, BK=64, STAGES=4, threads=128, consumers="pingpong"),
    dict(BM=64, BN=256, BK=64, STAGES=4, threads=128, consumers="pingpong", CLUSTER=2),
    dict(BM=128, BN=128, BK=64, STAGES=5, threads=128, consumers="pingpong", CLUSTER=2)]


def max_active_clusters(kernel, cfg: dict) -> int:
    """How many clusters of cfg["CLUSTER"] blocks of `kernel` (built with cfg) run at once."""
    from tegula.build import launch
    from tegula.runtime.driver import cuda_driver
    from tegula.runtime.launcher import cluster_launch_config
    driver, size = cuda_driver(), cfg["CLUSTER"]
    x = torch.randn(256, 256, device="cuda", dtype=torch.float16)
    out = launch(kernel, (size,), x, x, torch.empty_like(x), **cfg)
    ck = next(o for o in (out if isinstance(out, tuple) else (out,)) if hasattr(o, "_functions"))
    torch.cuda.synchronize()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    config = cluster_launch_config(driver, (sms // size * size, 1, 1), ck.threads,
                                   ck.shared_bytes, 0, (size, 1, 1))
    return driver.cuOccupancyMaxActiveClusters(ck._functions[torch.cuda.current_device()],
                                               config)[1]


def cluster_rows() -> list[tuple[str, str]]:
    """`--clusters`: cuBLAS, then the persistent 128x256 kernel in clusters of 1, 2, 4, 8."""
    base_cfg = dict(BM=128, BN=256, BK=64, STAGES=4, GROUP=8, threads=256)
    rows, fits = [], {1: torch.cuda.get_device_properties(0).multi_processor_count}
    for size in (2, 4, 8):
        fits[size] = max_active_clusters(persistent_gemm, dict(base_cfg, CLUSTER=size))
        rows.append((f"clusters of {size} at once", str(fits[size])))
    for m, n, k in SCHEDULE_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16)
        ms = do_bench(lambda: torch.matmul(a, b.T), warmup=25, rep=100, return_mode="median")
        base = 2 * m * n * k / ms / 1e9
        rows.append((f"{m}x{n}x{k} cuBLAS", f"{base:.0f} TFLOP/s"))
        for size, clusters in fits.items():
            cfg = dict(base_cfg, CLUSTER=size)
            grid = _persistent.persistent_grid(m, n, clusters * size, 128, 256, size)
            rows.append(measure(f"{m}x{n}x{k} persistent 128x256 CLUSTER={size}",
                                persistent_gemm, grid, a, b, base, target="sm_90a", **cfg))
            print(rows[-1], flush=True)
    return rows


#: `--decode`: matmul's sm_90a decode candidates (session 8) and the split-K they replaced.
DECODE_CONFIGS = [dict(BM=64, BN=128, BK=64, STAGES=4, SPLIT=4),
                  dict(BM=64, BN=32, BK=64, STAGES=8), dict(BM=64, BN=32, BK=64, STAGES=16),
                  dict(BM=64, BN=32, BK=128, STAGES=6), dict(BM=64, BN=64, BK=64, STAGES=8),
                  dict(BM=128, BN=32, BK=64, STAGES=8, threads=256)]
DECODE_SHAPES = [(16, 4096, 4096), (64, 4096, 4096), (128, 4096, 4096), (64, 4096, 14336)]


def decode_rows() -> list[tuple[str, str]]:
    """cuBLAS, then each DECODE_CONFIGS entry through matmul's launch path, checked."""
    from tegula.kernels.api_matmul import _gemm_launches

    def run(cfg, a, b, c):
        values = dict(cfg, kernel="shared")
        threads = values.pop("threads", None)
        _gemm_launches(tg.f16, values, threads, a, b, c)
    rows = []
    for m, n, k in DECODE_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16)
        ms = do_bench(lambda: torch.matmul(a, b.T), warmup=25, rep=100, return_mode="median")
        rows.append((f"{m}x{n}x{k} cuBLAS", f"{ms * 1e3:.1f} us"))
        for cfg in DECODE_CONFIGS:
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            run(cfg, a, b, c)
            torch.cuda.synchronize()
            bad = wrong_elements(c, a, b)
            t = do_bench(lambda: run(cfg, a, b, c), warmup=25, rep=100, return_mode="median")
            rows.append((f"{m}x{n}x{k} {cfg}", f"{t * 1e3:.1f} us = {ms / t:.2f}x cuBLAS, "
                         f"{bad} wrong elements"))
            print(rows[-1], flush=True)
    return rows


#: `--order`: the persistent 128x256x64 kernel (4 stages, cooperative) alone and in 2-CTA
#: clusters, at several tile-band heights (GROUP, in row tiles or in clusters' row pairs),
#: on the issue's large shapes (session 9).
ORDER_CONFIGS = [dict(BM=128, BN=256, BK=64, STAGES=4, GROUP=8, threads=256),
                 dict(BM=128, BN=256, BK=64, STAGES=4, GROUP=8, threads=256, CLUSTER=2),
                 dict(BM=128, BN=256, BK=64, STAGES=4, GROUP=4, threads=256, CLUSTER=2),
                 dict(BM=128, BN=256, BK=64, STAGES=4, GROUP=16, threads=256, CLUSTER=2)]
ORDER_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 14336, 4096)]


def order_rows() -> list[tuple[str, str]]:
    """cuBLAS, then each ORDER_CONFIGS entry of the persistent GEMM, checked and timed."""
    rows = []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m, n, k in ORDER_SHAPES:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        b = torch.randn(n, k, device="cuda", dtype=torch.float16)
        base = 0.0
        if not COMPILE_ONLY:
            ms = do_bench(lambda: torch.matmul(a, b.T), warmup=25, rep=100,
                          return_mode="median")
            base = 2 * m * n * k / ms / 1e9
            rows.append((f"{m}x{n}x{k} cuBLAS", f"{base:.0f} TFLOP/s"))
        for cfg in ORDER_CONFIGS:
            grid = _persistent.persistent_grid(m, n, sms, cfg["BM"], cfg["BN"],
                                               cfg.get("CLUSTER", 1))
            name = f"{m}x{n}x{k} C{cfg.get('CLUSTER', 1)} G{cfg['GROUP']}"
            rows.append(measure(name, persistent_gemm, grid, a, b, base or 1.0,
                                target="sm_90a", **cfg))
            print(rows[-1], flush=True)
        if COMPILE_ONLY:
            return rows  # one shape compiles every config
    return rows


#: `--fp8`: the per-tensor FP8 persistent kernel alone and in 2-CTA clusters (b's boxes
#: multicast), and the blockwise (DeepSeek-V3) kernel, against torch._scaled_mm.
FP8_CONFIGS = [dict(BM=128, BN=256, BK=128, STAGES=3, GROUP=8, threads=256),
               dict(BM=128, BN=256, BK=128, STAGES=3, GROUP=8, threads=256, CLUSTER=2),
               dict(BM=128, BN=128, BK=128, STAGES=4, GROUP=8, threads=256, CLUSTER=2)]
FP8_BLOCKWISE = dict(BM=128, BN=128, STAGES=4, threads=256)
FP8_SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 7168, 2048)]


def fp8_rows() -> list[tuple[str, str]]:
    """torch._scaled_mm, then each FP8_CONFIGS entry and the blockwise kernel: outputs
    NaN-poisoned, checked against an f32 reference of the same e4m3 inputs (relative
    Frobenius error), TFLOP/s and the ratio to _scaled_mm."""
    from tegula.kernels import fp8
    out_t, rows = tg.bf16, []
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m, n, k in FP8_SHAPES:
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        w = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn)
        sa = torch.tensor([[0.5]], device="cuda")
        sb = torch.tensor([[0.25]], device="cuda")
        ref = (a.float() @ w.float().T) * 0.125
        flops = 2 * m * n * k
        base = 1.0
        if not COMPILE_ONLY:
            ms = do_bench(lambda: torch._scaled_mm(a, w.T, sa.view(()), sb.view(()),
                                                   out_dtype=torch.bfloat16),
                          warmup=25, rep=100, return_mode="median")
            base = flops / ms / 1e9
            rows.append((f"{m}x{n}x{k} fp8 _scaled_mm", f"{base:.0f} TFLOP/s"))
        runs = [(f"persistent {c['BM']}x{c['BN']}x{c['BK']} C{c.get('CLUSTER', 1)}",
                 fp8.fp8_persistent_gemm_kernel(out_t),
                 _persistent.persistent_grid(m, n, sms, c["BM"], c["BN"], c.get("CLUSTER", 1)),
                 (sa, sb), c) for c in FP8_CONFIGS]
        scale_a = torch.full((m, k // 128), 0.5, device="cuda")
        scale_b = torch.full((tg.cdiv(n, 128), k // 128), 0.25, device="cuda")
        runs.append(("blockwise 128x128", fp8.fp8_blockwise_gemm_kernel(out_t),
                     (tg.cdiv(m, 128), tg.cdiv(n, 128)), (scale_a, scale_b), FP8_BLOCKWISE))
        for name, kernel, grid, (s1, s2), cfg in runs:
            c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
            label = f"{m}x{n}x{k} fp8 {name}"
            try:
                kernel[grid](a, w, s1, s2, c, **cfg)
                torch.cuda.synchronize()
                if COMPILE_ONLY:
                    rows.append((label, "compiled"))
                    continue
                err = float((c.float() - ref).norm() / ref.norm())
                ms = do_bench(lambda: kernel[grid](a, w, s1, s2, c, **cfg), warmup=25,
                              rep=100, return_mode="median")
                tf = flops / ms / 1e9
                rows.append((label, f"{tf:.0f} TFLOP/s = {tf / base:.2f}x _scaled_mm, "
                             f"rel err {err:.1e}"))
            except Exception as e:  # report and go on
                rows.append((label, f"FAILED {type(e).__name__}: {e}"[:160]))
            print(rows[-1], flush=True)
        if COMPILE_ONLY:
            return rows
    return rows


def main() -> None:
    print(torch.cuda.get_device_name(), torch.__version__, time.strftime("%Y-%m-%d"))
    for flag, make in (("--clusters", cluster_rows), ("--decode", decode_rows),
                       ("--order", order_rows), ("--fp8", fp8_rows)):
        if flag in sys.argv:
            rows = make()
            width = max(len(r[0]) for r in rows)
            for name, value in rows:
                print(f"{name:<{width}}  {value}")
            return
    if "--pingpong-epilogue" in sys.argv:
        rows = epilogue_rows()
        width = max(len(r[0]) for r in rows)
        for name, value in rows:
            print(f"{name:<{width}}  {value}")
        return
    if "--pingpong" in sys.argv:
        rows = [r for shape in SCHEDULE_SHAPES for r in schedule_rows(*shape)]
        width = max(len(r[0]) for r in rows)
        for name, value in rows:
            print(f"{name:<{width}}  {value}")
        return
    rows = compile_rows() + copy_rows()
    for shape in SHAPES:
        rows += gemm_rows(*shape)
        print(rows[-1], flush=True)
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
