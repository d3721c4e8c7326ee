"""Does the cost model rank configurations the way the GPU does? (issue 11's check)

    PYTHONPATH=. python3 benchmarks/cost_model_check.py [--out DIR] [--quick]
        [--families gemm_sm90,attention] [--shapes 0,2] [--jobs 14] [--budget-s 30]

For each kernel family — the README GEMM on the mma.sync path (target sm_90 on a Hopper
GPU) and on the wgmma path (sm_90a), row softmax, RMSNorm, and the attention forward — and
a few problem shapes, every configuration of a small space is built, its time predicted
by `tegula.recommend.score` (the analytical model of `tegula.synth.cost`, what `explain`
and `tg.recommend` print) and measured on the GPU (`triton.testing.do_bench`, median, in
this one process), after one launch into an output poisoned with NaN is checked element by
element against torch (the GEMMs against a float32 product, the rows against float32 torch,
attention's o against torch's attention of the same inputs). Configurations the compiler refuses or that fail to launch are listed,
not measured. Three families, not in the default run, each check one decision:
`gemm_sm90a_load` the load path (the best sm_90a GEMM tiles on TMA and on cp.async),
`gemm_sm90a_orient` the orientation (skinny shapes and their transposes) and
`gemm_sm90a_cluster` the cluster shape (the persistent GEMM in clusters of 1 and 2); for
them a decisions table says, per configuration, whether the model's choice is the GPU's,
and compares the search's pick with the measured best. Per (family, shape): the Spearman
rank correlation between predicted and measured time, and whether the model's top 5 holds
the measured best or one within 5% of it. Writes `cost_model_check.json` (every point) and `cost_model_check.svg` (predicted
against measured, log-log, one colour per family) into --out; a table last. Nothing is
asserted: this is the evidence for docs/performance.md, not a test.

Ties: two configurations whose measured times differ by less than the measurement noise
(`NOISE`, or the pair's own 20-80% spread of `do_bench` times if larger) cannot be ranked
by measuring them, so ranking them is not held against the model. Besides Spearman over
every configuration, the table gives `pairs`: of the pairs the GPU tells apart, the share
the model orders the same way, and how many pairs that is (a family whose configurations
are all within the noise has no such pairs: "-", not a noise-driven correlation).

For short device sessions: `--shapes` picks problem shapes by index, `--jobs N` builds and
compiles every configuration first in N processes (the cubins land in the disk cache; the
measuring process launches each priced build's thread kernel with its cubin, building
nothing itself: what is timed is the build the model priced, for the launch's grid), and `--budget-s` stops measuring after that many seconds (the rest are listed as
not measured), so a run fits a fixed time slot.
"""
from __future__ import annotations

import argparse
import importlib.util
import itertools
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

import tegula as tg
from tegula.recommend import score

ROOT = Path(__file__).resolve().parents[1]


def _example(name: str, attr: str):
    spec = importlib.util.spec_from_file_location(f"tegula_example_{name}", ROOT / "examples" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, attr)


def _space(**choices) -> list[dict]:
    names = list(choices)
    return [dict(zip(names, values)) for values in itertools.product(*choices.values())]


# ------------------------------------------------------------------ the kernel families

def gemm_family(target: str, load_paths: bool = False) -> dict:
    """The README GEMM; with `load_paths`, the sm_90a tiles the model ranks best on both
    load paths (`load_path=`: TMA, cp.async), the decision `tg.recommend` searches."""
    gemm = _example("gemm", "gemm")
    if load_paths:
        space = _space(BM=[128], BN=[128, 256], BK=[64], STAGES=[2, 3, 4], threads=[128, 256],
                       load_path=["tma", "cp.async"])
    elif target == "sm_90a":
        space = _space(BM=[64, 128, 256], BN=[64, 128, 256], BK=[64], STAGES=[2, 3, 4],
                       threads=[128, 256])
    else:
        space = _space(BM=[64, 128], BN=[64, 128], BK=[32, 64], STAGES=[2, 3, 4],
                       threads=[128, 256])
    # The last shape is held out of every fit of the model (session 7): a wide, shallow GEMM.
    shapes = [(4096, 4096, 4096), (2048, 2048, 2048), (4096, 4096, 1024), (1024, 1024, 1024),
              (2048, 8192, 1024)]

    def make(shape, device="cuda"):
        m, n, k = shape
        a = torch.randn(m, k, device=device, dtype=torch.float16)
        b = torch.randn(n, k, device=device, dtype=torch.float16)
        c = torch.empty(m, n, device=device, dtype=torch.float16)
        grid = lambda cfg: (tg.cdiv(m, cfg["BM"]), tg.cdiv(n, cfg["BN"]))  # noqa: E731
        return (a, b, c), dict(a=(m, k), b=(n, k), c=(m, n)), {}, grid, {}
    return dict(name=f"gemm {target}" + (" load path" if load_paths else ""), kernel=gemm,
                target=target, space=space, shapes=shapes, make=make,
                reference=lambda args: args[0].float() @ args[1].float().T)


