"""Torch-facing matrix products of the kernel library: `matmul` (f16/bf16, with a fused
bias + activation epilogue) and `matmul_fp8` (e4m3, per-tensor or blockwise scales),
re-exported by `tegula.kernels.api` and `tegula.kernels`.

    import tegula.kernels as tk
    c = tk.matmul(x, w.T, bias, "gelu")           # x (M, K), w (N, K)
    y = tk.matmul_fp8(xq, wq.T, sx, sw)           # e4m3, one f32 scale each

Each call checks its inputs, allocates the output, lets the autotuner pick a configuration
per shape bucket among `gemm_candidates` / `fp8_candidates` (timed on the first call,
cached per GPU), launches it on the current torch stream and remembers the launch so the
next call with the same signature replays it (see `tegula.kernels.api`, whose helpers
this module calls through the module so that tests can replace them). See api's module
docstring for how b's memory layout costs.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

from tegula.dtypes import DType, bf16, f16, f32
from tegula.kernels import api as _api
from tegula.runtime.autotune import Config

# --------------------------------------------------------------------------------------
# matmul
# --------------------------------------------------------------------------------------

#: The persistent kernel's configurations on sm_90a (kernels.gemm.persistent_gemm_kernel):
#: 128×256×64 in 4 stages on two cooperative consumer warpgroups is the H100's best
#: measured, alone or in 2-CTA clusters multicasting b (cuBLAS's own configuration),
#: within a few percent of each other and either ahead by shape (session 9, with the
#: producer's tile coordinates out of its k loop: 0.90–0.93× cuBLAS at 4096³, 0.98–1.08×
#: at 8192³ and 4096×14336×4096; tensor pipe 91–92% busy at 4096³): the tuner picks per
#: shape. (Session 8 had them at 0.80–0.85×, L2-bound: the producer's ~25-instruction
#: divisions each k-step kept the ring from running ahead.)
PERSISTENT = [dict(kernel="persistent", BM=128, BN=256, BK=64, STAGES=4, GROUP=8, threads=256),
              dict(kernel="persistent", BM=128, BN=256, BK=64, STAGES=4, GROUP=8, threads=256,
                   CLUSTER=2)]
#: Where 128×256 tiles would leave SMs idle (few rows): twice the tiles, 64×256 on
#: ping-pong consumer warpgroups (~400 TFLOP/s at 4096³: twice the L2 bytes per FLOP).
PERSISTENT_PINGPONG = dict(kernel="persistent", BM=64, BN=256, BK=64, STAGES=4, GROUP=8,
                           threads=128, consumers="pingpong")


#: What the search (`tg.recommend`, issue 11) decides for the persistent kernel on sm_90a:
#: the tile's width, its stages and the cluster shape (BM=128, BK=64, two consumer
#: warpgroups fixed).
PERSISTENT_SPACE = dict(BN=[128, 256], STAGES=[3, 4], CLUSTER=[1, 2])


@functools.lru_cache(maxsize=None)
def searched_persistent(m: int, n: int, k: int) -> list[dict]:
    """The persistent kernel's configurations matmul times for an (M, N, K) bucket on
    sm_90a: the cost model's top `len(PERSISTENT)` over `PERSISTENT_SPACE`, each config
    built and scored without a GPU (~0.3 s each, once per bucket). For the large shapes
    they are `PERSISTENT` (128×256 in 4 stages, alone and in 2-block clusters); where
    128×256 tiles leave SMs idle (512×4096: 64 tiles) the search takes 128×128."""
    from tegula.arch import get_target
    from tegula.kernels.gemm import persistent_gemm_kernel, persistent_grid
    from tegula.recommend import recommend
    sms = get_target("sm_90a").sm_count
    found = recommend(persistent_gemm_kernel(f16), shapes=dict(a=(m, k), b=(n, k), c=(m, n)),
                      grid=lambda c: persistent_grid(m, n, sms, c["BM"], c["BN"], c["CLUSTER"]),
                      space=PERSISTENT_SPACE, top_k=len(PERSISTENT), target="sm_90a",
                      BM=128, BK=64, GROUP=8, threads=256, load_path="tma")
    return [dict(kernel="persistent", BM=128, BN=c.config["BN"], BK=64, STAGES=c.config["STAGES"],
                 GROUP=8, threads=256, **({"CLUSTER": 2} if c.config["CLUSTER"] == 2 else {}))
            for c in found.top]


#: What the search decides for decode shapes on sm_90a: the orientation (C, or Cᵀ = b·aᵀ:
#: the weight's N rows as the wgmma's 64-row M and the few tokens as its N), with the
#: tile's width and ring depth (BM = 64, BK = 64, one warpgroup fixed).
ORIENTATION_SPACE = dict(BN=[16, 32], STAGES=[8, 16])


@functools.lru_cache(maxsize=None)
def searched_transposed(m: int, n: int, k: int) -> list[dict]:
    """The shared-memory kernel computing cᵀ = b·aᵀ for an (M, N, K) bucket on sm_90a,
    where the search (`tg.recommend` with `orientation=`, both orientations of every
    config of `ORIENTATION_SPACE`) ranks a transposed configuration first; else [] (on a
    predicted tie C ranks first). ~1 s once per bucket, no GPU. The kernel then writes
    out's transpose, an (N, M) view with unit stride along its first dimension."""
    from tegula.kernels.gemm import gemm_kernel, tile_grid
    from tegula.recommend import recommend

    def grid(c):
        rows, cols = (m, n) if c["orientation"] == "C" else (n, m)
        return tile_grid(rows, cols, 64, c["BN"]) + (1,)
    found = recommend(gemm_kernel(f16), shapes=dict(a=(m, k), b=(n, k), c=(m, n)),
                      grid=grid, space=ORIENTATION_SPACE, orientation=("a", "b", "c"),
                      top_k=1, target="sm_90a", BM=64, BK=64, threads=128, load_path="tma")
    best = found.ranked[0].config if found.ranked else None
    if best is None or best["orientation"] != "Cᵀ":
        return []
    return [dict(BM=64, BN=best["BN"], BK=64, STAGES=best["STAGES"], orientation="Cᵀ")]


