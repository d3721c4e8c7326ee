"""Compile time, trace to cubin, of the README GEMM and the attention forward (issue 11).

    PYTHONPATH=. python3 benchmarks/compile_time.py [--repeat 3] [--cpu-only]

Each measurement runs in a fresh process with an empty cubin cache (`TEGULA_CACHE_DIR` in
a new temporary directory), so nothing is reused: the kernel is traced, synthesized,
lowered, emitted as CUDA and compiled by the default compiler (NVRTC where installed).
Printed per kernel: the build (trace + synthesis + lowering), emission, compilation and
the total, the best of `--repeat` fresh processes. Targets (issue 11): < 1 s for the GEMM,
< 2 s for attention. No GPU is needed; `--cpu-only` stops at the CUDA source (no compiler
needed: the part of the time tegula's own passes take).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: (label, what to build): the README GEMM at its default tiles on both GEMM paths, and the
#: attention forward at the library's default tiles for D = 64 and 128 on sm_90a, and at
#: D = 64 on sm_80 (its two mma.sync gemms chained: the one search's coupled case).
CASES = [("gemm 128x128x32 sm_90a", "gemm", "sm_90a", {}),
         ("gemm 128x128x32 sm_80", "gemm", "sm_80", {}),
         ("attention fwd D=64 sm_90a", "attention", "sm_90a", {"D": 64}),
         ("attention fwd D=128 sm_90a", "attention", "sm_90a", {"D": 128}),
         ("attention fwd D=64 sm_80", "attention", "sm_80", {"D": 64})]


def _measure(which: str, target: str, extra: dict, cpu_only: bool = False) -> dict:
    """One cold trace-to-cubin in this process (run by `main` in a child process)."""
    import time
    start = time.perf_counter()
    import tegula as tg  # noqa: F401  (import time is reported apart)
    from tegula.build import build
    from tegula.codegen.cuda import emit_cuda
    from tegula.recommend import _facts
    from tegula.runtime.compiler import compile_cuda, default_compiler
    imported = time.perf_counter()
    if which == "gemm":
        import importlib.util
        spec = importlib.util.spec_from_file_location("readme_gemm", ROOT / "examples" / "gemm.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        kernel, constexprs = module.gemm, {}
        shapes = dict(a=(4096, 4096), b=(4096, 4096), c=(4096, 4096))
    else:
        import math
        from tegula.dtypes import f16
        from tegula.kernels.attention import attention_kernel, default_tiles
        d = extra["D"]
        kernel = attention_kernel(f16)
        constexprs = dict(default_tiles(d, target), D=d, QK_SCALE=1.0 / math.sqrt(d))
        v_shape = (4, 16, d, 4096) if constexprs["V_KMAJOR"] else (4, 16, 4096, d)
        shapes = dict(q=(4, 16, 4096, d), k=(4, 16, 4096, d), v=v_shape,
                      o=(4, 16, 4096, d), lse=(4, 16, 4096))
    t0 = time.perf_counter()
    built = build(kernel, constexprs, _facts(kernel, shapes), target=target)
    t1 = time.perf_counter()
    source = emit_cuda(built.thread_kernel, built.target.sm)
    t2 = time.perf_counter()
    if not cpu_only:
        compile_cuda(source, built.thread_kernel.name, built.target.sm)
    t3 = time.perf_counter()
    return dict(import_s=imported - start, build_s=t1 - t0, emit_s=t2 - t1,
                compile_s=t3 - t2, total_s=t3 - t0,
                compiler="none (--cpu-only)" if cpu_only else default_compiler().kind)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--cases", default=",".join(str(i) for i in range(len(CASES))),
                        help="comma-separated indices into CASES (default: all)")
    parser.add_argument("--cpu-only", action="store_true",
                        help="trace to CUDA source only (no compiler)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    options = parser.parse_args()
    if options.child:
        which, target, extra, cpu_only = json.loads(options.child)
        print(json.dumps(_measure(which, target, extra, cpu_only)))
        return
    print(f"{'kernel':28} {'build s':>8} {'emit s':>7} {'compile s':>9} {'total s':>8}  compiler")
    for label, which, target, extra in (CASES[int(i)] for i in options.cases.split(",")):
        runs = []
        for _ in range(options.repeat):
            with tempfile.TemporaryDirectory() as cache:
                env = dict(os.environ, TEGULA_CACHE_DIR=cache,
                           PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
                out = subprocess.run([sys.executable, __file__, "--child",
                                      json.dumps([which, target, extra,
                                                  options.cpu_only])],
                                     capture_output=True, text=True, env=env, check=True)
                runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
        best = min(runs, key=lambda r: r["total_s"])
        print(f"{label:28} {best['build_s']:8.2f} {best['emit_s']:7.2f} "
              f"{best['compile_s']:9.2f} {best['total_s']:8.2f}  {best['compiler']}")


if __name__ == "__main__":
    main()
