"""The TMA-store epilogue alternates the halves of its staging buffer (lower/hopper.py
`lower_tma_store`): with an even number of box slots, each round stages half of them and
waits only for the stores of the round before last (`cp.async.bulk.wait_group.read 1`),
so a round's stmatrix writes overlap the previous round's TMA stores instead of waiting
for them (the persistent 128x256 GEMM stored its 4 boxes in 2 rounds, the second waiting
for the first's stores to read shared memory, in every tile's epilogue)."""
from __future__ import annotations

import numpy as np
import pytest

import tegula.lower.hopper as hopper
from tegula.build import build
from tegula.dtypes import f16
from tegula.errors import TegulaError
from tegula.kernels.common import random_input
from tegula.kernels.gemm import gemm_emulated, persistent_gemm_kernel
from tegula.lower.async_ir import BulkWait

#: Two 64-column boxes of c per tile in two slots: rounds of one box, halves alternating.
TILES = dict(BM=64, BN=128, BK=32, STAGES=2, GROUP=3)


def _walk(stmts):
    for s in stmts:
        yield s
        for field in ("body", "then", "otherwise"):
            yield from _walk(getattr(s, field, None) or [])
        for role in getattr(s, "roles", None) or []:
            yield from _walk(role.body)


def _staging_waits(config: dict) -> list[int]:
    tk = build(persistent_gemm_kernel(f16), config, None, "sm_90a").thread_kernel
    return [s.pending for s in _walk(tk.body) if isinstance(s, BulkWait) and s.read_only]


def test_rounds_alternate_halves():
    # the benchmark's 128x256 tile: 4 boxes in 2 slots, 4 rounds, each waiting for all
    # but the newest group
    assert _staging_waits(dict(BM=128, BN=256, BK=64, STAGES=4, threads=256)) == [1] * 4
    # 64x128 on one warpgroup's 128 threads: two ping-pong consumer warpgroups, each with
    # its own staging buffer and its own 2 rounds
    assert _staging_waits(TILES) == [1] * 4


def _gemm(m: int, n: int, k: int, seed: int):
    rng = np.random.default_rng(seed)
    a, b = random_input(rng, (m, k), f16), random_input(rng, (n, k), f16)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    bound = 2.0 ** -10 * np.abs(ref) + k * 2.0 ** -23 * (np.abs(a) @ np.abs(b).T)
    return a, b, ref, bound


@pytest.mark.parametrize("blocks", [1, 2])
def test_several_tiles_per_block_at_ragged_shapes(blocks):
    # 1 or 2 blocks walk 3x2 ragged tiles, their two ping-pong consumer warpgroups alternate
    # tiles: a warpgroup's next tile stages into the half its previous tile's
    # second-to-last round used while that tile's last stores may still read the other
    a, b, ref, bound = _gemm(150, 232, 72, 11)
    c = gemm_emulated(a, b, persistent=blocks, **TILES)
    assert np.all(np.abs(c.astype(np.float64) - ref) <= bound)


def test_a_round_that_does_not_wait_for_its_half_is_reported(monkeypatch):
    # One more pending group allowed: a round writes the half whose stores may still be
    # reading it. The emulator must refuse (the proof that the wait is what orders them).
    real = BulkWait
    monkeypatch.setattr(hopper, "BulkWait", lambda pending, read_only=False: real(
        pending + 1 if read_only else pending, read_only=read_only))
    a, b, _, _ = _gemm(150, 232, 72, 12)
    with pytest.raises(TegulaError, match="TMA store still reads it"):
        gemm_emulated(a, b, persistent=1, **dict(TILES, GROUP=2))
