"""Arrival counters for `tg.last_arrival` launched from torch entry points.

A kernel that merges in its last-arriving block (the one-launch decode, the W4A16 fused
split K) takes one-element i32 counters that are zero before the launch; its last block
of each group wraps its counter back to 0, so every launch leaves them zero. Launches in
one stream run in order and may share counters; launches on two streams may overlap, so
each (device, stream) has its own buffer. One grow-only buffer per stream serves every
entry point: each call uses the first `count` counters and leaves them zero.

A call captured into a CUDA graph gets counters of its own instead: the graph keeps the
address it captured, and its replays may run on any stream, beside other graphs' replays
and eager calls, so shared counters could mix two launches' arrivals (a block would merge
before every split of its own launch had stored its partial: a silently wrong answer).
They are allocated in the graph's memory pool, which lives as long as the graph, and
zeroed by a memset the graph replays before the kernel. Replays of one graph never
overlap each other (CUDA orders the launches of one executable graph).
"""
from __future__ import annotations

from typing import Any

from tegula.runtime.launcher import _stream_handle

#: (device type, index, raw stream) -> a flat int32 buffer, all zero between launches.
_COUNTERS: dict = {}


def arrival_counters(device: Any, count: int) -> Any:
    """At least `count` zeroed int32 arrival counters (flat): a view of the buffer kept
    for `device`'s current stream, or, while that stream captures a CUDA graph, a fresh
    buffer for this call alone (CPU tensors in tests: one buffer for the device)."""
    import torch

    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        return torch.zeros(count, dtype=torch.int32, device=device)
    index = device.index if device.index is not None else 0
    if device.type == "cuda" and device.index is None:
        index = torch.cuda.current_device()
    key = (device.type, index, _stream_handle(None, index) if device.type == "cuda" else 0)
    found = _COUNTERS.get(key)
    if found is None or found.numel() < count:
        found = _COUNTERS[key] = torch.zeros(max(count, 256), dtype=torch.int32,
                                             device=device)
    return found[:count]
