"""Fuzzing persistent tile loops: tile maps and global reads that ping-pong must not split.

A tile loop `for t in tg.range(...)` around a TMA + wgmma K pipeline runs, on sm_90a, on
ping-pong consumer warpgroups where synthesis proves its iterations independent
(`synth/tile_map.py`). This generator draws such loops with a random **tile map** from
the iteration to the output tile — one-to-one (`t`, `t + s`, `T - 1 - t`, the pair
`(t // W, t % W)`, the library's grouped order) or not (`t // W`, `t % W`, an index
table with repeats) — and a random **global read** of
the output (none, the iteration's own tile, the tile the previous iteration stored), in
one block or, where the map is one-to-one and nothing is read across iterations, as a
persistent loop over several blocks (`tg.range(block, T, blocks)`). Some programs add
their tiles into c with `tg.atomic_add` instead of storing them (`TileLoop.add`: the
build's own choice, TMA bulk reduce-adds forced, or `red.global.add` per element), on
any map and any number of blocks: adds commute, so the model sums every iteration's
tile into c.

Each program runs in the emulator for sm_90a with synthesis's own choice and with
`consumers="pingpong"` forced (every other seed with each warpgroup held after its
named-barrier arrives: `role_order="stall"`), and for sm_80, against a sequential numpy
model (the last store of a tile wins, a read sees every earlier iteration's store).
Failures: a wrong
element, an internal error, ping-pong taken (by default or forced) where two iterations
do depend on each other (a silent wrong result on the GPU even where the emulator's
interleaving happened to agree). Ping-pong refused where they do not is counted
(`conservative`), not failed: the rule is a proof, and an index table is never proven.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

import numpy as np

#: Tile maps: one-to-one on the iterations or not (`TileLoop.injective`).
MAPS = ("row", "shifted", "reversed", "pair", "grouped", "div", "mod", "table")
READS = ("none", "own", "previous")
#: How a tile reaches c: stored, or added atomically on the build's path (`atomic_path`
#: None), on TMA bulk reduce-adds, or per element with red.global.add.
ADDS = ("", "auto", "bulk", "red")
BM = BN = 64
#: The role orders that hold a role after each named-barrier arrive (`emulate.roles`).
STALL_ORDERS = ("stall", "stall-reversed")


@dataclass(frozen=True)
class TileLoop:
    """One program: `tiles` iterations (row tiles of a), K of `k`, output tile of
    iteration t given by `map` with parameter `w`, the read `read`, `blocks` blocks,
    `table` the index table's entries (map "table")."""

    tiles: int
    k: int
    map: str
    w: int
    read: str
    blocks: int
    stages: int
    table: tuple = ()
    add: str = ""   # "": store; "auto" / "bulk" / "red": tg.atomic_add (ADDS), read none

    def tile_of(self, t: int) -> tuple[int, int]:
        """(row tile, column tile) of c that iteration t stores (the numpy model's map)."""
        m, w = self.map, self.w
        if m == "row":
            return t, 0
        if m == "shifted":
            return t + w, 0
        if m == "reversed":
            return self.tiles - 1 - t, 0
        if m == "pair":
            return t // w, t % w
        if m == "grouped":
            rows, cols = self.grid()
            band, first = t // (w * cols), (t // (w * cols)) * w
            height = min(rows - first, w)
            within = t % (w * cols)
            return first + within % height, within // height
        if m == "div":
            return t // w, 0
        if m == "mod":
            return t % w, 0
        return self.table[t], 0

    def grid(self) -> tuple[int, int]:
        """c's tiles (rows, columns)."""
        if self.map == "grouped":
            return self.w_rows(), self.tiles // self.w_rows()
        cells = [self.tile_of(t) for t in range(self.tiles)]
        return max(r for r, _ in cells) + 1, max(c for _, c in cells) + 1

    def w_rows(self) -> int:
        return next(r for r in (3, 2, 5, 1) if self.tiles % r == 0)

    def injective(self) -> bool:
        return len({self.tile_of(t) for t in range(self.tiles)}) == self.tiles

    def dependent(self) -> bool:
        """Whether two iterations touch one element of c, one storing (ground truth);
        atomic adds commute."""
        if self.add:
            return False
        return not self.injective() or (self.read == "previous" and self.tiles > 1)

    def describe(self) -> str:
        table = f" table={list(self.table)}" if self.table else ""
        add = f", atomic add ({self.add})" if self.add else ""
        return (f"tile loop: {self.tiles} tiles, K={self.k}, map {self.map} (w={self.w}), "
                f"read {self.read}, {self.blocks} block(s), {self.stages} stages{table}{add}")


