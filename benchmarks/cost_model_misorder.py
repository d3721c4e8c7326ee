"""Which configurations does the cost model mis-order, and what do they have in common?
(issue 11: softmax / RMSNorm below the 0.8 Spearman target.) No GPU, no compiler.

    python3 benchmarks/cost_model_misorder.py RESULTS.txt|RESULTS.json ... [--families softmax,rms_norm] [--top 25]

Reads the recorded points (the `P {...}` lines of a round's output, or a
`cost_model_check.json`; the last record of a configuration wins), each with the model's
prediction at its round and the GPU's time. Per (family, shape) it ranks both (average
ranks for ties) and charges each configuration its share of Spearman's loss,
6 d^2 / (n (n^2 - 1)) for a rank difference d. Printed: the most mis-ordered
configurations with what describes them (elements a thread, threads, rows a block, the
bound the model named, registers), then the loss summed over groups of configurations,
and a noise ceiling per shape: the Spearman rank correlation two repeated measurements
would have if each time moved by its recorded spread (do_bench's 20-80% range / 1.68 / 2,
an optimistic noise), which no model can beat.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cost_model_check import average_ranks  # noqa: E402  (Spearman's ranks, ties averaged)


def load_points(paths: list[str], families: set) -> list[dict]:
    found: dict = {}
    for path in paths:
        text = Path(path).read_text()
        if text.lstrip().startswith("{"):
            points = json.loads(text)["points"]
        else:
            points = [json.loads(line[2:]) for line in text.splitlines()
                      if line.startswith("P {")]
        for p in points:
            if p["family"] in families and "measured_us" in p and "predicted_us" in p:
                found[(p["family"], json.dumps(p["shape"]), json.dumps(p["config"],
                                                                      sort_keys=True))] = p
    return list(found.values())


def describe(p: dict) -> dict:
    c, (m, n) = p["config"], p["shape"]
    return dict(ept=c["BM"] * n // c["threads"], threads=c["threads"], BM=c["BM"],
                bound=p.get("bound", "?"), registers=p.get("registers", 0))


def group(p: dict) -> str:
    d = describe(p)
    if d["bound"] == "DRAM":
        return ("DRAM-bound, <= 8 elements a thread" if d["ept"] <= 8 else
                "DRAM-bound, >= 128 elements a thread" if d["ept"] >= 128 else
                "DRAM-bound, 16-64 elements a thread")
    return ("load chain, 1024 threads" if d["threads"] == 1024 else
            "load chain, >= 16 elements a thread" if d["ept"] >= 16 else "load chain, other")


def ceiling(points: list[dict], rng) -> float:
    measured = np.array([p["measured_us"] for p in points])
    sigma = np.array([p.get("spread", 0.05) for p in points]) / 1.68 / 2
    draws = []
    for _ in range(200):
        a = average_ranks(list(measured * (1 + rng.normal(0, sigma))))
        b = average_ranks(list(measured * (1 + rng.normal(0, sigma))))
        draws.append(np.corrcoef(a, b)[0, 1])
    return float(np.mean(draws))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+")
    parser.add_argument("--families", default="softmax,rms_norm")
    parser.add_argument("--top", type=int, default=25)
    options = parser.parse_args()
    points = load_points(options.results, set(options.families.split(",")))
    by_shape = collections.defaultdict(list)
    for p in points:
        by_shape[(p["family"], json.dumps(p["shape"]))].append(p)
    charged, rng = [], np.random.default_rng(0)
    print(f"{'family':9s} {'shape':14s} configs spearman noise-ceiling")
    for (family, shape), here in sorted(by_shape.items()):
        n = len(here)
        rp = average_ranks([p["predicted_us"] for p in here])
        rm = average_ranks([p["measured_us"] for p in here])
        d = rp - rm
        loss = 6 * d ** 2 / (n * (n * n - 1))   # exact without ties, a share with them
        charged += [(l, dd, p) for l, dd, p in zip(loss, d, here)]
        print(f"{family:9s} {shape:14s} {n:7d} {np.corrcoef(rp, rm)[0, 1]:8.2f} "
              f"{ceiling(here, rng):13.2f}")
    charged.sort(key=lambda x: -x[0])
    print(f"\nthe {options.top} most mis-ordered (loss: share of 1 - Spearman; d: predicted "
          f"rank - measured rank)")
    for loss, d, p in charged[:options.top]:
        c = describe(p)
        print(f"{p['family']:9s} {json.dumps(p['shape']):13s} BM={c['BM']:2d} "
              f"threads={c['threads']:4d} elems/thread={c['ept']:3d} regs={c['registers']:3d} "
              f"{c['bound']:10s} predicted {p['predicted_us']:6.1f} measured "
              f"{p['measured_us']:6.1f} us  d={d:+5.1f} loss={loss:.3f}")
    totals, slow = collections.Counter(), collections.defaultdict(list)
    for loss, _, p in charged:
        totals[group(p)] += loss
    for (family, shape), here in by_shape.items():
        dram = [p for p in here if p.get("bound") == "DRAM"]
        best = min((p["measured_us"] for p in dram), default=0)
        for p in dram:
            slow[describe(p)["ept"]].append(p["measured_us"] / best - 1)
    print("\nloss by group (summed over shapes):")
    for name, total in totals.most_common():
        print(f"  {name:40s} {total:6.2f}")
    print("\nDRAM-bound configurations (all predicted at the DRAM floor): measured time over "
          "the shape's best DRAM-bound one, by elements a thread")
    for ept in sorted(slow):
        print(f"  {ept:4d}: {np.mean(slow[ept]) * 100:5.1f}% slower on average "
              f"({len(slow[ept])} configurations)")


if __name__ == "__main__":
    main()