def orientation_family() -> dict:
    """The README GEMM on sm_90a at skinny shapes, each with its transpose: computing
    C = a @ b.T at (M, N, K) or Cᵀ = b @ a.T at (N, M, K) is the orientation decision
    (`tg.recommend(..., orientation=("a", "b", "c"))`); both are measured, so the table
    shows whether the model's faster orientation is the GPU's."""
    family = gemm_family("sm_90a")
    family.update(name="gemm sm_90a orientation",
                  space=_space(BM=[64, 128], BN=[16, 32, 64, 128], BK=[64], STAGES=[4],
                               threads=[128]),
                  shapes=[(16, 4096, 4096), (4096, 16, 4096), (64, 8192, 4096),
                          (8192, 64, 4096)])
    return family


def cluster_family() -> dict:
    """The persistent GEMM (sm_90a) launched in clusters of 1 or 2 blocks along M (`CLUSTER`:
    the b box multicast to both blocks of a cluster), on `persistent_grid` for the target's
    SM count."""
    from tegula.arch.targets import get_target
    from tegula.dtypes import f16
    from tegula.kernels.gemm import persistent_gemm_kernel, persistent_grid
    sms = get_target("sm_90a").sm_count
    space = _space(BM=[128], BN=[128, 256], BK=[64], STAGES=[3, 4], threads=[256],
                   CLUSTER=[1, 2])
    # The last: 64 tiles of 128x256 for 132 SMs, where matmul's search takes 128x128.
    shapes = [(4096, 4096, 4096), (2048, 8192, 1024), (8192, 2048, 4096), (8192, 8192, 2048),
              (512, 4096, 4096)]

    def make(shape, device="cuda"):
        m, n, k = shape
        a = torch.randn(m, k, device=device, dtype=torch.float16)
        b = torch.randn(n, k, device=device, dtype=torch.float16)
        c = torch.empty(m, n, device=device, dtype=torch.float16)
        grid = lambda cfg: persistent_grid(  # noqa: E731
            m, n, sms, cfg["BM"], cfg["BN"], cfg["CLUSTER"])
        return (a, b, c), dict(a=(m, k), b=(n, k), c=(m, n)), {}, grid, {}
    return dict(name="persistent gemm sm_90a cluster", kernel=persistent_gemm_kernel(f16),
                target="sm_90a", space=space, shapes=shapes, make=make,
                reference=lambda args: args[0].float() @ args[1].float().T)


