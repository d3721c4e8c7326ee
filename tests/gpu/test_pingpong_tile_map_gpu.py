"""On an H100: the tile loops whose iterations are not independent
(tests/synth/test_pingpong_tile_map.py: two iterations storing one tile, an iteration
reading the tile the previous one stored, a user's index table) keep one consumer role
and give numpy's sequential answer; outputs poisoned (NaN) first where the kernel only
writes them, every element checked. Before session 11 each was split between ping-pong
warpgroups by default."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "synth"))
import test_pingpong_tile_map as cases  # noqa: E402

BM, BN = cases.BM, cases.BN


def _cuda(x):
    return torch.from_numpy(np.ascontiguousarray(x)).cuda()


@pytest.mark.parametrize("tiles", [4, 7])
def test_folded_tiles_keep_the_last_iterations_tile(tiles):
    a, b = cases.operands(tiles, k=200)
    parts = cases.row_tiles(a, b)
    rows = -(-tiles // 2)
    c = torch.full((rows * BM, BN), float("nan"), device="cuda")
    cases.folded_tiles[(1,)](_cuda(a), _cuda(b), c)
    torch.cuda.synchronize()
    ref = np.concatenate([parts[min(2 * r + 1, tiles - 1)] for r in range(rows)])
    assert np.all(np.abs(c.cpu().numpy() - ref) <= cases.bound(a, b))


@pytest.mark.parametrize("tiles", [4, 9])
def test_the_running_sum_reads_each_previous_tile(tiles):
    a, b = cases.operands(tiles, k=72, seed=1)
    parts = cases.row_tiles(a, b)
    start = np.random.default_rng(2).standard_normal((tiles * BM, BN)).astype(np.float32)
    c = _cuda(start)
    cases.running_tiles[(1,)](_cuda(a), _cuda(b), c)
    torch.cuda.synchronize()
    total, ref = start[:BM].astype(np.float64), []
    for t in range(tiles):
        total = total + parts[t]
        ref.append(total)
    err = np.abs(c.cpu().numpy() - np.concatenate(ref))
    assert np.all(err <= tiles * cases.bound(a, b) + 1e-5 * np.abs(start).max())


def test_the_index_table_order():
    tiles = 6
    a, b = cases.operands(tiles, k=40, seed=4)
    parts = cases.row_tiles(a, b)
    order = np.array([2, 0, 2, 1, 0, 2], dtype=np.int32)    # tile 2 three times: last wins
    c = torch.full((3 * BM, BN), float("nan"), device="cuda")
    cases.table_tiles[(1,)](_cuda(a), _cuda(b), c, _cuda(order))
    torch.cuda.synchronize()
    last = {int(r): t for t, r in enumerate(order)}
    ref = np.concatenate([parts[last[r]] for r in range(3)])
    assert np.all(np.abs(c.cpu().numpy() - ref) <= cases.bound(a, b))
