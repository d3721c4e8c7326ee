"""`wgmma.mma_async` entries of the catalogue: Hopper's warpgroup-wide asynchronous MMA.

One entry per shape and type, `wgmma.m64n{N}k{K}.{acc}.{a}.{b}` (N = 8, 16, … 256):

    operands               K    accumulators   A from
    f16 x f16              16   f32, f16       shared memory (descriptor) or registers
    bf16 x bf16            16   f32            "
    e4m3/e5m2 x e4m3/e5m2  32   f32            "
    tf32 x tf32 (f32 data)  8   f32            "  (K-major only)

D (64 x N) = A (64 x K) · Bᵀ, B given as N x K, plus D when scale-d is 1. B always comes from
shared memory through a matrix descriptor (`tegula.arch.smem_matrix`); A from a descriptor
or from registers (the `a_tv` fragment). 16-bit operands may be MN-major (imm-trans 1);
8-bit operands are K-major only.

Fragments (PTX ISA "Register fragments and shared memory matrix layouts" for wgmma, 128
threads = 4 warps; groupID = lane >> 2, tig = lane % 4, w = warp of the warpgroup):

* D (`acc_tv`): warp w owns rows 16w .. 16w+15; value 4j+i (j = column block 0 .. N/8-1)
  sits at row 16w + groupID (+8 for i = 2, 3), column 8j + 2 tig + (i & 1) — the
  mma.m16n8 C fragment repeated over N/8 column blocks. Over the flat index m + 64 n:
  ((4,8,4),(2,2,N/8)) : ((128,1,16),(64,8,512)).
* A from registers (`a_tv`), flat index m + 64 k:
  16-bit k16: row 16w + groupID (+8 for values 2,3,6,7), col 2 tig + (i & 1) (+8 for
  values 4..7): ((4,8,4),(2,2,2)) : ((128,1,16),(64,8,512));
  8-bit k32: col 4 tig + (i & 3) (+16 for values 8..15), row +8 for values 4..7, 12..15:
  ((4,8,4),(4,2,2)) : ((256,1,16),(64,8,1024));
  tf32 k8: row 16w + groupID (+8 for values 1, 3), col tig (+4 for values 2, 3):
  ((4,8,4),(2,2)) : ((64,1,16),(8,256)).
These equal CuTe's `CLayout_64xN` / `ALayout_64x16` / `ALayout_64x32` (independent check;
the tests re-derive them from the formulas).

PTX, as the emitter prints it (CUTLASS spells scale-d the same way):

    { .reg .pred p; setp.ne.b32 p, %S, 0;
      wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 {d…}, descA | {a…}, descB, p, 1, 1[, tA], tB; }

with the accumulators read-write ("+f", or "+r" for packed f16 pairs), descriptors "l",
scale-d "r"; imm-scale-a/b are 1 and imm-trans-a/b immediates (16-bit types only; no
trans-a with A from registers). Only `sm_90a` has wgmma (`min_cc = 90` and the target's
"a" suffix).

tf32 (`wgmma.m64n{N}k8.f32.tf32.tf32`): the operands are f32 data in shared memory (tegula
has no tf32 type: `tg.gemm` of f32 tiles takes these on sm_90a). The PTX ISA leaves tf32's
internal layout implementation-defined (at least 10 mantissa bits) and converts f32 data
with `cvt.rna.tf32.f32` (round to nearest, ties away); operands read straight from shared
memory get no such conversion, and the tensor cores use the top 19 bits, i.e. the f32
value with its low 13 mantissa bits dropped (truncation toward zero; NaN stays NaN). The
entry's `execute` models exactly that (`truncate_to_tf32`); the GPU test
(tests/gpu/test_tf32_wgmma.py) checks it against both models on random f32 data.

Timing: issue cycles = M·N·K FMAs at the target's wgmma rate (`Target.wgmma_rate`, the
whole SM: the four warps of a warpgroup drive the four sub-partitions' tensor cores);
latency ~ issue + 100 cycles of pipeline fill (Luo et al., "Benchmarking and Dissecting the
Nvidia Hopper GPU Architecture", 2024, measure wgmma m64n{N}k16 latencies of ~ 120–250
cycles; approximate, for ranking only).
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping, Sequence

import numpy as np

from tegula.arch.formats import tensor_core_nan
from tegula.arch.instructions import AsmOperand, Instruction, ptx_type, tv_table
from tegula.arch.smem_matrix import (  # noqa: F401  (re-exported: one definition)
    MatrixDescriptor, canonical_smem_layout, decode_descriptor, descriptor_element_addresses,
    encode_descriptor, operand_descriptor, swizzle_bytes_address)
from tegula.dtypes import DType, bf16, f8e4m3, f8e5m2, f16, f32
from tegula.errors import TegulaError
from tegula.layout import Layout

#: Threads of a warpgroup.
WARPGROUP = 128
#: The N extents wgmma offers.
WGMMA_N = tuple(range(8, 257, 8))

_SOURCE = ("PTX ISA 'Asynchronous Warpgroup Level Matrix Multiply-Accumulate' (wgmma "
           "fragments, descriptors); CUTLASS mma_sm90_gmma.hpp (asm spelling); latency: "
           "Luo et al. 2024 (approximate); issue: Target.wgmma_rate")


def acc_layout(n: int) -> Layout:
    """D fragment of m64n{n}: (128 threads, n/2 values) -> m + 64*n'."""
    return Layout(((4, 8, 4), (2, 2, n // 8)), ((128, 1, 16), (64, 8, 512)))


def a_layout(bits: int) -> Layout:
    """A-from-registers fragment (128 threads, values) -> m + 64*k, for 32-bit (tf32),
    16- or 8-bit A."""
    if bits == 32:
        return Layout(((4, 8, 4), (2, 2)), ((64, 1, 16), (8, 256)))
    if bits == 16:
        return Layout(((4, 8, 4), (2, 2, 2)), ((128, 1, 16), (64, 8, 512)))
    if bits == 8:
        return Layout(((4, 8, 4), (4, 2, 2)), ((256, 1, 16), (64, 8, 1024)))
    raise TegulaError(f"no wgmma A fragment for {bits}-bit operands")


@dataclass(frozen=True)
class WgmmaInstr(Instruction):
    """One `wgmma.mma_async.sync.aligned.m64n{N}k{K}` shape and type (see module doc).

    `template`/`operands` describe the form with A from shared memory, K-major operands;
    `format_asm` prints either form (A as a descriptor or as registers) with the
    transpose immediates asked for. `acc_tv`/`a_tv`: (128 threads, value) layouts, values in
    PTX register element order (two f16 accumulators share a register, low half first).
    """

    m: int = 64
    n: int = 8
    k: int = 16
    a_dtype: DType | None = None
    b_dtype: DType | None = None
    acc_dtype: DType | None = None
    acc_tv: Layout | None = None
    a_tv: Layout | None = None
    operand_class: str = "f16"

    # ------------------------------------------------------------------ registers

    @property
    def acc_values(self) -> int:
        """Accumulator values each thread holds (N/2)."""
        return self.acc_tv.size // WARPGROUP

    @property
    def acc_regs(self) -> int:
        return self.acc_values * self.acc_dtype.bits // 32

    @property
    def a_values(self) -> int:
        return self.a_tv.size // WARPGROUP

    @property
    def a_regs(self) -> int:
        return self.a_values * self.a_dtype.bits // 32

    @property
    def transposable(self) -> bool:
        """Whether operands may be MN-major (imm-trans): 16-bit types only."""
        return self.a_dtype.bits == 16

    @property
    def flops(self) -> int:
        return 2 * self.m * self.n * self.k

    def tables(self) -> tuple[np.ndarray, np.ndarray]:
        """(acc, a) TV layouts as int64 [128, values] arrays."""
        return _tables(self.name, self.acc_tv, self.a_tv)

    # ------------------------------------------------------------------ code generation

    def format_asm(self, d: Sequence[str], a: str | Sequence[str], b: str, scale_d: str,
                   trans_a: int = 0, trans_b: int = 0) -> str:  # type: ignore[override]
        """The `asm volatile` statement. `d`: the accumulator registers (read and written);
        `a`: one 64-bit descriptor expression (A in shared memory) or the `a_regs` A
        registers; `b`: B's descriptor; `scale_d`: an int expression (0: D = A·B, else
        D = A·B + D); `trans_a`/`trans_b`: 1 for an MN-major operand (16-bit types)."""
        d = list(d)
        if len(d) != self.acc_regs:
            raise TegulaError(f"{self.name}: needs {self.acc_regs} accumulator registers, "
                              f"got {len(d)}")
        from_regs = not isinstance(a, str)
        a = list(a) if from_regs else [a]
        if from_regs and len(a) != self.a_regs:
            raise TegulaError(f"{self.name}: A from registers needs {self.a_regs} registers, "
                              f"got {len(a)}")
        for name, t in (("trans_a", trans_a), ("trans_b", trans_b)):
            if t not in (0, 1) or (t and not self.transposable):
                raise TegulaError(f"{self.name}: {name}={t!r} — transposed (MN-major) operands "
                                  "exist only for f16/bf16 wgmma, as 0 or 1")
        if from_regs and trans_a:
            raise TegulaError(f"{self.name}: A from registers cannot be transposed")
        nd, na = len(d), len(a)
        d_text = "{" + ", ".join(f"%{i}" for i in range(nd)) + "}"
        a_text = ("{" + ", ".join(f"%{nd + i}" for i in range(na)) + "}") if from_regs \
            else f"%{nd}"
        b_text, s_text = f"%{nd + na}", f"%{nd + na + 1}"
        imms = "1, 1"
        if self.transposable:
            imms += f", {trans_b}" if from_regs else f", {trans_a}, {trans_b}"
        text = ("{ .reg .pred p; setp.ne.b32 p, " + s_text + ", 0; " + self.ptx + " " + d_text
                + ", " + a_text + ", " + b_text + ", p, " + imms + "; }")
        acc_con = "f" if self.acc_dtype == f32 else "r"
        outs = ", ".join(f'"+{acc_con}"({e})' for e in d)
        a_ins = [f'"r"({e})' for e in a] if from_regs else [f'"l"({a[0]})']
        ins = ", ".join(a_ins + [f'"l"({b})', f'"r"((int)({scale_d}))'])
        return f'asm volatile("{text}\\n" : {outs} : {ins} : "memory");'

    # ------------------------------------------------------------------ semantics

    def execute(self, d: np.ndarray | None, a: np.ndarray, b: np.ndarray,
                scale_d: int = 1) -> np.ndarray:
        """What the instruction computes: D = A·Bᵀ (+ D when `scale_d` is nonzero), with A
        (64, K) and B (N, K) the operand values (any float array, already in the operand
        type) and D (64, N). Products are exact and summed in float64, the result rounded
        once to the accumulator type (f32 → float32, f16 → float16); NaN and Inf propagate
        as IEEE arithmetic says (Inf·0 = NaN). For 16-bit operands the hardware sums with
        at least f32 precision, so results agree to a few f32 ulps of sum |a·b| + |d|.
        The 8-bit (e4m3/e5m2) forms do not: measured on an H100 (2026-11-24), their error
        reaches 2^-12.2 · Σ|a·b| at K=512 (about 14 kept bits per k32 instruction, as
        DeepSeek-V3 §3.3.2 reports), where mma.sync is exact to f32 rounding. This model
        computes the exact sum, so an FP8 wgmma GEMM can differ from the emulator by that
        much; long-K FP8 GEMMs need partial sums promoted to f32 registers (issue 10)."""
        a = np.asarray(a, dtype=np.float64)
        b = np.asarray(b, dtype=np.float64)
        if self.operand_class == "tf32":
            a, b = truncate_to_tf32(a), truncate_to_tf32(b)
        if a.shape != (self.m, self.k) or b.shape != (self.n, self.k):
            raise TegulaError(f"{self.name}: A must be ({self.m}, {self.k}) and B "
                              f"({self.n}, {self.k}), got {a.shape} and {b.shape}")
        with np.errstate(invalid="ignore", over="ignore"):
            out = a @ b.T
            if scale_d:
                if d is None or np.shape(d) != (self.m, self.n):
                    raise TegulaError(f"{self.name}: scale-d 1 reads D ({self.m}, {self.n})")
                out = out + np.asarray(d, dtype=np.float64)
            return tensor_core_nan(out.astype(np.float32 if self.acc_dtype == f32
                                              else np.float16))

    def timing(self, target) -> tuple[float, float]:
        """(issue cycles of the warpgroup's instruction on one SM, latency cycles)."""
        rate = target.wgmma_rate(self.operand_class)
        issue = self.m * self.n * self.k / rate if rate else float("inf")
        return issue, issue + float(self.latency_cycles)

    def throughput(self, target) -> float:
        """Warpgroup instructions per clock per SM: `timing`'s issue cycles are already
        the whole SM's (the warpgroup drives all four sub-partitions' tensor cores)."""
        issue, _ = self.timing(target)
        return 1.0 / issue if issue else float("inf")

    def available_on(self, target) -> bool:
        """wgmma exists on the architecture-specific sm_90a only."""
        return target.cc >= self.min_cc and target.arch_suffix == "a"


def truncate_to_tf32(x: np.ndarray) -> np.ndarray:
    """f32 values as the tensor cores read them for a tf32 operand: the low 13 of the 23
    mantissa bits dropped (toward zero), Inf kept, NaN kept NaN (float64 out)."""
    f = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    kept = (f.view(np.uint32) & np.uint32(0xFFFFE000)).view(np.float32)
    return np.where(np.isnan(f), np.float32(np.nan), kept).astype(np.float64).reshape(np.shape(x))


_TABLES: dict[str, tuple[np.ndarray, np.ndarray]] = {}


def _tables(name: str, acc_tv: Layout, a_tv: Layout) -> tuple[np.ndarray, np.ndarray]:
    cached = _TABLES.get(name)
    if cached is None:
        cached = (tv_table(acc_tv, WARPGROUP), tv_table(a_tv, WARPGROUP))
        _TABLES[name] = cached
    return cached


def _wgmma(n: int, a: DType, b: DType, acc: DType) -> WgmmaInstr:
    """Build the m64n{n}k{k} entry for operand types a, b and accumulator acc."""
    k = 256 // a.bits  # 32 bytes of K per instruction
    spell = (lambda t: "tf32") if a.bits == 32 else ptx_type  # f32 data multiplied as tf32
    types = f"{ptx_type(acc)}.{spell(a)}.{spell(b)}"
    ptx = f"wgmma.mma_async.sync.aligned.m64n{n}k{k}.{types}"
    acc_tv = acc_layout(n)
    acc_regs = acc_tv.size // WARPGROUP * acc.bits // 32
    trans = ", 0, 0" if a.bits == 16 else ""
    template = ("{{ .reg .pred p; setp.ne.b32 p, {scale_d}, 0; " + ptx
                + " {d}, {a}, {b}, p, 1, 1" + trans + "; }}")
    operands = (AsmOperand("d", "out", acc_regs, "f" if acc == f32 else "r", vector=True),
                AsmOperand("a", "in", 1, "l"), AsmOperand("b", "in", 1, "l"),
                AsmOperand("scale_d", "in", 1, "r"))
    return WgmmaInstr(
        name=f"wgmma.m64n{n}k{k}.{types}", kind="wgmma", ptx=ptx, template=template,
        operands=operands, min_cc=90, issue_cycles=0.0, latency_cycles=100.0,
        align_bytes=16, clobbers_memory=True, source=_SOURCE, m=64, n=n, k=k,
        a_dtype=a, b_dtype=b, acc_dtype=acc, acc_tv=acc_tv, a_tv=a_layout(a.bits),
        operand_class={32: "tf32", 16: "f16", 8: "8bit"}[a.bits], pipe="tensor")


_TYPES = ((f16, f16, f32), (f16, f16, f16), (bf16, bf16, f32),
          (f8e4m3, f8e4m3, f32), (f8e4m3, f8e5m2, f32), (f8e5m2, f8e4m3, f32),
          (f8e5m2, f8e5m2, f32), (f32, f32, f32))  # the last: f32 data as tf32

WGMMA_INSTRUCTIONS: tuple[WgmmaInstr, ...] = tuple(
    _wgmma(n, a, b, acc) for a, b, acc in _TYPES for n in WGMMA_N)

_BY_NAME: Mapping[str, WgmmaInstr] = MappingProxyType({i.name: i for i in WGMMA_INSTRUCTIONS})


def get_wgmma(name: str) -> WgmmaInstr:
    """The wgmma entry called `name`, e.g. "wgmma.m64n128k16.f32.f16.f16"."""
    found = _BY_NAME.get(name)
    if found is None:
        raise TegulaError(f"no wgmma instruction {name!r} in the catalogue (shapes m64n8..256 "
                          "step 8; k16 f16/bf16, k32 e4m3/e5m2, k8 tf32)")
    return found


def wgmma_for(a_dtype: DType, b_dtype: DType, acc_dtype: DType, n: int) -> WgmmaInstr:
    """The entry computing acc += a·bᵀ with these types and N = `n`."""
    for i in WGMMA_INSTRUCTIONS:
        if (i.a_dtype, i.b_dtype, i.acc_dtype, i.n) == (a_dtype, b_dtype, acc_dtype, n):
            return i
    raise TegulaError(f"no wgmma multiplies {a_dtype} x {b_dtype} into {acc_dtype} with N={n} "
                      f"(N is a multiple of 8 up to 256; types: f16/bf16 -> f32, f16 -> f16, "
                      "e4m3/e5m2 -> f32, f32 (as tf32) -> f32)")


__all__ = [
    "WARPGROUP", "WGMMA_N", "WgmmaInstr", "WGMMA_INSTRUCTIONS", "get_wgmma", "wgmma_for",
    "acc_layout", "a_layout", "truncate_to_tf32", "MatrixDescriptor", "encode_descriptor", "decode_descriptor",
    "descriptor_element_addresses", "canonical_smem_layout", "operand_descriptor",
    "swizzle_bytes_address",
]