def row_family(which: str) -> dict:
    from tegula.dtypes import f16
    from tegula.kernels.norm import rms_norm_kernel
    from tegula.kernels.softmax import softmax_kernel
    kernel = softmax_kernel(f16) if which == "softmax" else rms_norm_kernel(f16)
    # large enough that the configurations differ by more than launch noise; then (32 MB
    # each way) where fewer rows per SM leave occupancy and tails to matter (sessions 5-8,
    # where most configurations ran at copy speed); then (session 9) rows of 256 to 8192,
    # 8-32 MB, where waves, occupancy and latency separate the configurations; the last
    # two held out of the session-9 fit; the last four held out of session 10's; then
    # (session 13) four shapes no model change has seen, measured after it (held out).
    shapes = [(131072, 1024), (32768, 4096), (262144, 512), (16384, 1024), (4096, 4096),
              (65536, 256), (8192, 2048), (2048, 8192), (4096, 1024), (1024, 4096),
              (32768, 512), (1536, 8192), (4096, 2048), (768, 8192), (2048, 2048),
              (12288, 1024), (3072, 4096), (6144, 2048), (24576, 512), (1024, 16384)]

    def make(shape, device="cuda"):
        m, n = shape
        x = torch.randn(m, n, device=device, dtype=torch.float16)
        y = torch.empty_like(x)
        grid = lambda cfg: (tg.cdiv(m, cfg["BM"]),)  # noqa: E731
        if which == "softmax":
            return (x, y), dict(x=(m, n), y=(m, n)), {}, grid, {}
        w = torch.randn(1, n, device=device, dtype=torch.float16)
        return (x, w, y), dict(x=(m, n), w=(1, n), y=(m, n)), {}, grid, dict(N=n)

    def reference(args):
        """What y must hold (float32 torch), from the launch's inputs."""
        x = args[0].float()
        if which == "softmax":
            return torch.softmax(x, 1)
        return x * torch.rsqrt((x * x).mean(1, keepdim=True) + 1e-6) * args[1].float()
    space_of = lambda shape: [c for c in _space(BM=[1, 2, 4, 8, 16], BN=[shape[1]],  # noqa: E731
                                                  threads=[32, 64, 128, 256, 512, 1024])
                              if c["BM"] * shape[1] // c["threads"] <= 256]
    return dict(name=which, kernel=kernel, target="sm_90a", space=space_of,
                shapes=shapes, make=make, reference=reference)


def attention_family() -> dict:
    from tegula.dtypes import f16
    from tegula.kernels.attention import attention_kernel
    kernel = attention_kernel(f16)
    shapes = [(4, 16, 2048, 64), (2, 16, 4096, 128)]

    def make(shape, v_kmajor: bool, device="cuda"):
        b, h, s, d = shape
        q, k, v = (torch.randn(b, h, s, d, device=device, dtype=torch.float16) for _ in range(3))
        if v_kmajor:  # the kernel then reads v as (B, H, D, S), as the library passes it
            v = v.transpose(-1, -2).contiguous()
        o = torch.empty_like(q)
        lse = torch.empty(b, h, s, device=device, dtype=torch.float32)
        grid = lambda cfg: (tg.cdiv(s, cfg["BM"]), h, b)  # noqa: E731
        fixed = dict(D=d, QK_SCALE=1.4426950408889634 / math.sqrt(d), CAUSAL=False,
                     V_KMAJOR=v_kmajor)
        return ((q, k, v, o, lse), dict(q=q.shape, k=k.shape, v=v.shape, o=o.shape, lse=lse.shape),
                {}, grid, fixed)
    space = _space(BM=[64, 128], BN=[32, 64, 128], STAGES=[1, 2, 3], P_SHARED=[False, True],
                   threads=[128, 256])
    shapes = [(shape, v_kmajor) for shape in shapes for v_kmajor in (False, True)]

    def reference(args):
        """o (f16 inputs through torch's attention; v back to (B, H, S, D) if K-major)."""
        q, k, v = args[:3]
        v = v.transpose(-1, -2) if v.shape != q.shape else v
        return torch.nn.functional.scaled_dot_product_attention(q, k, v).float()
    return dict(name="attention fwd", kernel=kernel, target="sm_90a", space=space,
                shapes=shapes, make=lambda shape, device="cuda": make(*shape, device=device),
                reference=reference, output=3)


# ------------------------------------------------------------------ measuring and ranking

#: Relative difference under which two measured times count as tied (do_bench medians of
#: one configuration vary by ~1% run to run on an idle H100).
NOISE = 0.02


def _compile_one(family_name: str, shape_index: int, cfg: dict, ptxas: bool = False,
                 measure_dropped: bool = False) -> dict:
    """Predict and compile one configuration into the disk cache (a worker process: no GPU
    use, the launch later finds the cubin by its source's key). Returns the point's
    prediction fields (`predicted_us`, `bound` or `dropped`) and the priced build's
    `thread_kernel` (which the measuring process launches, not building it again), or
    `error`. A configuration the model drops is compiled only with `measure_dropped` (else
    it is not measured)."""
    from tegula.runtime import compile_kernel
    family = FAMILIES[family_name]()
    shape = family["shapes"][shape_index]
    _, shapes, scalars, grid, fixed = family["make"](shape, device="meta")
    try:
        candidate = score(family["kernel"], dict(cfg), fixed, shapes, scalars,
                          lambda c, g=grid: g(c), family["target"], keep_build=True,
                          ptxas=ptxas)
        if candidate.dropped:
            if not (measure_dropped and candidate.build is not None):
                return dict(dropped=candidate.dropped)
            built = candidate.build
            compile_kernel(built.thread_kernel, built.target.sm)
            return dict(dropped=candidate.dropped, thread_kernel=built.thread_kernel)
        built = candidate.build
        compile_kernel(built.thread_kernel, built.target.sm)
    except Exception as err:  # reported again, in full, by the measuring process
        return dict(error=f"{type(err).__name__}: {err}"[:200])
    return dict(predicted_us=candidate.seconds * 1e6, bound=candidate.estimate.bound,
                registers=candidate.estimate.registers, thread_kernel=built.thread_kernel)


def _job_key(family_name: str, shape_index: int, cfg: dict) -> str:
    return json.dumps([family_name, shape_index, cfg], sort_keys=True)


def precompile(jobs: list, workers: int, log, ptxas: bool = False,
               measure_dropped: bool = False) -> dict:
    """Predict and compile `jobs` ((family name, shape index, config), ...) in `workers`
    processes, so the measuring process only loads cubins; returns each job's prediction
    by `_job_key`."""
    import concurrent.futures
    import multiprocessing
    start = time.time()
    context = multiprocessing.get_context("spawn")  # no CUDA state is inherited
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        results = list(pool.map(_compile_one, *zip(*jobs), [ptxas] * len(jobs),
                                [measure_dropped] * len(jobs)))
    failed = sum(1 for r in results if "error" in r)
    log(f"precompiled {len(jobs)} configurations in {time.time() - start:.1f} s "
        f"({failed} refused or failed)")
    return {_job_key(*job): r for job, r in zip(jobs, results)}


def run_family(family: dict, log, shape_indices, deadline: float, echo: bool = False,
               predicted: dict | None = None, family_name: str = "",
               rep_ms: float = 40, ptxas: bool = False,
               measure_dropped: bool = False) -> list[dict]:
    """Predict and measure every configuration of `family` at the shapes `shape_indices`
    (`predicted`: the precompile's predictions by `_job_key`, not recomputed)."""
    from triton.testing import do_bench
    points = []

    def record(point: dict) -> None:
        points.append(point)
        log(json.dumps(point))
        if echo:
            print(_point_line(point), flush=True)

    for index in shape_indices:
        shape = family["shapes"][index]
        args, shapes, scalars, grid, fixed = family["make"](shape)
        space = family["space"](shape) if callable(family["space"]) else family["space"]
        want = None
        for cfg in space:
            point = dict(family=family["name"], shape=list(shape), config=cfg)
            launch_cfg = {**fixed, **cfg}
            if time.time() > deadline:  # not even predicted: building it takes time too
                point["not_measured"] = "the run's time budget (--budget-s) was spent"
                record(point)
                continue
            try:
                known = (predicted or {}).get(_job_key(family_name, index, cfg))
                if not known or "error" in known:  # a failure is raised again, in full
                    candidate = score(family["kernel"], dict(cfg), fixed, shapes, scalars,
                                      lambda c, g=grid: g(c), family["target"], ptxas=ptxas)
                    known = dict(dropped=candidate.dropped) if candidate.dropped else dict(
                        predicted_us=candidate.seconds * 1e6, bound=candidate.estimate.bound,
                        registers=candidate.estimate.registers)
                if "dropped" in known:
                    point["dropped"] = known["dropped"]
                    if not measure_dropped or "compiler refuses" in known["dropped"]:
                        record(point)
                        continue
                known = dict(known)
                priced = known.pop("thread_kernel", None)
                point.update(known)
                if time.time() > deadline:
                    point["not_measured"] = "the run's time budget (--budget-s) was spent"
                    record(point)
                    continue
                g = grid(launch_cfg)
                call = _launcher(family, g, args, launch_cfg, priced)
                out = args[family.get("output", -1)]
                if "reference" in family:   # every element checked, output poisoned first
                    out.fill_(float("nan"))
                try:
                    call()
                    torch.cuda.synchronize()
                except Exception as err:  # measured as a user launches it instead, and said
                    if priced is None:
                        raise
                    point["launched_as_user"] = f"{type(err).__name__}: {err}"[:120]
                    call = _launcher(family, g, args, launch_cfg)
                    call()
                    torch.cuda.synchronize()
                if "reference" in family:
                    if want is None:  # one reference per shape: the inputs are the shape's
                        want = family["reference"](args)
                    point["max_error"] = _max_error(out, want)
                    if not point["max_error"] < 2e-2:
                        raise AssertionError(f"wrong result: max error {point['max_error']}")
                low, median, high = do_bench(call, warmup=10, rep=rep_ms,
                                             quantiles=[0.2, 0.5, 0.8])
                # a dropped configuration's time is kept out of the ranking (`repredict`
                # ranks it where a model, e.g. with ptxas's registers, keeps it)
                measured = "measured_but_dropped_us" if "dropped" in point else "measured_us"
                point[measured] = median * 1e3
                point["spread"] = (high - low) / median
            except Exception as err:  # one config must not hide the rest
                point["failed"] = f"{type(err).__name__}: {err}"[:300]
            record(point)
    return points


def _launcher(family: dict, grid, args, launch_cfg: dict, priced=None):
    """A call launching one configuration: the precompiled build the model priced (its
    thread kernel, its cubin from the disk cache: no build in this process), else
    `kernel[grid](...)` as a user launches it."""
    if priced is None:
        return lambda: family["kernel"][grid](*args, target=family["target"], **launch_cfg)
    from tegula.arch.targets import get_target
    from tegula.runtime import compile_kernel
    compiled = compile_kernel(priced, get_target(family["target"]).sm)
    return lambda: compiled.launch(grid, args)


def _max_error(got, want) -> float:
    """Largest |got - want| over max(1, |want|), NaN where an element was not written."""
    got = got.float()
    if not torch.isfinite(got).all():
        return float("nan")
    return float(((got - want).abs() / want.abs().clamp_min(1.0)).max())


def copy_calibration(sizes_mb: list[int], rep_ms: float) -> None:
    """Time torch's device copy (`y.copy_(x)`, read + write), a read (`x.amax()`) and a
    write (`y.fill_`) of f16 tensors of each size, as the families are timed (do_bench
    flushes L2 first): what the DRAM stream bandwidth and the fixed cost of a launch are.
    One line each: "COPY MB copy_us read_us write_us"."""
    from triton.testing import do_bench
    for mb in sizes_mb:
        x = torch.randn(mb * 2 ** 19, device="cuda", dtype=torch.float16)
        y = torch.empty_like(x)
        times = [do_bench(call, warmup=10, rep=rep_ms) * 1e3 for call in
                 (lambda: y.copy_(x), lambda: x.amax(), lambda: y.fill_(1.0))]
        print("COPY " + " ".join([str(mb)] + [f"{t:.2f}" for t in times]), flush=True)


def matmul_orientation(shapes: list[tuple], rep_ms: float) -> None:
    """Time matmul's launches at decode shapes in each orientation the entry point may
    take (`api_matmul._gemm_launches`: the streaming C tiles, the search's Cᵀ pick) and
    torch's `a @ w.T`, after checking each against torch: does the orientation decision
    earn its place? One line each: "ORIENT M N K config us ratio-to-torch max-error"."""
    from triton.testing import do_bench

    from tegula.dtypes import f16
    from tegula.kernels import api_matmul
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.float16)
        w = torch.randn(n, k, device="cuda", dtype=torch.float16)
        ref = a.double() @ w.double().T
        torch_us = do_bench(lambda: a @ w.T, warmup=10, rep=rep_ms) * 1e3
        print(f"ORIENT {m} {n} {k} torch {torch_us:.2f} 1.00 0", flush=True)
        configs = [c for c in api_matmul.gemm_candidates(m, n, k, hopper=True)
                   if c.get("SPLIT", 1) == 1][:2] + api_matmul.searched_transposed(m, n, k)
        for config in configs:
            out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
            values = dict(config, kernel=config.get("kernel", "shared"))
            threads = values.pop("threads", None)
            run = lambda: api_matmul._gemm_launches(f16, dict(values), threads, a, w, out)  # noqa: E731
            try:
                run()
                torch.cuda.synchronize()
                error = float((out.double() - ref).abs().max())
                us = do_bench(run, warmup=10, rep=rep_ms) * 1e3
            except Exception as err:  # one config must not hide the rest
                print(f"ORIENT {m} {n} {k} {json.dumps(config)} failed {err}"[:300], flush=True)
                continue
            name = json.dumps(config, ensure_ascii=False).replace(" ", "")
            print(f"ORIENT {m} {n} {k} {name} {us:.2f} {torch_us / us:.2f} {error:.3g}",
                  flush=True)


