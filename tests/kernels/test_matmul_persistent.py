"""The library's persistent GEMM (`kernels.gemm.persistent_gemm_kernel`, the default of
`tegula.kernels.matmul` on sm_90a for shapes that fill the GPU) in the emulator against
float64 numpy, every element: ragged shapes with more tiles than blocks and fewer, M = 1,
K shorter than one k-tile, every fused epilogue with NaN/±inf operands, sm_90a (one TMA
ring across the tiles, a producer warpgroup) and sm_80 (cp.async + mma.sync); the tuner's
candidates; the torch entry point through the persistent kernel on the CPU, replays
included."""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import tegula as tg
from tegula.build import build
from tegula.dtypes import bf16, f16
from tegula.kernels.api_matmul import PERSISTENT, gemm_candidates
from tegula.kernels.gemm import (ACTIVATIONS, gemm_emulated, persistent_gemm_kernel,
                                 persistent_grid)
from tegula.lower.async_ir import Roles, TmaLoad, Wgmma
from tegula.lower.thread_ir import Mma, walk

sys.path.insert(0, os.path.dirname(__file__))
from test_gemm import check_gemm  # noqa: E402
from test_matmul_epilogue import check_epilogue, operands  # noqa: E402

#: Small tiles that still take wgmma on sm_90a (64 rows, one warpgroup's instruction).
SMALL = dict(BM=64, BN=32, BK=16, STAGES=2, GROUP=2)


def _statements(kernel, target, **constexprs) -> set:
    return {type(s) for s in walk(build(kernel, constexprs, None, target).thread_kernel.body)}


def test_sm90a_takes_tma_wgmma_and_a_producer_role_and_sm80_takes_mma_sync():
    kernel = persistent_gemm_kernel(f16, "gelu", True)
    hopper = _statements(kernel, "sm_90a", **SMALL)
    assert {TmaLoad, Wgmma, Roles} <= hopper
    ampere = _statements(kernel, "sm_80", **SMALL)
    assert Mma in ampere and not {TmaLoad, Wgmma} & ampere


#: (M, N, K, SMs): more tiles than blocks (some blocks one tile more than others), fewer
#: tiles than blocks (idle blocks), one block doing all, M = 1, K < one k-tile (BK = 16),
#: a one-iteration K loop.
SHAPES = [(97, 130, 72, 5), (70, 40, 96, 16), (33, 65, 40, 1), (1, 77, 48, 3),
          (45, 50, 9, 4), (64, 96, 16, 2)]


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("m,n,k,sms", SHAPES, ids=lambda v: str(v))
def test_plain_f16_at_ragged_shapes(m, n, k, sms, target):
    rng = np.random.default_rng(m * n + k)
    a, b, _ = operands(rng, m, n, k, f16)
    c = gemm_emulated(a, b, f16, persistent=sms, target=target, **SMALL)
    check_gemm(c, a, b, f16)


@pytest.mark.parametrize("activation", ACTIVATIONS)
@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_bias_activation_and_nonfinite_values(activation, target):
    """A NaN row of a is NaN in every column; ±inf bias columns give the activation's
    value at ±inf; every other element within the epilogue's bound."""
    rng = np.random.default_rng(len(str(activation)) + len(target))
    m, n, k = 37, 70, 56
    a, b, bias = operands(rng, m, n, k, f16, nonfinite=True)
    c = gemm_emulated(a, b, bias=bias, activation=activation, target=target, persistent=3,
                      **SMALL)
    assert np.isnan(c[3, :]).all()
    check_epilogue(c, a, b, bias, activation, f16)


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
def test_bf16_with_bias_and_silu_at_more_stages(target):
    rng = np.random.default_rng(3)
    m, n, k = 50, 45, 120
    a, b, bias = operands(rng, m, n, k, bf16)
    c = gemm_emulated(a, b, bf16, bias=bias, activation="silu", target=target, persistent=2,
                      BM=64, BN=32, BK=16, STAGES=4, GROUP=3)
    check_epilogue(c, a, b, bias, "silu", bf16)


