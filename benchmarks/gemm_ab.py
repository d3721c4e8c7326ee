"""A/B timing of GEMM configurations and lowering variants in one process (issue 10; a
tuning aid, not a test).

    PYTHONPATH=. python3 benchmarks/gemm_ab.py --shapes 4096x14336x14336 \
        --contenders '[{"BM": 128, "BN": 256, ...}, {"config": {...}, "variant": "first_read"}]'

Each contender is a `matmul` configuration (as `gemm_candidates` lists them, "kernel"
included) built under a lowering variant (`VARIANTS`: monkeypatches of compiler hooks,
applied while fresh kernel objects are built and compiled, so each variant is its own
source and cubin; "a+b" applies both). Every contender writes into a NaN-poisoned output first and is checked
element by element against an f32 reference (no NaN, relative error); then all of them,
cuBLAS and (where triton imports) Triton's persistent TMA kernel are timed in interleaved
rounds (`time_ms`: L2 emptied before each run), the median of the rounds' medians kept,
so a drift of the GPU's clock hits every contender alike. Ratios are to the first tegula
contender (the A), to cuBLAS and to Triton TMA.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import statistics
import sys
import time
from pathlib import Path


def _first_round_reads_only(op, plan) -> bool:
    return False


def _no_prefetch(shape: tuple, config: dict) -> dict:
    """No `prefetch.tensormap` at kernel start (lowering issues one per TMA descriptor,
    thread 0, before the barrier inits): what the prefetch saves."""
    from tegula.lower import lower
    from tegula.lower.async_ir import PrefetchTensorMap
    from tegula.lower.thread_ir import If
    original = lower.finish_async

    def without(stmts: list) -> list:
        kept = []
        for s in stmts:
            if isinstance(s, If):
                s = If(s.cond, without(s.then), without(s.otherwise))
                if not (s.then or s.otherwise):
                    continue
            if not isinstance(s, PrefetchTensorMap):
                kept.append(s)
        return kept

    def finish_async(kernel, ctx, params, body):
        params, body = original(kernel, ctx, params, body)
        return params, without(body)
    return {"tegula.lower.lower:finish_async": finish_async}


def _exit_full(shape: tuple, config: dict) -> dict:
    """The block's last bulk wait without `.read` (until its TMA stores' global writes have
    landed), as before the exit wait became `.read`: what that saves."""
    from tegula.lower.async_ir import BulkWait
    return {"tegula.lower.hopper:exit_bulk_wait": lambda: BulkWait(0)}


def _constant_tiles(shape: tuple, config: dict) -> dict:
    """`grouped_tile` with the shape's tile counts as trace-time ints: its divisions are by
    constants (shifts and multiplies), so the A/B bounds what the run-time divisions
    before the producer's first load and in each epilogue cost. Only where the row tiles
    make whole bands (no shorter last band)."""
    m, n, _ = shape
    cluster, group = config.get("CLUSTER", 1), config["GROUP"]
    tiles_m = -(-(-(-m // config["BM"])) // cluster)
    tiles_n = -(-n // config["BN"])
    if tiles_m % group:
        raise ValueError(f"constant_tiles: {tiles_m} row units are no whole bands of {group}")

    def grouped(t, _tiles_m, _tiles_n, g):
        # grouped_tile's map where every band has `group` rows (checked above)
        per_band = g * tiles_n
        within = t % per_band
        return (t // per_band) * g + within % g, within // g
    return {"tegula.kernels.gemm:grouped_tile": grouped}


#: name -> (shape, config) -> {"module:attribute": replacement} applied while a contender
#: is built (fresh kernel objects, so each variant is its own source and cubin).
VARIANTS = {
    "main": lambda shape, config: {},
    # The epilogue's first round waits only for the staging buffer's reads (`.read`), as
    # before 3f5f606: the library's tile maps never revisit a tile, so this is what the
    # full wait costs there.
    "first_read": lambda shape, config: {
        "tegula.lower.hopper:first_round_waits_for_writes": _first_round_reads_only},
    "no_prefetch": _no_prefetch,
    "exit_full": _exit_full,
    "const_tiles": _constant_tiles,
}


#: Kernel objects built under a variant, by (variant, shape where the variant depends on
#: it, factory, arguments): the main variant keeps the factories' own objects, and each
#: other variant gets its own, reused across shapes (builds are cached on the kernel).
_VARIANT_KERNELS: dict = {}
_SHAPE_DEPENDENT = {"const_tiles"}  # (also inside a "+" name)


@contextlib.contextmanager
def variant(name: str, shape: tuple = (0, 0, 0), config: dict | None = None):
    """Apply the variant's patches while its contender is built; outside the main variant
    the GEMM kernel factories hand out the variant's own kernel objects, so no build
    crosses variants."""
    from tegula.kernels import gemm
    patches: dict = {}
    for part in name.split("+"):  # "a+b": both variants' patches (they patch different hooks)
        patches.update(VARIANTS[part](shape, config or {}))
    if name != "main":
        for factory in ("persistent_gemm_kernel", "staged_gemm_kernel", "gemm_kernel",
                        "gemm_split_k_kernel", "split_k_reduce_kernel"):
            original = getattr(gemm, factory)
            shaped = any(part in _SHAPE_DEPENDENT for part in name.split("+"))
            key = (name, shape if shaped else None, factory)

            def fresh(*args, _original=original, _key=key):
                found = _VARIANT_KERNELS.get((_key, args))
                if found is None:
                    found = _VARIANT_KERNELS[(_key, args)] = _original.__wrapped__(*args)
                return found
            patches[f"tegula.kernels.gemm:{factory}"] = fresh
    saved = []
    for where, value in patches.items():
        module, attr = where.split(":")
        mod = importlib.import_module(module)
        saved.append((mod, attr, getattr(mod, attr)))
        setattr(mod, attr, value)
    try:
        yield
    finally:
        for mod, attr, old in reversed(saved):
            setattr(mod, attr, old)


def _short(config: dict, name: str) -> str:
    text = ",".join(f"{k}={v}" for k, v in sorted(config.items()) if k not in ("B",))
    return text if name == "main" else f"{text} [{name}]"


def build_contender(torch, config: dict, name: str, a, w, ref):
    """(label, a launch closure, check text) for one configuration under one variant."""
    from tegula.dtypes import f16
    from tegula.kernels import api_matmul
    from tegula.runtime.autotune import Config
    c = Config.of(config)
    out = torch.full((a.shape[0], w.shape[0]), float("nan"), device="cuda",
                     dtype=torch.float16)
    with variant(name, (a.shape[0], w.shape[0], a.shape[1]), c.kwargs):
        launches = api_matmul._gemm_launches(f16, dict(c.kwargs), c.threads, a, w, out)
    torch.cuda.synchronize()
    bad = int((~torch.isfinite(out)).sum())
    diff = (out.float() - ref).abs()
    err = float(diff.norm() / ref.norm())
    worst = float(diff.max() / ref.abs().max())  # every element, against the largest
    check = f"err {err:.1e} max {worst:.1e} nan {bad}" + (
        "" if bad == 0 and err < 1e-2 and worst < 1e-2 else "  WRONG")

    def run():
        for ck, grid, args, _ in launches:
            ck.launch(grid, args)
    return _short(config, name), run, check


def measure(torch, shape: tuple, contenders: list[dict], rounds: int, rep_ms: float,
            triton: bool) -> None:
    from tegula.bench.gpu import time_ms
    m, n, k = shape
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    w = torch.randn(n, k, device="cuda", dtype=torch.float16)
    ref = a.float() @ w.float().T
    entries = [("cuBLAS", lambda: torch.matmul(a, w.T), "")]
    if triton:
        try:
            from tegula.bench import triton_kernels
            got = triton_kernels.matmul_tma_persistent(a, w.T)
            err = float((got.float() - ref).norm() / ref.norm())
            entries.append(("Triton TMA", lambda: triton_kernels.matmul_tma_persistent(a, w.T),
                            f"err {err:.1e}"))
        except Exception as e:  # noqa: BLE001 — the A/B goes on without it
            print(f"# Triton TMA unavailable: {type(e).__name__}: {str(e)[:100]}")
    first_tegula = len(entries)
    for item in contenders:
        config, name = (item["config"], item.get("variant", "main")) if "config" in item \
            else (item, "main")
        try:
            entries.append(build_contender(torch, config, name, a, w, ref))
        except Exception as e:  # noqa: BLE001
            print(f"# {_short(config, name)}: FAILED {type(e).__name__}: {str(e)[:140]}")
    times: dict[str, list] = {label: [] for label, _, _ in entries}
    for _ in range(rounds):
        for label, fn, _ in entries:
            times[label].append(time_ms(fn, 5.0, rep_ms))
    med = {label: statistics.median(v) for label, v in times.items()}
    flops = 2.0 * m * n * k
    base = entries[first_tegula][0] if len(entries) > first_tegula else None
    tri = med.get("Triton TMA")
    print(f"{'shape':16} {'contender':84} {'us':>8} {'TFLOP/s':>7} {'xA':>6} {'xcuBLAS':>7} "
          f"{'xTriTMA':>7} {'spread':>6}  check")
    for label, _, check in entries:
        ms = med[label]
        spread = (max(times[label]) - min(times[label])) / ms
        cells = [f"{ms * 1e3:8.1f}", f"{flops / ms / 1e9:7.0f}",
                 f"{med[base] / ms:6.3f}" if base else "     -",
                 f"{med['cuBLAS'] / ms:7.3f}", f"{tri / ms:7.3f}" if tri else "      -",
                 f"{spread:6.3f}"]
        print(f"{'x'.join(map(str, shape)):16} {label:84} {' '.join(cells)}  {check}",
              flush=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", required=True)
    parser.add_argument("--contenders", required=True,
                        help="JSON list: configurations, or {config, variant} objects")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rep-ms", type=float, default=20.0)
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--max-seconds", type=float, default=1e9,
                        help="measure no new shape after this many seconds")
    parser.add_argument("--jobs", type=int, default=1,
                        help="compile the main variant's contenders first in this many "
                             "processes")
    parser.add_argument("--compile-only", action="store_true",
                        help="with --jobs: only compile (no GPU use), then exit")
    args = parser.parse_args(argv)
    contenders = json.loads(args.contenders)
    shapes = [tuple(int(x) for x in text.split("x")) for text in args.shapes.split(",")]
    if args.jobs > 1:  # the main variant's cubins into the disk cache, in parallel
        from gemm_candidates import precompile
        plain = [c for c in contenders if "config" not in c or
                 c.get("variant", "main") == "main"]
        precompile([(shape, c.get("config", c)) for shape in shapes for c in plain], args.jobs)
    if args.compile_only:  # the variants' cubins too, one by one (each patches modules)
        from gemm_candidates import compile_job
        for shape in shapes:
            for c in contenders:
                if "config" in c and c.get("variant", "main") != "main":
                    try:
                        with variant(c["variant"], shape, c["config"]):
                            error = compile_job(shape, c["config"])
                    except Exception as e:  # noqa: BLE001 — e.g. a hook not on this main
                        error = f"{type(e).__name__}: {e}"
                    print(f"compiled {c['variant']} at {shape}: {error or 'ok'}", flush=True)
        return 0
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    start = time.time()
    for shape in shapes:
        if time.time() - start > args.max_seconds:
            print(f"{'x'.join(map(str, shape))} skipped (--max-seconds)")
            continue
        measure(torch, shape, contenders, args.rounds, args.rep_ms, not args.no_triton)
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # gemm_candidates
    sys.exit(main())
