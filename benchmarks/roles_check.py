"""Warp roles on the GPU: each TMA pipeline timed in one role and warp-specialized, beside
the cost model's price of both (`tegula/synth/cost_roles.py`) and the form synthesis picks
by default (issue 11: the decision belongs to the model, not to a pin in the kernel).

    PYTHONPATH=. python3 benchmarks/roles_check.py [--cases 0,3] [--jobs 16] [--entry]

Per case (the attention backward's dK/dV and dQ kernels, the attention forward, the
blockwise FP8 GEMM's 64x128 tile, the README GEMM; `--one-gemm`: the bodies of one gemm,
README GEMM tiles and the library's split-K and FP8 candidates at their shapes; `--grid`: the
README GEMM at grids of one to three blocks an SM): both forms are built (`warp_specialize=False` / `True`) and compiled in
worker processes, run once into outputs poisoned with NaN and checked element by element
against a float32 torch reference, then timed (`triton.testing.do_bench`, median, one
process). Printed last: measured specialized / one-role time, the model's ratio for the
case's launch grid (its block count passed as the `grid_blocks` build option), the grid's
blocks, one role's blocks per SM, the default's form, and whether the model's pick is the
faster form. `--recorded TEXT` prices the cases of an earlier run's table
(no GPU). `--entry` instead times the library entry points as users call them
(tuned `attention_backward` at 4x16x4096, D = 128, against torch's cuDNN and flash; the
persistent GEMM at 4096^3 against cuBLAS): the no-regression check after the default
changed. Nothing is asserted.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import importlib.util
import math
import multiprocessing
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

B, H, S = 4, 16, 4096
GEMM_SIZE = 4096


def _bwd(name: str, d: int, **tiles) -> dict:
    return dict(family="bwd_" + name, D=d, tiles=tiles)


#: (label, case): the backward kernels at the session-10 shape (4x16x4096), the forward
#: at the same, the README GEMM at 4096^3.
CASES = [
    ("bwd dK/dV D=128 64x64 128t", _bwd("dkdv", 128, BM=64, BN=64)),
    ("bwd dQ   D=128 64x64 128t", _bwd("dq", 128, BM=64, BN=64)),
    ("bwd dK/dV D=128 64x128 256t", _bwd("dkdv", 128, BM=64, BN=128, threads=256)),
    ("bwd dQ   D=128 128x64 256t", _bwd("dq", 128, BM=128, BN=64, threads=256)),
    ("bwd dK/dV D=64 64x64 128t", _bwd("dkdv", 64, BM=64, BN=64)),
    ("bwd dK/dV D=256 64x64 256t", _bwd("dkdv", 256, BM=64, BN=64, threads=256)),
    ("bwd dQ   D=256 64x64 256t", _bwd("dq", 256, BM=64, BN=64, threads=256)),
    ("fwd D=128 64x64 128t", dict(family="fwd", D=128, tiles=dict(BM=64, BN=64))),
    ("fwd D=128 128x64 256t", dict(family="fwd", D=128, tiles=dict(BM=128, BN=64,
                                                                    threads=256))),
    ("fp8 blockwise 64x128 S4 128t", dict(family="fp8bw", tiles=dict(BM=64, BN=128,
                                                                     STAGES=4))),
    ("gemm 128x128x32 S3 128t", dict(family="gemm", tiles=dict(BM=128, BN=128, BK=32,
                                                               STAGES=3))),
    ("gemm 128x128x64 S3 128t", dict(family="gemm", tiles=dict(BM=128, BN=128, BK=64,
                                                               STAGES=3))),
    ("gemm 128x128x64 S4 128t", dict(family="gemm", tiles=dict(BM=128, BN=128, BK=64,
                                                               STAGES=4))),
]

#: One-gemm bodies (issue 11: the model decides their roles too since session 12): more
#: README GEMM tiles, and every library candidate whose default form the model changed
#: (`benchmarks/roles_inventory.py`), at the shape its entry point times it for.
ONE_GEMM_CASES = [
    ("gemm 128x128x32 S4 128t", dict(family="gemm", tiles=dict(BM=128, BN=128, BK=32,
                                                               STAGES=4))),
    ("gemm 64x128x64 S4 128t", dict(family="gemm", tiles=dict(BM=64, BN=128, BK=64,
                                                              STAGES=4))),
    ("gemm 128x256x64 S3 256t", dict(family="gemm", tiles=dict(BM=128, BN=256, BK=64,
                                                               STAGES=3, threads=256))),
    ("splitk 64x128x64 S4 /4 @64", dict(family="splitk", mnk=(64, 4096, 4096),
                                        tiles=dict(BM=64, BN=128, BK=64, STAGES=4, SPLIT=4))),
    ("splitk 64x128x64 S4 /2 @128", dict(family="splitk", mnk=(128, 4096, 4096),
                                         tiles=dict(BM=64, BN=128, BK=64, STAGES=4, SPLIT=2))),
    ("fp8 64x128x128 S4 @64", dict(family="fp8", mnk=(64, 4096, 4096),
                                   tiles=dict(BM=64, BN=128, BK=128, STAGES=4))),
    ("fp8 64x64x128 S4 @64", dict(family="fp8", mnk=(64, 4096, 4096),
                                  tiles=dict(BM=64, BN=64, BK=128, STAGES=4))),
    ("fp8 128x128x64 S4 128t", dict(family="fp8", tiles=dict(BM=128, BN=128, BK=64,
                                                             STAGES=4))),
    ("fp8 blockwise 64x128 S4 @64", dict(family="fp8bw", mnk=(64, 4096, 4096),
                                         tiles=dict(BM=64, BN=128, STAGES=4))),
    ("fp8 blockwise 64x64 S4 @64", dict(family="fp8bw", mnk=(64, 4096, 4096),
                                        tiles=dict(BM=64, BN=64, STAGES=4))),
]
#: Small grids the session-12 data did not have (session 13, held out of the grid_blocks
#: change): the README GEMM's one-role tiles at shapes of at most one block an SM, at two,
#: and at three (two rounds at two resident, the last of one block at its own occupancy).
GRID_CASES = [
    ("gemm 128x128x32 S3 @512x1024", dict(family="gemm", mnk=(512, 1024, 4096),
                                          tiles=dict(BM=128, BN=128, BK=32, STAGES=3))),
    ("gemm 128x128x64 S3 @1024x2048", dict(family="gemm", mnk=(1024, 2048, 4096),
                                           tiles=dict(BM=128, BN=128, BK=64, STAGES=3))),
    ("gemm 64x128x64 S4 @1024x2048", dict(family="gemm", mnk=(1024, 2048, 4096),
                                          tiles=dict(BM=64, BN=128, BK=64, STAGES=4))),
    ("gemm 128x128x32 S3 @2048x3072", dict(family="gemm", mnk=(2048, 3072, 4096),
                                           tiles=dict(BM=128, BN=128, BK=32, STAGES=3))),
]
CASES = CASES + ONE_GEMM_CASES + GRID_CASES


def kernel_and_setup(case: dict):
    """(kernel, constexprs, argument names, shapes by name, grid) of a case."""
    from tegula.dtypes import f16
    fam, tiles = case["family"], dict(case["tiles"])
    m, n, k = case.get("mnk", (GEMM_SIZE,) * 3)
    grid = (-(-m // tiles["BM"]), -(-n // tiles["BN"]))
    if fam == "gemm":
        spec = importlib.util.spec_from_file_location("readme_gemm", ROOT / "examples" / "gemm.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return (module.gemm, tiles, ("a", "b", "c"),
                dict(a=(m, k), b=(n, k), c=(m, n)), grid)
    if fam == "splitk":
        gemm = importlib.import_module("tegula.kernels.gemm")
        rows = tiles["SPLIT"] * grid[0] * tiles["BM"]
        return (gemm.gemm_split_k_kernel(f16), tiles, ("a", "b", "partial"),
                dict(a=(m, k), b=(n, k), partial=(rows, n)), grid + (tiles["SPLIT"],))
    if fam in ("fp8", "fp8bw"):
        from tegula.dtypes import bf16
        fp8 = importlib.import_module("tegula.kernels.fp8")
        blockwise = fam == "fp8bw"
        scales = (dict(scale_a=(m, k // 128), scale_b=(n // 128, k // 128)) if blockwise
                  else dict(scale_a=(1, 1), scale_b=(1, 1)))
        factory = fp8.fp8_blockwise_gemm_kernel if blockwise else fp8.fp8_gemm_kernel
        return (factory(bf16), tiles, ("a", "b", "scale_a", "scale_b", "c"),
                dict(a=(m, k), b=(n, k), c=(m, n), **scales), grid)
    d = case["D"]
    if fam == "fwd":
        at = importlib.import_module("tegula.kernels.attention")
        cx = dict(at.default_tiles(d), **tiles, D=d, QK_SCALE=at.qk_scale(None, d))
        shapes = dict(q=(B, H, S, d), k=(B, H, S, d), v=(B, H, S, d), o=(B, H, S, d),
                      lse=(B, H, S))
        return (at.attention_kernel(f16), cx, ("q", "k", "v", "o", "lse"), shapes,
                (-(-S // cx["BM"]), H, B))
    ab = importlib.import_module("tegula.kernels.attention_backward")
    cx = dict(tiles, D=d, SCALE=1 / math.sqrt(d), CAUSAL=False, G=1)
    common = dict(q=(B, H, S, d), k=(B, H, S, d), v=(B, H, S, d), dout=(B, H, S, d),
                  lse=(B, H, S), delta=(B, H, S))
    if fam == "bwd_dkdv":
        names = ("q", "k", "v", "dout", "lse", "delta", "dk", "dv")
        shapes = dict(common, dk=(B, H, S, d), dv=(B, H, S, d))
        return (ab.attention_backward_dkdv_kernel(f16), cx, names, shapes,
                (-(-S // tiles["BN"]), H, B))
    names = ("q", "k", "v", "dout", "lse", "delta", "dq")
    return (ab.attention_backward_dq_kernel(f16), cx, names, dict(common, dq=(B, H, S, d)),
            (-(-S // tiles["BM"]), H, B))


def predict(index: int) -> dict:
    """The model's price of both forms for the case's launch grid (the `grid_blocks` build
    option) and the default's form (worker-safe, no GPU)."""
    from tegula.build import build
    from tegula.ir.ops import ForLoop, walk_ops
    from tegula.recommend import _facts
    from tegula.synth.cost_roles import roles_cost
    kernel, cx, _, shapes, grid = kernel_and_setup(CASES[index][1])
    facts = _facts(kernel, shapes)
    blocks = math.prod(grid)
    forced = build(kernel, dict(cx, warp_specialize=True), facts, "sm_90a")
    loop = next(op for op in walk_ops(forced.traced.body)
                if isinstance(op, ForLoop) and "roles" in op.choices)
    priced = roles_cost(forced.traced, loop, forced.target, blocks)
    default = build(kernel, dict(cx, warp_specialize=None, grid_blocks=blocks), facts,
                    "sm_90a")
    specialized = any("roles" in op.choices for op in walk_ops(default.traced.body)
                      if isinstance(op, ForLoop))
    return dict(model_ratio=priced.specialized / priced.one_role,
                default="specialized" if specialized else "one role",
                blocks=priced.one_role_blocks, grid_blocks=blocks)


