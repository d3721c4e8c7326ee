"""Split-KV decoding on the GPU: the configuration `decode_config` picks against other key
blocks (BN) and split counts, torch SDPA and the device's copy bandwidth, in one process.

    python benchmarks/attention_decode_sweep.py 1x32x8x128x131072 4x32x8x128x16384 \
        --bn 64,128 --splits 0.5,1,2 --paged both --form both

Shapes are BxHxHkvxDxS (one query token per sequence, every sequence S keys long); paged
caches are cut into 256-key pages in shuffled order (`tegula.bench.attention_decode`).
`--splits` multiplies the picked split count; `--threads` / `--stages` / `--br` override the
split kernel's block size (32: one warp per program, no cross-warp reductions per key block),
its K/V ring and its query tile's rows (the launches of `decode_launches`, run here as the
entry point runs them).
Every configuration is first checked against a float32 reference (relative error ≤ 5e-3,
no NaN); the time is the median of `tegula.bench.gpu.time_ms` with L2 flushed before each
run (a decode step reads the cache from DRAM). TB/s counts K and V read once; the
percentage is of the copy bandwidth, the ratio is to SDPA.
"""
from __future__ import annotations

import argparse

TOLERANCE = 5e-3


def decode_runner(torch, q, cache_k, cache_v, lengths, table, config: dict, split_extra: dict,
                  parts: slice = slice(None), combine: dict | None = None,
                  fused: bool = True):
    """A function launching the kernels for `config` (chunk, splits, BN) with
    `split_extra` merged into the split kernel's constexprs, as `attention_decode`
    launches them; returns o (B, H, 1, D). `fused`: one launch whose last split block per
    (batch, kv head) merges the partials, else the split and combine kernels. `parts`:
    which of the launches run (slice(0, 1) of the two-launch form: the split kernel alone,
    to time the combine's share); `combine`: the combine kernel's BD (columns a program:
    the grid follows) and UNROLL overrides."""
    from tegula.build import launch
    from tegula.dtypes import f16
    from tegula.kernels.attention_decode import decode_launches
    B, H, _, D = q.shape
    kv_heads = cache_k.shape[1]
    page = cache_k.shape[2] if table is not None else 0
    capacity = page * table.shape[1] if page else cache_k.shape[2]
    _, launches = decode_launches(f16, B, H, kv_heads, 1, D, capacity, page, D ** -0.5, False,
                                  config["splits"], config["BN"], fused=fused,
                                  wgmma=torch.cuda.get_device_capability() == (9, 0))
    R = H // kv_heads
    values = dict(q=q.view(B, kv_heads, R, D), k=cache_k, v=cache_v, seqlens=lengths,
                  block_table=table,
                  o_part=torch.empty((B, kv_heads, config["splits"], R, D), device="cuda"),
                  lse_part=torch.empty((B, kv_heads, config["splits"], R), device="cuda"),
                  o=torch.full((B, kv_heads, R, D), float("nan"), dtype=q.dtype,
                               device="cuda"),  # poisoned: every element must be written
                  lse=torch.empty((B, kv_heads, R), device="cuda"),
                  counters=torch.zeros((B, kv_heads), dtype=torch.int32, device="cuda"))
    calls = []
    for i, (kernel, grid, names, scalars, constexprs) in enumerate(launches):
        extra = split_extra if i == 0 else (combine or {})
        if i == 1 and "BD" in extra:
            grid = (D // extra["BD"],) + tuple(grid[1:])
        calls.append((kernel, grid, (*(values[n] for n in names), *scalars),
                      dict(constexprs, **extra)))

    def run():
        for kernel, grid, args, constexprs in calls[parts]:
            launch(kernel, grid, *args, **constexprs)
        return values["o"].view(B, H, 1, D)
    return run


def run_shape(torch, shape: tuple, paged: bool, bns: list, multipliers: list,
              extras: list, copy_bw: float, warm: bool = False, parts: bool = False,
              combines: tuple = (), forms: tuple = (True,), shuffled: bool = True,
              page_keys: int = 0) -> str:
    """One row: SDPA, then each (BN, split multiplier, split-kernel override, form: fused
    "F" or two launches "2L"); the configuration `decode_config` picks is starred.
    `parts`: also the split kernel timed alone (µs, and the whole step's µs beside it);
    `combines`: (BD, UNROLL) of the combine kernel to time the two-launch step with (µs)."""
    import torch.nn.functional as F

    from tegula.bench import gpu
    from tegula.bench.attention_decode import PAGE, page_cache, reference
    from tegula.kernels.attention_decode import decode_config
    B, H, kv_heads, D, S = shape
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, kv_heads, S, D, device="cuda", dtype=torch.float16)
            for _ in range(2))
    lengths = torch.full((B,), S, dtype=torch.int32, device="cuda")
    page_keys = page_keys or PAGE
    cache_k, cache_v, table = page_cache(torch, k, v, shuffled, page_keys) if paged else \
        (k, v, None)
    want = reference(torch, q, k, v)
    kv_bytes = 2 * B * kv_heads * S * D * 2
    tbps = lambda ms: kv_bytes / ms / 1e9  # noqa: E731
    sdpa = 1.0 if warm else tbps(gpu.time_ms(
        lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
    kind = (f" paged{page_keys if page_keys != PAGE else ''}" +
            ("" if shuffled else " in order")) if paged else ""
    row = (f"{B}x{H}/{kv_heads}x{D} S={S}{kind}: copy {copy_bw:.2f} "
           f"sdpa {sdpa:.2f} TB/s |")
    page = page_keys if paged else 0
    picked = decode_config(B, kv_heads, S, D, page)
    for bn in bns:
        base = decode_config(B, kv_heads, S, D, page, BN=bn or None)
        for mult in multipliers:
            splits = max(1, round(base["splits"] * mult))
            config = decode_config(B, kv_heads, S, D, page, num_splits=splits, BN=bn or None)
            for extra, fused in ((e, f) for e in extras for f in forms):
                label = f"BN{config['BN']}/{config['splits']}" + "".join(
                    f"/{k[0]}{v}" for k, v in extra.items()) + ("/F" if fused else "/2L") + (
                    "*" if config == picked and not extra else "")
                try:
                    run = decode_runner(torch, q, cache_k, cache_v, lengths, table, config,
                                        extra, fused=fused)
                    out = run()
                    torch.cuda.synchronize()
                except Exception as e:  # a configuration that does not build is reported
                    row += f" {label} ERROR {type(e).__name__}: {str(e)[:100]} |"
                    continue
                err = gpu.rel_error(out.float(), want)
                if torch.isnan(out).any() or err > TOLERANCE:
                    row += f" {label} FAIL err {err:.1e} |"
                    continue
                if warm:
                    row += f" {label} ok |"
                    continue
                ms = gpu.time_ms(run)
                rate = tbps(ms)
                row += f" {label} {rate:.2f} {rate / copy_bw:.0%} {rate / sdpa:.2f}x |"
                if parts:
                    alone = gpu.time_ms(decode_runner(torch, q, cache_k, cache_v, lengths,
                                                      table, config, extra, slice(0, 1),
                                                      fused=False))
                    row += f" split alone {alone * 1e3:.1f} of {ms * 1e3:.1f} us |"
                for bd, unroll in combines if not fused else ():
                    alt = decode_runner(torch, q, cache_k, cache_v, lengths, table, config,
                                        extra, combine=dict(BD=bd, UNROLL=unroll),
                                        fused=False)
                    out = alt()
                    torch.cuda.synchronize()
                    err = gpu.rel_error(out.float(), want)
                    if torch.isnan(out).any() or err > TOLERANCE:
                        row += f" combine {bd}:{unroll} FAIL err {err:.1e} |"
                        continue
                    row += f" combine {bd}:{unroll} {gpu.time_ms(alt) * 1e3:.1f} us |"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", help="BxHxHkvxDxS")
    parser.add_argument("--bn", default="0", help="key blocks, comma-separated (0: picked)")
    parser.add_argument("--splits", default="1", help="split-count multipliers")
    parser.add_argument("--paged", choices=("no", "yes", "both"), default="both")
    parser.add_argument("--threads", default="0", help="split-kernel block sizes (0: its own)")
    parser.add_argument("--stages", default="0", help="split-kernel K/V ring stages (0: its own)")
    parser.add_argument("--touch", default="0",
                        help="paged: touch the page this many key blocks ahead (the WARM "
                             "constexpr; 0: off), comma-separated")
    parser.add_argument("--br", default="0",
                        help="query-tile rows BR, comma-separated (0: the entry point's: G*Sq "
                             "rounded up, 64 paged at D=128 on sm_90a, where wgmma needs no "
                             "cross-warp softmax reductions)")
    parser.add_argument("--bound-k", default="1",
                        help="paged: the BOUND_K constexpr (0: K rows past the end load "
                             "unbounded, their scores selected away), comma-separated")
    parser.add_argument("--parts", action="store_true",
                        help="also time the split kernel alone (the combine's share)")
    parser.add_argument("--combine", default="",
                        help="combine kernels to time, BD:UNROLL comma-separated (e.g. 16:16)")
    parser.add_argument("--form", choices=("fused", "two", "both"), default="fused",
                        help="the fused kernel (the last split block merges), the two "
                             "launches (split, then combine), or both (an A/B in one process)")
    parser.add_argument("--page", type=int, default=0,
                        help="keys a page of the paged caches (0: the bench's 256)")
    parser.add_argument("--in-order", action="store_true",
                        help="paged caches with each sequence's pages in order (default: "
                             "shuffled over the pool)")
    parser.add_argument("--warm", action="store_true",
                        help="compile and check each configuration only (no timing)")
    args = parser.parse_args(argv)
    import torch

    from tegula.bench import gpu
    copy_bw = 1.0 if args.warm else gpu.copy_bandwidth(torch) / 1e12
    bns = [int(x) for x in args.bn.split(",")]
    multipliers = [float(x) for x in args.splits.split(",")]
    extras = [{k: v for k, v in (("threads", t), ("STAGES", st), ("WARM", w)) if v}
              | ({} if bk else {"BOUND_K": 0}) | ({"BR": br} if br else {})
              for t in map(int, args.threads.split(",")) for st in map(int, args.stages.split(","))
              for w in map(int, args.touch.split(",")) for bk in map(int, args.bound_k.split(","))
              for br in map(int, args.br.split(","))]
    combines = tuple(tuple(int(x) for x in c.split(":")) for c in filter(None, args.combine.split(",")))
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split("x"))
        for paged in {"no": (False,), "yes": (True,), "both": (False, True)}[args.paged]:
            forms = {"fused": (True,), "two": (False,), "both": (True, False)}[args.form]
            print(run_shape(torch, shape, paged, bns, multipliers, extras, copy_bw, args.warm,
                            args.parts, combines, forms, not args.in_order, args.page),
                  flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