def _point_line(point: dict) -> str:
    """One point as a line of its own JSON after "P " (a log that comes back as text is
    read back by `--repredict`)."""
    return "P " + json.dumps(point)


def _run_line(text: str) -> dict:
    """{gpu, date} from the "GPU, DATE, N s" line a run prints before its table."""
    import re
    found = re.search(r"^(.+), (\d{4}-\d\d-\d\d), \d+ s$", text, re.M)
    return dict(gpu=found.group(1), date=found.group(2)) if found else {}


def points_from_text(text: str) -> list[dict]:
    """The points of the "P " lines of a run's output (`--print-points`)."""
    return [json.loads(line[2:]) for line in text.splitlines() if line.startswith("P {")]


def average_ranks(values: list[float]) -> np.ndarray:
    """Ranks 1..n, tied values sharing the mean of their ranks."""
    values = np.asarray(values, dtype=float)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(len(values))
    start = 0
    while start < len(order):
        end = start
        while end + 1 < len(order) and values[order[end + 1]] == values[order[start]]:
            end += 1
        ranks[order[start:end + 1]] = (start + end) / 2 + 1
        start = end + 1
    return ranks


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation, ties ranked by their mean rank (its definition). Until
    session 11 ties were ranked in the order the configurations were listed, which read
    the model's genuine ties (a row kernel's configurations predicted at the same DRAM
    floor) as an ordering by position in the list: softmax / RMSNorm 768x8192 0.73 / 0.56
    that way, 0.75 / 0.67 by the definition."""
    if len(x) < 3:
        return float("nan")
    return float(np.corrcoef(average_ranks(x), average_ranks(y))[0, 1])


def pair_agreement(points: list[dict]) -> tuple[float, int]:
    """(share of the pairs the GPU tells apart that the model orders the same way, how many
    such pairs). A pair is told apart when its measured times differ by more than the
    noise: `NOISE`, or the larger of the two configurations' own spread."""
    agree = total = 0
    for i, a in enumerate(points):
        for b in points[i + 1:]:
            noise = max(NOISE, a.get("spread", 0.0), b.get("spread", 0.0))
            slow, fast = (a, b) if a["measured_us"] > b["measured_us"] else (b, a)
            if slow["measured_us"] <= fast["measured_us"] * (1 + noise):
                continue
            total += 1
            agree += slow["predicted_us"] > fast["predicted_us"]
    return (agree / total if total else float("nan")), total


