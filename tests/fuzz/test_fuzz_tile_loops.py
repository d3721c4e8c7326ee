"""The fuzzer's persistent tile loops (`tegula.fuzz.tile_loops`): tile maps and global
reads that ping-pong consumer warpgroups must not split (session 11). A seeded sample in
CI — a one-to-one map over several blocks, a map sending two iterations to one tile, a
read of the previous iteration's tile, and (session 12) TMA bulk adds of several blocks
into shared tiles — and the checker's own teeth: with the independence proof switched
off, ping-pong is taken and the check fails."""
from __future__ import annotations

import pytest

from tegula.fuzz.tile_loops import TileLoop, check_tile_loop, make_tile_loop

CI_SEED = 20261125


def _first(predicate, seed=CI_SEED, limit=200) -> tuple[int, TileLoop]:
    return next((i, p) for i in range(limit) if predicate(p := make_tile_loop(seed, i)))


SAMPLES = {
    "one-to-one, several blocks": lambda p: p.blocks > 1 and p.map in ("grouped", "pair"),
    "two iterations, one tile": lambda p: not p.injective() and p.read == "none",
    "reads the previous tile": lambda p: p.read == "previous" and p.injective(),
    "bulk adds, two iterations a tile, blocks": lambda p: p.add == "bulk" and p.blocks > 1
    and not p.injective(),
}


@pytest.mark.parametrize("kind", list(SAMPLES))
def test_seeded_tile_loops_are_right_and_split_only_when_independent(kind):
    index, loop = _first(SAMPLES[kind])
    status, reason, detail = check_tile_loop(loop, index)
    assert status in ("pass", "conservative"), (
        f"python -m tegula.fuzz --seed {CI_SEED} --tile-loop {index}: {reason}\n{detail}")
    if kind == "one-to-one, several blocks":
        assert status == "pass", detail     # the rule proves these: ping-pong taken


def test_the_ground_truth_of_maps():
    assert TileLoop(6, 32, "pair", 3, "none", 1, 2).injective()
    assert TileLoop(10, 32, "grouped", 3, "none", 1, 2).injective()
    assert not TileLoop(4, 32, "div", 2, "none", 1, 2).injective()
    assert not TileLoop(4, 32, "mod", 3, "none", 1, 2).injective()
    assert TileLoop(3, 32, "row", 1, "previous", 1, 2).dependent()
    assert not TileLoop(3, 32, "row", 1, "own", 1, 2).dependent()


def test_without_the_proof_the_check_fails(monkeypatch):
    import tegula.synth.roles as roles
    monkeypatch.setattr(roles, "global_dependence", lambda *args: "")
    loop = TileLoop(4, 32, "div", 2, "none", 1, 3)   # STAGES=3: a build of its own
    status, reason, _ = check_tile_loop(loop, 1)
    assert status == "mismatch" and "ping-pong taken" in reason


def test_a_tile_stored_twice_waits_for_the_first_store():
    """Tile 1 is stored by iterations 0 and 2: the async proxy does not order two TMA
    stores to one address, so the epilogue's first round waits for the earlier stores'
    writes (not only `.read`), and the emulator reports a TMA store to an element still in
    flight (this loop failed so before the wait, session 12)."""
    loop = TileLoop(3, 40, "table", 2, "none", 1, 3, (1, 0, 1))
    status, reason, detail = check_tile_loop(loop, 19)
    assert status in ("pass", "conservative"), f"{reason}\n{detail}"
