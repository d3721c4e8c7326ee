"""Blockwise (DeepSeek-V3) FP8 GEMM against tegula's per-tensor FP8 and torch._scaled_mm,
in one process (session 10, issue 10):

    PYTHONPATH=. python3 benchmarks/fp8_blockwise.py [--moe] [--variants]

For 4096^3, 8192^3 and 4096x7168x2048: torch._scaled_mm (per-tensor), tegula's per-tensor
persistent kernel (128x256x128, the session-9 winner), the one-block-per-tile blockwise
kernel and the persistent warp-specialized blockwise kernel in several tilings. Blockwise
scales are random over two decades (1x128 for a, 128x128 for b), outputs NaN-poisoned and
checked against a float32 reference of the same e4m3 inputs and scales (relative
Frobenius error). `--moe`: the MoE grouped GEMM's 64-expert top-6 case (balanced) in
several tilings against dense cuBLAS at equal FLOPs. `--variants`: the measurement-only
variants of `benchmarks/fp8_blockwise_variants.py` (instead of the FP8 rows); `--ceilings`:
per-tensor ceilings of other tiles (`CEILINGS`); `--wide`: the library's blockwise kernel on
wider tiles with per-column b scales (`WIDE`); `--turns`: two consumer warpgroups taking
turns in the K loop (`TURNS`); `--pairs`: two K blocks an iteration (`PAIRS`); `--twin`:
two K blocks a stage, both in flight (`TWIN`). A table last (TFLOP/s; nothing is
asserted about time).
"""
from __future__ import annotations

import sys
import time

import torch
from triton.testing import do_bench

import tegula as tg

START = time.time()
SHAPES = [(4096, 4096, 4096), (8192, 8192, 8192), (4096, 7168, 2048)]
#: Per-tensor persistent: the session-9 winner first (the ratios' base), then the same
#: 128x128 tile as the blockwise kernel's.
PER_TENSOR = [dict(BM=128, BN=256, BK=128, STAGES=3, GROUP=8, threads=256),
              dict(BM=128, BN=128, BK=128, STAGES=4, GROUP=8, threads=256)]
BLOCKWISE_TILES = dict(BM=128, BN=128, STAGES=4, threads=256)
#: Rounds 1-2 (session 10, TFLOP/s at 4096^3 / 8192^3 / 4096x7168x2048): 128x128 on two
#: consumer warpgroups 927-949 / 863-878 / 876-901; 192x128 on three 948 / 1014 / 957 (3
#: stages; 4: 825 / 894 / 930). Slower, dropped: scales carried a K block ahead (815 / 816 /
#: 731), promotion a block late (800 / 783 / 755), two K blocks a stage (879-928 / 871-903 /
#: 820-868), 2-CTA clusters (no gain), 128x256 as two column parts (341-399, spills).
#: Session 14 round 1 (x per-tensor 128x256, 4096^3 / 8192^3 / 4096x7168x2048): 192x128
#: S3 0.72 / 0.76 / 0.82; 128x128 S4 0.72 / 0.67 / 0.78; TWIN=1 128x128 S3 0.73 / 0.72 /
#: 0.79 (S2 0.71 / 0.72 / 0.77, S3 C2 0.72 / 0.70 / 0.78); per-tensor 128x128 0.91 /
#: 0.97 / 0.97.
BLOCKWISE_PERSISTENT = [dict(BM=192, BN=128, STAGES=3, GROUP=8, threads=384),
                        dict(BM=128, BN=128, STAGES=4, GROUP=8, threads=256),
                        dict(BM=128, BN=128, STAGES=3, GROUP=8, threads=256, TWIN=1)]


def bench(fn) -> float:
    return do_bench(fn, warmup=10, rep=40, return_mode="median")


