"""Random fuzz programs (`tegula.fuzz.program`), with switches for language features.

`Generator(rng, switches).program(label)` draws one program: a thread count (powers of two,
and others when `npot_threads` is on), a tile (any of 1..64 per dim, products up to
`max_tile`; non-powers of two with `npot_tiles`), tensors that do not divide into tiles,
1-3 inputs loaded along a random route between scopes, a chain of element-wise ops
(every operator and math function, comparisons, `where` with tiles and numbers, casts
between every type), reductions on either axis, in-place updates, loops with carried
values (some through a shared scratch tile: stashed before the loop, read and written back
in it — now and then inside a `tg.if_` on the block's row or column — read after it), and
1-3 outputs stored along a random route.

A switch that is off keeps the generator away from a construct (a known bug being
fixed elsewhere), so the seeded CI run stays green while the rest is tested.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, fields

from tegula.fuzz import numerics as nx
from tegula.fuzz.program import (ARITHMETIC, COMPARISONS, FLOAT_UNARY, Alias, Assign,
                                 Binary, Cast, Cumsum, Extent, Full, Gemm, Indices, InPlace, Load, Loop,
                                 Num,
                                 Program, Reduce, Scope, Stash, Store, TensorDecl, TileType, Unary,
                                 Branch,
                                 Unstash, Where, broadcast, check)
from tegula.fuzz.program import (GEMM_ACCUMULATOR, ROLE_CONSUMER_REGS, ROLE_PRODUCER_REGS,
                                 ROLE_SCHEDULES)

DTYPES = ("f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i32", "i8", "u8")
_DTYPE_WEIGHTS = (6, 3, 3, 1, 1, 3, 2, 2)
POW2_THREADS = (32, 64, 128, 256)
NPOT_THREADS = (96, 160, 192)
POW2_DIMS = (1, 2, 4, 8, 16, 32, 64)
NPOT_DIMS = (3, 5, 6, 12, 24, 48)
FLOAT_NUMBERS = (0.0, -0.0, 1.0, -1.0, 0.5, 2.0, -2.5, 3.0, 0.1, 1e-3, 100.0, -7.75, 1e30,
                 float("inf"), -float("inf"), float("nan"), 448.0, 65504.0)
INT_NUMBERS = {"i32": (0, 1, -1, 2, 3, 7, -5, 100, 2**31 - 1, -2**31),
               "i8": (0, 1, -1, 3, -7, 127, -128), "u8": (0, 1, 2, 3, 7, 128, 255)}
DIVISORS = {"i32": (2, 3, 7, -5, -1, 1000), "i8": (2, 3, -7, -1, 100), "u8": (2, 3, 7, 200)}
GEMM_PROGRAM_SHARE = 0.35 # of programs: GEMM-shaped (the sm_90a TMA + wgmma candidates)
EPILOGUE_KINDS = ("unary", "binary", "binary", "cast", "cast", "where", "compare", "reduce",
                  "inplace")
GEMM_ELEMENT_BYTES = {"f16": 2, "bf16": 2}  # the others are 8-bit
#: The `consumers=` schedules a warp-specialized build may ask for (`build_options`).
WARP_SPECIALIZED_SCHEDULES = ("cooperative", "pingpong")
FLOAT_FILLS = (None, 0.0, -0.0, 1.5, -1.0, 3.0, float("inf"), -float("inf"), float("nan"))
INT_FILLS = {"i32": (None, 0, 1, -1, 7), "i8": (None, 0, 1, -1, 7), "u8": (None, 0, 1, 7)}


@dataclass
class Switches:
    """Which constructs the generator may use. Defaults: everything."""

    npot_threads: bool = True       # 96, 160, 192 threads
    npot_tiles: bool = True         # tile dims 3, 5, 6, 12, 24, 48
    small_tile_shared: bool = True  # global->shared copies of tiles smaller than the block
    shared_fill: bool = True        # global->shared copies with a fill other than 0
    where_numbers: bool = True      # tg.where(cond, tile, number)
    loop_rebind: bool = True        # loop state rebound with `=` (acc = acc * a + x)
    loops: bool = True
    pipelines: bool = True          # tg.pipeline loops with staged shared buffers
    scratch: bool = True            # a shared tile carried through loops (Stash/Unstash)
    branches: bool = True           # tg.if_ on the block's row or column around a statement
    transposed: bool = True         # loads through a transposed shared view
    shared_to_shared: bool = True   # shared->shared copies
    indices: bool = True            # tg.indices tiles and kernel scalars (x.shape[1]) in math
    arg_reductions: bool = True     # tg.argmax / tg.argmin
    gemm: bool = True               # tg.gemm on one K tile (shared or register operands)
    gemm_programs: bool = True      # GEMM-shaped programs, K loops (tg.range, tg.pipeline)
    transposed_gemm: bool = True    # gemm operands stored K x M / K x N (read through .T)
    clusters: bool = True           # GEMM-shaped programs in clusters of 2 blocks (tg.cluster)
    roles: bool = True              # pipelines written as tg.producer / tg.consumer blocks
    warp_specialize: bool = True    # sm_90a builds with warp_specialize= / consumers= drawn
    repeats: bool = True            # a K loop run again inside a tg.range, same accumulator
    bitcasts: bool = True           # some f32 <-> i32 casts are tg.bitcast instead
    scans: bool = True              # tg.cumsum (forward and reversed) of a value
    gemm_max_tile: int = 8192       # largest BM * BN of a GEMM-shaped program
    floor_division: bool = True     # integer // and %
    nan_reductions: bool = True     # NaN reaching tg.max/tg.min is checked (else not compared)
    max_tile: int = 2048            # largest BM * BN

    @classmethod
    def parse(cls, text: str) -> Switches:
        """'-loop_rebind,-pipelines,max_tile=256' style overrides of the defaults."""
        s = cls()
        for item in filter(None, (t.strip() for t in text.split(","))):
            if "=" in item:
                name, value = item.split("=", 1)
                setattr(s, name, int(value))
            else:
                on = not item.startswith("-")
                name = item.lstrip("+-")
                if name not in {f.name for f in fields(cls)}:
                    raise ValueError(f"unknown fuzz switch {name!r}")
                setattr(s, name, on)
        return s


class Generator:
    #: What a GEMM-shaped program's frame is drawn from (`gemm_program`).
    GEMM_DRAWS = {"threads": (128, 128, 128, 256, 64), "npot_threads": (192,),
                  "dtype": ("f16", "bf16", "f16", "bf16", "f8e4m3", "f8e5m2", "i8"),
                  "bm": (64, 64, 64, 128, 32, 16), "bn": (8, 16, 24, 32, 48, 64, 128),
                  "stages": (2, 3, 3, 4, 1, 0)}
    #: Share of pipelined K extents rounded to rows of 16 bytes (what TMA boxes need).
    TMA_ROWS_SHARE = 0.75
    #: Share of GEMM programs with a transposed operand whose M and N are rounded to rows of
    #: 16 bytes (the stride TMA needs; the others are near misses that must fall back).
    TRANSPOSED_ROWS_SHARE = 0.75
    #: How outputs are stored (`Store.route`).
    STORE_ROUTES = ("copy", "shared", "shared_reg")

    def __init__(self, rng: random.Random, switches: Switches | None = None):
        self.rng = rng
        self.sw = switches or Switches()
        #: The body runs in a persistent tile loop (`Program.persistent`): its loads,
        #: stores and K loops then mostly keep off shared memory beyond the ring, which
        #: ping-pong consumer warpgroups (both running the body at once) cannot share.
        self.in_tile_loop = False

    # -- the frame ------------------------------------------------------------------------
    def program(self, label: str = "") -> Program:
        """One random program that passes `check` (drawn again until one does)."""
        for _ in range(100):
            program = self._draw(label)
            try:
                check(program)
            except Exception:  # noqa: BLE001 — a draw the rules refuse: draw again
                continue
            return program
        raise RuntimeError("the fuzz generator could not draw a valid program")

    def _draw(self, label: str) -> Program:
        r = self.rng
        if self.sw.gemm and self.sw.gemm_programs and r.random() < GEMM_PROGRAM_SHARE:
            return self.gemm_program(label)
        # Thread counts and tile dims that are not powers of two now and then: they are
        # mostly refused (cleanly) where threads share out elements, so most programs
        # use powers of two and run.
        npot_threads = self.sw.npot_threads and r.random() < 0.15
        threads = r.choice(NPOT_THREADS if npot_threads else POW2_THREADS)
        def dim() -> int:
            npot = self.sw.npot_tiles and r.random() < 0.15
            return r.choice(NPOT_DIMS if npot else POW2_DIMS)
        while True:
            bm, bn = dim(), dim()
            if bm * bn <= self.sw.max_tile:
                break
        gm, gn = r.randint(1, 3), r.randint(1, 3)
        m = r.randint((gm - 1) * bm + 1, gm * bm)
        n = r.randint((gn - 1) * bn + 1, gn * bn)
        self.threads, self.bm, self.bn = threads, bm, bn
        self.tensors: list[TensorDecl] = []
        self.names = 0
        self.scans = 0   # cumsums inside loops (`carried_scan`)
        self.loops = 0
        body: list = []
        scope = Scope()
        for _ in range(r.randint(1, 3)):
            self.load_input(body, scope)
        for _ in range(r.randint(2, 10)):
            self.step(body, scope, in_loop=None)
        self.stores(body, scope)
        return Program(threads, bm, bn, m, n, tuple(self.tensors), tuple(body), label)

    def fresh(self) -> str:
        self.names += 1
        return f"v{self.names}"

    def small_tile(self) -> bool:
        return self.bm * self.bn < self.threads

    def shared_ok(self) -> bool:
        """May a global->shared copy be drawn for this tile?"""
        return self.sw.small_tile_shared or not self.small_tile()

    # -- loads and stores -----------------------------------------------------------------
    def load_input(self, body: list, scope: Scope) -> str:
        r = self.rng
        dtype = r.choices(DTYPES, _DTYPE_WEIGHTS)[0]
        routes = ["load", "copy", "via_register"]
        if self.in_tile_loop and r.random() < 0.9:
            routes = ["load", "copy"]
        elif self.shared_ok():
            routes += ["shared", "shared"] + (["transposed"] if self.sw.transposed else [])
            if self.sw.shared_to_shared and r.random() < 0.2:
                routes.append("shared2")
        route = r.choice(routes)
        name = f"x{len(self.tensors)}"
        self.tensors.append(TensorDecl(name, dtype, "in_t" if route == "transposed" else "in"))
        out = self.fresh()
        body.append(Load(out, name, route, self.fill(dtype, route)))
        scope.define(out, TileType(dtype, (True, True)))
        return out

    def fill(self, dtype: str, route: str) -> Num | None:
        choices = FLOAT_FILLS if nx.is_float(dtype) else INT_FILLS[dtype]
        if route in ("shared", "shared2", "transposed") and not self.sw.shared_fill:
            choices = (None, 0.0) if nx.is_float(dtype) else (None, 0)
        value = self.rng.choice(choices)
        return None if value is None else Num(value)

    def stores(self, body: list, scope: Scope) -> None:
        r = self.rng
        candidates = list(reversed(list(scope.types)))  # the latest first
        count = min(len(candidates), r.randint(1, 3))
        chosen = candidates[:1] + r.sample(candidates[1:], max(0, count - 1))
        for name in chosen:
            t = scope.types[name]
            if t.dtype == nx.BOOL:
                cast_to = r.choice(("i32", "u8", "f32", "f16"))
                out = self.fresh()
                body.append(Cast(out, name, cast_to))
                scope.define(out, TileType(cast_to, t.shape))
                name, t = out, scope.types[out]
            tensor = f"o{sum(1 for d in self.tensors if d.kind == 'out')}"
            self.tensors.append(TensorDecl(tensor, t.dtype, "out", shape=t.shape))
            routes = ("copy",) if self.in_tile_loop and r.random() < 0.9 else self.STORE_ROUTES
            body.append(Store(tensor, name, r.choice(routes)))

    # -- statements -----------------------------------------------------------------------
    def pick(self, scope: Scope, pred=lambda t: True, recent: float = 0.6) -> str | None:
        names = [n for n, t in scope.types.items() if pred(t)]
        if not names:
            return None
        if self.rng.random() < recent:
            return self.rng.choice(names[-3:])
        return self.rng.choice(names)

    def number(self, dtype: str) -> Num:
        if nx.is_float(dtype):
            return Num(self.rng.choice(FLOAT_NUMBERS))
        if dtype == nx.BOOL:
            return Num(self.rng.choice((True, False)))
        return Num(self.rng.choice(INT_NUMBERS[dtype]))

    def step(self, body: list, scope: Scope, in_loop: Loop | None, kinds=None) -> None:
        """One random statement (of `kinds` when given)."""
        if kinds is None:
            kinds = ["unary", "binary", "binary", "compare", "where", "cast", "reduce",
                     "inplace", "assign", "full", "logic", "load"] + \
                (["indices"] if self.sw.indices else [])
            if in_loop is None and self.sw.loops and self.loops < 2:
                kinds.append("loop")
            if in_loop is None and self.sw.gemm:
                kinds.append("gemm")
        kind = self.rng.choice(kinds)
        getattr(self, f"draw_{kind}")(body, scope, in_loop)
        if in_loop is None:
            self.maybe_cumsum(body, scope)

    def maybe_cumsum(self, body: list, scope: Scope) -> None:
        """Now and then rebind a value to its cumulative sum along an axis (`tg.cumsum`,
        reversed at times). Drawn from a stream of its own, seeded by the program's stream
        without drawing from it, and the name keeps its type: the rest of the program is
        what it was before cumulative sums existed. Outside loops only (a loop would
        carry the rebinding)."""
        if not self.sw.scans:
            return
        side = random.Random(hash(self.rng.getstate()[1]))  # a tuple of ints: stable
        names = [n for n, t in scope.types.items()
                 if t.dtype != nx.BOOL and len(scope.shared_with[n]) == 1]
        if not names or side.random() >= 0.06:
            return
        x = side.choice(names)
        body.append(Cumsum(x, x, side.choice((0, 1)), side.random() < 0.3))

    def carried_scan(self, body: list, scope: Scope, source: str) -> str:
        """`source`, or now and then a fresh `tg.cumsum` of it inside the loop (so the
        carried tile accumulates running sums iteration after iteration). Drawn from a
        side stream, as `maybe_cumsum`: programs that take none are what they were."""
        side = random.Random(hash(self.rng.getstate()[1]) ^ 0x5CA7)
        t = scope.types[source]
        if not self.sw.scans or t.dtype == nx.BOOL or side.random() >= 0.15:
            return source
        self.scans += 1  # names of their own: the other statements keep theirs
        return self.define(body, scope, Cumsum(f"scan{self.scans}", source,
                                               side.choice((0, 1)), side.random() < 0.3),
                           t.dtype, t.shape)

    def define(self, body: list, scope: Scope, stmt, dtype: str, shape) -> str:
        body.append(stmt)
        scope.define(stmt.out, TileType(dtype, shape))
        return stmt.out

    def draw_load(self, body, scope, in_loop) -> None:
        if in_loop is None:
            self.load_input(body, scope)

    def draw_full(self, body, scope, in_loop) -> None:
        r = self.rng
        dtype = r.choices(DTYPES, _DTYPE_WEIGHTS)[0]
        shape = (r.random() < 0.7, r.random() < 0.7)
        self.define(body, scope, Full(self.fresh(), shape, dtype, self.number(dtype)), dtype,
                    shape)

    def draw_indices(self, body, scope, in_loop) -> None:
        r = self.rng
        axis = r.choice((0, 1))
        shape = (True, True) if r.random() < 0.6 else ((True, False) if axis == 0
                                                        else (False, True))
        self.define(body, scope, Indices(self.fresh(), shape, axis, r.random() < 0.5), "i32",
                    shape)

    def draw_unary(self, body, scope, in_loop) -> None:
        x = self.pick(scope)
        t = scope.types[x]
        if nx.is_float(t.dtype):
            ops = FLOAT_UNARY + ("neg", "abs")
        elif t.dtype == nx.BOOL:
            ops = ("not",)
        else:
            ops = ("neg", "abs", "not")
        self.define(body, scope, Unary(self.fresh(), self.rng.choice(ops), x), t.dtype, t.shape)

    def _second_operand(self, scope, dtype: str, op: str, number_p: float = 0.35):
        """A tile of `dtype` (any shape: operands broadcast) or a number."""
        if op in ("div", "floordiv", "mod") and nx.is_int(dtype) and self.rng.random() < 0.5:
            return Num(self.rng.choice(DIVISORS[dtype]))  # else any tile: 0 and -1 included
        other = self.pick(scope, lambda t: t.dtype == dtype, recent=0.3)
        if dtype == "i32" and self.sw.indices and op != "div" and self.rng.random() < 0.25:
            inputs = [t.name for t in self.tensors if t.kind == "in"]
            if inputs:  # a kernel scalar: the masking idiom `cols < x.shape[1]`
                return Extent(self.rng.choice(inputs), self.rng.choice((0, 1)))
        if other is None or self.rng.random() < number_p:
            return self.number(dtype)
        return other

    def draw_binary(self, body, scope, in_loop) -> None:
        a = self.pick(scope, lambda t: t.dtype != nx.BOOL)
        if a is None:
            return
        t = scope.types[a]
        if nx.is_float(t.dtype):
            ops = ARITHMETIC
        else:
            ops = ("add", "sub", "mul", "div", "max", "min", "and", "or", "xor") + \
                (("floordiv", "mod") if self.sw.floor_division else ())
        op = self.rng.choice(ops)
        b = self._second_operand(scope, t.dtype, op)
        if isinstance(b, Num) and op != "div" and self.rng.random() < 0.3:
            a, b = b, a  # a number on the left: 2.0 - x, 1.0 / x
        self._emit_binary(body, scope, op, a, b)

    def _emit_binary(self, body, scope, op, a, b, out: str | None = None) -> str:
        ta = scope.types[a] if isinstance(a, str) else None
        tb = scope.types[b] if isinstance(b, str) else None
        tiles = [t for t in (ta, tb) if t is not None]
        shape = tiles[0].shape if len(tiles) == 1 else broadcast(tiles[0].shape, tiles[1].shape)
        dtype = nx.BOOL if op in COMPARISONS else tiles[0].dtype
        return self.define(body, scope, Binary(out or self.fresh(), op, a, b), dtype, shape)

    def draw_compare(self, body, scope, in_loop) -> None:
        a = self.pick(scope, lambda t: t.dtype != nx.BOOL)
        if a is None:
            return
        op = self.rng.choice(COMPARISONS)
        b = self._second_operand(scope, scope.types[a].dtype, op, number_p=0.5)
        self._emit_binary(body, scope, op, a, b)

    def draw_logic(self, body, scope, in_loop) -> None:
        a = self.pick(scope, lambda t: t.dtype == nx.BOOL)
        if a is None:
            return self.draw_compare(body, scope, in_loop)
        op = self.rng.choice(("and", "or", "xor"))
        b = self.pick(scope, lambda t: t.dtype == nx.BOOL, recent=0.3)
        self._emit_binary(body, scope, op, a, b if b != a else Num(True))

    def draw_where(self, body, scope, in_loop) -> None:
        cond = self.pick(scope, lambda t: t.dtype == nx.BOOL)
        if cond is None:
            return self.draw_compare(body, scope, in_loop)
        a = self.pick(scope, lambda t: t.dtype != nx.BOOL, recent=0.5)
        if a is None:
            return
        dtype = scope.types[a].dtype
        b = self._second_operand(scope, dtype, "where",
                                 number_p=0.5 if self.sw.where_numbers else 0.0)
        if isinstance(b, Num) and self.rng.random() < 0.5:
            a, b = b, a
        ct = scope.types[cond]
        shape = ct.shape
        for x in (a, b):
            if isinstance(x, str):
                shape = broadcast(shape, scope.types[x].shape)
        self.define(body, scope, Where(self.fresh(), cond, a, b), dtype, shape)

    def draw_cast(self, body, scope, in_loop) -> None:
        x = self.pick(scope)
        t = scope.types[x]
        dtype = self.rng.choice([d for d in DTYPES if d != t.dtype])
        bits = self.bitcast_instead(t.dtype)
        if bits:
            dtype = "i32" if t.dtype == "f32" else "f32"
        self.define(body, scope, Cast(self.fresh(), x, dtype, bits), dtype, t.shape)

    def bitcast_instead(self, dtype: str) -> bool:
        """Now and then a cast of an f32 or i32 value is `tg.bitcast` to the other 32-bit
        type (session 10: the emitter truncated those to 16 bits on the GPU). Drawn from a
        stream of its own, so a seed's programs stay what they were otherwise."""
        if not self.sw.bitcasts or dtype not in ("f32", "i32"):
            return False
        return random.Random(hash(self.rng.getstate()[1]) ^ 0xB17).random() < 0.5

    def draw_reduce(self, body, scope, in_loop) -> None:
        x = self.pick(scope, lambda t: t.dtype != nx.BOOL)
        if x is None:
            return
        t = scope.types[x]
        axis = self.rng.choice((0, 1))
        shape = (False, t.shape[1]) if axis == 0 else (t.shape[0], False)
        kinds = ("sum", "max", "min") + (("argmax", "argmin") if self.sw.arg_reductions else ())
        kind = self.rng.choice(kinds)
        dtype = "i32" if kind.startswith("arg") else t.dtype
        self.define(body, scope, Reduce(self.fresh(), kind, x, axis), dtype, shape)

    def draw_inplace(self, body, scope, in_loop) -> None:
        target = self.pick(scope, lambda t: t.dtype != nx.BOOL)
        if target is None or len(scope.shared_with[target]) > 1:
            return
        t = scope.types[target]
        op = self.rng.choice(("add", "sub", "mul", "div"))
        x = self._second_operand(scope, t.dtype, op)
        if isinstance(x, str) and broadcast(scope.types[x].shape, t.shape) != t.shape:
            x = self.number(t.dtype) if op != "div" or nx.is_float(t.dtype) else x
        if isinstance(x, str) and broadcast(scope.types[x].shape, t.shape) != t.shape:
            return
        body.append(InPlace(target, op, x))

    def draw_assign(self, body, scope, in_loop) -> None:
        target = self.pick(scope, lambda t: t.dtype != nx.BOOL)
        if target is None or len(scope.shared_with[target]) > 1:
            return
        t = scope.types[target]
        x = self.pick(scope, lambda u: (u.dtype, u.shape) == (t.dtype, t.shape), recent=0.3)
        if x is None or x == target or self.rng.random() < 0.3:
            x = self.number(t.dtype)
        body.append(Assign(target, x))

    def draw_gemm(self, body, scope, in_loop) -> None:
        """A gemm among other statements: mostly one K tile, now and then a K loop."""
        r = self.rng
        fits = self.bm % 16 == 0 and self.bn % 8 == 0 and \
            self.bm * self.bn >= 128 * (self.threads // 32)  # an MMA fragment per warp
        if not fits and r.random() < 0.9:  # mostly tiles an MMA can cover; some refusals
            return
        stages = r.choice((0, 0, 0, 1, 2)) if self.sw.gemm_programs else 0
        self.add_gemm(body, scope, r.choice(tuple(GEMM_ACCUMULATOR)), stages)

    def add_gemm(self, body, scope, dtype: str, stages: int, new_acc: float = 0.4) -> str:
        """Append `tg.gemm(acc, a, b)` over fresh (M x K) and (N x K) tensors of `dtype`
        (either stored transposed now and then: `transposed_read`; K rows of 32, 64 or 128 bytes — the spans wgmma's swizzles take — or, pipelined,
        now and then 256 bytes: two swizzle blocks, two TMA boxes and a descriptor per
        block) to an existing accumulator or a new one; returns the accumulator's name."""
        r = self.rng
        acc_dtype = GEMM_ACCUMULATOR[dtype]
        acc = self.pick(scope, lambda t: (t.dtype, t.shape) == (acc_dtype, (True, True)))
        if acc is None or len(scope.shared_with[acc]) > 1 or r.random() < new_acc:
            start = Num(0.0 if acc_dtype == "f32" else 0) if r.random() < 0.7 else \
                self.number(acc_dtype)
            acc = self.define(body, scope, Full(self.fresh(), (True, True), acc_dtype, start),
                              acc_dtype, (True, True))
        row_bytes = r.choice((32, 64, 128, 32, 64, 128, 256) if stages > 1 else
                             (32, 64, 128) if stages else (32, 64))
        bk = row_bytes // GEMM_ELEMENT_BYTES.get(dtype, 1)
        if stages == 0:
            extent = r.randint(max(1, bk - 15), bk)
        else:
            k_tiles = r.randint(1, 4)
            extent = r.randint((k_tiles - 1) * bk + 1, k_tiles * bk)
            if r.random() < self.TMA_ROWS_SHARE:  # rows a multiple of 16 bytes, as TMA
                # needs: K still ragged
                grain = 16 // GEMM_ELEMENT_BYTES.get(dtype, 1)
                extent = min(-(-extent // grain) * grain, k_tiles * bk)
        if not self.shared_ok():
            stages = min(stages, 1)
        route = "shared" if stages > 1 or (self.shared_ok() and r.random() < 0.7) else \
            "register"
        ta, tb = (self.transposed_read(dtype, route) for _ in "ab")
        names = []
        for kind, trans in (("gemm_a", ta), ("gemm_b", tb)):
            names.append(f"g{kind[-1]}{len(self.tensors)}")
            self.tensors.append(TensorDecl(names[-1], dtype, kind + ("_t" if trans else ""),
                                           extent))
        scratch = self.sw.scratch and stages > 0 and self.bm == self.bn and \
            r.random() < (0.05 if self.in_tile_loop else 0.5)
        tma_like = (self.threads % 128 == 0 and self.bm % 64 == 0 and dtype != "i8" and
                    extent * GEMM_ELEMENT_BYTES.get(dtype, 1) % 16 == 0)
        body.append(Gemm(acc, names[0], names[1], bk, route, stages, ta, tb, scratch,
                         self.role_blocks(stages, 0.6 if tma_like else 0.1),
                         self.repeat_count(stages)))
        self.tma_like = tma_like
        return acc

    def repeat_count(self, stages: int) -> int:
        """`Gemm.repeat`: now and then a K loop runs 2 or 3 times into one accumulator
        (a pipeline inside a run-time loop that carries its accumulator). Drawn from a
        stream of its own, as `role_blocks` is, so a seed's programs stay what they were."""
        if not self.sw.repeats or stages < 1:
            return 1
        side = random.Random(hash(self.rng.getstate()[1]) ^ 0x5EED)
        return side.choice((2, 3)) if side.random() < 0.2 else 1

    def role_blocks(self, stages: int, p: float) -> tuple:
        """`Gemm.roles` for a pipeline, with probability `p` (high where the pipeline
        looks like one synthesis splits, TMA + wgmma; low for the near misses, which must
        be refused at the block's line): the stated producer/consumer split, mostly with
        the budgets and schedule left to synthesis (else the budgets it would choose, and
        others, extremes included). Drawn from a stream of its own, seeded by the
        program's stream without drawing from it, so a seed's programs stay the programs
        they were before role blocks existed."""
        if not self.sw.roles or stages < 2:
            return ()
        side = random.Random(hash(self.rng.getstate()[1]))  # a tuple of ints: stable
        if side.random() >= p:
            return ()
        pick = lambda choices: None if side.random() < 0.5 else side.choice(choices[1:])  # noqa: E731
        return (pick(ROLE_PRODUCER_REGS), pick(ROLE_CONSUMER_REGS),
                None if side.random() < 0.7 else side.choice(ROLE_SCHEDULES[1:]))

    def transposed_read(self, dtype: str, route: str) -> str:
        """How one gemm operand is stored and read (`Gemm.ta`): mostly K-major; often, for
        f16/bf16 (wgmma's MN-major operands), a K x rows tensor through a shared `.T` view
        or its global `.T` view; now and then for 8-bit types (near misses: they must fall
        back to mma.sync or be refused cleanly)."""
        r = self.rng
        share = 0.4 if dtype in GEMM_ELEMENT_BYTES else 0.15
        if not self.sw.transposed_gemm or r.random() >= share:
            return ""
        return "smem" if route == "shared" and r.random() < 0.7 else "gmem"

    def gemm_program(self, label: str) -> Program:
        """A GEMM-shaped program: the README's pipelined K loop (sometimes a plain loop or
        one K tile) into a fresh accumulator, then an epilogue of random statements and
        the stores. Tiles, thread counts and types are mostly ones the sm_90a path takes
        to TMA + wgmma (threads a multiple of 128, BM a multiple of 64, 16- and 8-bit
        floats), with the near misses that must fall back (64 or 192 threads, BM 16/32,
        i8); M, N and K do not divide the tiles. One in five runs in clusters of two blocks
        along M (`tg.cluster(2)`: b's box multicast, stages released remotely; sm_80 and
        sm_89 refuse it, sm_90 takes the Ampere path's turn)."""
        r, draws = self.rng, self.GEMM_DRAWS
        persistent = self.tile_loop_blocks()
        self.in_tile_loop = persistent > 0
        threads = r.choice(draws["threads"] + (draws["npot_threads"] if self.sw.npot_threads
                                                else ()))
        dtype = r.choice(draws["dtype"])
        while True:
            bm, bn = r.choice(draws["bm"]), r.choice(draws["bn"])
            if self.sw.scratch and r.random() < 0.15:
                bn = bm  # square: a K loop may go through a transposed scratch tile
            if bm * bn <= self.sw.gemm_max_tile and self.tile_fits(threads, bm, bn):
                break
        cluster = 2 if self.sw.clusters and r.random() < 0.2 and not persistent else 1
        gm, gn = (2 if cluster > 1 else r.randint(1, 2)), r.randint(1, 2)
        m = r.randint((gm - 1) * bm + 1, gm * bm)
        n = r.randint((gn - 1) * bn + 1, gn * bn)
        self.threads, self.bm, self.bn = threads, bm, bn
        self.tensors, self.names, self.loops = [], 0, 0
        body: list = []
        scope = Scope()
        if r.random() < 0.3:
            self.load_input(body, scope)  # a C operand for the epilogue
        self.add_gemm(body, scope, dtype, r.choice(draws["stages"]), new_acc=1.0)
        if any(t.kind.endswith("_t") for t in self.tensors) and \
                r.random() < self.TRANSPOSED_ROWS_SHARE:
            # A transposed operand's rows are M or N long: a multiple of 16 bytes (as TMA
            # needs) mostly, still not of the tile.
            grain = 16 // GEMM_ELEMENT_BYTES.get(dtype, 1)
            m, n = (min(-(-x // grain) * grain, g * b) for x, g, b in ((m, gm, bm), (n, gn, bn)))
        for _ in range(r.randint(0, 4)):  # element-wise work on the latest values
            self.step(body, scope, in_loop=None, kinds=EPILOGUE_KINDS)
        self.stores(body, scope)
        return Program(threads, bm, bn, m, n, tuple(self.tensors), tuple(body), label, cluster,
                       *self.build_options(body), persistent=persistent)

    def tile_loop_blocks(self) -> int:
        """`Program.persistent` of a GEMM program: 0 here (one block a tile); the
        warp-specialized generator draws persistent tile loops."""
        return 0

    def tile_fits(self, threads: int, bm: int, bn: int) -> bool:
        """Whether to keep a drawn (threads, BM, BN): every draw here (near misses that
        must fall back or be refused included)."""
        return True

    def build_options(self, body: list) -> tuple:
        """(`warp_specialize`, `consumers`) of the sm_90a build, for a pipeline whose body
        states no roles: four in five of those that look like TMA + wgmma (the cost model keeps
        most small tiles in one role, so the producer/consumer lowering would otherwise be
        drawn only through role blocks) ask for the producer warpgroup or for one role,
        some with a consumer schedule; a few near misses ask too (a clean refusal naming
        the pipeline). Drawn from a stream of its own, seeded by the program's stream
        without drawing from it, so a seed's programs stay what they were otherwise."""
        pipeline = next((s for s in body if isinstance(s, Gemm) and s.stages > 1), None)
        if not self.sw.warp_specialize or pipeline is None or pipeline.roles:
            return None, None
        side = random.Random(hash(self.rng.getstate()[1]) ^ 0x3A11)
        if side.random() >= (0.8 if self.tma_like else 0.1):
            return None, None
        specialize = side.choice((True, True, False))
        consumers = (side.choice(WARP_SPECIALIZED_SCHEDULES)
                     if specialize and side.random() < 0.4 else None)
        return specialize, consumers

    # -- loops ----------------------------------------------------------------------------
    def draw_loop(self, body, scope, in_loop) -> None:
        r = self.rng
        self.loops += 1
        loop_id = self.loops
        axis = r.choice((0, 1))
        tile = self.bn if axis == 1 else self.bm
        trips = r.randint(1, 3)
        extent = r.randint((trips - 1) * tile + 1, trips * tile)
        dtype = r.choices(DTYPES, _DTYPE_WEIGHTS)[0]
        name = f"k{loop_id}"
        self.tensors.append(TensorDecl(name, dtype, f"loop{axis}", extent))
        stages = 2 if self.sw.pipelines and self.shared_ok() and r.random() < 0.25 else 1
        carried = self._carried(body, scope)
        inner = scope.copy()
        loop_body: list = []
        route = "shared" if stages > 1 else r.choice(
            ["load", "copy"] + (["shared"] if self.shared_ok() else []))
        tile_name = self.fresh()
        loop_body.append(Load(tile_name, name, route, self.fill(dtype, route), loop_id))
        inner.define(tile_name, TileType(dtype, (True, True)))
        probe = Loop(loop_id, name, axis, (), stages)
        scratch = self.sw.scratch and r.random() < 0.5
        if scratch:
            buffer, read = self._scratch_before(body, scope, loop_id, dtype)
            loop_body.append(read)
            inner.define(read.out, TileType(dtype, (True, True)))
        for _ in range(r.randint(0, 3)):
            self.step(loop_body, inner, probe)
        for c in carried:
            self._update(loop_body, inner, c, read.out if scratch and r.random() < 0.5
                         else tile_name)
        if scratch and r.random() < 0.7:  # written back: read again by the next iteration
            op = r.choice(("add", "max", "min") if nx.is_float(dtype) else ("add", "max", "xor"))
            value = self._emit_binary(loop_body, inner, op, read.out, tile_name)
            loop_body.append(self._maybe_branch([Stash(buffer, value)]))
        if scratch and carried and r.random() < 0.3:  # a branch of register work only
            c = carried[0]
            if len(inner.shared_with[c]) == 1:
                number = Num(2.0) if nx.is_float(inner.types[c].dtype) else Num(3)
                loop_body.append(self._maybe_branch([InPlace(c, "mul", number)], p=1.0))
        body.append(Loop(loop_id, name, axis, tuple(loop_body), stages))
        if scratch:
            self._scratch_after(body, scope, buffer, dtype)

    def _scratch_before(self, body, scope, loop_id: int, dtype: str) -> tuple[str, Unstash]:
        """A scratch tile stashed before loop `loop_id`, and the read that starts its body
        (through `.T` mostly, where the tile is square: other threads' elements)."""
        r = self.rng
        buffer = f"sc{loop_id}"
        init = self.define(body, scope, Full(self.fresh(), (True, True), dtype,
                                             self.number(dtype)), dtype, (True, True))
        body.append(Stash(buffer, init))
        return buffer, Unstash(self.fresh(), buffer, self.bm == self.bn and r.random() < 0.7)

    def _maybe_branch(self, body: list, p: float = 0.3):
        """`body` as one statement: itself, or (probability `p`) inside a `tg.if_` on the
        block's row or column that holds in some blocks."""
        r = self.rng
        if len(body) != 1 or not self.sw.branches or r.random() >= p:
            return body[0] if len(body) == 1 else None
        return Branch(r.choice((0, 1)), r.choice(("lt", "ge", "eq")), r.choice((0, 1)),
                      tuple(body))

    def _scratch_after(self, body, scope, buffer: str, dtype: str) -> None:
        """After the loop: read the scratch tile (what the last iteration left), and maybe
        overwrite it first (a write after the loop's reads)."""
        r = self.rng
        if r.random() < 0.4:
            value = self.pick(scope, lambda t: t.dtype == dtype and t.shape == (True, True))
            if value is not None:
                body.append(self._maybe_branch([Stash(buffer, value)]))
        if r.random() < 0.8:
            out = self.fresh()
            body.append(Unstash(out, buffer, self.bm == self.bn and r.random() < 0.5))
            scope.define(out, TileType(dtype, (True, True)))

    def _carried(self, body, scope) -> list[str]:
        """1-2 names the loop will carry: existing tiles or fresh accumulators."""
        r = self.rng
        carried = []
        for _ in range(r.randint(1, 2)):
            existing = self.pick(scope, lambda t: t.dtype != nx.BOOL, recent=0.5)
            if existing and existing not in carried and \
                    len(scope.shared_with[existing]) == 1 and r.random() < 0.5:
                carried.append(existing)
                continue
            dtype = r.choices(DTYPES, _DTYPE_WEIGHTS)[0]
            shape = r.choice(((True, True), (True, False), (False, True)))
            value = Num(0.0 if nx.is_float(dtype) else 0) if r.random() < 0.5 else \
                self.number(dtype)
            carried.append(self.define(body, scope, Full(self.fresh(), shape, dtype, value),
                                       dtype, shape))
        return carried

    def _update(self, body, scope, c: str, source: str) -> None:
        """Fold `source` (cast and reduced to fit) into the carried tile `c`; now and then
        its cumulative sum instead (`carried_scan`: a scan feeding loop-carried state)."""
        r = self.rng
        t = scope.types[c]
        w = self.carried_scan(body, scope, source)
        if scope.types[w].dtype != t.dtype:
            w = self.define(body, scope, Cast(self.fresh(), w, t.dtype), t.dtype,
                            scope.types[w].shape)
        for axis in (0, 1):
            if scope.types[w].shape[axis] and not t.shape[axis]:
                shape = (False, scope.types[w].shape[1]) if axis == 0 else \
                    (scope.types[w].shape[0], False)
                w = self.define(body, scope, Reduce(self.fresh(), r.choice(("sum", "max", "min")),
                                                    w, axis), t.dtype, shape)
        styles = ["inplace", "assign"] + (["rebind", "rebind_alias"] if self.sw.loop_rebind else [])
        style = r.choice(styles)
        op = r.choice(("add", "max", "min", "scaled") if nx.is_float(t.dtype)
                      else ("add", "max", "min", "xor"))
        if style == "inplace" and op in ("add", "scaled"):
            if op == "scaled":
                body.append(InPlace(c, "mul", Num(0.5)))
            body.append(InPlace(c, "add", w))
            return
        if style == "inplace":
            style = "assign"
        if op == "scaled":
            scaled = self._emit_binary(body, scope, "mul", c, Num(0.5),
                                       out=c if style == "rebind" else None)
            op, first = "add", scaled
        else:
            first = c
        out = c if style == "rebind" else None
        value = self._emit_binary(body, scope, op, first, w, out=out)
        if style == "assign":
            body.append(Assign(c, value))
        elif style == "rebind_alias":
            body.append(Alias(c, value))
            scope.alias(c, value)


__all__ = ["Generator", "Switches", "DTYPES"]