def summarize(points: list[dict]) -> list[dict]:
    rows = []
    keys = sorted({(p["family"], json.dumps(p["shape"])) for p in points})
    for family, shape in keys:
        here = [p for p in points if p["family"] == family and json.dumps(p["shape"]) == shape]
        ok = [p for p in here if "measured_us" in p]
        if not ok:
            continue
        predicted = [p["predicted_us"] for p in ok]
        measured = [p["measured_us"] for p in ok]
        best = min(measured)
        top5 = sorted(ok, key=lambda p: p["predicted_us"])[:5]
        hit = any(p["measured_us"] <= 1.05 * best for p in top5)
        agreement, pairs = pair_agreement(ok)
        rows.append(dict(family=family, shape=json.loads(shape), configs=len(ok),
                         not_measured=len(here) - len(ok),
                         spearman=spearman(predicted, measured), pairs=pairs,
                         pair_agreement=agreement, top5_hit=hit, best_measured_us=best,
                         model_pick_measured_us=min(ok, key=lambda p: p["predicted_us"])["measured_us"]))
    return rows


#: The decision each optional family checks: the config key its configurations differ in
#: (orientation: a shape against its transpose, the same config).
DECISION_OF = {"gemm sm_90a load path": "load_path",
               "persistent gemm sm_90a cluster": "CLUSTER",
               "gemm sm_90a orientation": "orientation"}