def gemm_candidates(m: int, n: int, k: int, hopper: bool = True,
                    fused: bool = False, n_exact: int | None = None) -> list[dict]:
    """GEMM configurations worth timing for an (M, N, K) bucket, the default (untuned)
    first; at most 7 (what the tuner times). `kernel` picks the dataflow ("persistent":
    one block per SM walking the tiles in grouped-rows order, on sm_90a one TMA ring
    across them, only offered where `hopper`; "shared": one block per tile, multi-stage
    shared-memory pipeline — on sm_90a TMA + wgmma; "staged": the same with the persistent
    kernel's TMA-store epilogue (`gemm.staged_gemm_kernel`); "registers": global ->
    registers -> MMA). Few rows (`_few_rows_candidates`) stream the weight through narrow tiles with
    deep rings, with split-K (SPLIT partial sums, then a deterministic reduction) where K
    is long; many rows (`_many_rows_candidates`) take the persistent kernel first on
    sm_90a unless a bias or activation is `fused` (its one consumer role runs the
    epilogue while the tensor cores wait: on an H100 at 4096³ with bias + GELU 398
    TFLOP/s, one block per tile 617). Large tiles take 256 threads, keeping accumulators
    at ≤ 128 f32 registers a thread. `n_exact`: the true N of a decode shape
    (`fitted_n`), which its `wave_fitted` tiles, or many rows' `persistent_width` ones,
    are cut to (by default the bucket's n)."""
    if _api._pow2_at_least(m, 1) <= 256:
        chosen, split = _few_rows_candidates(m, n, hopper, n_exact or n)
    else:
        chosen, split = _many_rows_candidates(m, n, k, hopper, fused, n_exact or n), []
    # Split K only where each split still has a few k-tiles to pipeline.
    chosen += [c for c in split if k // c["BK"] // c["SPLIT"] >= 8]
    if hopper and not fused:
        chosen = _with_orientation(chosen, m, n, k)
    return [dict(c, kernel=c.get("kernel", "shared")) for c in chosen]


#: sm_90a, up to 64 rows: the weight streamed through 64×32 wgmma tiles (N/32 blocks),
#: the ring as deep as shared memory allows. Measured on an H100 (session 10, each
#: candidate against cuBLAS in one process, `benchmarks/gemm_candidates.py`) at
#: 64×4096×4096: 64×32×128 in 6 stages 1.04×, 64×32×64 in 16 0.98×; 64×64 / 64×128 /
#: 32×64 tiles in 4 stages and split-K 0.65–0.77× (each k-step's fixed cost — the
#: full/empty barrier round, the wgmma commit and wait — is paid per 64 of K: the wider
#: the step and the deeper the ring, the closer to the memory's rate). Dropped in session
#: 11, never the fastest: the 64×32 tile in 2-block clusters multicasting a (0.82–0.94×)
#: and 32×64 in 4 stages (0.93–0.94×).
STREAM_64 = [dict(BM=64, BN=32, BK=128, STAGES=6), dict(BM=64, BN=32, BK=64, STAGES=16),
             dict(BM=64, BN=64, BK=128, STAGES=6)]
#: sm_90a, 65–128 rows: 64×64 tiles in 12 stages 0.99× cuBLAS at 128×4096×4096 (8 stages
#: 0.96×), 64×64×128 in 6 0.97×; then 128×128 on two warpgroups in 6 stages (0.94–0.96×
#: with long weights, which 64-row tiles read twice). Dropped in session 11, never the
#: fastest: 128×32 in 8 stages (0.77–0.94×), the ping-pong persistent 64×256 (0.61–0.93×).
STREAM_128 = [dict(BM=64, BN=64, BK=64, STAGES=12), dict(BM=64, BN=64, BK=128, STAGES=6),
              dict(BM=128, BN=128, BK=64, STAGES=6, threads=256)]


def wave_fitted(rows: int, n: int, bm: int, bk: int, sms: int,
                smem: int = 232448, max_stages: int = 16) -> dict:
    """A decode tile (sm_90a, shared kernel) whose width makes one whole wave: BN the
    narrowest multiple of 8 (wgmma's N step, ≤ 256) that gives at most `sms` blocks for
    `rows` rows of BM and N columns, and the deepest ring of (BM + BN)·BK f16 stages that
    fits `smem` (less a kilobyte: the barriers), at most `max_stages`. The pow2 lists' 64-
    or 128-wide tiles leave a last partial wave at N = 11008 / 14336 (128×14336 in 64×64
    tiles is 448 blocks, 3.4 waves of 132); these leave none (88 wide: 126 blocks at
    N = 11008, 112: 128 at 14336; 64 rows of 64 at N = 4096: 32 wide, the measured best).
    BM = 128 takes two consumer warpgroups (threads=256)."""
    tiles_m = -(-rows // bm)
    per_wave = max(1, sms // tiles_m)
    bn = min(256, 8 * -(-n // (8 * per_wave)))
    stages = min(max_stages, (smem - 1024) // ((bm + bn) * bk * 2))
    config = dict(BM=bm, BN=bn, BK=bk, STAGES=stages)
    return dict(config, threads=256) if bm == 128 else config


def _few_rows_candidates(m: int, n: int, hopper: bool,
                         n_exact: int) -> tuple[list[dict], list[dict]]:
    """(unsplit, split-K) candidates for decode shapes (up to 256 rows). With M = 16 a
    128-wide N tile gives only N/128 blocks (32 for N = 4096, a quarter of an H100), so
    narrower N tiles trade reuse, which few rows cannot use anyway, for blocks; with a
    long K, splitting it multiplies the blocks again (128×4096 in 64×128 tiles is 64
    blocks; split 4 ways, 256). On sm_90a the streaming tiles come first: for 17–128
    rows `_hopper_decode`'s (tiles cut to N, `STREAM_64` / `STREAM_128`)."""
    registers = dict(kernel="registers", BM=64, BN=64, BK=32)
    rows = _api._pow2_at_least(m, 1)
    if rows <= 16:
        # 16 rows on sm_90a: 64×32 tiles, 16 stages of 64 or 6 of 128 (0.99–1.10×
        # cuBLAS, session 9), then the mma.sync-sized 16-row tiles.
        streaming = [dict(BM=64, BN=32, BK=64, STAGES=16),
                     dict(BM=64, BN=32, BK=128, STAGES=6)] if hopper else []
        chosen = streaming + [dict(BM=16, BN=32, BK=128, STAGES=4),
                              dict(BM=16, BN=64, BK=64, STAGES=4),
                              dict(BM=32, BN=64, BK=64, STAGES=4), registers][:-2 if hopper
                                                                            else None]
        split = [dict(BM=16, BN=64, BK=64, STAGES=4, SPLIT=4),
                 dict(BM=16, BN=128, BK=64, STAGES=4, SPLIT=4),
                 dict(BM=16, BN=128, BK=64, STAGES=4, SPLIT=8)]
        return chosen, split
    if hopper and rows <= 128:
        return _hopper_decode(rows, n_exact)
    if rows <= 64:
        return [dict(BM=32, BN=64, BK=64, STAGES=4), dict(BM=64, BN=64, BK=64, STAGES=4),
                dict(BM=64, BN=128, BK=64, STAGES=4), dict(BM=32, BN=128, BK=64, STAGES=4),
                registers], [dict(BM=64, BN=128, BK=64, STAGES=4, SPLIT=4),
                             dict(BM=32, BN=128, BK=64, STAGES=4, SPLIT=2),
                             dict(BM=64, BN=128, BK=64, STAGES=4, SPLIT=8)]
    if hopper:
        return STREAM_128 + [PERSISTENT_PINGPONG], [dict(BM=64, BN=128, BK=64, STAGES=4,
                                                         SPLIT=2)]
    return [dict(BM=64, BN=128, BK=64, STAGES=4), dict(BM=128, BN=128, BK=32, STAGES=4),
            dict(BM=128, BN=128, BK=32, STAGES=4, threads=256),
            dict(BM=128, BN=256, BK=32, STAGES=3, threads=256)], \
        [dict(BM=64, BN=128, BK=64, STAGES=4, SPLIT=2),
         dict(BM=64, BN=128, BK=64, STAGES=4, SPLIT=4)]


def _hopper_decode(rows: int, n: int) -> tuple[list[dict], list[dict]]:
    """sm_90a, 17–128 rows: the `wave_fitted` tiles cut to N where N is no power of two
    (first: measured on an H100, session 11, at N = 11008 / 14336 and K = 4096, 0.96–1.02×
    cuBLAS where the listed tiles ran 0.81–0.98×), then `STREAM_64` / `STREAM_128`, at
    most 6 unsplit, split K last (dropped by `gemm_candidates` where K is short). At
    128 rows 64-row tiles in BK = 128 (64×168 at 11008: 1.01×) lead, then two consumer
    warpgroups on 128 rows (128×112 at 14336: 0.96×)."""
    from tegula.arch import get_target
    sms = get_target("sm_90a").sm_count
    if rows <= 64:
        fitted = [wave_fitted(rows, n, 64, bk, sms) for bk in (128, 64)]
        listed, split = STREAM_64, dict(BM=64, BN=128, BK=64, STAGES=4, SPLIT=4)
    else:
        fitted = [wave_fitted(rows, n, bm, bk, sms) for bk in (128, 64) for bm in (64, 128)]
        listed, split = STREAM_128, dict(BM=64, BN=128, BK=64, STAGES=4, SPLIT=2)
    return _merge_tiles(fitted, listed)[:6], [split]


def _merge_tiles(fitted: list[dict], listed: list[dict]) -> list[dict]:
    """The fitted configs whose width is no power of two (cut to an N such as 11008),
    then `listed`, then the other fitted ones whose (BM, BN, BK) is not listed (at
    N = 4096 the fitted tiles are the listed ones, whose measured ring depths stay)."""
    def tile(c):
        return c["BM"], c["BN"], c["BK"]
    cut = [c for c in fitted if c["BN"] & (c["BN"] - 1)]
    have = {tile(c) for c in cut + listed}
    return cut + listed + [c for c in fitted if c not in cut and tile(c) not in have]


#: sm_90a, outputs up to 1024×1024 (64 tiles of 128×128 leave half an H100 idle): tiles
#: of 128×64 on two warpgroups or 64×128, 128 blocks, deep rings. At 1024³ (H100, session
#: 10): 128×64 in 8 stages 0.88× cuBLAS, 64×128×128 in 4 0.81×, 64×128 in 8 0.79×, where
#: 128×128 tiles ran 0.57–0.65× (the previous pick). First, the same 128×64×128 tile with
#: the TMA-store epilogue (`kernel="staged"`): 9.4 µs, 1.015× cuBLAS, where the register
#: epilogue ran 10.1 µs (0.94×) in the same process (session 13, round 1; ncu: 8.5 µs for
#: the register-epilogue kernel, 7.6 µs for cuBLAS's 64×128 tile in 2-block clusters).
SMALL_SQUARES = [dict(kernel="staged", BM=128, BN=64, BK=128, STAGES=4, threads=256),
                 dict(BM=128, BN=64, BK=64, STAGES=8, threads=256),
                 dict(BM=128, BN=64, BK=128, STAGES=4, threads=256),
                 dict(BM=64, BN=128, BK=128, STAGES=4), dict(BM=64, BN=128, BK=64, STAGES=8),
                 dict(BM=128, BN=128, BK=64, STAGES=6, threads=256)]


def persistent_width(m: int, n: int, sms: int, bm: int = 128, narrowest: int = 224,
                     gain: float = 0.03) -> int:
    """The persistent kernel's tile width for an (M, N) result on `sms` SMs: of the
    multiples of 8 from `narrowest` to 256 (wgmma's N step), the one whose tiles cost the
    SMs least time — whole waves times the width, as a last partial wave costs a whole
    one — if that saves at least `gain` of 256's, else 256 (a width that is no multiple
    of 64 loses the TMA-store epilogue). At 4096×11008, 256 wide is 32 × 43 = 1376 tiles,
    10.4 waves of 132 (11, the last 42% full); 248 wide is 32 × 45 = 1440, 10.9 (11 waves
    of 3% narrower tiles). Widths under `narrowest` read a's tile more often per product
    than the tensor cores can afford (128×128 ran 0.87–0.91× the 128×256 tile)."""
    tiles_m = -(-m // bm)

    def cost(bn: int) -> int:
        return -(-tiles_m * -(-n // bn) // sms) * bn
    best = min(range(256, narrowest - 1, -8), key=cost)
    return best if cost(best) <= (1 - gain) * cost(256) else 256


def _many_rows_candidates(m: int, n: int, k: int, hopper: bool, fused: bool,
                          n_exact: int | None = None) -> list[dict]:
    """Candidates for more than 256 rows. On sm_90a, where the tiles fill the GPU, the
    searched persistent configurations (`searched_persistent`), then, where N (`n_exact`,
    by default the bucket's n) leaves a partial last wave of 128×256 tiles, the width
    `persistent_width` fits to it, then one block per 128×256 tile with the persistent
    kernel's TMA-store epilogue (`kernel="staged"`, with and without a producer
    warpgroup; first where the tiles make one nearly full wave: at 2048³, 128 tiles for
    132 SMs, it ran 0.94–0.95× cuBLAS where the persistent kernel, one tile a block after
    five divisions, ran 0.89–0.91×, H100 session 12), then the persistent kernel with
    taller row bands, alone and in clusters. One block per 128×256 tile storing registers
    (0.78–0.86× at 2048³, 4096×11008² and 8192³) is only timed with a `fused` epilogue,
    where it comes first; the two-warpgroup
    shared-pipeline tiles with 32-wide k-steps ran 0.54–0.66× cuBLAS at 2048³ and
    4096×4096×14336 (session 10) and are no longer offered there."""
    chosen = [dict(BM=128, BN=128, BK=32, STAGES=4),
              dict(BM=128, BN=128, BK=32, STAGES=4, threads=256),
              dict(BM=128, BN=256, BK=32, STAGES=3, threads=256),
              dict(BM=256, BN=128, BK=32, STAGES=3, threads=256),
              dict(BM=128, BN=128, BK=64, STAGES=3, threads=256),
              dict(BM=128, BN=256, BK=64, STAGES=3, threads=256)]
    if m * n <= 1024 * 1024:
        if hopper:
            return list(SMALL_SQUARES)
        chosen = [c for c in chosen if c["BM"] * c["BN"] <= 128 * 128]  # smaller tiles
        return chosen + [dict(BM=64, BN=128, BK=64, STAGES=4),
                         dict(BM=64, BN=64, BK=64, STAGES=4)]
    if not hopper:
        return chosen
    persistent = searched_persistent(m, n, k)
    taller = dict(persistent[0], GROUP=16)
    from tegula.arch import get_target
    sms = get_target("sm_90a").sm_count
    width = persistent_width(m, n_exact or n, sms)
    if width != 256:
        persistent = persistent + [dict(PERSISTENT[0], BN=width)]
    one_per_tile = [dict(BM=128, BN=256, BK=64, STAGES=3, threads=256),
                    dict(BM=128, BN=256, BK=64, STAGES=4, threads=256)]
    staged = [dict(kernel="staged", BM=128, BN=256, BK=64, STAGES=4, threads=256),
              dict(kernel="staged", BM=128, BN=256, BK=64, STAGES=4, threads=256,
                   warp_specialize=False)]
    if fused:
        return one_per_tile[:1] + staged[:1] + persistent + [taller] + one_per_tile[1:]
    # Clusters of 2 walk units of 2 row tiles: GROUP=4 bands 8 row tiles, as GROUP=8 alone
    # (8192³, H100 session 12: 1.05× cuBLAS measured last of its shape, GROUP=8 0.94×).
    banded = [dict(c, GROUP=4) for c in persistent if c.get("CLUSTER", 1) == 2]
    tiles = -(-m // 128) * -(-(n_exact or n) // 256)
    if 0.9 * sms <= tiles <= sms:   # one nearly full wave, a tile a block: staged first
        return (staged + persistent + [taller] + banded)[:7]
    return (persistent + staged + [taller] + banded)[:7]


def _with_orientation(chosen: list, m: int, n: int, k: int) -> list:
    """`chosen` with the search's transposed configuration for up to 64 rows, where it
    ranks Cᵀ first (not with a fused epilogue: cᵀ takes one bias value per row, the
    kernel's epilogue adds one per column), in the last place of a full list (the tuner's
    7; the last is a split-K one)."""
    if _api._pow2_at_least(m, 1) > 64:
        return chosen
    transposed = searched_transposed(m, n, k)
    return chosen[:7 - len(transposed)] + transposed


def _check_epilogue_args(fn: str, bias: Any, activation: Any, a: Any, n: int) -> None:
    """bias: None or an (N,) tensor of a's dtype; activation: one of ACTIVATIONS."""
    from tegula.kernels.gemm import ACTIVATIONS
    if activation not in ACTIVATIONS:
        raise ValueError(f"tegula.kernels.{fn}: activation must be one of "
                         f"{', '.join(map(repr, ACTIVATIONS))}, got {activation!r}")
    if bias is None:
        return
    _api._check_tensor(fn, "bias", bias, _api._GEMM_DTYPES, ndim=1)
    _api._check_same_dtype(fn, {"a": a, "bias": bias})
    if bias.shape[0] != n:
        raise ValueError(f"tegula.kernels.{fn}: bias must have one value per output column "
                         f"(N = {n}), got shape {tuple(bias.shape)}")


def _activation_in_torch(z: Any, activation: str | None) -> Any:
    """The epilogue's activation by torch (only for K = 0, where there is no GEMM)."""
    f = _api._torch().nn.functional
    return {None: lambda t: t, "relu": f.relu, "gelu": f.gelu, "silu": f.silu,
            "gelu_tanh": lambda t: f.gelu(t, approximate="tanh")}[activation](z)


def matmul(a: Any, b: Any, bias: Any = None, activation: str | None = None, *,
           out: Any = None) -> Any:
    """`activation(a @ b + bias)` for a (M, K) and b (K, N) CUDA tensors of f16 or bf16,
    accumulated in f32 and returned in the inputs' dtype as a new (M, N) tensor (or written
    into `out`), in one kernel: `bias` (N,) of the same dtype is added to the f32
    accumulator, then `activation` — None, "relu", "gelu" (exact, erf: torch's default
    `F.gelu`), "gelu_tanh" (`F.gelu(approximate="tanh")`) or "silu" — then one rounding.
    (torch's `F.gelu(a @ b + bias)` rounds after the matmul and after the add as well, so
    the two differ by about one rounding of the output type.)

    See the module docstring for how `b`'s memory layout costs (free for `w.T` of a
    K-major (N, K) `w`)."""
    tensors = (a, b) if bias is None else (a, b, bias)
    signature = None
    if out is None:
        found = _api._replay_entry(tensors, "matmul", activation)
        if type(found) is not tuple:
            return found  # replayed
        signature = found[0]
    dtype = _api._check_tensor("matmul", "a", a, _api._GEMM_DTYPES, ndim=2)
    _api._check_tensor("matmul", "b", b, _api._GEMM_DTYPES, ndim=2)
    _api._check_same_dtype("matmul", {"a": a, "b": b})
    (m, k), (k2, n) = a.shape, b.shape
    if k != k2:
        raise ValueError(f"tegula.kernels.matmul: inner dimensions differ: a is {tuple(a.shape)}"
                         f", b is {tuple(b.shape)} (a's columns must equal b's rows)")
    _check_epilogue_args("matmul", bias, activation, a, n)
    _api._check_cuda("matmul", {"a": a, "b": b, **({} if bias is None else {"bias": bias})})
    torch = _api._torch()
    if out is None:
        out = torch.empty((m, n), dtype=a.dtype, device=a.device)
    else:
        _api._check_out("matmul", out, (m, n), a)
    if m == 0 or n == 0:
        return out
    if k == 0:  # an empty sum: the epilogue of zeros
        if bias is None and activation is None:
            return out.zero_()
        z = torch.zeros(n, device=a.device) if bias is None else bias.float()
        return out.copy_(_activation_in_torch(z, activation).to(a.dtype).expand(m, n))
    a_contiguous = a.stride(1) == 1
    if not a_contiguous:
        a = a.contiguous()  # the kernel reads a's rows with vectors
    bias_row = None if bias is None else bias.contiguous().view(1, n)
    bt = b.T
    layouts = ["view"] if bt.stride(1) == 1 else (["view", "copy"] if bt.stride(0) == 1
                                                  else ["copy"])
    hopper = _is_hopper(a.device)
    n_exact = fitted_n(m, n, hopper)
    configs = _api._configs("gemm", _api._pow2_at_least(m, 1), _api._pow2_at_least(n, 1),
                            _api._pow2_at_least(k, 1), hopper,
                            bias is not None or activation is not None, n_exact,
                            tuple(layouts))
    epilogue = (activation, bias_row)

    def run(config: Config) -> Any:
        values = config.kwargs
        b_layout = values.pop("B")
        operand = bt if b_layout == "view" else bt.contiguous()
        return _gemm_launches(dtype, values, config.threads, a, operand, out,
                              epilogue), b_layout

    # Each epilogue is tuned on its own: it does not cost the same everywhere (on an H100
    # bias + GELU took the persistent 128x256 kernel from 638 to 398 TFLOP/s at 4096³: its
    # one consumer role runs the epilogue while the tensor cores wait).
    fused = "" if bias is None and activation is None else \
        f"/{activation}{'+bias' if bias is not None else ''}"
    fused += "" if n_exact is None else f"/n={n_exact}"   # its own tiles: its own pick
    plan, b_layout = _api._tune_and_run("matmul", a.device.index, configs, (m, n, k),
                                        f"{dtype}/{'+'.join(layouts)}{fused}", run)
    if signature is not None and a_contiguous and (bias is None or bias.stride(0) == 1):
        _api._remember(signature, _matmul_replay(plan, b_layout, m, n))
    return out


def fitted_n(m: int, n: int, hopper: bool) -> int | None:
    """N itself where the candidates depend on it, not only on its power-of-two bucket:
    sm_90a decode shapes of 17–128 rows, whose `wave_fitted` tiles are cut to the weight's
    N (11008 and 14336 share the bucket 16384, and the 88- and 112-wide tiles that fill an
    H100's SMs at each would leave the other with a partial wave), and shapes of more
    rows whose persistent tiles `persistent_width` narrows at this N (for the rows of
    M's bucket); else None. The tuner then keeps one pick per N (an LLM has a few weight
    shapes)."""
    if not hopper:
        return None
    rows = _api._pow2_at_least(m, 1)
    if 16 < rows <= 128:
        return n
    from tegula.arch import get_target
    large = rows > 256 and rows * _api._pow2_at_least(n, 1) > 1024 * 1024
    return n if large and persistent_width(rows, n, get_target("sm_90a").sm_count) != 256 \
        else None


@functools.lru_cache(maxsize=None)
def _device_facts(device: Any) -> tuple[bool, int]:
    """(Hopper?, SMs) of a tensor's device. Off the GPU (the emulated tests): not
    Hopper, and the default target's SM count for a persistent grid."""
    if getattr(device, "type", None) != "cuda":
        from tegula.arch import get_target
        return False, get_target("sm_90a").sm_count
    props = _api._torch().cuda.get_device_properties(device)
    return (props.major, props.minor) == (9, 0), props.multi_processor_count


def _is_hopper(device: Any) -> bool:
    """Whether the device runs sm_90a (H100/H200): the persistent TMA + wgmma kernel."""
    return _device_facts(device)[0]


def _num_sms(device: Any) -> int:
    return _device_facts(device)[1]


def _matmul_replay(plan: list[tuple], b_layout: str, m: int, n: int) -> Any:
    """A replay of `plan` (matmul's launches, each (kernel, grid, args, their roles), the
    first's args starting with a) for new tensors of the same signature, called as
    `replay((a, b[, bias]), their data pointers)`: one launch on b as given (a free view
    of b) is an `EntryReplay` (one C call where the extension is built); a split-K pair or
    a copied b is a closure doing the same in Python."""
    first_a = plan[0][2][plan[0][3].index("a")]
    allocate = _api.fast_empty(first_a, (m, n))
    # An EntryReplay passes the call's pointers in the call's order (a, b[, bias], c): only
    # for a launch taking them in that order (not the transposed orientation's b, a, c).
    if len(plan) == 1 and b_layout == "view" and plan[0][3] == _call_order(plan[0][3]):
        (ck, grid, args, _), = plan  # args: a, b.T, [bias row,] c: the tensors' pointers
        return _api.EntryReplay(ck, grid, args, allocate)
    launches = [(_api._replayer(ck, grid, args), roles) for ck, grid, args, roles in plan]
    workspace = next((args[roles.index("partial")] for _, _, args, roles in plan
                      if "partial" in roles), None)
    partial_shape = tuple(workspace.shape) if workspace is not None else None
    new_partial = None if workspace is None else _api.fast_empty(first_a, partial_shape,
                                                                 workspace.dtype)

    def replay_matmul(tensors: tuple, pointers: list) -> Any:
        a, b = tensors[:2]
        c = allocate(a)
        by_role = {"a": pointers[0], "b": pointers[1], "c": c.data_ptr()}
        if b_layout != "view":
            operand = b.T.contiguous()  # kept alive until its launches are queued
            by_role["b"] = operand.data_ptr()
        if len(tensors) == 3:
            by_role["bias"] = pointers[2]
        if new_partial is not None:
            partial = new_partial(a)
            by_role["partial"] = partial.data_ptr()
        for launch, roles in launches:
            launch(tuple(by_role[r] for r in roles))
        return c
    return replay_matmul


def _call_order(roles: tuple) -> tuple:
    """`roles` sorted into matmul's argument order (a, b, bias, c)."""
    return tuple(sorted(roles, key=("a", "b", "bias", "c").index))


def _gemm_launches(dtype: DType, values: dict, threads: int | None, a: Any, bt: Any,
                   out: Any, epilogue: tuple = (None, None)) -> list[tuple]:
    """Launch one GEMM configuration (`values`: tiles, "kernel", optional "SPLIT") on
    a (M, K), bt (N, K) into out (M, N), with the fused `epilogue` (activation, (1, N) bias
    or None); returns each launch as (compiled kernel, grid, arguments, their roles), which
    is what a replay repeats. A split-K configuration is two launches through an f32
    workspace: the split GEMM, then the reduction (which runs the epilogue)."""
    from tegula.kernels import gemm

    (m, _), n = a.shape, out.shape[1]
    activation, bias_row = epilogue
    with_bias = bias_row is not None
    bias_args, bias_roles = ((bias_row,), ("bias",)) if with_bias else ((), ())
    which, split = values.pop("kernel"), values.pop("SPLIT", 1)
    bm, bn = values["BM"], values["BN"]
    if values.pop("orientation", "C") == "Cᵀ":
        # cᵀ = b·aᵀ: the kernel's a is b's (N, K) rows, its c the (N, M) view out.T.
        assert which == "shared" and split == 1 and not with_bias and out.stride(1) == 1
        grid = gemm.tile_grid(n, m, bm, bn) + (1,)
        args = (bt, a, out.T)
        ck = _api._launch(gemm.gemm_kernel(dtype, activation, False), grid, args, values,
                          threads)
        return [(ck, grid, args, ("b", "a", "c"))]
    if split == 1:
        factory = {"registers": gemm.gemm_registers_kernel, "shared": gemm.gemm_kernel,
                   "persistent": gemm.persistent_gemm_kernel,
                   "staged": gemm.staged_gemm_kernel}[which]
        grid = gemm.tile_grid(m, n, bm, bn, values.get("CLUSTER_M", 1),
                              values.get("CLUSTER_N", 1)) + (1,)
        if which == "persistent":
            grid = gemm.persistent_grid(m, n, _num_sms(a.device), bm, bn,
                                        values.get("CLUSTER", 1)) + (1, 1)
        args = (a, bt, *bias_args, out)
        ck = _api._launch(factory(dtype, activation, with_bias), grid, args, values, threads)
        return [(ck, grid, args, ("a", "b", *bias_roles, "c"))]
    rows = gemm.split_k_rows(m, bm)
    partial = _api._torch().empty((split * rows, n), dtype=_api._torch().float32, device=a.device)
    grid = (-(-m // bm), -(-n // bn), split)
    ck = _api._launch(gemm.gemm_split_k_kernel(dtype), grid, (a, bt, partial),
                 dict(values, SPLIT=split), threads)
    reduce_grid = gemm.split_k_reduce_grid(m, n)
    reduce_args = (partial, *bias_args, out)
    reduce_ck = _api._launch(gemm.split_k_reduce_kernel(dtype, activation, with_bias), reduce_grid,
                        reduce_args, dict(ROWS=rows, SPLIT=split), None)
    return [(ck, grid, (a, bt, partial), ("a", "b", "partial")),
            (reduce_ck, reduce_grid, reduce_args, ("partial", *bias_roles, "c"))]


# --------------------------------------------------------------------------------------
# matmul_fp8
# --------------------------------------------------------------------------------------

def fp8_candidates(m: int, n: int, k: int, block_scales: bool,
                   hopper: bool = True) -> list[dict]:
    """FP8 GEMM configurations for an (M, N, K) bucket, the default first. A 128-byte e4m3
    k-step (BK = 128) gets the 128-byte swizzle; 128×128 f32 accumulators take two
    consumer warpgroups (threads=256) to stay under 255 registers a thread with the
    blockwise kernel's second (per-K-block) accumulator. The blockwise kernel's BK is its
    scale block, 128, and its BN must divide 128. On Hopper, shapes that fill the GPU try
    the persistent kernel first (`kernel="persistent"`, as `matmul`'s), blockwise too
    (session 10: its warp-specialized form, 192x128 on three consumer warpgroups, 1.2-1.35x
    the one block per tile on an H100)."""
    if block_scales:
        chosen = [dict(BM=128, BN=128, STAGES=4, threads=256),
                  dict(BM=128, BN=128, STAGES=3, threads=256),
                  dict(BM=64, BN=128, STAGES=4)]
        if m <= 64:
            # Few rows: one block an SM at most, which the roles decision (a per-block
            # model, blind to the grid) does not see; a producer warpgroup measured 1.12-1.16x
            # faster here (H100, session 12, benchmarks/roles_check.py --one-gemm), so ask for it.
            chosen = [dict(BM=64, BN=128, STAGES=4, warp_specialize=True),
                      dict(BM=64, BN=64, STAGES=4, warp_specialize=True)]
        elif hopper and m * n > 1024 * 1024:
            chosen = [dict(kernel="persistent", BM=192, BN=128, STAGES=3, GROUP=8,
                           threads=384),
                      dict(kernel="persistent", BM=128, BN=128, STAGES=4, GROUP=8,
                           threads=256)] + chosen
        return chosen
    chosen = [dict(BM=128, BN=128, BK=128, STAGES=4, threads=256),
              dict(BM=128, BN=256, BK=128, STAGES=3, threads=256),
              dict(BM=128, BN=256, BK=64, STAGES=4, threads=256),
              dict(BM=128, BN=128, BK=64, STAGES=4)]
    if m <= 64:
        # As above: a producer warpgroup measured level to 1.04x faster at 64 rows.
        chosen = [dict(BM=64, BN=128, BK=128, STAGES=4, warp_specialize=True),
                  dict(BM=64, BN=64, BK=128, STAGES=4, warp_specialize=True)]
    elif hopper and m * n > 1024 * 1024:
        # 128x256 alone and in 2-CTA clusters multicasting b: 1.02-1.05x and 1.00-1.07x
        # torch._scaled_mm on an H100 (session 9; the tuner picks per shape).
        chosen = [dict(kernel="persistent", BM=128, BN=256, BK=128, STAGES=3, GROUP=8,
                       threads=256),
                  dict(kernel="persistent", BM=128, BN=256, BK=128, STAGES=3, GROUP=8,
                       threads=256, CLUSTER=2),
                  dict(kernel="persistent", BM=128, BN=128, BK=128, STAGES=4, GROUP=8,
                       threads=256)] + chosen
    return chosen


def _fp8_scale(fn: str, name: str, scale: Any, want: tuple) -> Any:
    """A scale tensor checked against its expected shape, as the 2-D f32 view the kernel
    reads (a per-tensor scale may be a 0-D, (1,) or (1, 1) tensor)."""
    _api._check_tensor(fn, name, scale, _api._SCALE_DTYPES)
    if want == (1, 1) and scale.numel() == 1 and scale.dim() <= 2:
        return scale.reshape(1, 1)
    if tuple(scale.shape) != want:
        raise ValueError(f"tegula.kernels.{fn}: {name} has shape {tuple(scale.shape)}, "
                         f"expected {want}")
    return scale.contiguous()


def matmul_fp8(a: Any, b: Any, scale_a: Any, scale_b: Any, out_dtype: Any = None,
               block_scales: bool = False, *, out: Any = None) -> Any:
    """`(a · scale_a) @ (b · scale_b)` for float8_e4m3fn a (M, K) and b (K, N), accumulated
    in f32 and returned as `out_dtype` (torch.bfloat16 by default, torch.float16 or
    torch.float32), as `torch._scaled_mm(a, b, scale_a, scale_b, out_dtype=...)`.

    * per-tensor (`block_scales=False`): scale_a and scale_b are one f32 value each (0-D,
      (1,) or (1, 1) tensors); K a multiple of 16.
    * blockwise (`block_scales=True`, DeepSeek-V3): scale_a is (M, ⌈K/128⌉) — one scale
      per row and 128 of K — and scale_b is (⌈N/128⌉, ⌈K/128⌉) — one per 128×128 block of
      the (N, K) weight whose transpose b is; K a multiple of 16. Each 128-wide K block is
      multiplied into a fresh f32 accumulator, scaled, and added to the main one.

    As with `_scaled_mm`, b is best the transpose of a K-major (N, K) weight (`w.T`, a free
    view); another b is copied to that layout first."""
    fn = "matmul_fp8"
    tensors, options = (a, b, scale_a, scale_b), (out_dtype, type(block_scales), block_scales)
    signature = None
    if out is None:
        found = _api._replay_entry(tensors, fn, *options)
        if type(found) is not tuple:
            return found  # replayed
        signature = found[0]
    torch = _api._torch()
    _api._check_tensor(fn, "a", a, _api._FP8_DTYPES, ndim=2)
    _api._check_tensor(fn, "b", b, _api._FP8_DTYPES, ndim=2)
    out_dtype = torch.bfloat16 if out_dtype is None else out_dtype
    out_t = {torch.bfloat16: bf16, torch.float16: f16, torch.float32: f32}.get(out_dtype)
    if out_t is None:
        raise TypeError(f"tegula.kernels.{fn}: out_dtype must be torch.bfloat16, "
                        f"torch.float16 or torch.float32, got {out_dtype}")
    if not isinstance(block_scales, bool):
        raise TypeError(f"tegula.kernels.{fn}: block_scales must be True or False, got "
                        f"{block_scales!r}")
    from tegula.kernels import fp8, gemm
    m, n, k = fp8.check_fp8_shapes(fn, tuple(a.shape), tuple(b.T.shape), block_scales,
                                   b_name="b.T")
    want_a, want_b = fp8.scale_shapes(m, n, k, block_scales)
    sa = _fp8_scale(fn, "scale_a", scale_a, want_a)
    sb = _fp8_scale(fn, "scale_b", scale_b, want_b)
    _api._check_cuda(fn, {"a": a, "b": b, "scale_a": scale_a, "scale_b": scale_b})
    if out is None:
        out = torch.empty((m, n), dtype=out_dtype, device=a.device)
    else:
        _api._check_out(fn, out, (m, n), torch.empty(0, dtype=out_dtype, device=a.device))
    if m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    a = a if a.stride(1) == 1 else a.contiguous()
    bt = b.T if b.T.stride(1) == 1 else b.T.contiguous()
    kernels = {"tiles": fp8.fp8_blockwise_gemm_kernel(out_t) if block_scales else
               fp8.fp8_gemm_kernel(out_t),
               "persistent": fp8.fp8_blockwise_persistent_kernel(out_t) if block_scales else
               fp8.fp8_persistent_gemm_kernel(out_t)}
    configs = tuple(Config.of(c) for c in fp8_candidates(
        _api._pow2_at_least(m, 1), _api._pow2_at_least(n, 1), k, block_scales,
        _is_hopper(a.device)))

    def run(config: Config) -> Any:
        values = config.kwargs
        which = values.pop("kernel", "tiles")
        grid = (-(-m // values["BM"]), -(-n // values["BN"]), 1)
        if which == "persistent":
            grid = gemm.persistent_grid(m, n, _num_sms(a.device), values["BM"], values["BN"],
                                        values.get("CLUSTER", 1)) + (1, 1)
        return _api._launch(kernels[which], grid, (a, bt, sa, sb, out), values,
                            config.threads), grid

    ck, grid = _api._tune_and_run(fn, a.device.index, configs, (m, n, k),
                             f"{out_t}/{'blockwise' if block_scales else 'per-tensor'}", run)
    if signature is not None and _api._views_of((a, bt, sa, sb), tensors):
        _api._remember(signature, _api.EntryReplay(
            ck, grid, (a, bt, sa, sb, out), _api.fast_empty(a, (m, n), out_dtype)))
    return out


__all__ = ["matmul", "matmul_fp8", "gemm_candidates", "fp8_candidates"]