def compile_case(index: int, form: bool) -> str:
    """Build and compile one form into the disk cache ("" or the error)."""
    from tegula.build import build
    from tegula.recommend import _facts
    from tegula.runtime import compile_kernel
    try:
        kernel, cx, _, shapes, _ = kernel_and_setup(CASES[index][1])
        built = build(kernel, dict(cx, warp_specialize=form), _facts(kernel, shapes), "sm_90a")
        compile_kernel(built.thread_kernel, built.target.sm)
    except Exception as err:  # noqa: BLE001 (reported by the measuring process)
        return f"{type(err).__name__}: {err}"[:200]
    return ""


# ------------------------------------------------------------------ references (torch f32)

def attention_reference(q, k, v, do=None):
    """Per (batch, head), in float32: o, lse (natural log) and, with `do`, dq, dk, dv."""
    import torch
    scale = 1 / math.sqrt(q.shape[-1])
    out = {n: [] for n in ("o", "lse", "dq", "dk", "dv")}
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            qf, kf, vf = (t[b, h].float() for t in (q, k, v))
            s = qf @ kf.T * scale
            lse = torch.logsumexp(s, 1)
            p = torch.exp(s - lse[:, None])
            o = p @ vf
            out["o"].append(o)
            out["lse"].append(lse)
            if do is not None:
                dof = do[b, h].float()
                delta = (dof * o.to(q.dtype).float()).sum(1)
                ds = p * (dof @ vf.T - delta[:, None])
                out["dq"].append(ds @ kf * scale)
                out["dk"].append(ds.T @ qf * scale)
                out["dv"].append(p.T @ dof)
    shape = q.shape[:2]
    return {n: torch.stack(x).reshape(*shape, *x[0].shape) for n, x in out.items() if x}


