"""Fuzzing chained gemms in a pipeline: the two consumer warpgroups' turns inside a K loop.

With `consumers="pingpong"`, 256 threads (a 128-row tile, 64 rows a warpgroup) and a
pipeline of two gemms or more in no tile loop, the two consumer warpgroups take turns at
the tensor cores inside the loop (FlashAttention-3's ping-pong, `lower/warp_roles.py`
`take_turns_in_loop`): one's register work between the gemms runs while the other's
gemms do. The attention forward is the only kernel that reached it; the random fuzz
programs have one gemm a pipeline. This generator draws attention-shaped chains:

    for j in tg.pipeline(key blocks):       # k_j, v_j through the TMA ring
        s = q @ k_j.T                       # gemm 1, D deep
        p = f(s) (masked past the keys' end) # register work: the turn's other side
        l += sum(p)                         # a carried row sum, some programs
        acc = acc * 0.5                     # a rescale of the in-flight accumulator, some
        acc += p.to(16 bits) @ v_j          # gemm 2: A from registers, v K- or MN-major

with random D, value width DV, key block BN, stages, lengths that do not divide the
blocks, f16 or bf16, f (scale, ReLU, tanh, exp2), an f32 or 16-bit output, stated warp
roles or not, the consumer schedule (ping-pong: turns; cooperative; synthesis's choice)
on 256 threads mostly (128 now and then: one consumer warpgroup), and now and then a
persistent tile loop over the query blocks around it (where the ring spans the tile loop:
no turns; synthesis must pick another schedule or refuse ping-pong cleanly).

Each program runs in the emulator for sm_90a under a drawn role order (every other one a
stall order: a warpgroup held after each named-barrier arrive, so a lapping turn is
found) and for sm_80, against a float64 model with an error bound per element.
`python -m tegula.fuzz --seed S --gemm-chain I` shows and reruns one.
"""
from __future__ import annotations

import random
from dataclasses import dataclass, replace

import numpy as np

FUNCTIONS = ("scale", "relu", "tanh", "exp2")
SCHEDULES = ("pingpong", "pingpong", None, "cooperative")
STALL_ORDERS = ("stall", "stall-reversed")
SCALE_NUM = 0.5   # s is scaled by SCALE_NUM / sqrt(D) before f