def make_tile_loop(seed: int, index: int) -> TileLoop:
    """Program `index` of the tile-loop run with `seed` (its own random stream)."""
    rng = random.Random(f"tegula.fuzz.tile_loops {seed} {index}")
    kind = rng.choice(MAPS)
    tiles = rng.choice((2, 3, 4, 5, 6, 8))
    w = rng.choice((2, 3)) if kind in ("div", "mod", "pair", "grouped") else rng.choice((1, 2))
    if kind == "pair":
        tiles = w * rng.choice((1, 2, 3))
    if kind == "grouped":
        tiles = rng.choice((4, 6, 9, 10))
    table = ()
    if kind == "table":
        rows = rng.randint(1, tiles)
        entries = list(range(rows)) + [rng.randrange(rows) for _ in range(tiles - rows)]
        rng.shuffle(entries)
        table = tuple(entries)
    read = rng.choice(READS)
    if kind == "shifted" and read == "none":
        read = "own"   # c is read, so the rows the shift skips keep their values
    loop = TileLoop(tiles, rng.choice((8, 32, 40, 96, 160)), kind, w, read, 1,
                    rng.choice((2, 3, 4)), table)
    if not loop.dependent() and rng.random() < 0.5:
        loop = TileLoop(loop.tiles, loop.k, kind, w, read, rng.choice((2, 3)), loop.stages,
                        table)
    if rng.random() < 0.3:   # drawn last: earlier seeds keep their other choices
        loop = replace(loop, add=rng.choice(ADDS[1:]), read="none",
                       blocks=rng.choice((1, 2, 3)))
    return loop


