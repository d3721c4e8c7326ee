"""Arrival counters shared by the entry points that merge in their last block."""
import pytest

torch = pytest.importorskip("torch")

from tegula.runtime import arrivals  # noqa: E402
from tegula.runtime.arrivals import arrival_counters  # noqa: E402


@pytest.fixture(autouse=True)
def fresh_counters(monkeypatch):
    monkeypatch.setattr(arrivals, "_COUNTERS", {})   # other tests' buffers stay theirs


def test_calls_on_one_device_and_stream_share_one_zeroed_buffer():
    device = torch.device("cpu")
    first = arrival_counters(device, 12)
    assert first.dtype == torch.int32 and first.numel() == 12 and not first.any()
    again = arrival_counters(device, 5)   # a smaller call: the same counters, first 5
    assert again.data_ptr() == first.data_ptr() and again.numel() == 5


def test_a_larger_call_gets_a_larger_zeroed_buffer():
    device = torch.device("cpu")
    small = arrival_counters(device, 3)
    large = arrival_counters(device, 1000)
    assert large.numel() == 1000 and not large.any()
    assert arrival_counters(device, 3).data_ptr() == large.data_ptr() != small.data_ptr()