def test_every_tile_is_written_once_whatever_the_group():
    """Grouped order with a band taller than the tile rows, and one row of tiles."""
    rng = np.random.default_rng(5)
    for m, group in ((97, 8), (20, 1), (200, 3)):
        a, b, _ = operands(rng, m, 100, 24, f16)
        c = gemm_emulated(a, b, f16, persistent=4, BM=64, BN=32, BK=16, STAGES=2, GROUP=group)
        check_gemm(c, a, b, f16)


@pytest.mark.parametrize("m,n,k,sms", [(97, 130, 72, 4), (200, 40, 40, 6), (33, 70, 24, 2)])
def test_clusters_of_two_share_b_tiles_and_stay_right(m, n, k, sms):
    """CLUSTER=2 (multicast b on sm_90a): an odd number of row tiles (a block past a's
    rows joins its cluster, stores nothing), more and fewer tiles than clusters."""
    rng = np.random.default_rng(m + n)
    a, b, bias = operands(rng, m, n, k, f16)
    c = gemm_emulated(a, b, f16, bias=bias, activation="relu", persistent=sms, CLUSTER=2,
                      **SMALL)
    check_epilogue(c, a, b, bias, "relu", f16)


@pytest.mark.parametrize("m,n,k,sms,cluster", [(300, 200, 72, 8, 4), (130, 70, 72, 16, 8)])
def test_clusters_of_four_and_eight_stay_right(m, n, k, sms, cluster):
    """b multicast to 4 / 8 row tiles: row tiles no multiple of the cluster (blocks past
    a's rows join their cluster), fewer and more units than clusters."""
    rng = np.random.default_rng(m + cluster)
    a, b, _ = operands(rng, m, n, k, f16)
    c = gemm_emulated(a, b, f16, persistent=sms, CLUSTER=cluster, BM=64, BN=32, BK=32,
                      STAGES=3, GROUP=2)
    check_gemm(c, a, b, f16)


def test_grid_is_one_block_per_sm_or_per_tile():
    assert persistent_grid(4096, 4096, 132, 128, 256) == (132,)
    assert persistent_grid(256, 512, 132, 128, 256) == (4,)
    assert persistent_grid(1, 1, 132, 128, 256) == (1,)
    assert persistent_grid(4096, 4096, 132, 128, 256, cluster=2) == (132,)
    assert persistent_grid(300, 256, 132, 128, 256, cluster=2) == (4,)   # 3 rows: 2 units


def test_persistent_width_fills_the_last_wave_where_n_leaves_it_partial(monkeypatch):
    """4096×11008 in 128×256 tiles is 1376 tiles, 10.4 waves of 132 SMs; 128×248 tiles are
    1440, 10.9: the same 11 waves of 3% narrower tiles, so matmul also times those (keyed
    by N). Where 256 wide fills its waves, or a narrower tile saves under 3%, 256 stays.
    (The cost-model search behind the first candidates is replaced: seconds, not tested
    here.)"""
    from tegula.kernels import api_matmul
    from tegula.kernels.api_matmul import fitted_n, persistent_width
    monkeypatch.setattr(api_matmul, "searched_persistent", lambda m, n, k: list(PERSISTENT))
    assert persistent_width(4096, 11008, 132) == 248
    for m, n in [(4096, 4096), (4096, 14336), (8192, 8192), (2048, 2048), (6144, 6144)]:
        assert persistent_width(m, n, 132) == 256, (m, n)
    assert fitted_n(4096, 11008, True) == 11008 and fitted_n(4096, 11008, False) is None
    fitted = dict(PERSISTENT[0], BN=248)
    found = gemm_candidates(4096, 16384, 16384, hopper=True, n_exact=11008)
    assert fitted in found and len(found) <= 7 and found[:len(PERSISTENT)] == PERSISTENT
    assert fitted not in gemm_candidates(4096, 16384, 16384, hopper=True)