def _kernel():
    """The kernel every tile-loop program runs (its map and read are constexprs)."""
    import tegula as tg
    from tegula import f16, f32, i32
    from tegula.kernels.schedule import grouped_tile

    maps = {name: i for i, name in enumerate(MAPS)}
    reads = {name: i for i, name in enumerate(READS)}

    @tg.kernel(threads=128)
    def tile_loop(a: tg.Tensor[f16], b: tg.Tensor[f16], c: tg.Tensor[f32],
                  table: tg.Tensor[i32, 1], MAP: tg.constexpr = 0, W: tg.constexpr = 1,
                  READ: tg.constexpr = 0, ROWS: tg.constexpr = 1, ADD: tg.constexpr = 0,
                  BK: tg.constexpr = 32, STAGES: tg.constexpr = 2):
        sa = tg.shared((BM, BK), f16, stages=STAGES)
        sb = tg.shared((BN, BK), f16, stages=STAGES)
        gb = b.tile((BN, BK), (0, None))
        tiles = tg.cdiv(a.shape[0], BM)
        # The grouped order is one-to-one on [0, ROWS * columns): the loop says so.
        count = ROWS * (tiles // ROWS) if MAP == maps["grouped"] else tiles
        for t in tg.range(tg.block_id(0), count, tg.num_programs(0)):
            ga = a.tile((BM, BK), (t, None))
            acc = tg.zeros((BM, BN), f32)
            for k in tg.pipeline(ga.shape[2], stages=STAGES):
                tg.copy(ga[:, :, k], sa[k])
                tg.copy(gb[:, :, k], sb[k])
                tg.gemm(acc, sa[k], sb[k])
            if MAP == maps["row"]:
                r, col = t, 0
            elif MAP == maps["shifted"]:
                r, col = t + W, 0
            elif MAP == maps["reversed"]:
                r, col = tiles - 1 - t, 0
            elif MAP == maps["pair"]:
                r, col = t // W, t % W
            elif MAP == maps["grouped"]:
                r, col = grouped_tile(t, ROWS, tiles // ROWS, W)
            elif MAP == maps["div"]:
                r, col = t // W, 0
            elif MAP == maps["mod"]:
                r, col = t % W, 0
            else:
                r, col = table[t], 0
            if READ == reads["own"]:
                acc = acc + tg.load(c.tile((BM, BN), (r, col)))
            elif READ == reads["previous"]:
                acc = acc + tg.load(c.tile((BM, BN), (tg.maximum(t - 1, 0), 0)))
            if ADD:
                tg.atomic_add(acc, c.tile((BM, BN), (r, col)))
            else:
                tg.copy(acc, c.tile((BM, BN), (r, col)))

    return tile_loop


_KERNEL = []


def kernel():
    if not _KERNEL:
        _KERNEL.append(_kernel())
    return _KERNEL[0]


def inputs(loop: TileLoop, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    rows, cols = loop.grid()
    if loop.read == "previous":
        rows = max(rows, loop.tiles)
    # A ragged last row tile where nothing adds c to it (an element-wise op needs equal
    # extents: a's rows masked at 507 and c's at 512 do not combine).
    ragged = int(rng.integers(0, 9)) if loop.read == "none" else 0
    a = rng.standard_normal((loop.tiles * BM - ragged, loop.k))
    b = rng.standard_normal((BN, loop.k))
    c = rng.standard_normal((rows * BM, cols * BN))
    table = np.array(loop.table or (0,), dtype=np.int32)
    return dict(a=a.astype(np.float16), b=b.astype(np.float16), c=c.astype(np.float32),
                table=table)


def expected(loop: TileLoop, x: dict) -> tuple[np.ndarray, np.ndarray]:
    """(c after the loop run in order, an error bound per element), in float64."""
    a, b = x["a"].astype(np.float64), x["b"].astype(np.float64)
    a = np.concatenate([a, np.zeros((loop.tiles * BM - len(a), loop.k))])
    c, err = x["c"].astype(np.float64), np.zeros(x["c"].shape)
    per = loop.k * 2.0 ** -23 * (np.abs(a) @ np.abs(b).T) + 1e-30
    for t in range(loop.tiles):
        r, col = loop.tile_of(t)
        rs, cs = slice(t * BM, (t + 1) * BM), slice(r * BM, (r + 1) * BM)
        ns = slice(col * BN, (col + 1) * BN)
        value, bound = a[rs] @ b.T, per[rs]
        if loop.add:   # added into c: each add rounds once more
            value = value + c[cs, ns]
            bound = bound + err[cs, ns] + np.abs(c[cs, ns]) * 2.0 ** -23
        elif loop.read == "own":
            value, bound = value + c[cs, ns], bound + err[cs, ns]
        elif loop.read == "previous":
            p = slice(max(t - 1, 0) * BM, max(t, 1) * BM)
            value, bound = value + c[p, :BN], bound + err[p, :BN]
        c[cs, ns] = value
        err[cs, ns] = bound + np.abs(value) * 2.0 ** -23
    return c, err


def _constexprs(loop: TileLoop) -> dict:
    paths = {"auto": {}, "bulk": {"atomic_path": "bulk"}, "red": {"atomic_path": "red"}}
    return dict(MAP=MAPS.index(loop.map), W=loop.w, READ=READS.index(loop.read),
                ROWS=loop.w_rows() if loop.map == "grouped" else 1, STAGES=loop.stages,
                ADD=int(bool(loop.add)), **paths.get(loop.add, {}))


def _run(loop: TileLoop, x: dict, target: str, role_order: str, consumers=None):
    """c after one emulated run (or the TegulaError it raised). Coverage is not checked:
    some maps leave tiles of c unwritten on purpose (they keep their values; the model
    checks every element)."""
    import tegula as tg
    c = x["c"].copy()
    extra = {} if consumers is None else dict(consumers=consumers)
    tg.emulate(kernel(), (loop.blocks,), x["a"], x["b"], c, x["table"], target=target,
               role_order=role_order, check_coverage=False, **_constexprs(loop), **extra)
    return c


def _schedule(loop: TileLoop) -> str:
    from tegula.build import build
    text = build(kernel(), dict(_constexprs(loop), threads=128), None, "sm_90a").explain()
    line = next((x for x in text.splitlines() if "consumers:" in x), "")
    return line.split("consumers:")[1].split()[0] if line else "none"


def check_tile_loop(loop: TileLoop, seed: int, role_order: str = "random:0") -> tuple:
    """(status, reason, detail): "pass", "conservative" (ping-pong refused where the
    iterations are independent: right, not a failure), or "mismatch" / "internal"."""
    from tegula.errors import SynthesisError, TegulaError
    x = inputs(loop, seed)
    want, bound = expected(loop, x)
    schedule = _schedule(loop)
    if schedule == "pingpong" and loop.dependent():
        return ("mismatch", "ping-pong taken for dependent iterations", loop.describe())
    runs = [("sm_90a", None), ("sm_80", None), ("sm_90a", "pingpong")]
    forced_refused = False
    for target, consumers in runs:
        # Every other seed runs the forced ping-pong under a stall order (`emulate.roles`):
        # a warpgroup held after each bar.arrive while the other runs ahead (lapping).
        order = STALL_ORDERS[seed // 2 % 2] if consumers and seed % 2 else role_order
        try:
            got = _run(loop, x, target, order, consumers)
        except SynthesisError as e:
            if consumers and loop.dependent():
                continue   # refused, as it must be
            if consumers:
                forced_refused = True
                continue
            return ("internal", f"SynthesisError on {target}", f"{loop.describe()}\n{e}")
        except TegulaError as e:
            return ("internal", f"{type(e).__name__} on {target} ({consumers})",
                    f"{loop.describe()}\n{e}")
        if consumers and loop.dependent():
            return ("mismatch", "consumers='pingpong' accepted for dependent iterations",
                    loop.describe())
        bad = ~(np.abs(got - want) <= bound)
        if bad.any():
            i = np.argwhere(bad)[0]
            return ("mismatch", f"wrong element on {target} ({consumers or 'default'})",
                    f"{loop.describe()}\nc{tuple(i)} = {got[tuple(i)]!r}, expected "
                    f"{want[tuple(i)]!r} (bound {bound[tuple(i)]:.3g}); {int(bad.sum())} wrong")
    if forced_refused or (schedule != "pingpong" and not loop.dependent()):
        return ("conservative", f"ping-pong refused for map {loop.map}, read {loop.read}",
                loop.describe())
    return ("pass", "", loop.describe())


__all__ = ["TileLoop", "make_tile_loop", "check_tile_loop", "MAPS", "READS", "ADDS"]
