"""`python -m tegula.bench moe`: the MoE grouped GEMM against a Triton grouped GEMM and
against dense cuBLAS at equal FLOPs.

For each case (tokens T, top-k, experts E, K, N) the routing is random or balanced (every
expert gets T·k / E rows), the rows are sorted by expert (`tegula.kernels.moe`), and three
things run on the same sorted problem:

* tegula: `tegula.kernels.moe.moe_gemm` (bf16, or FP8 weights with `--fp8`), one config
  or autotuned; with `--w4`, 4-bit weights (`moe_w4.moe_gemm_w4a16`, group 128 with zero
  points, pre-packed once in the MMA fragment's order — `pack_experts_fragments` — as a
  model loader would; its default tiles or `--config`), checked against the dequantized
  weights;
* triton: `grouped_gemm_triton` below, a Triton grouped GEMM in one launch: program v
  of each column is *virtual* row tile v, expert e owning `offsets[e] // BM + e …` (so
  the grid comes from shapes alone; tiles past an expert's rows exit), the expert found
  by comparing v against every expert's start at once; grouped tile order,
  BM×BN×BK = 128×128×64, 4 stages, 8 warps — the kind of kernel vLLM's fused MoE is;
* dense: `torch.matmul` of a (T·k, K) by (K, N) bf16 operand, the same FLOPs in one
  cuBLAS GEMM: the ceiling the issue compares against (≥ 0.8× with balanced routing).

Every result is checked against a torch loop over experts (f32) before timing; rates are
TFLOP/s of the useful work (2·T·k·N·K).
"""
from __future__ import annotations

import argparse
from typing import Any

from tegula.bench.gpu import gpu_info, load_torch, no_gpu, time_ms, write_record

#: (label, tokens, k, experts, K, N): Mixtral 8x7B's up projection (w1/w3 as one 2·14336
#: weight is the same GEMM twice as wide), its down projection, and a many-expert model.
CASES = [("mixtral-up", 4096, 2, 8, 4096, 14336),
         ("mixtral-down", 4096, 2, 8, 14336, 4096),
         ("e64-k6", 4096, 6, 64, 2048, 1408)]
QUICK = CASES[:1]


