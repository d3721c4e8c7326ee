"""Would a DRAM-efficiency term by elements per thread lift the softmax / RMSNorm Spearman?
An offline experiment on recorded H100 data (no GPU, nothing in the model changed).

    python3 benchmarks/cost_model_rows_factor.py [--data FILE]

The model predicts every DRAM-bound row configuration at the DRAM floor, so it ties them;
the GPU orders them in a U shape by elements a thread (session 11: 8 elements +8.5%, 16-64
+3%, 128 +7.7% over each shape's best). Here each DRAM-bound prediction is multiplied by
the median measured slowdown of its elements-per-thread class, taken from *other* shapes
only: the training shapes (the held-out five never contribute), and leave-one-shape-out.
Printed per held-out (family, shape): Spearman of the model as recorded and with the term
(average ranks, `cost_model_check.average_ranks`' definition), then the means.
"""
from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "results" / "h100-2026-11-25-session11-cost-model-rows.json"
#: The shapes held out of the session-9 and session-10 fits (cost_model_check.py).
HELD_OUT = {(768, 8192), (2048, 2048), (12288, 1024), (1536, 8192), (4096, 2048)}


def average_ranks(values) -> np.ndarray:
    x = np.asarray(values, float)
    order = np.argsort(x, kind="mergesort")
    ranks, ordered, i = np.empty(len(x)), x[order], 0
    while i < len(x):
        j = i
        while j + 1 < len(x) and ordered[j + 1] == ordered[i]:
            j += 1
        ranks[order[i:j + 1]] = (i + j) / 2
        i = j + 1
    return ranks


def spearman(a, b) -> float:
    return float(np.corrcoef(average_ranks(a), average_ranks(b))[0, 1])


def elements_per_thread(point: dict) -> int:
    config = point["config"]
    return config.get("BM", 1) * point["shape"][1] // config["threads"]


def slowdowns(groups: dict, family: str, skip) -> dict:
    """Elements a thread -> median measured time over its shape's best DRAM-bound one,
    over the shapes of `family` that `skip` lets through."""
    found = defaultdict(list)
    for (fam, shape), points in groups.items():
        if fam != family or skip(shape):
            continue
        dram = [p for p in points if p.get("bound") == "DRAM"]
        if dram:
            best = min(p["measured_us"] for p in dram)
            for p in dram:
                found[elements_per_thread(p)].append(p["measured_us"] / best)
    return {e: float(np.median(v)) for e, v in found.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", default=str(DATA))
    points = [p for p in json.load(open(parser.parse_args().data))["points"]
              if p.get("measured_us") and p.get("predicted_us")]
    groups = defaultdict(list)
    for p in points:
        groups[(p["family"], tuple(p["shape"]))].append(p)
    print(f"{'family':9s} {'shape':14s} {'configs':>7s} {'model':>6s} {'+term (train)':>13s} "
          f"{'+term (loo)':>11s}")
    sums = defaultdict(list)
    for (family, shape), pts in sorted(groups.items()):
        if len(pts) < 4:
            continue
        measured = [p["measured_us"] for p in pts]
        row = [spearman([p["predicted_us"] for p in pts], measured)]
        for skip in (lambda s: s in HELD_OUT, lambda s, own=shape: s == own):
            factor = slowdowns(groups, family, skip)
            adjusted = [p["predicted_us"] * (factor.get(elements_per_thread(p), 1.0)
                                             if p.get("bound") == "DRAM" else 1.0) for p in pts]
            row.append(spearman(adjusted, measured))
        which = "held-out" if shape in HELD_OUT else "fitted"
        for i, value in enumerate(row):
            sums[which, i].append(value)
        if shape in HELD_OUT:
            print(f"{family:9s} {str(shape):14s} {len(pts):7d} {row[0]:6.2f} {row[1]:13.2f} "
                  f"{row[2]:11.2f}")
    for which in ("held-out", "fitted"):
        means = [np.mean(sums[which, i]) for i in range(3)]
        print(f"mean over {which} shapes: model {means[0]:.3f}, with the term {means[1]:.3f} "
              f"(trained on the fitted shapes), {means[2]:.3f} (leave one shape out)")


if __name__ == "__main__":
    main()
