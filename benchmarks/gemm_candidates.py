"""Time `tegula.kernels.matmul`'s candidate configurations one by one against cuBLAS (a
tuning aid for issue 10, not a test).

    PYTHONPATH=. python3 benchmarks/gemm_candidates.py --shapes 64x4096x4096,1024x1024x1024 \
        [--extra '{"64x4096x4096": [{"BM": 64, "BN": 32, "BK": 64, "STAGES": 12}]}'] \
        [--jobs 16] [--rep-ms 30]

For each shape (a (M, K) @ w.T with w (N, K), f16): every configuration `gemm_candidates`
offers the tuner for the shape's bucket, plus `--extra` ones (for every shape, or per
shape), launched exactly as `matmul`
launches them (`api_matmul._gemm_launches`) into a NaN-poisoned output, checked against
cuBLAS's result, and timed with the bench's timer (median, L2 emptied before each run) with
more repetitions than the tuner takes — so a pick that was noise shows as one. cuBLAS is
timed before and after the candidates (their spread is the noise floor). `--epilogue
relu|gelu|silu`: the fused lists (`gemm_candidates(..., fused=True)`) with a bias and that
activation in the kernel, against torch's matmul + bias + activation. The candidates
are compiled first in `--jobs` processes (no GPU use: each builds from the launch's tensor
facts into the disk cache, where the launch finds the cubin), so a cold cache costs
seconds, not minutes. `--precompile-bench plain|epilogue` only compiles what `tegula bench
gemm` will time (before a run on a cold cache). `--profile MxNxK CONFIG_JSON`: launch that configuration (or each
of a JSON list) and cuBLAS three times each after one warm-up, for `ncu` to profile, and
nothing else.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import multiprocessing
import sys
import time

TARGET = "sm_90a"


def _pow2(n: int) -> int:
    from tegula.kernels.api import _pow2_at_least
    return _pow2_at_least(n, 1)


def candidates(shape: tuple, extra: list[dict], fused: bool = False) -> list[dict]:
    """matmul's candidates for the shape's bucket on an H100 (`fused`: with a bias or
    activation; decode tiles fitted to the shape's N, as matmul's), then the extra ones (each once; "kernel" defaults to "shared" as in
    `gemm_candidates`)."""
    from tegula.kernels.api_matmul import fitted_n, gemm_candidates
    m, n, k = shape
    found = gemm_candidates(_pow2(m), _pow2(n), _pow2(k), True, fused, fitted_n(m, n, True))
    for c in extra:
        c = dict(c, kernel=c.get("kernel", "shared"))
        if c not in found:
            found.append(c)
    return found


def _compile_only(kernel, grid, args, constexprs, threads) -> None:
    """`api._launch` for the precompile: build and compile (disk cache) for the facts a
    launch with these arguments would have; launch nothing. Tensors are `meta` tensors,
    given the alignment a CUDA allocation has."""
    from tegula.build import BUILD_OPTIONS, compiled, split_arguments
    from tegula.synth.facts import TensorFacts

    extra = {} if threads is None or threads == kernel.threads else {"threads": threads}
    tensors, _, values = split_arguments(kernel, args, {**constexprs, **extra})
    options = {k: values.pop(k) for k in BUILD_OPTIONS if k in values}
    facts = {name: TensorFacts.of(tuple(t.shape), tuple(t.stride()),
                                  (1 << 20) + t.storage_offset() * t.element_size(),
                                  t.element_size())
             for name, t in tensors.items()}
    compiled(kernel, dict(kernel.constexpr_values(values), **options), facts, TARGET)


def _operands(torch, shape: tuple, device: str):
    m, n, k = shape
    a = torch.randn(m, k, device=device, dtype=torch.float16)
    w = torch.randn(n, k, device=device, dtype=torch.float16)
    return a, w


def _launch(config: dict, a, w, out, epilogue: tuple = (None, None)) -> list:
    """matmul's launches of one configuration (its `run`, without the tuner)."""
    from tegula.dtypes import f16
    from tegula.kernels import api_matmul
    from tegula.runtime.autotune import Config
    c = Config.of(config)
    return api_matmul._gemm_launches(f16, c.kwargs, c.threads, a, w, out, epilogue)