@dataclass(frozen=True)
class GemmChain:
    """One program (module docstring): q (m, d), k (keys, d), v (keys, dv) or stored
    transposed (dv, keys) when `v_kmajor`; `bm` query rows a block (threads 2·bm)."""

    m: int
    keys: int
    d: int
    dv: int
    bm: int
    bn: int
    stages: int
    dtype: str = "f16"
    out: str = "f32"
    f: str = "scale"
    mask: bool = True
    rowsum: bool = False
    rescale: bool = False
    v_kmajor: bool = False
    roles: bool = False
    consumers: str | None = "pingpong"
    persistent: int = 0

    @property
    def threads(self) -> int:
        return 2 * self.bm

    def grid(self) -> tuple:
        return (self.persistent,) if self.persistent else (-(-self.m // self.bm),)

    def describe(self) -> str:
        extra = [name for name in ("mask", "rowsum", "rescale", "v_kmajor", "roles")
                 if getattr(self, name)]
        return (f"gemm chain: q {self.m}x{self.d}, {self.keys} keys, dv {self.dv}, "
                f"{self.dtype}->{self.out}, BM {self.bm} ({self.threads} threads), BN "
                f"{self.bn}, {self.stages} stages, f {self.f}, consumers {self.consumers}"
                + (f", persistent on {self.persistent} blocks" if self.persistent else "")
                + (f", {', '.join(extra)}" if extra else ""))


def make_gemm_chain(seed: int, index: int) -> GemmChain:
    """Program `index` of the gemm-chain run with `seed` (its own random stream)."""
    r = random.Random(f"tegula.fuzz.gemm_chains {seed} {index}")
    bm = 128 if r.random() < 0.8 else 64
    d, dv = r.choice((16, 32, 64, 64, 128)), r.choice((16, 32, 64, 64, 128))
    bn = r.choice((32, 64, 64, 128))
    m = r.randint(1, r.choice((1, 2)) * bm)
    keys = r.randint(1, r.choice((1, 2, 3, 4)) * bn)
    v_kmajor = r.random() < 0.3
    if v_kmajor:   # v stored (dv, keys): rows of 16 bytes, as TMA needs
        keys = -(-keys // 8) * 8
    chain = GemmChain(m, keys, d, dv, bm, bn, r.choice((2, 3, 4)), r.choice(("f16", "bf16")),
                      r.choice(("f32", "f32", "16")), r.choice(FUNCTIONS), r.random() < 0.7,
                      r.random() < 0.5, r.random() < 0.3, v_kmajor, r.random() < 0.3,
                      r.choice(SCHEDULES), r.choice((1, 2)) if r.random() < 0.2 else 0)
    # Ping-pong outside its frame (128 threads, or a tile loop the ring spans) is a near
    # miss that must be refused cleanly: kept one time in five.
    if chain.consumers == "pingpong" and (bm < 128 or chain.persistent) and r.random() < 0.8:
        chain = replace(chain, consumers=None)
    return chain


def _kernel(dtype: str, out: str):
    """The kernel chains of these types run (their choices are constexprs)."""
    import contextlib
    import tegula as tg
    from tegula import f32
    DT, OUT = getattr(tg, dtype), getattr(tg, out)  # noqa: N806 (read by the annotations)

    @tg.kernel(threads=256)
    def gemm_chain(q: tg.Tensor[DT], k: tg.Tensor[DT], v: tg.Tensor[DT],
                   o: tg.Tensor[OUT], rowsum: tg.Tensor[f32], BM: tg.constexpr = 128,
                   BN: tg.constexpr = 64, D: tg.constexpr = 64, DV: tg.constexpr = 64,
                   STAGES: tg.constexpr = 2, F: tg.constexpr = 0, MASK: tg.constexpr = 1,
                   ROWSUM: tg.constexpr = 0, RESCALE: tg.constexpr = 0,
                   VK: tg.constexpr = 0, ROLES: tg.constexpr = 0,
                   PERSISTENT: tg.constexpr = 0, SCALE: tg.constexpr = 0.0):
        keys = k.tile((BN, D), (None, 0))
        values = v.tile((DV, BN), (0, None)) if VK else v.tile((BN, DV), (None, 0))
        sq = tg.shared((BM, D), DT)
        sk = tg.shared((BN, D), DT, stages=STAGES)
        sv = tg.shared((DV, BN) if VK else (BN, DV), DT, stages=STAGES)
        producer = (lambda: tg.producer()) if ROLES else contextlib.nullcontext
        consumer = (lambda: tg.consumer()) if ROLES else contextlib.nullcontext
        def tile(m):
            tg.copy(q.tile((BM, D), (m, 0)), sq)
            acc = tg.zeros((BM, DV), f32)
            total = tg.zeros((BM, 1), f32)
            for j in tg.pipeline(keys.shape[2], stages=STAGES):
                with producer():
                    tg.copy(keys[:, :, j], sk[j])
                    tg.copy(values[:, :, j], sv[j])
                with consumer():
                    s = tg.zeros((BM, BN), f32)
                    tg.gemm(s, sq, sk[j])
                    p = f(s * SCALE)
                    if MASK:
                        cols = tg.arange(BN, offset=j * BN)
                        p = tg.where(cols[None, :] < k.shape[0], p, 0.0)
                    if ROWSUM:
                        total += tg.sum(p, 1)
                    if RESCALE:
                        acc = acc * 0.5
                    tg.gemm(acc, p.to(DT), sv[j] if VK else sv[j].T)
            tg.copy(acc.to(OUT), o.tile((BM, DV), (m, 0)))
            if ROWSUM:
                tg.copy(total, rowsum.tile((BM, 1), (m, 0)))

        def f(x):
            if F == 0:
                return x
            if F == 1:
                return tg.maximum(x, 0.0)
            return tg.tanh(x) if F == 2 else tg.exp2(x)

        if PERSISTENT:   # a tile loop over the query blocks: the ring spans it
            for t in tg.range(tg.block_id(0), tg.cdiv(q.shape[0], BM), tg.num_programs(0)):
                tile(t)
        else:
            tile(tg.block_id(0))

    return gemm_chain


_KERNELS: dict = {}


def _types(p: GemmChain) -> tuple[str, str]:
    return p.dtype, (p.dtype if p.out == "16" else p.out)


def kernel(p: GemmChain):
    """The kernel of `p`'s input and output types (one build cache per pair)."""
    key = _types(p)
    if key not in _KERNELS:
        _KERNELS[key] = _kernel(*key)
    return _KERNELS[key]


def options(p: GemmChain) -> dict:
    """Constexprs and build options of `p`'s launch for sm_90a (`consumers=` there only)."""
    return dict(BM=p.bm, BN=p.bn, D=p.d, DV=p.dv, STAGES=p.stages,
                F=FUNCTIONS.index(p.f), MASK=int(p.mask), ROWSUM=int(p.rowsum),
                RESCALE=int(p.rescale), VK=int(p.v_kmajor), ROLES=int(p.roles),
                PERSISTENT=int(bool(p.persistent)), SCALE=SCALE_NUM / np.sqrt(p.d),
                threads=p.threads)


def inputs(p: GemmChain, seed: int) -> dict:
    """q, k, v exact in the input type (float64 values), o and rowsum poisoned."""
    from tegula.fuzz import numerics as nx
    rng = np.random.default_rng(seed)
    q, k = (nx.round_float(rng.standard_normal(shape), p.dtype)
            for shape in ((p.m, p.d), (p.keys, p.d)))
    v = nx.round_float(rng.standard_normal((p.keys, p.dv)), p.dtype)
    return dict(q=q, k=k, v=v, o=np.full((p.m, p.dv), -1234.5),
                rowsum=np.full((p.m, 1), -1234.5))


def _f(p: GemmChain, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(f(x), |f'(x)|)."""
    if p.f == "scale":
        return x, np.ones_like(x)
    if p.f == "relu":
        return np.maximum(x, 0.0), (x > 0).astype(np.float64)
    if p.f == "tanh":
        return np.tanh(x), 1.0 - np.tanh(x) ** 2
    y = np.exp2(x)
    return y, y * np.log(2.0)


def expected(p: GemmChain, x: dict) -> tuple:
    """((o, its bound), (rowsum, its bound)) in float64: s in f32 (D·2^-22 of Σ|q·k|), f
    (a 2^-20 relative error of the math function and the derivative times s's error), p
    rounded to the input type (its 1-ulp uncertainty), the second gemm in f32."""
    from tegula.fuzz import numerics as nx
    q, k, v = x["q"], x["k"], x["v"]
    scale = float(np.float32(SCALE_NUM / np.sqrt(p.d)))
    rel16 = 2.0 ** (-11 if p.dtype == "f16" else -8)
    acc, acc_err = np.zeros((p.m, p.dv)), np.zeros((p.m, p.dv))
    total, total_err = np.zeros((p.m, 1)), np.zeros((p.m, 1))
    for start in range(0, p.keys, p.bn):
        kj, vj = k[start:start + p.bn], v[start:start + p.bn]
        s = q @ kj.T
        s_err = p.d * 2.0 ** -22 * (np.abs(q) @ np.abs(kj).T) + np.abs(s) * 2.0 ** -23
        val, slope = _f(p, s * scale)
        err = slope * 1.01 * s_err * scale + np.abs(val) * 2.0 ** -20 + 1e-30
        total += val.sum(1, keepdims=True)
        total_err += err.sum(1, keepdims=True) + \
            np.abs(val).sum(1, keepdims=True) * p.bn * 2.0 ** -23
        p16 = nx.round_float(val, p.dtype)
        p_err = err + np.abs(val) * rel16          # p16 may round the other way
        if p.rescale:
            acc, acc_err = acc * 0.5, acc_err * 0.5
        acc = acc + p16 @ vj
        acc_err = acc_err + p_err @ np.abs(vj) + \
            (p.bn + 1) * 2.0 ** -22 * (np.abs(p16) @ np.abs(vj) + np.abs(acc))
    # keys past the end: masked to 0, or f(0) times v's zero rows (nothing) — but the row
    # sum counts f(0) for each padded key unless masked
    padded = (-p.keys) % p.bn
    if not p.mask and padded:
        f0 = _f(p, np.zeros(1))[0][0]
        total += padded * f0
    out = _types(p)[1]
    rounding = 2.0 ** -23 if out == "f32" else 2.0 ** (-11 if out == "f16" else -8)
    return ((acc, acc_err + np.abs(acc) * rounding + 1e-30),
            (total, total_err + np.abs(total) * 2.0 ** -23 + 1e-30))


def _arrays(p: GemmChain, x: dict) -> list:
    from tegula.fuzz import numerics as nx
    dt, out = _types(p)
    v = x["v"].T.copy() if p.v_kmajor else x["v"]
    return [nx.storage(x["q"], dt), nx.storage(x["k"], dt), nx.storage(v, dt),
            nx.storage(x["o"], out), x["rowsum"].astype(np.float32)]


def run_emulated(p: GemmChain, x: dict, target: str, role_order: str = "listed") -> tuple:
    """(o, rowsum) as float64 after an emulated launch for `target`."""
    import tegula as tg
    arrays = _arrays(p, x)
    extra = dict(consumers=p.consumers) if p.consumers and target == "sm_90a" else {}
    if target == "sm_90a":
        extra["role_order"] = role_order
    with np.errstate(all="ignore"):
        tg.emulate(kernel(p), p.grid(), *arrays, target=target, check_coverage=False,
                   **options(p), **extra)
    for built in list(getattr(kernel(p), "_builds", {}).values()):
        built.cuda_source()   # a program the emulator runs but codegen refuses: a bug
    return arrays[3].astype(np.float64), arrays[4].astype(np.float64)


def judge(p: GemmChain, got: tuple, want: tuple) -> str:
    """"" if every element of o (and the row sum) is within its bound, else the first
    wrong one."""
    for name, value, (model, bound) in (("o", got[0], want[0]), ("rowsum", got[1], want[1])):
        if name == "rowsum" and not p.rowsum:
            continue
        bad = ~(np.abs(value - model) <= bound)
        if bad.any():
            i = tuple(np.argwhere(bad)[0])
            return (f"{name}{i} = {value[i]!r}, expected {model[i]!r} (bound "
                    f"{bound[i]:.3g}); {int(bad.sum())} of {bad.size} wrong")
    return ""


def check_gemm_chain(p: GemmChain, seed: int, targets: tuple = ("sm_90a", "sm_80")) -> tuple:
    """(status, reason, detail): "pass", "rejected" (every target refused it cleanly: a
    SynthesisError naming the line), "mismatch" or "internal" (an emulation error, an
    error saying internal, a crash)."""
    from tegula.fuzz.runner import check_template
    x = inputs(p, seed)
    want = expected(p, x)
    order = STALL_ORDERS[seed // 2 % 2] if seed % 2 else f"random:{seed}"

    def wrong(got) -> str:
        found = judge(p, got, want)
        return found and f"{found} (roles in order {order})"
    return check_template(p.describe(), targets, lambda t: run_emulated(p, x, t, order), wrong)


__all__ = ["GemmChain", "make_gemm_chain", "check_gemm_chain", "kernel", "options", "inputs",
           "expected", "judge"]
