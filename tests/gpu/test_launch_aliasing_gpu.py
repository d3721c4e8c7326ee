"""On a GPU: launches whose written tensor shares memory with another argument are refused
(`tegula/runtime/aliasing.py`) on the first (full) launch and on replays through the C
launch; the identical tensor of an element-wise kernel runs in place and gives numpy's
answer, every element checked; disjoint views of one allocation run (outputs poisoned)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.errors import LaunchError

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]


@tg.kernel(threads=64)
def doubled(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((BM, BN), (m, 0))) * 2.0, y.tile((BM, BN), (m, 0)))


@tg.kernel(threads=64)
def shifted(x: tg.Tensor[f32], y: tg.Tensor[f32], BM: tg.constexpr = 4, BN: tg.constexpr = 16):
    m = tg.block_id(0)
    tg.copy(tg.load(x.tile((BM, BN), (m + 1, 0))), y.tile((BM, BN), (m, 0)))


def _storage(rows=40):
    rng = np.random.default_rng(rows)
    host = rng.standard_normal((rows, 16)).astype(np.float32)
    return host, torch.from_numpy(host).cuda()


def test_identical_in_place_runs_and_replays():
    host, x = _storage(37)
    for round_ in range(3):                       # a full launch, then C replays
        doubled[(tg.cdiv(37, 4),)](x, x)
        torch.cuda.synchronize()
        host = host * 2
        assert np.array_equal(x.cpu().numpy(), host), round_


def test_overlapping_views_are_refused_first_and_on_replay():
    host, storage = _storage(40)
    a, b = storage[:16], storage[16:32]
    b.fill_(float("nan"))                         # poisoned output
    doubled[(4,)](a, b)                           # disjoint: runs (and prepares the replay)
    torch.cuda.synchronize()
    assert np.array_equal(b.cpu().numpy(), host[:16] * 2)
    before = storage.cpu().numpy()
    with pytest.raises(LaunchError, match="'y' \\(written\\) and 'x' share memory") as err:
        doubled[(4,)](storage[:16], storage[12:28])   # same key as above: the C replay
    assert "test_launch_aliasing_gpu.py" in str(err.value)
    with pytest.raises(LaunchError, match="cannot run in place"):
        shifted[(4,)](storage[:16], storage[:16])
    torch.cuda.synchronize()
    assert np.array_equal(storage.cpu().numpy(), before)   # nothing ran


def test_library_copy_in_place_and_overlap():
    from tegula.kernels import copy
    x = torch.randn(64, 256, device="cuda")
    want = x.clone()
    copy(x, out=x)                                # element-wise: in place allowed
    torch.cuda.synchronize()
    assert torch.equal(x, want)
    flat = torch.randn(2 * 64 * 256, device="cuda")
    with pytest.raises(LaunchError, match="share memory"):
        copy(flat[:64 * 256].view(64, 256), out=flat[256:256 + 64 * 256].view(64, 256))
