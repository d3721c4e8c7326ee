"""Split-KV decoding on the GPU: the configuration `decode_config` picks against other key
blocks (BN) and split counts, torch SDPA and the device's copy bandwidth, in one process.

    python benchmarks/attention_decode_sweep.py 1x32x8x128x131072 4x32x8x128x16384 \
        --bn 64,128 --splits 0.5,1,2 --paged both

Shapes are BxHxHkvxDxS (one query token per sequence, every sequence S keys long); paged
caches are cut into 256-key pages in shuffled order (`tegula.bench.attention_decode`).
`--splits` multiplies the picked split count. Every configuration is first checked
against a float32 reference (relative error ≤ 5e-3, no NaN); the time is the median of
`tegula.bench.gpu.time_ms` with L2 flushed before each run (a decode step reads the cache
from DRAM). TB/s counts K and V read once; `copy` is the fraction of the copy bandwidth.
"""
from __future__ import annotations

import argparse

TOLERANCE = 5e-3


def run_shape(torch, shape: tuple, paged: bool, bns: list, multipliers: list,
              copy_bw: float) -> str:
    """One row: SDPA, the picked configuration, then each (BN, split multiplier)."""
    import torch.nn.functional as F

    from tegula.bench import gpu
    from tegula.bench.attention_decode import PAGE, page_cache, reference
    from tegula.kernels.attention_decode import attention_decode, decode_config
    B, H, kv_heads, D, S = shape
    q = torch.randn(B, H, 1, D, device="cuda", dtype=torch.float16)
    k, v = (torch.randn(B, kv_heads, S, D, device="cuda", dtype=torch.float16)
            for _ in range(2))
    lengths = torch.full((B,), S, dtype=torch.int32, device="cuda")
    cache_k, cache_v, table = page_cache(torch, k, v) if paged else (k, v, None)
    want = reference(torch, q, k, v)
    kv_bytes = 2 * B * kv_heads * S * D * 2
    tbps = lambda ms: kv_bytes / ms / 1e9  # noqa: E731
    sdpa = tbps(gpu.time_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True)))
    row = (f"{B}x{H}/{kv_heads}x{D} S={S}{' paged' if paged else ''}: copy {copy_bw:.2f} "
           f"sdpa {sdpa:.2f} TB/s |")
    page = PAGE if paged else 0
    picked = decode_config(B, kv_heads, S, D, page)
    for bn in bns:
        base = decode_config(B, kv_heads, S, D, page, BN=bn or None)
        for mult in multipliers:
            splits = max(1, round(base["splits"] * mult))
            config = decode_config(B, kv_heads, S, D, page, num_splits=splits, BN=bn or None)

            def run(config=config):
                return attention_decode(q, cache_k, cache_v, lengths, table,
                                        num_splits=config["splits"], BN=config["BN"])
            out = run()
            torch.cuda.synchronize()
            err = gpu.rel_error(out.float(), want)
            mark = "*" if config == picked else ""
            label = f"BN{config['BN']}/{config['splits']}{mark}"
            if torch.isnan(out).any() or err > TOLERANCE:
                row += f" {label} FAIL err {err:.1e} |"
                continue
            rate = tbps(gpu.time_ms(run))
            row += f" {label} {rate:.2f} {rate / copy_bw:.0%} {rate / sdpa:.2f}x |"
    return row


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shapes", nargs="+", help="BxHxHkvxDxS")
    parser.add_argument("--bn", default="0", help="key blocks, comma-separated (0: picked)")
    parser.add_argument("--splits", default="1", help="split-count multipliers")
    parser.add_argument("--paged", choices=("no", "yes", "both"), default="both")
    args = parser.parse_args(argv)
    import torch

    from tegula.bench import gpu
    copy_bw = gpu.copy_bandwidth(torch) / 1e12
    bns = [int(x) for x in args.bn.split(",")]
    multipliers = [float(x) for x in args.splits.split(",")]
    for text in args.shapes:
        shape = tuple(int(x) for x in text.split("x"))
        for paged in {"no": (False,), "yes": (True,), "both": (False, True)}[args.paged]:
            print(run_shape(torch, shape, paged, bns, multipliers, copy_bw), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
