"""The record of a device run of `cost_model_check.py --print-points` as it came back (the
round's stdout: its "P" lines are every point, predicted and measured there): the JSON of
the points, the predicted-vs-measured SVG and the table, with the predictions as they were
made on the device (no re-prediction; `cost_model_check.py --repredict` re-predicts).

    PYTHONPATH=. python3 benchmarks/cost_model_report.py ROUND.out [MORE.out ...] --out PREFIX

writes PREFIX.json and PREFIX.svg and prints the table (Spearman, pairs the GPU tells
apart, top-5 hit per family and shape) and the timed configurations per family.
"""
from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))

from cost_model_check import points_from_text, print_table, summarize, svg_plot  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outputs", nargs="+", help="round outputs holding P lines")
    parser.add_argument("--out", required=True, help="prefix of the .json and .svg written")
    options = parser.parse_args()
    points = []
    for name in options.outputs:
        points += points_from_text(Path(name).read_text())
    rows = summarize(points)
    prefix = Path(options.out)
    prefix.parent.mkdir(parents=True, exist_ok=True)
    prefix.with_suffix(".json").write_text(json.dumps(
        dict(sources=[Path(n).name for n in options.outputs], points=points, summary=rows),
        indent=1))
    svg_plot(points, prefix.with_suffix(".svg"))
    print_table(rows)
    timed = collections.Counter(p["family"] for p in points if "measured_us" in p)
    for family, count in sorted(timed.items()):
        print(f"{family}: {count} configurations timed and ranked")


if __name__ == "__main__":
    main()
