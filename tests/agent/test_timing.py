"""The timing protocol's pieces that run without a GPU: one warm-up call then one timed
call per fresh input set, the flush and synchronization around each; the roofline bound."""
from __future__ import annotations

import pytest
import torch

from tegula.agent import timing


def test_time_trials_warms_up_once_and_times_each_fresh_set(monkeypatch):
    events = []
    monkeypatch.setattr(timing, "_SYNC", lambda: events.append("sync"))
    sets = [[torch.full((2,), float(i))] for i in range(4)]

    def call(inputs):
        events.append(f"call {int(inputs[0][0])}")
        return inputs[0] * 2

    times, outputs = timing.time_trials(call, sets, torch)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert [float(o[0]) for o in outputs] == [2.0, 4.0, 6.0]
    # warm-up on set 0, then sync / call / sync around every timed call (after the flush)
    assert events == ["call 0", "sync"] + sum(
        (["sync", f"call {i}", "sync"] for i in (1, 2, 3)), [])
    with pytest.raises(ValueError, match="warm-up"):
        timing.time_trials(call, sets[:1], torch)


def test_roofline_bound():
    # 1 GB of inputs on an H200 (4.8 TB/s): at least ~208 us; flops can dominate.
    assert timing.roofline_seconds(10**9, 0, "NVIDIA H200") == pytest.approx(10**9 / 4.8e12)
    assert timing.roofline_seconds(1, 2 * 4096**3, "NVIDIA H100 80GB HBM3") == \
        pytest.approx(2 * 4096**3 / 989e12)
    assert timing.peaks_for("Some Future GPU") == timing.UNKNOWN_PEAK
    assert timing.median([3.0, 1.0, 2.0]) == 2.0
