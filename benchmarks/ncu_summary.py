"""`ncu --csv --page raw ... | python benchmarks/ncu_summary.py`: one line per profiled
kernel — its name, grid, and each metric as name=value, the stall-reason metrics
(smsp__average_warps_issue_stalled_X_per_issue_active.ratio) shortened to X — so a GPU
round's output stays a few lines."""
from __future__ import annotations

import csv
import sys

STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")


def short(metric: str) -> str:
    if metric.startswith(STALL[0]) and metric.endswith(STALL[1]):
        return metric[len(STALL[0]):-len(STALL[1])]
    return metric


def main() -> int:
    rows = list(csv.reader(line for line in sys.stdin if line.startswith('"')))
    if not rows:
        print("ncu_summary: no CSV rows (ncu printed nothing to parse)")
        return 1
    head = rows[0]
    for row in rows[2:]:   # rows[1]: the units
        record = dict(zip(head, row))
        values = "; ".join(f"{short(k)}={v}" for k, v in record.items() if "__" in k)
        print(f"{record.get('Kernel Name', '?')[:24]} {record.get('Grid Size', '')} "
              f"{record.get('Block Size', '')}: {values}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
