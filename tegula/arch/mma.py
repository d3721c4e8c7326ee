"""`mma.sync.aligned` entries of the catalogue (Ampere/Ada/Hopper warp-level MMA).

The TV layouts transcribe the PTX ISA fragment tables ("Matrix fragments for mma.m16n8k16",
"… m16n8k8", "… m16n8k32"), with groupID = lane >> 2 and tig = lane % 4 (threadID in group):

m16n8k16, 16-bit A (8 values a0..a7 in 4 .b32):
    row = groupID (+8 for a2,a3,a6,a7), col = 2*tig + (i & 1) (+8 for a4..a7)
    -> ((4,8),(2,2,2)):((32,1),(16,8,128)) over A (16,16), index m + 16k
m16n8k16, 16-bit B (4 values b0..b3 in 2 .b32):
    k = 2*tig + (i & 1) (+8 for b2,b3), n = groupID -> ((4,8),(2,2)):((16,1),(8,64))
m16n8k8, 16-bit A (4 values): row = groupID (+8 for a2,a3), col = 2*tig + (i & 1)
    -> ((4,8),(2,2)):((32,1),(16,8));  B (2 values): k = 2*tig + i, n = groupID
    -> ((4,8),2):((16,1),8)
m16n8k32, 8-bit A (16 values in 4 .b32):
    row = groupID (+8 for a4..a7, a12..a15), col = 4*tig + (i & 3) (+16 for a8..a15)
    -> ((4,8),(4,2,2)):((64,1),(16,8,256));  B (8 values): k = 4*tig + (i & 3)
    (+16 for b4..b7), n = groupID -> ((4,8),(4,2)):((32,1),(8,128))
C/D for all (4 values c0..c3): row = groupID (+8 for c2,c3), col = 2*tig + (i & 1)
    -> ((4,8),(2,2)):((32,1),(16,8)) over C (16,8), index m + 16n.

These equal CuTe's `SM80_16x8x16_*`, `SM80_16x8x8_*`, `SM80_16x8x32_*` and
`SM89_16x8x32_*` traits (an independent check; tests re-derive them from the formulas).

Latency numbers (cycles, dependent-issue latency of one warp): ~33 for the k16 f16/bf16
and the k32 8-bit shapes, ~18 for k8, from the microbenchmarks of Abdelkhalik et al.,
"Demystifying the Nvidia Ampere Architecture through Microbenchmarking and
Instruction-level Analysis" (HPEC 2022) and Luo et al. (Hopper, 2024), who report the
same order for mma.sync on H800. They are approximate: the cost model uses them to
rank candidates, not to predict time to the cycle. Issue cycles come from the target's
tensor rate (`MmaInstr.timing`).
"""
from __future__ import annotations

from tegula.arch.instructions import AsmOperand, MmaInstr, ptx_type
from tegula.dtypes import DType, bf16, f8e4m3, f8e5m2, f16, f32, i8, i32, u8
from tegula.layout import Layout

# ---------------------------------------------------------------- fragment layouts

C_16x8 = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))
A_16x16_B16 = Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))
B_8x16_B16 = Layout(((4, 8), (2, 2)), ((16, 1), (8, 64)))
A_16x8_B16 = Layout(((4, 8), (2, 2)), ((32, 1), (16, 8)))
B_8x8_B16 = Layout(((4, 8), 2), ((16, 1), 8))
A_16x32_B8 = Layout(((4, 8), (4, 2, 2)), ((64, 1), (16, 8, 256)))
B_8x32_B8 = Layout(((4, 8), (4, 2)), ((32, 1), (8, 128)))

_LAYOUTS = {  # (k, operand bits) -> (a_tv, b_tv)
    (16, 16): (A_16x16_B16, B_8x16_B16),
    (8, 16): (A_16x8_B16, B_8x8_B16),
    (32, 8): (A_16x32_B8, B_8x32_B8),
}
_LATENCY = {(16, 16): 33.0, (8, 16): 18.0, (32, 8): 33.0}
_SOURCE = ("PTX ISA 'Warp-level matrix fragments'; latency: Abdelkhalik et al. HPEC 2022 "
           "(A100), Luo et al. 2024 (H800); issue: target tensor rate")


def _mma(k: int, a: DType, b: DType, c: DType, min_cc: int) -> MmaInstr:
    """Build the m16n8k{k} entry with operand types a, b and accumulator c (= d)."""
    bits = a.bits
    a_tv, b_tv = _LAYOUTS[(k, bits)]
    types = f"{ptx_type(c)}.{ptx_type(a)}.{ptx_type(b)}.{ptx_type(c)}"
    ptx = f"mma.sync.aligned.m16n8k{k}.row.col.{types}"
    acc_regs = 4 if c.bits == 32 else 2
    acc_con = "f" if c == f32 else "r"
    a_regs = a_tv.size // 32 * bits // 32
    b_regs = b_tv.size // 32 * bits // 32
    operands = (  # all vector operands: m16n8k8's one-register B is still `{%i}`
        AsmOperand("d", "out", acc_regs, acc_con, vector=True),
        AsmOperand("a", "in", a_regs, "r", vector=True),
        AsmOperand("b", "in", b_regs, "r", vector=True),
        AsmOperand("c", "in", acc_regs, acc_con, vector=True),
    )
    return MmaInstr(
        name=f"mma.m16n8k{k}.{types}", kind="mma", ptx=ptx,
        template=ptx + " {d}, {a}, {b}, {c};", operands=operands, min_cc=min_cc,
        issue_cycles=0.0, latency_cycles=_LATENCY[(k, bits)], source=_SOURCE,
        shape_mnk=(16, 8, k), a_dtype=a, b_dtype=b, c_dtype=c,
        a_tv=a_tv, b_tv=b_tv, c_tv=C_16x8, operand_class="f16" if bits == 16 else "8bit",
        pipe="tensor",
    )


MMA_INSTRUCTIONS: tuple[MmaInstr, ...] = (
    _mma(16, f16, f16, f32, 80),
    _mma(16, f16, f16, f16, 80),
    _mma(16, bf16, bf16, f32, 80),
    _mma(8, f16, f16, f32, 75),
    _mma(8, f16, f16, f16, 75),
    _mma(8, bf16, bf16, f32, 80),
    _mma(32, i8, i8, i32, 80),
    _mma(32, u8, u8, i32, 80),
    _mma(32, i8, u8, i32, 80),
    _mma(32, u8, i8, i32, 80),
    _mma(32, f8e4m3, f8e4m3, f32, 89),
    _mma(32, f8e4m3, f8e5m2, f32, 89),
    _mma(32, f8e5m2, f8e4m3, f32, 89),
    _mma(32, f8e5m2, f8e5m2, f32, 89),
)
