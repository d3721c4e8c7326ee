"""Fuzzing `tg.last_arrival`: split-K GEMMs whose last block merges the splits' partials.

A split-K GEMM (the W4A16 fused split, the one-launch decode) runs S blocks along K for
each output tile: block (m, n, s) multiplies its share of K into a partial tile, stores it
to a partial buffer, and arrives on a counter; the block that arrives last reads every
split's partial and writes the output tile (`tg.last_arrival`, lang/arrivals.py). This
generator draws such kernels with random tiles (BM, BN, BK), thread counts, operand routes
(registers, or shared memory: wgmma / mma.sync operands), splits S and K tiles per split
(some splits past K's end: their partials are zeros), ragged M, N and K, an f16 or bf16
input, a merge (the sum of the partials, or their maximum: the order of arrival must not
matter), an epilogue (none, a scale, a ReLU), an output of f32 or the input type, the
counter (one per output tile, or one for the whole launch with the count every block of
the grid, so one block merges every tile), the count given as an int or as
`tg.num_programs(2)`, and how many launches reuse the counters (the arrival wraps the
counter back to 0, so a second launch must find it zeroed and merge again).

Each program runs in the emulator for sm_90a and sm_80 (blocks in the emulator's order,
which need not be the launch order: the emulator reports a read of another block's store
that no arrival orders as a race, and a counter left outside 0 .. count - 1) against a
float64 numpy model with an error bound per element; the counters must be zero after
every launch. `tests/gpu/test_fuzz_gpu.py` launches a sample on the GPU into poisoned
outputs. `python -m tegula.fuzz --seed S --split-merge I` shows and reruns one.
"""
from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np

MERGES = ("sum", "max")
EPILOGUES = ("none", "scale", "relu")
#: The counters: one per output tile (count S), or one for the launch (count: every block).
COUNTERS = ("tile", "launch")
ROUTES = ("register", "shared")
SCALE = 0.375