def fp8_rows(budget: float) -> list[tuple[str, str]]:
    from tegula.kernels import fp8
    from tegula.kernels.gemm import persistent_grid
    rows, out_t = [], tg.bf16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m, n, k in SHAPES:
        if time.time() - START > budget:
            rows.append((f"{m}x{n}x{k}", "skipped (time)"))
            continue
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = (torch.randn(m, k, device="cuda", generator=g) * 4).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device="cuda", generator=g) * 4).to(torch.float8_e4m3fn)
        sa = torch.tensor([[0.5]], device="cuda")
        sb = torch.tensor([[0.25]], device="cuda")
        block_a = 10 ** (torch.rand(m, k // 128, device="cuda", generator=g) * 2 - 1)
        block_b = 10 ** (torch.rand(tg.cdiv(n, 128), k // 128, device="cuda", generator=g) * 2 - 1)
        flops = 2 * m * n * k
        ref_tensor = (a.float() @ w.float().T) * 0.125
        a_scaled = a.float() * block_a.repeat_interleave(128, 1)
        w_scaled = w.float() * block_b.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
        ref_block = a_scaled @ w_scaled.T
        del a_scaled, w_scaled
        ms = bench(lambda: torch._scaled_mm(a, w.T, sa.view(()), sb.view(()),
                                            out_dtype=torch.bfloat16))
        base = flops / ms / 1e9
        rows.append((f"{m}x{n}x{k} _scaled_mm", f"{base:.0f} TFLOP/s"))
        runs = [(f"per-tensor persistent {c['BM']}x{c['BN']}", fp8.fp8_persistent_gemm_kernel(out_t),
                 persistent_grid(m, n, sms, c["BM"], c["BN"]), (sa, sb), c, ref_tensor)
                for c in PER_TENSOR]
        runs.append(("blockwise tiles 128x128 S4", fp8.fp8_blockwise_gemm_kernel(out_t),
                     (tg.cdiv(m, 128), tg.cdiv(n, 128)), (block_a, block_b), BLOCKWISE_TILES,
                     ref_block))
        for c in BLOCKWISE_PERSISTENT:
            runs.append((f"blockwise persistent {c['BM']}x{c['BN']} S{c['STAGES']} "
                         f"G{c['GROUP']} C{c.get('CLUSTER', 1)}"
                         + (" TWIN" if c.get("TWIN") else ""),
                         fp8.fp8_blockwise_persistent_kernel(out_t),
                         persistent_grid(m, n, sms, c["BM"], c["BN"], c.get("CLUSTER", 1)),
                         (block_a, block_b), c, ref_block))
        import tegula.kernels as tk

        def entry(a, w, s1, s2, c, **_):      # matmul_fp8 as users call it (autotuned)
            return tk.matmul_fp8(a, w.T, s1, s2, torch.bfloat16, True, out=c)
        runs.append(("blockwise tk.matmul_fp8 (autotuned)", {(): entry}, (),  # entry[()]: as
                     (block_a, block_b), {}, ref_block))                    # a kernel[grid]
        per_tensor = None
        for name, kernel, grid, (s1, s2), cfg, ref in runs:
            label = f"{m}x{n}x{k} {name}"
            if time.time() - START > budget:
                rows.append((label, "skipped (time)"))
                continue
            try:
                c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                kernel[grid](a, w, s1, s2, c, **cfg)
                torch.cuda.synchronize()
                err = float((c.float() - ref).norm() / ref.norm())
                nans = int(torch.isnan(c).sum())
                ms = bench(lambda: kernel[grid](a, w, s1, s2, c, **cfg))
                tf = flops / ms / 1e9
                per_tensor = per_tensor or tf
                rows.append((label, f"{tf:.0f} TFLOP/s = {tf / base:.2f}x _scaled_mm = "
                             f"{tf / per_tensor:.2f}x per-tensor, rel err {err:.1e}, "
                             f"{nans} NaN"))
            except Exception as e:  # report and go on
                rows.append((label, f"FAILED {type(e).__name__}: {e}"[:200]))
            print(rows[-1], f"t={time.time() - START:.0f}s", flush=True)
    return rows


#: Session 11 round 1: what keeps blockwise below per-tensor (`fp8_blockwise_variants`):
#: (label, mode, config, scale layout). "unit" runs with every scale 1 (the ablations are
#: right only then), "colmajor" passes scale_a as a column-major (M, K/128) view.
_T192 = dict(BM=192, BN=128, STAGES=3, GROUP=8, threads=384)
_T128 = dict(BM=128, BN=128, STAGES=4, GROUP=8, threads=256)
_T256 = dict(BM=256, BN=128, STAGES=3, GROUP=8, threads=256)
VARIANTS = [("base 192x128 S3", "base", _T192, "random"),
            ("ahead 192x128 S3", "ahead", _T192, "random"),
            ("tilescale 192x128 S3 (no loads in the K loop)", "tilescale", _T192, "unit"),
            ("halves 256x128 S3 (repeated wait)", "halves", _T256, "random"),
            ("halves 256x128 S3 (membar instead)", "halves_membar", _T256, "random"),
            ("per-tensor 256x128 S3 (same tile, no promotion)", None, {**_T256, "BK": 128}, "unit"),
            ("per-tensor 192x128 S3 (same tile, no promotion)", None, {**_T192, "BK": 128}, "unit"),
            ("ahead 128x128 S4", "ahead", _T128, "random"),
            ("base 128x128 S4", "base", _T128, "random"),
            ("ahead 192x128 S4", "ahead", {**_T192, "STAGES": 4}, "random"),
            ("ahead 192x128 S3 C2", "ahead", {**_T192, "CLUSTER": 2}, "random"),
            ("halves 256x128 S4 (repeated wait)", "halves", {**_T256, "STAGES": 4}, "random"),
            ("ahead 128x128 S6", "ahead", {**_T128, "STAGES": 6}, "random"),
            ("per-tensor 128x128 S4 (same tile, no promotion)", None, {**_T128, "BK": 128}, "unit"),
            ("per-tensor 192x128 S3 C2", None, {**_T192, "BK": 128, "CLUSTER": 2}, "unit"),
            ("ahead 192x128 S3 colmajor scale_a", "ahead", _T192, "colmajor")]


#: Session 11 round 2: round 1 found blockwise 192x128 at its tile's per-tensor ceiling
#: (0.90-1.00x) and that ceiling low (0.74-0.83x the per-tensor 128x256); the per-tensor
#: ceilings of the 2-warpgroup tiles whose blockwise form fits the registers (an f32
#: accumulator and a product a thread: m64n160/n192, not n224 or n256), with the
#: library's blockwise 192x128 as the reference row.
CEILINGS = [("blockwise 192x128 S3 (the library's)", "base", _T192, "random"),
            ("per-tensor 192x128 S3", None, {**_T192, "BK": 128}, "unit"),
            ("per-tensor 128x192 S3", None, {**_T128, "BN": 192, "BK": 128, "STAGES": 3}, "unit"),
            ("per-tensor 128x192 S4", None, {**_T128, "BN": 192, "BK": 128}, "unit"),
            ("per-tensor 128x160 S4", None, {**_T128, "BN": 160, "BK": 128}, "unit"),
            ("per-tensor 128x224 S3", None, {**_T128, "BN": 224, "BK": 128, "STAGES": 3}, "unit"),
            ("per-tensor 256x128 S3", None, {**_T256, "BK": 128}, "unit"),
            ("per-tensor 128x128 S4", None, {**_T128, "BK": 128}, "unit")]


#: Session 12: the library's blockwise kernel ("library": `blockwise_product`, whose
#: promotion takes a per-column b scale, one of two, where BN does not divide 128) on the
#: 2-warpgroup tiles whose per-tensor ceiling is above 192x128's, beside those ceilings.
#: Round 1 (H100, 4096^3 / 8192^3 / 4096x7168x2048, x per-tensor 128x256): 192x128 S3
#: 0.73 / 0.70 / 0.88; 128x192 S3 0.63 / 0.63 / 0.76 (S4 0.60 / 0.59 / 0.73, S5 0.62 /
#: 0.61 / 0.73, S4 C2 0.60 / 0.61 / 0.72); per-tensor 128x192 S4 0.91 / 0.98 / 1.08.
WIDE = [("blockwise 192x128 S3 (session 11's pick)", "library", _T192, "random"),
        ("blockwise 128x192 S4", "library", {**_T128, "BN": 192}, "random"),
        ("blockwise 128x192 S3", "library", {**_T128, "BN": 192, "STAGES": 3}, "random"),
        ("blockwise 128x192 S4 C2", "library", {**_T128, "BN": 192, "CLUSTER": 2}, "random"),
        ("blockwise 128x192 S5", "library", {**_T128, "BN": 192, "STAGES": 5}, "random"),
        ("per-tensor 128x192 S4 (ceiling)", None, {**_T128, "BN": 192, "BK": 128}, "unit")]


#: Session 13: the two consumer warpgroups of a 128-row tile taking turns at the tensor
#: cores in the K loop (`fp8_blockwise_variants.install_one_gemm_turns`; "turns" rows run
#: consumers="pingpong", their A/B partner "cooperative"), persistent ("library") and one
#: block per tile ("staged"), against the library's 192x128 on three warpgroups.
#: Round 1 (H100, x per-tensor 128x256 at 4096^3 / 8192^3 / 4096x7168x2048): library
#: 192x128 0.72 / 0.78 / 0.87; 128x192 S3 turns 0.70 / 0.78 / 0.82 (cooperative 0.63 /
#: 0.72 / 0.75; S4 turns 0.71 / 0.77 / 0.83); 128x128 S4 turns 0.63 / 0.61 / 0.79, slower
#: than cooperative 0.71 / 0.68 / 0.81 (a warpgroup's wgmma drain, promotion and turn sync
#: outlast the other's 256-cycle K block); staged 128x192 S4 turns 0.62 / 0.70 / 0.68;
#: per-tensor ceilings 128x192 0.92 / 1.02 / 1.05, 128x128 0.92 / 0.96 / 1.01.
_P2 = dict(BM=128, GROUP=8, threads=256)
TURNS = [("blockwise 192x128 S3 (the library's)", "library", _T192, "random"),
         ("blockwise 128x128 S4 cooperative", "library", {**_P2, "BN": 128, "STAGES": 4,
                                                          "consumers": "cooperative"}, "random"),
         ("blockwise 128x128 S4 turns", "library", {**_P2, "BN": 128, "STAGES": 4,
                                                    "consumers": "pingpong"}, "random"),
         ("blockwise 128x192 S3 cooperative", "library", {**_P2, "BN": 192, "STAGES": 3,
                                                          "consumers": "cooperative"}, "random"),
         ("blockwise 128x192 S3 turns", "library", {**_P2, "BN": 192, "STAGES": 3,
                                                    "consumers": "pingpong"}, "random"),
         ("blockwise 128x192 S4 turns", "library", {**_P2, "BN": 192, "STAGES": 4,
                                                    "consumers": "pingpong"}, "random"),
         ("blockwise 128x128 S5 turns", "library", {**_P2, "BN": 128, "STAGES": 5,
                                                    "consumers": "pingpong"}, "random"),
         ("blockwise staged 128x192 S4 turns", "staged", {**_P2, "BN": 192, "STAGES": 4,
                                                          "consumers": "pingpong"}, "random"),
         ("per-tensor 128x192 S4 (ceiling)", None, {**_T128, "BN": 192, "BK": 128}, "unit"),
         ("per-tensor 128x128 S4 (ceiling)", None, {**_T128, "BK": 128}, "unit")]


#: Session 13 round 2: two K blocks an iteration, each promoted while the other's wgmmas
#: run ("pairs", `fp8_blockwise_variants.pairs_product`), on two cooperative consumer
#: warpgroups, against the library's pick and round 1's best turns tile.
PAIRS = [("blockwise 192x128 S3 (the library's)", "library", _T192, "random"),
         ("blockwise pairs 128x128 S2", "pairs", {**_P2, "BN": 128, "STAGES": 2}, "random"),
         ("blockwise pairs 128x128 S3", "pairs", {**_P2, "BN": 128, "STAGES": 3}, "random"),
         ("blockwise 128x192 S3 turns", "library", {**_P2, "BN": 192, "STAGES": 3,
                                                    "consumers": "pingpong"}, "random")]


#: Session 14: two K blocks a stage, both products fresh and issued back to back, the
#: first promoted while the second's wgmmas run (TWIN=1, `fp8.twin_blockwise_product`;
#: the products cleared by `scale_d` 0, `lower/fresh_accumulators.py`, so ptxas keeps both
#: in flight), on two cooperative consumer warpgroups at 128x128, against the library's
#: 192x128 and the same tile one K block a stage.
TWIN = [("blockwise 192x128 S3 (the library's)", "library", _T192, "random"),
        ("blockwise 128x128 S4 (one K block a stage)", "library", _T128, "random"),
        ("blockwise twin 128x128 S2", "library", {**_T128, "STAGES": 2, "TWIN": 1}, "random"),
        ("blockwise twin 128x128 S3", "library", {**_T128, "STAGES": 3, "TWIN": 1}, "random"),
        ("blockwise twin 128x128 S3 C2", "library", {**_T128, "STAGES": 3, "TWIN": 1,
                                                      "CLUSTER": 2}, "random"),
        ("per-tensor 128x128 S4 (ceiling)", None, {**_T128, "BK": 128}, "unit")]


def variant_rows(budget: float, variants: list) -> list[tuple[str, str]]:
    """`variants` at every shape, against the per-tensor 128x256 kernel in the same process;
    every output NaN-poisoned and checked against a float32 reference of its scales."""
    from fp8_blockwise_variants import (install_one_gemm_turns, install_split_halves,
                                        variant_kernel)
    install_split_halves()
    install_one_gemm_turns()
    from tegula.kernels import fp8
    from tegula.kernels.gemm import persistent_grid
    rows, out_t = [], tg.bf16
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for m, n, k in SHAPES:
        g = torch.Generator(device="cuda").manual_seed(m + n + k)
        a = (torch.randn(m, k, device="cuda", generator=g) * 4).to(torch.float8_e4m3fn)
        w = (torch.randn(n, k, device="cuda", generator=g) * 4).to(torch.float8_e4m3fn)
        block_a = 10 ** (torch.rand(m, k // 128, device="cuda", generator=g) * 2 - 1)
        block_b = 10 ** (torch.rand(tg.cdiv(n, 128), k // 128, device="cuda", generator=g) * 2 - 1)
        ones_a, ones_b = torch.ones_like(block_a), torch.ones_like(block_b)
        scales = {"random": (block_a, block_b), "unit": (ones_a, ones_b),
                  "colmajor": (block_a.t().contiguous().t(), block_b)}
        ref_unit = a.float() @ w.float().T
        ref_block = (a.float() * block_a.repeat_interleave(128, 1)) @ \
            (w.float() * block_b.repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)).T
        flops, base = 2 * m * n * k, None
        c_cfg = PER_TENSOR[0]
        runs = [("per-tensor persistent 128x256", fp8.fp8_persistent_gemm_kernel(out_t), c_cfg,
                 (torch.ones(1, 1, device="cuda"),) * 2, ref_unit)]
        for label, mode, cfg, layout in variants:
            kernel = fp8.fp8_persistent_gemm_kernel(out_t) if mode is None else \
                fp8.fp8_blockwise_persistent_kernel(out_t) if mode == "library" else \
                fp8.fp8_blockwise_gemm_kernel(out_t) if mode == "staged" else \
                variant_kernel(out_t, mode)
            if mode == "staged":     # one block per tile: the grid is the tiles
                cfg = {key: v for key, v in cfg.items() if key != "GROUP"}
            s = (torch.ones(1, 1, device="cuda"),) * 2 if mode is None else scales[layout]
            runs.append((label, kernel, cfg, s, ref_block if layout != "unit" else ref_unit))
        for label, kernel, cfg, (s1, s2), ref in runs:
            label = f"{m}x{n}x{k} {label}"
            if time.time() - START > budget:
                rows.append((label, "skipped (time)"))
                continue
            try:
                grid = persistent_grid(m, n, sms, cfg["BM"], cfg["BN"], cfg.get("CLUSTER", 1)) \
                    if "GROUP" in cfg or "BK" in cfg else (tg.cdiv(m, cfg["BM"]), tg.cdiv(n, cfg["BN"]))
                c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
                kernel[grid](a, w, s1, s2, c, **cfg)
                torch.cuda.synchronize()
                err = float((c.float() - ref).norm() / ref.norm())
                nans = int(torch.isnan(c).sum())
                tf = flops / bench(lambda: kernel[grid](a, w, s1, s2, c, **cfg)) / 1e9
                base = base or tf
                rows.append((label, f"{tf:.0f} TFLOP/s = {tf / base:.2f}x per-tensor 128x256, "
                             f"rel err {err:.1e}, {nans} NaN"))
            except Exception as e:  # report and go on
                rows.append((label, f"FAILED {type(e).__name__}: {e}"[:200]))
            print(rows[-1], f"t={time.time() - START:.0f}s", flush=True)
    return rows


#: The 64-expert case: N = 1408 is 5.5 tiles of 256 (a ninth of the last wave's MMA
#: wasted) or exactly 8 of 176 (wgmma n176) or 11 of 128, or 6 of 240 (2% wasted); GROUP 3
#: puts one expert's three 128-row tiles (384 rows each, balanced) in a band. 64-row tiles
#: on one warpgroup (threads=128, unstaged) run ping-pong: one consumer warpgroup's
#: epilogue overlaps the other's main loop (K = 2048 is 32 k-steps a tile).
#: Rounds 1-2 (session 10, dense 723-730 TFLOP/s): 128x256 in bands of 8 row tiles 515,
#: 128x176 in bands of 8 530, of 3 (one expert) 554-555 (0.77x), of 6 544, of 1 538;
#: 128x176 3 stages 479, BK 128 386; 128x240 506-522, 128x128 503-527; ping-pong 64x256 437
#: / 64x176 479. ncu (128x176, bands of 3): 263 us, 479 MB from DRAM (61% of its peak),
#: tensor pipe 77% active. Round 3: 192-row tiles on three consumer warpgroups (an
#: expert's 384 rows are two of them).
MOE_CONFIGS = [dict(BM=128, BN=176, BK=64, STAGES=4, GROUP=3, threads=256, STAGED=True),
               dict(BM=192, BN=176, BK=64, STAGES=3, GROUP=2, threads=384, STAGED=True)]


def moe_rows(budget: float) -> list[tuple[str, str]]:
    from tegula.bench.moe import make_problem, reference
    from tegula.kernels import moe
    rows = []
    tokens, k, experts, kdim, n = 4096, 6, 64, 2048, 1408
    p = make_problem(torch, tokens, k, experts, kdim, n, True)
    xs, w, offsets = p["x_sorted"], p["w"], p["routing"].expert_offsets
    ref = reference(torch, xs, w, offsets.tolist())
    flops = 2.0 * xs.shape[0] * n * kdim
    a = torch.randn(xs.shape[0], kdim, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(kdim, n, device="cuda", dtype=torch.bfloat16)
    dense = flops / bench(lambda: a @ b) / 1e9
    rows.append(("e64-k6 dense cuBLAS", f"{dense:.0f} TFLOP/s"))
    for cfg in MOE_CONFIGS:
        label = "e64-k6 " + " ".join(f"{key}={v}" for key, v in cfg.items()
                                     if key != "threads")
        if time.time() - START > budget:
            rows.append((label, "skipped (time)"))
            continue
        try:
            out = torch.full((xs.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
            moe.moe_gemm(xs, w, offsets, out=out, config=cfg)
            torch.cuda.synchronize()
            err = float((out.float() - ref).abs().max() / ref.abs().max())
            nans = int(torch.isnan(out).sum())
            tf = flops / bench(lambda: moe.moe_gemm(xs, w, offsets, out=out, config=cfg)) / 1e9
            rows.append((label, f"{tf:.0f} TFLOP/s = {tf / dense:.2f}x dense, max err "
                         f"{err:.1e}, {nans} NaN"))
        except Exception as e:
            rows.append((label, f"FAILED {type(e).__name__}: {e}"[:200]))
        print(rows[-1], f"t={time.time() - START:.0f}s", flush=True)
    rows += moe_bench_rows(budget)
    return rows


def moe_bench_rows(budget: float) -> list[tuple[str, str]]:
    """`tegula bench moe`'s three balanced bf16 cases (`bench.moe.bench_case`: moe_gemm
    autotuned as users call it, checked against the torch loop, L2 flushed clean; dense
    cuBLAS at equal FLOPs), while the budget lasts."""
    from tegula.bench.moe import CASES, bench_case
    rows = []
    for label, *dims in CASES[2:] + CASES[:2]:     # the 64-expert case first
        if time.time() - START > budget:
            rows.append((f"{label} bench moe", "skipped (time)"))
            continue
        res = bench_case(torch, label, tuple(dims), True, False, None, None, "clean")["results"]
        if "tflops" not in res["tegula"]:
            rows.append((f"{label} bench moe (autotuned)", str(res["tegula"])))
        else:
            t, d = res["tegula"]["tflops"], res["dense"]["tflops"]
            rows.append((f"{label} bench moe (autotuned)", f"{t:.0f} TFLOP/s = {t / d:.2f}x "
                         f"dense ({d:.0f}), max err {res['tegula']['rel_err']:.1e}"))
        print(rows[-1], f"t={time.time() - START:.0f}s", flush=True)
    return rows


def profile_once() -> None:
    """`--profile`: one launch each (after a warm-up) of the e64 MoE GEMM at 128x176 GROUP
    3 and of the persistent blockwise kernel at 4096^3 in 128x128 tiles (two consumer
    warpgroups) and 192x128 (three), for ncu to measure (`--kernel-name regex:moe_gemm|fp8_blockwise`)."""
    from tegula.bench.moe import make_problem
    from tegula.kernels import fp8, moe
    from tegula.kernels.gemm import persistent_grid
    p = make_problem(torch, 4096, 6, 64, 2048, 1408, True)
    for _ in range(2):
        moe.moe_gemm(p["x_sorted"], p["w"], p["routing"].expert_offsets, config=MOE_CONFIGS[0])
    m = n = k = 4096
    a = (torch.randn(m, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    w = (torch.randn(n, k, device="cuda") * 4).to(torch.float8_e4m3fn)
    sa, sb = torch.ones(m, k // 128, device="cuda"), torch.ones(n // 128, k // 128, device="cuda")
    c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for cfg in BLOCKWISE_PERSISTENT[:2]:
        for _ in range(2):
            fp8.fp8_blockwise_persistent_kernel(tg.bf16)[persistent_grid(
                m, n, sms, cfg["BM"], cfg["BN"])](a, w, sa, sb, c, **cfg)
    torch.cuda.synchronize()


def main() -> None:
    if "--profile" in sys.argv:
        return profile_once()
    print(torch.cuda.get_device_name(), torch.__version__, time.strftime("%Y-%m-%d %H:%M"))
    rows = []
    budget = float(sys.argv[sys.argv.index("--budget") + 1]) if "--budget" in sys.argv else 600
    lists = {"--variants": VARIANTS, "--ceilings": CEILINGS, "--wide": WIDE, "--turns": TURNS,
             "--pairs": PAIRS, "--twin": TWIN}
    chosen = [v for flag, v in lists.items() if flag in sys.argv]
    if chosen:
        rows += variant_rows(budget, chosen[0])
    elif "--fp8" in sys.argv or "--moe" not in sys.argv:
        rows += fp8_rows(budget)
    if "--moe" in sys.argv:
        rows += moe_rows(float(sys.argv[sys.argv.index("--moe-budget") + 1])
                         if "--moe-budget" in sys.argv else 600)
    print_table(rows)


def print_table(rows: list[tuple[str, str]]) -> None:
    """The round's short table, printed last: one (name, value) row a line, names aligned."""
    width = max(len(r[0]) for r in rows)
    print("== table")
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


if __name__ == "__main__":
    main()