def worst_error(got, want) -> float:
    """Largest |got - want| over max |want| (NaN where an element was never written)."""
    import torch
    got = got.float()
    if not torch.isfinite(got).all():
        return float("nan")
    return float((got - want).abs().max() / want.abs().max().clamp_min(1e-6))


def tensors_for(case: dict, device="cuda") -> tuple[dict, dict]:
    """(the launch's tensors by name, reference results by output name)."""
    import torch
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape):
        return torch.randn(*shape, device=device, generator=gen, dtype=torch.float16)

    m, n, k = case.get("mnk", (GEMM_SIZE,) * 3)
    if case["family"] == "gemm":
        a, b = randn(m, k), randn(n, k)
        c = torch.full((m, n), float("nan"), device=device, dtype=torch.float16)
        return dict(a=a, b=b, c=c), dict(c=a.float() @ b.float().T)
    if case["family"] == "splitk":
        tiles = case["tiles"]
        a, b = randn(m, k), randn(n, k)
        rows = -(-m // tiles["BM"]) * tiles["BM"]
        partial = torch.full((tiles["SPLIT"] * rows, n), float("nan"), device=device)
        # What the launch's correctness check compares: the partials summed over the
        # splits (each split's rows past M hold zeros, from the zero-filled loads).
        want = torch.zeros(rows, n, device=device)
        want[:m] = a.float() @ b.float().T
        return dict(a=a, b=b, partial=partial), dict(partial=want)
    if case["family"] in ("fp8", "fp8bw"):
        a8, b8 = randn(m, k).to(torch.float8_e4m3fn), randn(n, k).to(torch.float8_e4m3fn)
        c = torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16)
        if case["family"] == "fp8":
            sa = torch.full((1, 1), 0.75, device=device)
            sb = torch.full((1, 1), 1.25, device=device)
            return dict(a=a8, b=b8, scale_a=sa, scale_b=sb, c=c), \
                dict(c=(a8.float() @ b8.float().T) * (0.75 * 1.25))
        sa = torch.rand(m, k // 128, device=device, generator=gen) + 0.5
        sb = torch.rand(n // 128, k // 128, device=device, generator=gen) + 0.5
        af = a8.float() * sa.repeat_interleave(128, 1)
        bf = b8.float() * sb.repeat_interleave(128, 0).repeat_interleave(128, 1)
        return dict(a=a8, b=b8, scale_a=sa, scale_b=sb, c=c), dict(c=af @ bf.T)
    d = case["D"]
    q, k, v, do = (randn(B, H, S, d) for _ in range(4))
    ref = attention_reference(q, k, v, do if case["family"] != "fwd" else None)
    nan = lambda *s, dt=torch.float16: torch.full(s, float("nan"), device=device, dtype=dt)  # noqa: E731
    if case["family"] == "fwd":
        return dict(q=q, k=k, v=v, o=nan(B, H, S, d), lse=nan(B, H, S, dt=torch.float32)), \
            dict(o=ref["o"], lse=ref["lse"])
    o = ref["o"].to(torch.float16)
    delta = (do.float() * o.float()).sum(-1)
    lse = ref["lse"]  # natural log, as the forward returns it
    names = dict(q=q, k=k, v=v, dout=do, lse=lse, delta=delta)
    if case["family"] == "bwd_dkdv":
        return dict(names, dk=nan(B, H, S, d), dv=nan(B, H, S, d)), \
            dict(dk=ref["dk"], dv=ref["dv"])
    return dict(names, dq=nan(B, H, S, d)), dict(dq=ref["dq"])


def measure(index: int, form: bool, log) -> dict:
    """Run the form once (checked) and time it."""
    import torch
    from triton.testing import do_bench

    from tegula.build import launch
    label, case = CASES[index]
    kernel, cx, names, _, grid = kernel_and_setup(case)
    values, want = tensors_for(case)
    args = [values[n] for n in names]
    run = lambda: launch(kernel, grid, *args, warp_specialize=form, **cx)  # noqa: E731
    run()
    torch.cuda.synchronize()
    got = dict(values)
    if case["family"] == "splitk":   # every split's partial rows written, then summed
        split = case["tiles"]["SPLIT"]
        if not torch.isfinite(values["partial"]).all():
            got["partial"] = values["partial"]
        else:
            got["partial"] = values["partial"].reshape(split, -1, values["partial"].shape[1]).sum(0)
    errors = {n: worst_error(got[n], want[n]) for n in want}
    bad = {n: e for n, e in errors.items() if not e < 2e-2}
    if bad:
        log(f"  {label} warp_specialize={form}: WRONG {bad}")
        return dict(error=f"wrong {bad}")
    ms = do_bench(run, warmup=10, rep=60)
    return dict(ms=ms, err=max(errors.values()))


def backward_jobs() -> list[tuple]:
    """(kernel name, constexprs) of every build the tuned backward entry point times at
    4x16x4096, D = 128 (its candidates' dK/dV and dQ kernels, and the preprocess)."""
    ab = importlib.import_module("tegula.kernels.attention_backward")
    jobs = [("preprocess", dict(D=128, BM=64))]
    for c in ab.backward_candidates(128):
        common = dict(D=128, SCALE=ab.default_scale(None, 128), CAUSAL=False, G=1, **c)
        jobs += [("dkdv", common), ("dq", common)]
    return jobs


def compile_backward(which: str, cx: dict) -> str:
    """Build and compile one of `backward_jobs` into the disk cache ("" or the error)."""
    from tegula.build import build
    from tegula.dtypes import f16
    from tegula.recommend import _facts
    from tegula.runtime import compile_kernel
    ab = importlib.import_module("tegula.kernels.attention_backward")
    kernel = {"preprocess": ab.attention_backward_preprocess_kernel,
              "dkdv": ab.attention_backward_dkdv_kernel,
              "dq": ab.attention_backward_dq_kernel}[which](f16)
    full = (B, H, S, 128)
    shapes = {p.name: ((B, H, S) if p.name in ("lse", "delta") else full)
              for p in kernel.params if p.kind == "tensor"}
    try:
        built = build(kernel, dict(cx), _facts(kernel, shapes), "sm_90a")
        compile_kernel(built.thread_kernel, built.target.sm)
    except Exception as err:  # noqa: BLE001 (the entry point compiles it again)
        return f"{which}: {type(err).__name__}: {err}"[:200]
    return ""


def entry_points(log, jobs: int) -> None:
    """The backward as users call it (tuned over `backward_candidates`) at 4x16x4096,
    D = 128 (q, k, v, dO random; o and lse from the float32 reference) against torch's
    cuDNN and flash backward in this process; the persistent GEMM's first candidate at
    4096^3 against cuBLAS (its warp roles did not change). Every element is checked
    before timing."""
    import torch
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from triton.testing import do_bench

    from tegula.build import launch
    from tegula.dtypes import f16
    from tegula.kernels import attention_backward
    from tegula.kernels.api_matmul import PERSISTENT
    from tegula.kernels.gemm import persistent_gemm_kernel, persistent_grid
    start = time.time()
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(jobs, mp_context=context) as pool:
        problems = [p for p in pool.map(compile_backward, *zip(*backward_jobs())) if p]
    log(f"precompiled the backward's candidates in {time.time() - start:.1f} s"
        + "".join(f"\n  {p}" for p in problems))
    gen = torch.Generator(device="cuda").manual_seed(1)
    q, k, v, do = (torch.randn(B, H, S, 128, device="cuda", generator=gen,
                               dtype=torch.float16) for _ in range(4))
    ref = attention_reference(q, k, v, do)
    o, lse = ref["o"].to(torch.float16), ref["lse"].contiguous()
    dq, dk, dv = attention_backward(q, k, v, o, lse, do)
    errs = [worst_error(g, ref[n]) for g, n in ((dq, "dq"), (dk, "dk"), (dv, "dv"))]
    ms = do_bench(lambda: attention_backward(q, k, v, o, lse, do), warmup=5, rep=100)
    flops = 2.5 * 4 * B * H * S * S * 128  # 5 gemms of 2*S*S*D
    line = (f"entry attention_backward 4x16x4096 D=128 (tuned, {time.time() - start:.0f} s "
            f"so far): {ms:.3f} ms, {flops / ms / 1e9:.0f} TFLOP/s, max rel err "
            f"{max(errs):.2e}{'' if max(errs) < 2e-2 else ' WRONG'}")
    qt, kt, vt = (t.detach().requires_grad_() for t in (q, k, v))
    for name, backend in (("cuDNN", SDPBackend.CUDNN_ATTENTION),
                          ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            with sdpa_kernel(backend):
                out = torch.nn.functional.scaled_dot_product_attention(qt, kt, vt)
                theirs = do_bench(lambda: out.backward(do, retain_graph=True), warmup=5,
                                  rep=100)
            line += f"; {name} {theirs:.3f} ms (tegula {theirs / ms:.3f}x)"
        except RuntimeError as err:
            line += f"; {name} unavailable ({str(err)[:60]})"
    log(line)
    n = GEMM_SIZE
    a, b = (torch.randn(n, n, device="cuda", generator=gen, dtype=torch.float16)
            for _ in range(2))
    c = torch.full((n, n), float("nan"), device="cuda", dtype=torch.float16)
    cfg = {key: val for key, val in PERSISTENT[0].items() if key != "kernel"}
    grid = persistent_grid(n, n, torch.cuda.get_device_properties(0).multi_processor_count,
                           cfg["BM"], cfg["BN"])
    kernel = persistent_gemm_kernel(f16)
    run = lambda: launch(kernel, grid, a, b, c, **cfg)  # noqa: E731
    run()
    err = worst_error(c, a.float() @ b.float().T)
    ms = do_bench(run, warmup=10, rep=100)
    torch_ms = do_bench(lambda: a @ b.T, warmup=10, rep=100)
    log(f"persistent GEMM {cfg} {n}^3 f16: {ms:.3f} ms, {2 * n ** 3 / ms / 1e9:.0f} "
        f"TFLOP/s; cuBLAS {torch_ms:.3f} ms; tegula {torch_ms / ms:.3f}x cuBLAS; max rel "
        f"err {err:.2e}{'' if err < 2e-2 else ' WRONG'}")


def recorded_times(path: Path) -> dict:
    """label -> {False: {"ms": one role}, True: {"ms": specialized}} from a results text
    this script printed (the last row of each label wins)."""
    times = {}
    for line in path.read_text().splitlines():
        label, rest = line[:30].strip(), line[30:].split()
        if label in dict(CASES) and len(rest) >= 3:
            try:
                times[label] = {False: dict(ms=float(rest[0])), True: dict(ms=float(rest[1]))}
            except ValueError:
                continue
    return times


def print_rows(rows: list, log) -> None:
    """The table: measured times and ratio, the model's ratio and pick, right or not."""
    log(f"{'case':30s} {'1 role ms':>9s} {'spec ms':>8s} {'spec/1role':>10s} "
        f"{'model':>6s} {'grid':>6s} {'1role blk':>9s} {'default':11s} right")
    right = decided = 0
    for label, got, model in rows:
        one, spec = got[False].get("ms"), got[True].get("ms")
        ratio = f"{spec / one:10.3f}" if one and spec else f"{'-':>10s}"
        verdict = "-"
        if one and spec:   # the model is right where it prices the faster form lower
            decided += 1
            ok = (model["model_ratio"] > 1) == (spec > one)
            right += ok
            verdict = "yes" if ok else "NO"
        log(f"{label:30s} {one or float('nan'):9.3f} {spec or float('nan'):8.3f} {ratio} "
            f"{model['model_ratio']:6.2f} {model['grid_blocks']:6d} {model['blocks']:9d} "
            f"{model['default']:11s} {verdict}")
        for form in (False, True):
            if "error" in got[form]:
                log(f"  warp_specialize={form}: {got[form]['error']}")
    log(f"the model's pick (one role where its ratio > 1) right on {right} of {decided} "
        f"cases measured both ways")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default=None, help="case indices, e.g. 0,1,7")
    parser.add_argument("--jobs", type=int, default=16)
    parser.add_argument("--entry", action="store_true")
    parser.add_argument("--one-gemm", action="store_true",
                        help="the one-gemm bodies: the README GEMM's and ONE_GEMM_CASES")
    parser.add_argument("--grid", action="store_true",
                        help="GRID_CASES: the README GEMM at small grids (session 13)")
    parser.add_argument("--recorded", default=None, metavar="TEXT",
                        help="no GPU: today's model against the times of a results text "
                             "this script printed (e.g. benchmarks/results/"
                             "h100-2026-11-25-session12-roles.txt)")
    options = parser.parse_args()

    def log(text: str) -> None:
        print(text, flush=True)

    if options.entry:
        entry_points(log, options.jobs)
        return
    grid_cases = [i for i, case in enumerate(CASES) if case in GRID_CASES]
    picked = ([int(i) for i in options.cases.split(",")] if options.cases
              else grid_cases if options.grid
              else [i for i, (_, case) in enumerate(CASES)
                    if case["family"] in ("gemm", "splitk", "fp8", "fp8bw")
                    and i not in grid_cases] if options.one_gemm
              else list(range(len(CASES))))
    if options.recorded:
        times = recorded_times(Path(options.recorded))
        picked = [i for i in picked if CASES[i][0] in times]
        print_rows([(CASES[i][0], times[CASES[i][0]], predict(i)) for i in picked], log)
        return
    start = time.time()
    context = multiprocessing.get_context("spawn")
    jobs = [(i, f) for i in picked for f in (False, True)]
    with concurrent.futures.ProcessPoolExecutor(options.jobs, mp_context=context) as pool:
        compiled = list(pool.map(compile_case, *zip(*jobs)))
        predicted = list(pool.map(predict, picked))
    log(f"compiled {len(jobs)} builds in {time.time() - start:.1f} s")
    rows = []
    for i, model in zip(picked, predicted):
        got = {}
        for form in (False, True):
            problem = compiled[jobs.index((i, form))]
            got[form] = dict(error=problem) if problem else measure(i, form, log)
        rows.append((CASES[i][0], got, model))
    print_rows(rows, log)


if __name__ == "__main__":
    main()