def compile_job(shape: tuple, config: dict, activation: str | None = None) -> str:
    """Worker: compile one configuration's kernels for one shape (with `activation`: the
    bias + activation epilogue); '' or the error."""
    import torch
    from tegula.kernels import api
    api._launch = _compile_only
    a, w = _operands(torch, shape, "meta")
    out = torch.empty((shape[0], shape[1]), device="meta", dtype=torch.float16)
    bias = None if activation is None else torch.empty((1, shape[1]), device="meta",
                                                       dtype=torch.float16)
    try:
        _launch(config, a, w, out, (activation, bias))
    except Exception as e:  # noqa: BLE001 — reported with the config, the others go on
        return f"{type(e).__name__}: {str(e)[:160]}"
    return ""


def _bucket_candidates(shape: tuple, fused: bool) -> list[dict]:
    return candidates(shape, [], fused)


def bench_jobs(shapes: list[tuple], activation: str | None, pool=None) -> list[tuple]:
    """(shape, config, activation) of every candidate matmul times on these shapes, each
    compiled cubin once: a configuration's source depends on the shape only through its
    facts (divisibility, index width), so one shape of each fact class is enough. With a
    `pool` the candidate lists (a cost-model search for some buckets, ~1 s each) are made
    in its processes."""
    fused = [activation is not None] * len(shapes)
    lists = (pool.map if pool is not None else map)(_bucket_candidates, shapes, fused)
    jobs, seen = [], set()
    for shape, found in zip(shapes, lists):
        for c in found:
            key = (json.dumps(c, sort_keys=True), tuple(s % 16 == 0 for s in shape),
                   max(shape[0], shape[1]) * shape[2] >= 2 ** 31)
            if key not in seen:
                seen.add(key)
                jobs.append((shape, c, activation))
    return jobs


def compile_pool(workers: int):
    return concurrent.futures.ProcessPoolExecutor(
        workers, mp_context=multiprocessing.get_context("spawn"))  # no CUDA state inherited


def precompile(jobs: list[tuple], workers: int, pool=None) -> dict:
    """Compile `jobs` ((shape, config[, activation]) each) in `workers` processes (or in
    `pool`); the errors by job."""
    start = time.time()
    if pool is None:
        with compile_pool(workers) as pool:
            errors = list(pool.map(compile_job, *zip(*jobs)))
    else:
        errors = list(pool.map(compile_job, *zip(*jobs)))
    print(f"precompiled {len(jobs)} configurations in {time.time() - start:.1f} s", flush=True)
    return {json.dumps(job, sort_keys=True): e for job, e in zip(jobs, errors) if e}


def _torch_baseline(torch, a, w, activation: str | None):
    """(what the candidates are compared with, its f32 reference, the (1, N) bias row or
    None): cuBLAS's matmul, or with an `activation` torch's matmul + bias + activation
    (three kernels, what `tegula bench gemm --mode epilogue` compares with)."""
    if activation is None:
        return (lambda: torch.matmul(a, w.T)), a.float() @ w.float().T, None
    from tegula.bench.gemm import _activation
    act = _activation(torch, activation)
    bias = torch.randn(w.shape[0], device="cuda", dtype=torch.float16)
    return (lambda: act(torch.matmul(a, w.T) + bias)), \
        act(a.float() @ w.float().T + bias.float()), bias.view(1, -1)


def measure_shape(torch, shape: tuple, configs: list[dict], rep_ms: float,
                  activation: str | None = None) -> list[tuple]:
    """Rows (config text, µs, TFLOP/s, × the baseline, check) for one shape; with an
    `activation` every candidate runs the fused bias + activation epilogue and the
    baseline is torch's unfused ops."""
    from tegula.bench.gpu import time_ms
    m, n, k = shape
    a, w = _operands(torch, shape, "cuda")
    baseline, ref32, bias = _torch_baseline(torch, a, w, activation)
    epilogue = (activation, bias)
    flops = 2.0 * m * n * k
    base = [time_ms(baseline, 10, rep_ms)]
    rows = []
    for config in configs:
        out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
        try:
            _launch(config, a, w, out, epilogue)
            torch.cuda.synchronize()
            err = float((out.float() - ref32).norm() / ref32.norm())
            bad = int((~torch.isfinite(out)).sum())
            ms = time_ms(lambda c=config: _launch(c, a, w, out, epilogue), 10, rep_ms)
            rows.append((config, ms, f"err {err:.1e} nan {bad}"))
        except Exception as e:  # noqa: BLE001
            rows.append((config, None, f"FAILED {type(e).__name__}: {str(e)[:120]}"))
    base.append(time_ms(baseline, 10, rep_ms))
    cublas = min(base)
    name = "cuBLAS" if activation is None else f"torch mm+bias+{activation}"
    out_rows = [(f"{name} ({base[0] * 1e3:.1f} / {base[1] * 1e3:.1f} us)", cublas, "")]
    out_rows += rows
    return [(text if isinstance(text, str) else _short(text), ms,
             None if ms is None else flops / ms / 1e9,
             None if ms is None else cublas / ms, check) for text, ms, check in out_rows]