def _decision_points(points: list[dict], family: str, key: str):
    """(problem, the rest of the config, the choice, point) of each measured point."""
    for p in points:
        if p["family"] != family or "measured_us" not in p:
            continue
        rest = dict(p["config"])
        if key == "orientation":     # (M, N, K) written as C, (N, M, K) as its transpose
            m, n, k = p["shape"]
            problem, choice = (min(m, n), max(m, n), k), ("C" if m <= n else "Cᵀ")
        else:
            problem, choice = tuple(p["shape"]), rest.pop(key)
        yield problem, json.dumps(rest, sort_keys=True), str(choice), p


def decision_rows(points: list[dict]) -> list[dict]:
    """Per decision and problem: of the configurations measured with every choice, how
    often the model's choice is the GPU's (or within the noise of it), and the whole
    search's pick (every config and choice) against the measured best."""
    rows = []
    for family, key in DECISION_OF.items():
        by_problem: dict = {}
        for problem, rest, choice, p in _decision_points(points, family, key):
            by_problem.setdefault(problem, {}).setdefault(rest, {})[choice] = p
        for problem, groups in sorted(by_problem.items()):
            agree = within_noise = compared = 0
            for choices in groups.values():
                if len(choices) < 2:
                    continue
                compared += 1
                model = min(choices, key=lambda c: choices[c]["predicted_us"])
                gpu = min(choices, key=lambda c: choices[c]["measured_us"])
                noise = max([NOISE] + [q.get("spread", 0.0) for q in choices.values()])
                agree += model == gpu
                within_noise += model != gpu and choices[model]["measured_us"] <= \
                    choices[gpu]["measured_us"] * (1 + noise)
            every = [(c, p) for choices in groups.values() for c, p in choices.items()]
            pick = min(every, key=lambda cp: cp[1]["predicted_us"])
            best = min(every, key=lambda cp: cp[1]["measured_us"])
            rows.append(dict(decision=key, problem=list(problem), compared=compared,
                             agree=agree, within_noise=within_noise,
                             pick_choice=pick[0], best_choice=best[0],
                             pick_over_best=pick[1]["measured_us"] / best[1]["measured_us"]))
    return rows


def print_decisions(rows: list[dict]) -> None:
    if not rows:
        return
    print(f"{'decision':12} {'problem':20} {'same config, model = GPU':>25} "
          f"{'pick':>5} {'best':>5} {'pick/best':>9}")
    for r in rows:
        agree = f"{r['agree']}/{r['compared']} (+{r['within_noise']} in noise)"
        print(f"{r['decision']:12} {json.dumps(r['problem']):20} {agree:>25} "
              f"{r['pick_choice']:>5} {r['best_choice']:>5} {r['pick_over_best']:9.2f}")


def svg_plot(points: list[dict], path: Path) -> None:
    """Predicted against measured microseconds, log-log, one colour per family."""
    ok = [p for p in points if "measured_us" in p and p["predicted_us"] > 0]
    if not ok:
        return
    xs = [math.log10(p["measured_us"]) for p in ok]
    ys = [math.log10(p["predicted_us"]) for p in ok]
    lo, hi = min(xs + ys) - 0.1, max(xs + ys) + 0.1
    size, pad = 520, 50
    scale = lambda v: pad + (v - lo) / (hi - lo) * (size - 2 * pad)  # noqa: E731
    colours = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b"]
    families = sorted({p["family"] for p in ok})
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{size + 180}" height="{size}">',
           f'<rect width="{size + 180}" height="{size}" fill="white"/>',
           f'<line x1="{scale(lo)}" y1="{size - scale(lo)}" x2="{scale(hi)}" '
           f'y2="{size - scale(hi)}" stroke="#999" stroke-dasharray="4"/>',
           f'<text x="{size / 2 - 60}" y="{size - 10}" font-size="12">measured µs (log)</text>',
           f'<text x="5" y="20" font-size="12">predicted µs (log)</text>']
    for decade in range(math.floor(lo), math.ceil(hi) + 1):
        if lo <= decade <= hi:
            out.append(f'<text x="{scale(decade) - 8}" y="{size - pad + 15}" font-size="10">'
                       f'{10 ** decade:g}</text>')
            out.append(f'<text x="{pad - 35}" y="{size - scale(decade)}" font-size="10">'
                       f'{10 ** decade:g}</text>')
    for p, x, y in zip(ok, xs, ys):
        colour = colours[families.index(p["family"]) % len(colours)]
        out.append(f'<circle cx="{scale(x):.1f}" cy="{size - scale(y):.1f}" r="2.5" '
                   f'fill="{colour}" fill-opacity="0.7"/>')
    for i, family in enumerate(families):
        out.append(f'<circle cx="{size + 10}" cy="{30 + 18 * i}" r="4" fill="{colours[i % len(colours)]}"/>')
        out.append(f'<text x="{size + 20}" y="{34 + 18 * i}" font-size="11">{family}</text>')
    out.append("</svg>")
    path.write_text("\n".join(out))