@dataclass(frozen=True)
class SplitMerge:
    """One program: output (m, n) of tiles (bm, bn), K of `k` in tiles of `bk`, `splits`
    blocks per output tile, `k_tiles` K tiles each (splits * k_tiles * bk may pass K's
    end), and the choices above; `launches` launches reuse the counters."""

    m: int
    n: int
    k: int
    bm: int
    bn: int
    bk: int
    threads: int
    splits: int
    k_tiles: int
    dtype: str = "f16"
    out: str = "f32"
    route: str = "register"
    merge: str = "sum"
    epilogue: str = "none"
    counter: str = "tile"
    count_literal: bool = True
    launches: int = 1

    def grid(self) -> tuple[int, int, int]:
        return (-(-self.m // self.bm), -(-self.n // self.bn), self.splits)

    def describe(self) -> str:
        return (f"split merge: {self.m}x{self.n}x{self.k} {self.dtype}->{self.out}, tiles "
                f"{self.bm}x{self.bn}x{self.bk}, {self.threads} threads, {self.splits} splits "
                f"x {self.k_tiles} K tiles, operands via {self.route}, merge {self.merge}, "
                f"epilogue {self.epilogue}, a counter per {self.counter} (count "
                f"{'literal' if self.count_literal else 'tg.num_programs'}), "
                f"{self.launches} launch(es)")


def make_split_merge(seed: int, index: int) -> SplitMerge:
    """Program `index` of the split-merge run with `seed` (its own random stream)."""
    r = random.Random(f"tegula.fuzz.split_merge {seed} {index}")
    bm, bn = r.choice(((64, 64), (64, 32), (32, 64), (64, 16), (16, 32), (128, 64))), None
    bm, bn = bm
    threads = r.choice((128, 128, 64, 256)) if bm * bn >= 4096 else r.choice((64, 128))
    dtype = r.choice(("f16", "bf16"))
    bk = r.choice((16, 32, 64))
    splits = r.choice((1, 2, 3, 4, 5))
    k_tiles = r.choice((1, 1, 2, 3))
    # K: anywhere from inside the first split to past the last one's end (empty splits)
    k = r.randint(1, splits * k_tiles * bk)
    if r.random() < 0.5:
        k = min(-(-k // 8) * 8, splits * k_tiles * bk)   # rows of 16 bytes (TMA-able)
    m = r.randint(1, r.choice((1, 2)) * bm)
    n = r.randint(1, r.choice((1, 2)) * bn)
    if r.random() < 0.5:
        n = min(-(-n // 8) * 8, -(-n // bn) * bn)
    return SplitMerge(m, n, k, bm, bn, bk, threads, splits, k_tiles, dtype,
                      r.choice(("f32", "f32", dtype)), r.choice(ROUTES), r.choice(MERGES),
                      r.choice(EPILOGUES), r.choice(COUNTERS), r.random() < 0.5,
                      r.choice((1, 1, 2, 3)))


def _kernel(dtype: str, out: str):
    """The kernel split-merge programs of these types run (their choices are constexprs)."""
    import tegula as tg
    from tegula import f32, i32
    DT, OUT = getattr(tg, dtype), getattr(tg, out)  # noqa: N806 (read by the annotations)

    @tg.kernel(threads=128)
    def split_merge(a: tg.Tensor[DT], b: tg.Tensor[DT], part: tg.Tensor[f32], c: tg.Tensor[OUT],
                    counters: tg.Tensor[i32, 1], BM: tg.constexpr = 64,
                    BN: tg.constexpr = 64, BK: tg.constexpr = 32, S: tg.constexpr = 2,
                    KT: tg.constexpr = 1, SHARED: tg.constexpr = 0, MAX: tg.constexpr = 0,
                    EPI: tg.constexpr = 0, LAUNCH: tg.constexpr = 0,
                    LITERAL: tg.constexpr = 1):
        m, n, s = tg.block_id(0), tg.block_id(1), tg.block_id(2)
        gm, gn = tg.num_programs(0), tg.num_programs(1)
        acc = tg.zeros((BM, BN), f32)
        ga = a.tile((BM, BK), (m, None))
        gb = b.tile((BN, BK), (n, None))
        if SHARED:
            sa = tg.shared((BM, BK), DT)
            sb = tg.shared((BN, BK), DT)
        for j in tg.range(KT):
            kt = s * KT + j
            if SHARED:
                tg.copy(ga[:, :, kt], sa)
                tg.copy(gb[:, :, kt], sb)
                tg.gemm(acc, sa, sb)
            else:
                tg.gemm(acc, tg.load(ga[:, :, kt]), tg.load(gb[:, :, kt]))
        # split s of tile (m, n): rows (s * gm + m) * BM of the partial buffer
        tg.copy(acc, part.tile((BM, BN), (s * gm + m, n)))
        if LAUNCH:   # one counter for the launch: the last of every block merges all
            count = S * gm * gn if LITERAL else tg.num_programs(2) * gm * gn
            last = tg.last_arrival(counters.tile((1,), (0,)), count)
        else:
            count = S if LITERAL else tg.num_programs(2)
            last = tg.last_arrival(counters.tile((1,), (m * gn + n,)), count)
        with tg.if_(last):
            tiles = gm * gn if LAUNCH else 1
            for t in tg.range(tiles):
                tm = t // gn if LAUNCH else m
                tn = t % gn if LAUNCH else n
                total = tg.load(part.tile((BM, BN), (tm, tn)))
                for q in tg.range(1, S):
                    p = tg.load(part.tile((BM, BN), (q * gm + tm, tn)))
                    total = tg.maximum(total, p) if MAX else total + p
                if EPI == 1:
                    total = total * SCALE
                elif EPI == 2:
                    total = tg.maximum(total, 0.0)
                tg.copy(total.to(OUT), c.tile((BM, BN), (tm, tn)))

    return split_merge


_KERNELS: dict = {}


def kernel(p: SplitMerge):
    """The kernel of `p`'s input and output types (one build cache per pair)."""
    key = (p.dtype, p.out)
    if key not in _KERNELS:
        _KERNELS[key] = _kernel(*key)
    return _KERNELS[key]


def constexprs(p: SplitMerge) -> dict:
    return dict(BM=p.bm, BN=p.bn, BK=p.bk, S=p.splits, KT=p.k_tiles,
                SHARED=int(p.route == "shared"), MAX=int(p.merge == "max"),
                EPI=EPILOGUES.index(p.epilogue), LAUNCH=int(p.counter == "launch"),
                LITERAL=int(p.count_literal), threads=p.threads)


def inputs(p: SplitMerge, seed: int) -> dict:
    """a (m, k), b (n, k) exact in the input type (float32 arrays of its values), the
    partial buffer (NaN: every element the merge reads is stored first), c, counters 0."""
    from tegula.fuzz import numerics as nx
    rng = np.random.default_rng(seed)
    gm, gn, _ = p.grid()
    a = nx.round_float(rng.standard_normal((p.m, p.k)) * rng.choice((1.0, 4.0)), p.dtype)
    b = nx.round_float(rng.standard_normal((p.n, p.k)), p.dtype)
    return dict(a=a.astype(np.float32), b=b.astype(np.float32),
                part=np.full((p.splits * gm * p.bm, gn * p.bn), np.nan, np.float32),
                c=np.full((p.m, p.n), -1234.5, np.float32),
                counters=np.zeros(1 if p.counter == "launch" else gm * gn, np.int32))


def expected(p: SplitMerge, x: dict) -> tuple[np.ndarray, np.ndarray]:
    """(c, an error bound per element) in float64: each split's product summed in f32
    (a relative 2^-22 per K element of sum |a·b|), merged, the epilogue, the output's
    rounding."""
    a, b = x["a"].astype(np.float64), x["b"].astype(np.float64)
    span = p.k_tiles * p.bk
    parts, bounds = [], []
    for s in range(p.splits):
        ks = slice(s * span, (s + 1) * span)
        parts.append(a[:, ks] @ b[:, ks].T)
        bounds.append(max(span, 1) * 2.0 ** -22 * (np.abs(a[:, ks]) @ np.abs(b[:, ks]).T))
    if p.merge == "sum":
        value = np.sum(parts, axis=0)
        bound = np.sum(bounds, axis=0) + p.splits * 2.0 ** -23 * np.sum(np.abs(parts), axis=0)
    else:
        value, bound = np.max(parts, axis=0), np.max(bounds, axis=0)
    if p.epilogue == "scale":
        value, bound = value * SCALE, bound * SCALE
    elif p.epilogue == "relu":
        value = np.maximum(value, 0.0)
    rounding = 2.0 ** -23 if p.out == "f32" else 2.0 ** (-11 if p.out == "f16" else -8)
    return value, bound + np.abs(value) * rounding + 1e-30


def _arrays(p: SplitMerge, x: dict) -> list:
    from tegula.fuzz import numerics as nx
    return [nx.storage(x["a"].astype(np.float64), p.dtype),
            nx.storage(x["b"].astype(np.float64), p.dtype), x["part"],
            nx.storage(x["c"].astype(np.float64), p.out), x["counters"]]


def run_emulated(p: SplitMerge, x: dict, target: str) -> tuple[np.ndarray, np.ndarray]:
    """(c after the last launch, the counters after it) of emulated launches on fresh
    copies of `x`; raises AssertionError if a launch leaves a counter non-zero or changes
    c from one launch to the next."""
    import tegula as tg
    arrays = [np.array(v, copy=True) for v in _arrays(p, x)]
    previous = None
    for launch in range(p.launches):
        with np.errstate(all="ignore"):
            tg.emulate(kernel(p), p.grid(), *arrays, target=target, **constexprs(p))
        c = arrays[3].astype(np.float64)
        assert not arrays[4].any(), f"launch {launch}: counters {arrays[4]} not zero after it"
        assert previous is None or np.array_equal(c, previous, equal_nan=True), \
            f"launch {launch} wrote another c than launch {launch - 1}"
        previous = c
    # The CUDA the builds print (no compiler needed): a program the emulator runs but
    # codegen refuses would fail only at a GPU launch.
    for built in list(getattr(kernel(p), "_builds", {}).values()):
        built.cuda_source()
    return previous, arrays[4]


def judge(p: SplitMerge, got: np.ndarray, want: np.ndarray, bound: np.ndarray) -> str:
    """"" if every element of c is within its bound, else the first wrong one."""
    bad = ~(np.abs(got - want) <= bound)
    if not bad.any():
        return ""
    i = tuple(np.argwhere(bad)[0])
    return (f"c{i} = {got[i]!r}, expected {want[i]!r} (bound {bound[i]:.3g}); "
            f"{int(bad.sum())} of {bad.size} wrong")


def check_split_merge(p: SplitMerge, seed: int,
                      targets: tuple = ("sm_90a", "sm_80")) -> tuple:
    """(status, reason, detail): "pass", "rejected" (a clean refusal), "mismatch" or
    "internal" (an emulation error — a race, a counter out of range —, an error saying
    internal, or a crash)."""
    from tegula.fuzz.runner import check_template
    x = inputs(p, seed)
    want, bound = expected(p, x)
    return check_template(p.describe(), targets, lambda t: run_emulated(p, x, t)[0],
                          lambda got: judge(p, got, want, bound))


__all__ = ["SplitMerge", "make_split_merge", "check_split_merge", "kernel", "constexprs",
           "inputs", "expected", "judge"]
