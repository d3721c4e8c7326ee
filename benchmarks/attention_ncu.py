"""One short line per kernel from `ncu --csv --page raw` output of the attention forward
variants (`benchmarks/attention_variants.py --profile`) and cuDNN's kernel beside them:

    ncu --csv --page raw --section SpeedOfLight --section WarpStateStats \
        --section LaunchStats --metrics M ... > prof.csv
    python benchmarks/attention_ncu.py prof.csv [labels...]

Printed per kernel: its time, tensor pipe and issue-active percentages, the MUFU (XU)
pipe's share, registers a thread, and the six largest stall reasons in warps per issued
instruction (smsp__average_warps_issue_stalled_X_per_issue_active), so the two kernels can
be compared reason by reason. `labels` name the profiled launches in order (the ncu rows
carry only the kernel's name and grid)."""
from __future__ import annotations

import csv
import sys

STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
#: (column, short name) printed first when present
COLUMNS = (("gpu__time_duration.sum", "us"),
           ("sm__pipe_tensor_cycles_active.avg.pct_of_peak_sustained_elapsed", "tensor%"),
           ("smsp__issue_active.avg.pct_of_peak_sustained_active", "issue%"),
           ("sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active", "xu%"),
           ("launch__registers_per_thread", "regs"),
           ("launch__occupancy_limit_registers", "blk/SM(regs)"))


def number(text: str) -> float | None:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def summarize(record: dict, label: str) -> str:
    """The line for one profiled kernel."""
    parts = [f"{label or record.get('Kernel Name', '?')[:28]:28s}"]
    for column, short in COLUMNS:
        value = number(record.get(column, ""))
        if value is not None:
            value = value / 1000 if short == "us" else value  # ns -> us
            parts.append(f"{short}={value:.1f}")
    stalls = [(number(v), k[len(STALL[0]):-len(STALL[1])]) for k, v in record.items()
              if k.startswith(STALL[0]) and k.endswith(STALL[1]) and number(v) is not None]
    stalls.sort(reverse=True)
    parts.append("stalls: " + " ".join(f"{name}={value:.2f}" for value, name in stalls[:6]))
    return " ".join(parts)


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    with open(argv[0]) as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    if len(rows) < 3:
        print("attention_ncu: no profiled kernel in", argv[0])
        return 1
    head, labels = rows[0], argv[1:]
    for i, row in enumerate(rows[2:]):   # rows[1]: the units
        record = dict(zip(head, row))
        label = labels[i] if i < len(labels) else ""
        name = record.get("Kernel Name", "?")
        grid = record.get("Grid Size", "").replace(" ", "")
        print(summarize(record, f"{label} {name[:12]}{grid}" if label else f"{name[:14]}{grid}"))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
