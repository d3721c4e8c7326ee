"""On a GPU: the entry points' replays (one C call where built) read each call's own
inputs and write each call's own output — a fresh one, or the `out=` tensor — on the
current stream, side streams included. Outputs start poisoned (NaN); every element is
compared. Run with `pytest -m gpu tests/kernels/test_api_replay_gpu.py`."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tegula.kernels as tk  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _references(x, w):
    xd = x.double()
    norm = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    return {"rms_norm": norm, "softmax": torch.softmax(xd, -1), "copy": xd}


@pytest.mark.parametrize("with_out", [False, True])
def test_replayed_entry_points_write_their_own_outputs(with_out):
    side = torch.cuda.Stream()
    for call in range(6):  # full path, Python replay, then C replays; the last two on `side`
        g = torch.Generator(device="cuda").manual_seed(call)
        x = torch.randn(37, 300, device="cuda", dtype=torch.float16, generator=g) * 3
        w = torch.rand(300, device="cuda", dtype=torch.float16, generator=g) + 0.5
        outs = {name: torch.full_like(x, float("nan")) if with_out else None
                for name in ("rms_norm", "softmax", "copy")}
        stream = side if call >= 4 else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            got = {"rms_norm": tk.rms_norm(x, w, 1e-5, out=outs["rms_norm"]),
                   "softmax": tk.softmax(x, out=outs["softmax"]),
                   "copy": tk.copy(x, out=outs["copy"])}
        stream.synchronize()
        for name, ref in _references(x, w).items():
            y = got[name]
            assert (y is outs[name]) if with_out else y.is_contiguous(), (name, call)
            assert not torch.isnan(y).any(), (name, call)
            if name == "copy":
                assert torch.equal(y, x), (name, call)
            else:
                err = ((y.double() - ref).abs() / (ref.abs() + 1e-3)).max().item()
                assert err < 4e-3, (name, call, err)
