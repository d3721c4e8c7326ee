"""Launches that replay an earlier launch's checked arguments (`tegula.build`'s fast path):
new data pointers and new scalar values must reach the kernel, a different specialization
must not replay, and `stream=` must be honoured. Every output poisoned, every element
checked."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

import tegula as tg
from tegula import i32
from tegula.errors import LaunchError

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parent))  # gpu_helpers, beside us
from gpu_helpers import poison  # noqa: E402


@tg.kernel(threads=64)
def pick_columns(x: tg.Tensor[i32], y: tg.Tensor[i32], k: int, BM: tg.constexpr = 16):
    """y = the k-th 32-column block of x (k a run-time scalar)."""
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((BM, 32), (m, k))), y.tile((BM, 32), (m, 0)))


def _fresh(rows: int, cols: int, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randint(-2**31, 2**31 - 1, (rows, cols), device="cuda", dtype=torch.int32,
                      generator=g)
    return x, poison(torch.empty(rows, 32, device="cuda", dtype=torch.int32))


def test_replayed_launches_see_new_pointers_and_scalars():
    grid = (tg.cdiv(37, 16),)
    for seed, k in enumerate([0, 3, 1, 2, 3]):  # one specialization, launched five times
        x, y = _fresh(37, 128, seed)
        pick_columns[grid](x, y, k)
        torch.cuda.synchronize()
        assert torch.equal(y, x[:, 32 * k:32 * (k + 1)]), f"launch {seed} with k={k}"
    assert len(pick_columns._fast_launch) == 1


def test_a_new_shape_or_alignment_is_not_replayed():
    x, y = _fresh(37, 128, 7)
    pick_columns[(3,)](x, y, 1)
    # Shifted by one element: the pointer loses its 16-byte alignment, so the launch must
    # take the checked path (and compile for the weaker facts) rather than replay.
    x2, y2 = _fresh(40, 129, 8)
    x2v, y2v = x2[:, 1:], y2[:37]
    pick_columns[(3,)](x2v, y2v, 2)
    torch.cuda.synchronize()
    assert torch.equal(y, x[:, 32:64])
    assert torch.equal(y2v, x2v[:37, 64:96])


def test_replayed_launch_checks_scalars_and_honours_the_stream():
    x, y = _fresh(37, 128, 9)
    pick_columns[(3,)](x, y, 0)
    with pytest.raises(LaunchError, match="does not fit in 32 bits"):
        pick_columns[(3,)](x, y, 2**40)
    stream = torch.cuda.Stream()
    y = poison(torch.empty_like(y))
    with torch.cuda.stream(stream):  # the current stream, read at each launch
        pick_columns[(3,)](x, y, 3)
    pick_columns[(3,)](x, y, 3, stream=stream)  # an explicit stream keyword
    stream.synchronize()
    assert torch.equal(y, x[:, 96:128])
