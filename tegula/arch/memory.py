"""Memory and data-movement entries: vector ld/st, cp.async, ldmatrix/stmatrix, shuffles.

Vector accesses move 1, 2, 4, 8 or 16 bytes per thread and must be aligned to their size
(the hardware faults on a misaligned vector access). PTX forms used:

    bytes  load                      store                      registers
    1      ld.{sp}.u8    (r)         st.{sp}.u8    (r)          1 x 32-bit, low byte
    2      ld.{sp}.b16   (h)         st.{sp}.b16   (h)          1 x 16-bit
    4      ld.{sp}.b32               st.{sp}.b32                1
    8      ld.{sp}.v2.b32            st.{sp}.v2.b32             2
    16     ld.{sp}.v4.b32            st.{sp}.v4.b32             4

`cp.async.ca.shared.global` copies 4, 8 or 16 bytes (through L1), `cp.async.cg` only 16
(bypassing L1); both take a src-size operand, and bytes past src-size are zero-filled,
which is how predicated-off copies are written (src-size 0). Addresses (both sides)
must be aligned to the copy size.

ldmatrix (cc >= 75) / stmatrix (cc >= 90) `.m8n8.x{1,2,4}[.trans].shared.b16`: lane
8j + r addresses row r (16 contiguous, 16-byte-aligned bytes) of matrix j. Without
.trans, lane t holds elements (row t/4, cols 2(t%4), 2(t%4)+1) of each matrix; with
.trans, (rows 2(t%4), 2(t%4)+1, col t/4) — i.e. the matrix is transposed on the way.

Timing numbers (approximate, cycles): shared-memory loads ~23-30 latency and ldmatrix ~30
(Abdelkhalik et al. HPEC 2022, A100; Luo et al. 2024, H800); global loads: ~ 470 (DRAM
miss) on A100, ~ 200-260 L2 hit; issue is one cycle per *ideal wavefront* of the shared
pipe (128 B/clk/SM) — bank conflicts add wavefronts, the emulator counts them.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Mapping

import numpy as np

from tegula.arch.convert import round_f32
from tegula.arch.instructions import AsmOperand, MatrixInstr, MemInstr, ShuffleInstr
from tegula.dtypes import DType, bf16, f16, f32, i32
from tegula.layout import Layout

_MEM_SOURCE = ("PTX ISA ld/st/cp.async; latency: Abdelkhalik et al. HPEC 2022, "
               "Luo et al. 2024 (approximate)")

# bytes -> (type suffix, registers, constraint)
_VEC_FORMS = {1: ("u8", 1, "r"), 2: ("b16", 1, "h"), 4: ("b32", 1, "r"),
              8: ("v2.b32", 2, "r"), 16: ("v4.b32", 4, "r")}
VECTOR_BYTES = tuple(_VEC_FORMS)


def vector_refusal(elem_bits: int, count: int, sizes: tuple[int, ...] = VECTOR_BYTES) -> str | None:
    """Why `count` elements of `elem_bits` bits per thread are not one access of an entry
    moving one of `sizes` bytes (the ld/st widths by default; cp.async's for a cp.async),
    or None where they are. The emitter and the emulator both ask this."""
    bits = elem_bits * count
    if bits % 8 == 0 and bits // 8 in sizes:
        return None
    return (f"{count} x {elem_bits}-bit elements are {bits / 8:g} bytes, not one access of "
            f"{', '.join(map(str, sizes))} bytes")


def _access(op: str, space: str, nbytes: int) -> MemInstr:
    """One ld/st entry: `op` is "ld" or "st", `space` "global" or "shared"."""
    suffix, regs, con = _VEC_FORMS[nbytes]
    ptx = f"{op}.{space}.{suffix}"
    addr_con = "l" if space == "global" else "r"
    if op == "ld":
        operands = (AsmOperand("d", "out", regs, con), AsmOperand("addr", "in", 1, addr_con))
        template = ptx + " {d}, [{addr}];"
    else:
        operands = (AsmOperand("addr", "in", 1, addr_con), AsmOperand("s", "in", regs, con))
        template = ptx + " [{addr}], {s};"
    latency = 470.0 if space == "global" else 25.0
    return MemInstr(
        name=ptx, kind=f"{op}.{space}", ptx=ptx, template=template, operands=operands,
        min_cc=50, issue_cycles=1.0, latency_cycles=latency, align_bytes=nbytes,
        clobbers_memory=True, source=_MEM_SOURCE, pipe=space, space=space, nbytes=nbytes)


def _cp_async(cache: str, nbytes: int) -> MemInstr:
    ptx = f"cp.async.{cache}.shared.global"
    operands = (AsmOperand("dst", "in", 1, "r"), AsmOperand("src", "in", 1, "l"),
                AsmOperand("src_size", "in", 1, "r"))
    return MemInstr(
        name=f"{ptx}.{nbytes}", kind="cp.async", ptx=ptx,
        template=ptx + " [{dst}], [{src}], " + str(nbytes) + ", {src_size};",
        operands=operands, min_cc=80, issue_cycles=1.0, latency_cycles=470.0,
        align_bytes=nbytes, clobbers_memory=True, source=_MEM_SOURCE, pipe="global",
        space="global->shared", nbytes=nbytes, cache=cache)


def cp_async_asm(instr: MemInstr, dst: str, src: str, pred: str | None = None) -> str:
    """The asm statement of a cp.async entry; where `pred` is false the shared bytes are
    zero-filled (src-size 0) and the global address is not read."""
    size = str(instr.nbytes) if pred is None else f"(({pred}) ? {instr.nbytes} : 0)"
    return instr.format_asm(dst=dst, src=src, src_size=size)


CP_ASYNC_COMMIT = MemInstr(
    name="cp.async.commit_group", kind="cp.async.commit", ptx="cp.async.commit_group",
    template="cp.async.commit_group;", operands=(), min_cc=80, clobbers_memory=True,
    source=_MEM_SOURCE, pipe="sync", space="", nbytes=0)


def cp_async_wait(pending: int) -> MemInstr:
    """`cp.async.wait_group N` (N = groups allowed to stay in flight)."""
    return MemInstr(
        name=f"cp.async.wait_group.{pending}", kind="cp.async.wait",
        ptx="cp.async.wait_group", template=f"cp.async.wait_group {pending};", operands=(),
        min_cc=80, clobbers_memory=True, source=_MEM_SOURCE, pipe="sync", space="",
        nbytes=0)


# ---------------------------------------------------------------- atomic adds (red)

# tegula dtype name -> (PTX type with modifiers, constraint, min_cc, bytes). `red` is the
# fire-and-forget atomic (no result returned): f32/s32 on every target, f16 (.noftz) from
# sm_70, bf16 from sm_90 (PTX ISA "red"); the emitter's helper falls back to a
# compare-and-swap loop for bf16 below sm_90 (`codegen/ptx.py`, which computes the same).
_RED_FORMS = {"f32": ("f32", "f", 50, 4), "i32": ("s32", "r", 50, 4),
              "f16": ("noftz.f16", "h", 70, 2), "bf16": ("noftz.bf16", "h", 90, 2)}
_RED_TYPES = {"f32": f32, "i32": i32, "f16": f16, "bf16": bf16}


@dataclass(frozen=True)
class RedAddInstr(MemInstr):
    """`red.global.add.T`: memory[addr] += v, atomically; `dtype` the element type.
    `flushes_subnormals`: the f32 form flushes subnormal inputs and results to
    sign-preserving zero (PTX ISA "red"/"atom": `.add.f32` "flushes subnormal inputs and
    results"; measured on the H100, session 10 round 1); the 16-bit forms are `.noftz`."""

    dtype: DType = f32
    flushes_subnormals: bool = False

    def execute(self, old, v) -> np.ndarray:
        """The new memory values from the `old` ones and the added `v` (emulator storage
        values of `dtype`): s32 wraps around; floats add once, rounded to nearest even
        to `dtype` (the exact sum of two 16-bit floats rounds the same through f32), f32
        with subnormal operands and results flushed to zero of their sign."""
        if self.dtype == i32:
            return (np.asarray(old, np.int64) + np.asarray(v, np.int64)).astype(np.int32)
        old, v = np.asarray(old, np.float32), np.asarray(v, np.float32)
        if self.flushes_subnormals:
            old, v = _flush_subnormals(old), _flush_subnormals(v)
        with np.errstate(all="ignore"):
            total = old + v
        if self.flushes_subnormals:
            total = _flush_subnormals(total)
        return round_f32(total, self.dtype)


def _flush_subnormals(x: np.ndarray) -> np.ndarray:
    """f32 values with every subnormal replaced by a zero of its sign."""
    tiny = np.abs(x) < np.finfo(np.float32).tiny
    return np.where(tiny & (x != 0), np.copysign(np.float32(0), x), x).astype(np.float32)


def _red_add(ptx_type: str, constraint: str, min_cc: int, nbytes: int,
             dtype: DType) -> RedAddInstr:
    # Without .noftz a float red flushes subnormals (only f32 has no .noftz form here).
    ptx = f"red.global.add.{ptx_type}"
    return RedAddInstr(
        name=ptx, kind="red.global", ptx=ptx, template=ptx + " [{addr}], {v};",
        operands=(AsmOperand("addr", "in", 1, "l"), AsmOperand("v", "in", 1, constraint)),
        min_cc=min_cc, issue_cycles=1.0, latency_cycles=470.0, align_bytes=nbytes,
        clobbers_memory=True, source="PTX ISA red; latency as a global access (approximate)",
        pipe="global", space="global", nbytes=nbytes, dtype=dtype,
        flushes_subnormals=dtype.is_float and "noftz" not in ptx_type)


#: The global atomic-add entry for each element type that has one (tegula dtype name).
RED_ADD: Mapping[str, RedAddInstr] = MappingProxyType(
    {name: _red_add(*form, _RED_TYPES[name]) for name, form in _RED_FORMS.items()})


# ---------------------------------------------------------------- ldmatrix / stmatrix

def matrix_tv(num: int, trans: bool) -> Layout:
    """(32 lanes, 2*num values) -> row + 8*col + 64*matrix for ldmatrix/stmatrix."""
    if trans:
        # row = 2*(t%4) + v, col = t//4
        return Layout(((4, 8), (2, num)), ((2, 8), (1, 64)))
    # row = t//4, col = 2*(t%4) + v
    return Layout(((4, 8), (2, num)), ((16, 1), (8, 64)))


def _matrix(op: str, num: int, trans: bool) -> MatrixInstr:
    t = ".trans" if trans else ""
    ptx = f"{op}.sync.aligned.m8n8.x{num}{t}.shared.b16"
    if op == "ldmatrix":
        operands = (AsmOperand("d", "out", num, "r", vector=True),  # .x1 too: {%0}
                    AsmOperand("addr", "in", 1, "r"))
        template = ptx + " {d}, [{addr}];"
        min_cc, latency = 75, 30.0
    else:
        operands = (AsmOperand("addr", "in", 1, "r"),
                    AsmOperand("s", "in", num, "r", vector=True))
        template = ptx + " [{addr}], {s};"
        min_cc, latency = 90, 25.0
    return MatrixInstr(
        name=f"{op}.x{num}{t}", kind=op, ptx=ptx, template=template, operands=operands,
        min_cc=min_cc, issue_cycles=float(num), latency_cycles=latency, align_bytes=16,
        clobbers_memory=True, source=_MEM_SOURCE, pipe="shared", num=num, trans=trans,
        tv=matrix_tv(num, trans))


# ---------------------------------------------------------------- shuffles

_SHFL_MODES = (("bfly", "xor", 0x1F), ("idx", "idx", 0x1F), ("down", "down", 0x1F),
               ("up", "up", 0x0))


def _shuffle(mode: str, ir_mode: str, clamp: int) -> ShuffleInstr:
    ptx = f"shfl.sync.{mode}.b32"
    operands = (AsmOperand("d", "out", 1, "r"), AsmOperand("a", "in", 1, "r"),
                AsmOperand("b", "in", 1, "r"))
    return ShuffleInstr(
        name=ptx, kind="shfl", ptx=ptx,
        template=ptx + " {d}, {a}, {b}, " + hex(clamp) + ", 0xffffffff;",
        operands=operands, min_cc=70, issue_cycles=1.0, latency_cycles=23.0,
        source="PTX ISA shfl.sync; latency ~23 cycles (Abdelkhalik et al. 2022)", pipe="alu",
        mode=mode, ir_mode=ir_mode, clamp=clamp)


MEMORY_INSTRUCTIONS: tuple[MemInstr, ...] = tuple(
    _access(op, space, n) for space in ("global", "shared") for op in ("ld", "st")
    for n in VECTOR_BYTES
) + tuple(_cp_async("ca", n) for n in (4, 8, 16)) + (_cp_async("cg", 16), CP_ASYNC_COMMIT) \
    + tuple(RED_ADD.values())

MATRIX_INSTRUCTIONS: tuple[MatrixInstr, ...] = tuple(
    _matrix(op, num, trans) for op in ("ldmatrix", "stmatrix") for num in (1, 2, 4)
    for trans in (False, True))

SHUFFLE_INSTRUCTIONS: tuple[ShuffleInstr, ...] = tuple(_shuffle(*m) for m in _SHFL_MODES)