def _shape_indices(spec: str | None, family: str, count: int, quick: bool) -> list[int]:
    """The shape indices `--shapes` picks for `family`: "0,2" for every family,
    "gemm_sm90=2,attention=0" per family (a family not named gets none), nothing: all
    (the first two with --quick)."""
    if not spec:
        return list(range(min(count, 2) if quick else count))
    items = spec.split(",")
    if any("=" in item for item in items):
        return [int(i) for f, _, i in (item.partition("=") for item in items)
                if f == family and int(i) < count]
    return [int(i) for i in items if int(i) < count]


def _only(space, spec: str, family: str = ""):
    """`space` (a list, or a function of the shape) keeping the configurations whose values
    match every KEY=VALUE of `spec` that names one of their keys; an item FAMILY:KEY=VALUE
    applies to that family (its command-line name) only."""
    items = [item.split(":", 1) if ":" in item else ("", item) for item in spec.split(",")]
    wanted = dict(item.split("=", 1) for name, item in items if name in ("", family))

    def keep(configs: list) -> list:
        return [c for c in configs
                if all(str(c[k]) == v for k, v in wanted.items() if k in c)]
    return (lambda shape: keep(space(shape))) if callable(space) else keep(space)


#: The kernel families by command-line name.
FAMILIES = {"gemm_sm90": lambda: gemm_family("sm_90"),
            "gemm_sm90a": lambda: gemm_family("sm_90a"),
            "gemm_sm90a_load": lambda: gemm_family("sm_90a", load_paths=True),
            "gemm_sm90a_orient": orientation_family,
            "gemm_sm90a_cluster": cluster_family,
            "softmax": lambda: row_family("softmax"),
            "rms_norm": lambda: row_family("rms_norm"),
            "attention": attention_family}


#: Families the default run leaves out (each checks one decision; name them in --families).
OPTIONAL_FAMILIES = ("gemm_sm90a_load", "gemm_sm90a_orient", "gemm_sm90a_cluster")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    parser.add_argument("--quick", action="store_true", help="the first two shapes")
    parser.add_argument("--families", default=",".join(f for f in FAMILIES if f not in OPTIONAL_FAMILIES))
    parser.add_argument("--shapes", default=None,
                        help="comma-separated shape indices of each family (default: all); "
                             "FAMILY=I picks shape I of one family (e.g. gemm_sm90=2)")
    parser.add_argument("--repredict", default=None, metavar="JSON",
                        help="no GPU: re-predict the measured points of a recorded JSON (or "
                             "of the 'P' lines of a --print-points run's output) with the "
                             "current model, write JSON/SVG into --out, print the table")
    parser.add_argument("--only", default=None,
                        help="keep configurations with these values, e.g. BM=128,threads=256; "
                             "FAMILY:KEY=VALUE for one family (gemm_sm90a:BM=256)")
    parser.add_argument("--jobs", type=int, default=0,
                        help="compile every configuration first in this many processes")
    parser.add_argument("--budget-s", type=float, default=float("inf"),
                        help="stop measuring after this many seconds")
    parser.add_argument("--rep-ms", type=float, default=40,
                        help="milliseconds of repetitions per configuration (do_bench rep)")
    parser.add_argument("--copy-sizes", default="",
                        help="first time torch's copy, read and write at these sizes (MB "
                             "each way, comma-separated): the device's stream bandwidth")
    parser.add_argument("--ptxas-registers", action="store_true",
                        help="predict with ptxas's register count (each configuration "
                             "compiled with its report), not the liveness estimate")
    parser.add_argument("--measure-dropped", action="store_true",
                        help="also measure the configurations the model drops for their "
                             "registers (kept out of the ranking; --repredict ranks them "
                             "where the model then keeps them)")
    parser.add_argument("--matmul-orientation", default="",
                        help="first time matmul's launches in each orientation at these "
                             "MxNxK shapes (comma-separated) against torch")
    parser.add_argument("--print-points", action="store_true",
                        help="print every point as it is measured")
    options = parser.parse_args()
    if options.repredict:
        repredict(Path(options.repredict), Path(options.out), options.ptxas_registers)
        return
    start = time.time()
    deadline = start + options.budget_s
    out = Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    log_file = open(out / "cost_model_check.log", "w")
    log = lambda line: (log_file.write(line + "\n"), log_file.flush())  # noqa: E731
    chosen = {}
    for name in filter(None, options.families.split(",")):
        family = FAMILIES[name]()
        if options.only:
            family["space"] = _only(family["space"], options.only, name)
        chosen[name] = (family, _shape_indices(options.shapes, name, len(family["shapes"]),
                                               options.quick))
    _device_checks(options)
    if not chosen:
        return
    predicted = {}
    if options.jobs:
        jobs = [(name, i, cfg) for name, (family, indices) in chosen.items()
                for i in indices
                for cfg in (family["space"](family["shapes"][i]) if callable(family["space"])
                            else family["space"])]
        predicted = precompile(jobs, options.jobs,
                               lambda line: (log(line), print(line, file=sys.stderr)),
                               options.ptxas_registers, options.measure_dropped)
    points = []
    for name, (family, indices) in chosen.items():
        family_start = time.time()
        points += run_family(family, log, indices, deadline, options.print_points,
                             predicted, name, options.rep_ms, options.ptxas_registers,
                             options.measure_dropped)
        print(f"{name}: {time.time() - family_start:.0f} s", file=sys.stderr, flush=True)
    rows = summarize(points)
    gpu = torch.cuda.get_device_name()
    (out / "cost_model_check.json").write_text(json.dumps(
        dict(gpu=gpu, date=time.strftime("%Y-%m-%d"), points=points, summary=rows), indent=1))
    svg_plot(points, out / "cost_model_check.svg")
    print(f"{gpu}, {time.strftime('%Y-%m-%d')}, {time.time() - start:.0f} s")
    print_table(rows)
    print_decisions(decision_rows(points))