def test_fitted_width_at_a_ragged_shape():
    """The 248-wide persistent tile (no multiple of 64, so register stores rather than
    the TMA-store epilogue) on sm_90a: a ragged column tile, a partial k-step, more tiles
    than blocks; every element against float64."""
    from tegula.kernels.api_matmul import PERSISTENT
    rng = np.random.default_rng(248)
    a, b, _ = operands(rng, 130, 260, 72, f16)
    config = {k: v for k, v in PERSISTENT[0].items() if k not in ("kernel", "threads")}
    c = gemm_emulated(a, b, f16, persistent=3, target="sm_90a",
                      **dict(config, BN=248, threads=256))
    check_gemm(c, a, b, f16)


def test_candidates_put_the_persistent_kernel_first_on_hopper_for_large_shapes():
    large = gemm_candidates(4096, 4096, 4096, hopper=True)
    assert large[:len(PERSISTENT)] == PERSISTENT
    assert any(c["kernel"] == "staged" for c in large)       # the tuner still compares
    assert not any(c["kernel"] == "persistent" for c in gemm_candidates(4096, 4096, 4096,
                                                                         hopper=False))
    # With a fused epilogue the one-block-per-tile 128x256 kernel storing registers leads
    # (measured faster); without, it is not timed (0.78-0.86x cuBLAS, session 12).
    fused = gemm_candidates(4096, 4096, 4096, hopper=True, fused=True)
    assert fused[0] == dict(kernel="shared", BM=128, BN=256, BK=64, STAGES=3, threads=256)
    assert not any(c["kernel"] == "shared" for c in large) and len(fused) <= 7
    # Clusters of 2 are also timed with GROUP=4: the 8-row-tile bands of GROUP=8 alone.
    assert dict(PERSISTENT[1], GROUP=4) in large
    # No more 128x256 tiles than SMs (2048^3: 128): one block per tile, staged, first.
    assert [c["kernel"] for c in gemm_candidates(2048, 2048, 2048)[:2]] == ["staged"] * 2
    # Few tiles (1024²: 32 of 128×256) or decode rows: one block per tile leads (at 1024²
    # the 128×64 tile with the TMA-store epilogue, 1.015× cuBLAS in session 13).
    assert gemm_candidates(1024, 1024, 1024)[0]["kernel"] == "staged"
    assert all(c["kernel"] != "persistent" for c in gemm_candidates(1024, 1024, 1024))
    # The shared-pipeline tiles with 32-wide k-steps (0.54–0.66× cuBLAS, session 10) are
    # no longer timed for large shapes on sm_90a; the persistent kernel with taller bands is.
    assert all(c["BK"] == 64 for c in large)
    assert dict(PERSISTENT[0], GROUP=16) in large
    decode = gemm_candidates(16, 4096, 16384)
    assert decode[0]["kernel"] != "persistent"
    assert any(c.get("SPLIT", 1) > 1 for c in decode)


@pytest.mark.parametrize("m", [1, 16, 64, 128])
def test_decode_candidates_stream_the_weight_through_deep_wgmma_rings_on_hopper(m):
    """sm_90a decode shapes: up to 16 rows 64×32 tiles in 16 stages of 64 or 6 of 128;
    up to 64 rows the session-10 order (64×32×128 in 6 stages first: 1.04× cuBLAS at
    64×4096×4096); 128 rows 64×64 in 12 stages first (0.99×), then 64×64×128 in 6 —
    within the tuner's 7, split-K still timed; none of them on older GPUs."""
    from tegula.kernels.api_matmul import STREAM_64, STREAM_128
    hopper = gemm_candidates(m, 4096, 16384, hopper=True)
    streaming = [dict(kernel="shared", BM=64, BN=32, BK=64, STAGES=16),
                 dict(kernel="shared", BM=64, BN=32, BK=128, STAGES=6)] if m <= 16 else \
        [dict(c, kernel="shared") for c in (STREAM_64 if m <= 64 else STREAM_128)]
    assert hopper[:len(streaming)] == streaming and len(hopper) <= 7
    assert any(c.get("SPLIT", 1) > 1 for c in hopper)      # split-K is still timed
    older = gemm_candidates(m, 4096, 16384, hopper=False)
    assert not any(c in older for c in streaming)
    # Deep rings: every streaming stage ring holds at least 96 KB in flight.
    assert all(c["STAGES"] * (c["BM"] + c["BN"]) * c["BK"] * 2 >= 96 * 1024
               for c in streaming)


