"""Timing on a GPU, the same way for the candidate and the reference, and the roofline
bound that flags impossible speedups.

`time_trials(call, input_sets, torch)` makes one call on the first input set (a warm-up:
compilation, caches), then one on each further set — fresh inputs every trial,
so nothing can be reused from the previous one — with L2 emptied before each call (a
buffer of twice the L2 is read through) and the whole device synchronized before the
clock starts and before it stops: work the model left on any stream is inside the time.
The evaluator reports the median. The clock is the host's monotonic nanosecond clock,
captured when this module is imported (before any candidate code runs).

`roofline_seconds` is the least time any kernel could take: it must read every input
from DRAM once (L2 was emptied) at the device's peak bandwidth, and do the task's flops
at the peak dense tensor-core rate. A candidate measured faster than that is flagged —
its time cannot be real (timing escaped, work skipped or cached).
"""
from __future__ import annotations

import statistics
import time
from typing import Any

_CLOCK = time.perf_counter_ns  # bound at import: a later patch of time.* changes nothing


def _bind_sync() -> Any:
    try:
        import torch
        return torch.cuda.synchronize
    except ImportError:
        return None


_SYNC = _bind_sync()  # likewise for the device-wide synchronization

# Peak numbers by device-name fragment (bytes/s, dense f16 flop/s). Deliberately the
# generous side of each part (wgmma peak, not mma.sync), so an honest kernel is never
# flagged; an unknown device gets the largest of them.
PEAKS = {"H200": (4.8e12, 989e12), "H100": (3.35e12, 989e12), "A100": (2.04e12, 312e12),
         "L40S": (0.864e12, 362e12), "4090": (1.01e12, 330e12)}
UNKNOWN_PEAK = (8.0e12, 2.5e15)


def time_trials(call: Any, input_sets: list, torch: Any) -> tuple[list[float], list]:
    """Seconds per timed `call(inputs)` and the outputs of those calls (see the module
    docstring). The L2 flush runs outside `call`, so a harness may audit only the model."""
    from tegula.runtime.autotune import l2_emptier

    if len(input_sets) < 2:
        raise ValueError("timing needs a warm-up input set and at least one timed set")
    flush = l2_emptier(torch)
    call(input_sets[0])
    _SYNC()
    times, outputs = [], []
    for inputs in input_sets[1:]:
        flush()
        _SYNC()
        start = _CLOCK()
        out = call(inputs)
        _SYNC()
        times.append((_CLOCK() - start) * 1e-9)
        outputs.append(out)
    return times, outputs


def median(values: list[float]) -> float:
    return float(statistics.median(values))


def peaks_for(device_name: str) -> tuple[float, float]:
    """(bytes/s, flop/s) upper bounds for a device by name."""
    for fragment, peaks in PEAKS.items():
        if fragment.lower() in device_name.lower():
            return peaks
    return UNKNOWN_PEAK


def roofline_seconds(input_bytes: int, flops: float, device_name: str) -> float:
    """The least time a kernel reading `input_bytes` and doing `flops` can take."""
    bandwidth, flop_rate = peaks_for(device_name)
    return max(input_bytes / bandwidth, flops / flop_rate)


__all__ = ["time_trials", "median", "roofline_seconds", "peaks_for"]