def grouped_gemm_triton():
    """The Triton kernel (built on first use: triton is imported only when it runs)."""
    import triton
    import triton.language as tl

    @triton.jit
    def kernel(x, w, offsets, out, N, K, tiles_v, tiles_n, E: tl.constexpr,
               E_POW2: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
               GROUP: tl.constexpr):
        pid = tl.program_id(0)                 # grouped order, as Triton's matmul tutorial
        band = pid // (GROUP * tiles_n)
        first_v = band * GROUP
        rows_in_band = min(tiles_v - first_v, GROUP)
        v = first_v + (pid % (GROUP * tiles_n)) % rows_in_band
        n = (pid % (GROUP * tiles_n)) // rows_in_band
        js = tl.arange(0, E_POW2)
        starts = tl.load(offsets + js, mask=js < E, other=0) // BM + js
        e = tl.sum(((starts <= v) & (js >= 1) & (js < E)).to(tl.int32), axis=0)
        r0, r1 = tl.load(offsets + e), tl.load(offsets + e + 1)
        m = v - (r0 // BM + e)
        if m * BM < r1 - r0:
            rows = r0 + m * BM + tl.arange(0, BM)
            cols = n * BN + tl.arange(0, BN)
            ks = tl.arange(0, BK)
            a_ptr = x + rows[:, None].to(tl.int64) * K + ks[None, :]
            b_ptr = w + e.to(tl.int64) * N * K + cols[None, :].to(tl.int64) * K + ks[:, None]
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for k0 in range(0, K, BK):
                a = tl.load(a_ptr, mask=(rows[:, None] < r1) & (ks[None, :] + k0 < K), other=0.0)
                b = tl.load(b_ptr, mask=(cols[None, :] < N) & (ks[:, None] + k0 < K), other=0.0)
                acc = tl.dot(a, b, acc)
                a_ptr += BK
                b_ptr += BK
            o_ptr = out + rows[:, None].to(tl.int64) * N + cols[None, :]
            tl.store(o_ptr, acc.to(out.dtype.element_ty),
                     mask=(rows[:, None] < r1) & (cols[None, :] < N))

    def run(x, w, offsets, out, BM=128, BN=128, BK=64, stages=4, warps=8, group=8):
        experts, n, k = w.shape
        tiles_v, tiles_n = x.shape[0] // BM + experts, triton.cdiv(n, BN)
        kernel[(tiles_v * tiles_n,)](x, w, offsets, out, n, k, tiles_v, tiles_n, E=experts,
                                     E_POW2=triton.next_power_of_2(experts), BM=BM, BN=BN,
                                     BK=BK, GROUP=group, num_stages=stages, num_warps=warps)
        return out
    return run


def make_problem(torch: Any, tokens: int, k: int, experts: int, kdim: int, n: int,
                 balanced: bool, seed: int = 0) -> dict:
    """Inputs of one case on the GPU: x (T, K), w (E, N, K), the routing and x sorted."""
    from tegula.kernels import moe
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(tokens, kdim, device="cuda", dtype=torch.bfloat16, generator=g)
    w = torch.randn(experts, n, kdim, device="cuda", dtype=torch.bfloat16, generator=g)
    w = w * kdim ** -0.5
    if balanced:  # token t's j-th choice: expert (t·k + j) mod E, so every expert gets T·k/E
        ids = (torch.arange(tokens * k, device="cuda") % experts).view(tokens, k)
    else:
        logits = torch.randn(tokens, experts, device="cuda", generator=g)
        ids, _ = moe.route(logits, k)
    routing = moe.sort_by_expert(ids.to(torch.int32), experts)
    return dict(x=x, w=w, routing=routing, x_sorted=moe.scatter_rows(x, routing))


def reference(torch: Any, x_sorted: Any, w: Any, offsets: list[int]) -> Any:
    """The torch loop over experts, in f32."""
    out = torch.empty(x_sorted.shape[0], w.shape[1], device="cuda", dtype=torch.float32)
    for e in range(w.shape[0]):
        a, b = offsets[e], offsets[e + 1]
        out[a:b] = x_sorted[a:b].float() @ w[e].float().T
    return out


#: The group size of `--w4`'s 4-bit weights.
W4_GROUP = 128


def dequantized_w4(torch: Any, packed: Any, scales: Any, zeros: Any) -> Any:
    """The f32 (E, N, K) weights that `moe_w4`'s packed ones stand for (on the GPU)."""
    from tegula.kernels.quant import unpack_w4
    zero = 8.0 if zeros is None else zeros.float().repeat_interleave(W4_GROUP, -1)
    return (unpack_w4(packed).float() - zero) * scales.float().repeat_interleave(W4_GROUP, -1)


def bench_case(torch: Any, label: str, dims: tuple, balanced: bool, fp8: bool,
               config: dict | None, triton_run: Any, flush: str, w4: bool = False) -> dict:
    """One case: check tegula and Triton against the torch loop, then time all three
    (`fp8` / `w4`: tegula with quantized weights, checked against what they stand for;
    no Triton run)."""
    from tegula.kernels import moe, moe_w4
    tokens, k, experts, kdim, n = dims
    p = make_problem(torch, tokens, k, experts, kdim, n, balanced)
    xs, w, offsets = p["x_sorted"], p["w"], p["routing"].expert_offsets
    rows, flops = xs.shape[0], 2.0 * xs.shape[0] * n * kdim
    host_offsets = offsets.tolist()
    w_scale = None

    def run():
        return moe.moe_gemm(xs, w, offsets, w_scale, config=config)
    if fp8:
        w, w_scale = moe.quantize_experts_fp8(w)
        ref = reference(torch, xs, (w.float() * w_scale[:, None, None]).to(torch.bfloat16),
                        host_offsets)
    elif w4:
        from tegula.kernels.moe_w4_fragment import pack_experts_fragments
        packed, scales, zeros = moe_w4.quantize_experts_w4(w, W4_GROUP)
        ref = reference(torch, xs, dequantized_w4(torch, packed, scales, zeros), host_offsets)
        stored = pack_experts_fragments(packed)     # once per weight, as a model loader would
        # written into NaNs: the check below sees any element left unwritten
        out_w4 = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)

        def run():
            return moe_w4.moe_gemm_w4a16(xs, stored, scales, zeros, W4_GROUP, offsets,
                                         config=config, out=out_w4)
    else:
        ref = reference(torch, xs, w, host_offsets)
    record = {"label": label, "dims": dims, "balanced": balanced, "fp8": fp8, "w4": w4,
              "results": {}}

    def check(name: str, out: Any, tol: float) -> bool:
        err = ((out.float() - ref).abs().max() / ref.abs().max()).item()
        ok = err < tol and not torch.isnan(out).any().item()
        record["results"][name] = {"rel_err": err, "status": "ok" if ok else "WRONG"}
        return ok

    impls = {"tegula": run}
    if triton_run is not None and not fp8 and not w4:
        out_t = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
        impls["triton"] = lambda: triton_run(xs, w, offsets, out_t)
    for name, fn in impls.items():
        if check(name, fn(), 0.05 if fp8 else 0.01):   # w4: the reference is its weights
            record["results"][name]["tflops"] = flops / time_ms(fn, flush=flush) / 1e9
    a = torch.randn(rows, kdim, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(kdim, n, device="cuda", dtype=torch.bfloat16)
    record["results"]["dense"] = {"status": "ok",
                                  "tflops": flops / time_ms(lambda: a @ b, flush=flush) / 1e9}
    return record


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tegula.bench moe", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="the first case only")
    weights = parser.add_mutually_exclusive_group()
    weights.add_argument("--fp8", action="store_true", help="FP8 e4m3 weights")
    weights.add_argument("--w4", action="store_true",
                        help=f"4-bit weights (group {W4_GROUP}, zero points)")
    parser.add_argument("--random", action="store_true",
                        help="random routing (default: balanced)")
    parser.add_argument("--config", default=None,
                        help="one tegula config, e.g. BM=128,BN=256,BK=64,STAGES=4,"
                             "threads=256 (default: autotuned)")
    parser.add_argument("--no-triton", action="store_true")
    parser.add_argument("--flush", default="clean", choices=("clean", "dirty"))
    parser.add_argument("--out", default=None)
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    torch, why = load_torch("moe")
    if torch is None:
        return no_gpu(why)
    config = None
    if args.config:
        config = {key: int(value) for key, value in
                  (item.split("=") for item in args.config.split(","))}
    triton_run = None if args.no_triton else grouped_gemm_triton()
    records = []
    for label, *dims in (QUICK if args.quick else CASES):
        records.append(bench_case(torch, label, tuple(dims), not args.random, args.fp8,
                                  config, triton_run, args.flush, args.w4))
    gpu = gpu_info(torch)
    rows = []
    for r in records:
        res = r["results"]
        cell = {name: (f"{res[name]['tflops']:.0f}" if "tflops" in res.get(name, {})
                       else res.get(name, {}).get("status", "-"))
                for name in ("tegula", "triton", "dense")}
        ratio = (res["tegula"]["tflops"] / res["dense"]["tflops"]
                 if "tflops" in res["tegula"] else None)
        rows.append(f"{r['label']:<14} {str(r['dims']):<32} {cell['tegula']:>7} "
                    f"{cell['triton']:>7} {cell['dense']:>7} "
                    f"{'-' if ratio is None else f'{ratio:.2f}x':>8}")
    weights = "fp8" if args.fp8 else "w4" if args.w4 else "bf16"
    if not args.no_write:
        print(f"wrote {write_record('moe', gpu, {'dtype': weights, 'cases': records}, args.out)}")
    print(f"moe grouped GEMM ({weights} weights, "
          f"{'random' if args.random else 'balanced'} routing) on {gpu['name']}, TFLOP/s")
    print(f"{'case':<14} {'(T, k, E, K, N)':<32} {'tegula':>7} {'triton':>7} {'dense':>7} "
          f"{'vs dense':>8}")
    print("\n".join(rows))
    return 0