def _device_checks(options) -> None:
    """The runs before the families: the copy calibration and matmul's orientations."""
    if options.copy_sizes:
        copy_calibration([int(mb) for mb in options.copy_sizes.split(",")], options.rep_ms)
    if options.matmul_orientation:
        matmul_orientation([tuple(int(d) for d in shape.split("x"))
                            for shape in options.matmul_orientation.split(",")], options.rep_ms)


def print_table(rows: list[dict]) -> None:
    print(f"{'family':14} {'shape':26} {'configs':>7} {'skipped':>7} {'spearman':>8} "
          f"{'pairs':>11} {'top5':>5} {'best us':>9} {'pick us':>9}")
    for r in rows:
        pairs = (f"{r['pair_agreement']:.2f}/{r['pairs']}" if r["pairs"] else "-")
        print(f"{r['family']:14} {json.dumps(r['shape']):26} {r['configs']:7d} "
              f"{r['not_measured']:7d} {r['spearman']:8.2f} {pairs:>11} "
              f"{str(r['top5_hit']):>5} {r['best_measured_us']:9.1f} "
              f"{r['model_pick_measured_us']:9.1f}")


def repredict(recorded: Path, out: Path, ptxas: bool = False) -> None:
    """Re-predict every measured point of `recorded` with the current model (CPU only):
    the measurements stay as recorded, `predicted_us` is today's model's, the recorded
    prediction kept as `recorded_prediction_us`. Families are looked up by their name."""
    text = recorded.read_text()
    data = json.loads(text) if text.lstrip().startswith("{") else \
        dict(points=points_from_text(text), source=recorded.name, **_run_line(text))
    by_name = {family["name"]: family for family in (make() for make in FAMILIES.values())}
    points = []
    for point in data["points"]:
        family = by_name[point["family"]]
        shape = point["shape"] if not isinstance(point["shape"][0], list) else \
            (tuple(point["shape"][0]), point["shape"][1])
        shape = tuple(shape) if not isinstance(shape, tuple) else shape
        _, shapes, scalars, grid, fixed = family["make"](shape, device="meta")
        candidate = score(family["kernel"], dict(point["config"]), fixed, shapes, scalars,
                          lambda c, g=grid: g(c), family["target"], ptxas=ptxas)
        point = dict(point)
        if "predicted_us" in point:
            point["recorded_prediction_us"] = point["predicted_us"]
        if candidate.dropped:  # kept, out of the ranking: the model would not propose it
            if "measured_us" in point:
                point["measured_but_dropped_us"] = point.pop("measured_us")
            point["dropped"] = candidate.dropped
        else:
            if "measured_but_dropped_us" in point:
                point["measured_us"] = point.pop("measured_but_dropped_us")
            point.pop("dropped", None)
            point["predicted_us"] = candidate.seconds * 1e6
            point["bound"] = candidate.estimate.bound
            point["registers"] = candidate.estimate.registers
        points.append(point)
    rows = summarize(points)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cost_model_check.json").write_text(json.dumps(
        {**{k: v for k, v in data.items() if k not in ("points", "summary")},
         "predicted_by": "the model at the time of --repredict", "points": points,
         "summary": rows}, indent=1))
    svg_plot(points, out / "cost_model_check.svg")
    print_table(rows)
    print_decisions(decision_rows(points))


if __name__ == "__main__":
    main()