def _short(config: dict) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(config.items()) if k != "B")


def profile(torch, shape: tuple, configs: list[dict]) -> None:
    """Each configuration (then cuBLAS) once as a warm-up, then 3 times each in turn."""
    a, w = _operands(torch, shape, "cuda")
    out = torch.empty((shape[0], shape[1]), device="cuda", dtype=torch.float16)
    for _ in range(4):
        for config in configs:
            _launch(config, a, w, out)
        torch.matmul(a, w.T)
        torch.cuda.synchronize()


def _print_rows(rows: list[tuple]) -> None:
    print(f"{'shape':16} {'configuration':72} {'us':>7} {'TFLOP/s':>8} {'xbase':>7}  check")
    for shape, text, ms, tflops, ratio, check in rows:
        cells = ("-", "-", "-") if ms is None else (f"{ms * 1e3:.1f}", f"{tflops:.0f}",
                                                      f"{ratio:.2f}")
        print(f"{'x'.join(map(str, shape)):16} {text:72} {cells[0]:>7} {cells[1]:>8} "
              f"{cells[2]:>7}  {check}", flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="64x4096x4096")
    parser.add_argument("--extra", default="[]",
                        help="JSON: a list of extra configurations for every shape, or an "
                             "object {\"MxNxK\": [configurations]} per shape")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--rep-ms", type=float, default=30.0)
    parser.add_argument("--max-seconds", type=float, default=1e9,
                        help="measure no new shape after this many seconds of measuring")
    parser.add_argument("--profile", nargs=2, metavar=("SHAPE", "CONFIG_JSON"))
    parser.add_argument("--precompile-bench", choices=("plain", "epilogue"),
                        help="only compile every candidate `tegula bench gemm` (that mode, "
                             "its default shapes or --shapes) will time, into the disk cache")
    parser.add_argument("--activation", default="gelu", help="--precompile-bench epilogue's")
    parser.add_argument("--epilogue", choices=("relu", "gelu", "gelu_tanh", "silu"),
                        help="time the candidates with a bias + this activation fused (the "
                             "fused lists), against torch's matmul + bias + activation")
    parser.add_argument("--no-precompile", action="store_true",
                        help="compile as the launches need (the cache is already warm)")
    args = parser.parse_args(argv)
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    if args.profile:
        shape = tuple(int(x) for x in args.profile[0].split("x"))
        found = json.loads(args.profile[1])
        profile(torch, shape, found if isinstance(found, list) else [found])
        return 0
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    if args.precompile_bench:
        from tegula.bench import gemm as bench
        default = {"plain": bench.SQUARES + bench.LLM + bench.DECODE,
                   "epilogue": bench.EPILOGUE_SHAPES}[args.precompile_bench]
        chosen = shapes if "--shapes" in (argv or sys.argv) else default
        activation = args.activation if args.precompile_bench == "epilogue" else None
        with compile_pool(args.jobs) as pool:
            precompile(bench_jobs(chosen, activation, pool), args.jobs, pool)
        return 0
    extra = json.loads(args.extra)
    activation = args.epilogue
    per_shape = {s: candidates(s, extra if isinstance(extra, list)
                               else extra.get("x".join(map(str, s)), []), activation is not None)
                 for s in shapes}
    errors = {} if args.no_precompile else \
        precompile([(s, c, activation) for s in shapes for c in per_shape[s]], args.jobs)
    start = time.time()
    for shape in shapes:
        if time.time() - start > args.max_seconds:
            print(f"{'x'.join(map(str, shape))} skipped (--max-seconds)")
            continue
        configs = [c for c in per_shape[shape]
                   if json.dumps((shape, c, activation), sort_keys=True) not in errors]
        rows = [(shape, _short(c), None, None, None, f"REFUSED {errors[key]}")
                for c in per_shape[shape]
                if (key := json.dumps((shape, c, activation), sort_keys=True)) in errors]
        rows += [(shape, *row) for row in measure_shape(torch, shape, configs, args.rep_ms,
                                                        activation)]
        _print_rows(rows)  # as it goes: a round cut short keeps what it measured
    return 0


if __name__ == "__main__":
    sys.exit(main())