def test_small_squares_on_hopper_take_tiles_that_give_every_sm_a_block():
    """1024³ in 128×128 tiles is 64 blocks for 132 SMs (0.57–0.65× cuBLAS); the sm_90a
    candidates for outputs up to 1024×1024 are 128×64 or 64×128 tiles with deep rings
    (128 blocks), 128×128 last; the 128×64×128 tile with the TMA-store epilogue first
    (`kernel="staged"`: 9.4 µs, 1.015× cuBLAS, against 10.1 µs storing registers, H100
    session 13), then the shared kernel's."""
    found = gemm_candidates(1024, 1024, 1024, hopper=True)
    blocks = [(1024 // c["BM"]) * (1024 // c["BN"]) for c in found]
    assert blocks[:-1] == [128] * (len(found) - 1) and blocks[-1] == 64
    assert found[0] == dict(kernel="staged", BM=128, BN=64, BK=128, STAGES=4, threads=256)
    assert found[1] == dict(kernel="shared", BM=128, BN=64, BK=64, STAGES=8, threads=256)
    assert gemm_candidates(1024, 1024, 1024, hopper=False)[0]["BK"] == 32  # mma.sync's


def test_persistent_candidates_fit_the_h100(monkeypatch):
    """Each persistent configuration synthesizes for sm_90a (shared memory, registers)."""
    for config in PERSISTENT:
        values = {k: v for k, v in config.items() if k != "kernel"}
        build(persistent_gemm_kernel(f16, "gelu", True), values, None, "sm_90a")


torch = pytest.importorskip("torch")


@pytest.fixture
def persistent_only(on_cpu, monkeypatch):
    """matmul with the persistent kernel its only candidate (small tiles, emulated); the
    launches each call would replay are recorded (an emulated launch has no compiled
    kernel to replay)."""
    import tegula.kernels.api as api
    import tegula.kernels.api_matmul as api_matmul
    from tegula.runtime.autotune import Config

    config = (Config.of(dict(kernel="persistent", B="view", **SMALL)),)
    monkeypatch.setattr(api, "_configs", lambda family, *bucket: config)
    plans = []
    monkeypatch.setattr(api_matmul, "_matmul_replay",
                        lambda plan, b_layout, m, n: plans.append((plan, b_layout)))
    monkeypatch.setattr(api, "_remember", lambda signature, replay: None)
    return plans


def test_matmul_entry_point_runs_the_persistent_kernel(persistent_only):
    import tegula.kernels as tk

    for seed, (m, n, k) in enumerate([(45, 70, 40), (130, 33, 24), (1, 64, 16)]):
        g = torch.Generator().manual_seed(seed)
        a = torch.randn(m, k, generator=g).to(torch.float16)
        w = torch.randn(n, k, generator=g).to(torch.float16)
        bias = torch.randn(n, generator=g).to(torch.float16)
        c = tk.matmul(a, w.T, bias, "gelu")
        check_epilogue(c.float().numpy(), a.float().numpy(), w.float().numpy(),
                       bias.float().numpy(), "gelu", f16)
        (plan, b_layout), = persistent_only[-1:]
        (_, grid, args, roles), = plan          # one launch, on one block per tile here
        assert grid == persistent_grid(m, n, 132, SMALL["BM"], SMALL["BN"]) + (1, 1)
        assert roles == ("a", "b", "bias", "c") and b_layout == "view"


def test_emulated_kernel_matches_tg_emulate_directly():
    """gemm_emulated(persistent=...) is the kernel on the persistent grid, nothing else."""
    rng = np.random.default_rng(9)
    a, b, _ = operands(rng, 40, 40, 32, f16)
    c = np.full((40, 40), np.nan, np.float16)
    tg.emulate(persistent_gemm_kernel(f16), persistent_grid(40, 40, 3, 64, 32), a, b, c,
               target="sm_90a", **SMALL)
    assert np.array_equal(c, gemm_emulated(a, b, f16, persistent=3, **SMALL))
