"""Special-function entries: approximations the SM's multi-function unit (MUFU) computes.

    entry            d    a    from   what it does
    lg2.approx.f32   f    f    all    log2(a), approximate: |error| <= 2^-22 for a in
                                      [0.5, 2], else <= 2 ulp from the correctly rounded
                                      result; subnormal inputs kept (not flushed)

(PTX ISA "lg2"; the error bound is the CUDA programming guide's for `__log2f`, which is this
instruction.) `tg.log2` prints it (the emitter's `tg_log2` helper, `codegen/ptx.py`) where
CUDA's `log2f` is the accurate library function: about 20 instructions around its own
MUFU.LG2 (93 of the 694 SASS instructions of a selective-scan chunk in session 11). It is
the same policy as `tg.exp2`, which is one `ex2.approx.ftz`: the base-2 functions are the
fast ones, `tg.exp` / `tg.log` the accurate ones.

Why not `.ftz`: with it a subnormal input reads as zero and gives -inf, an unbounded error
where torch.log2 is finite (-126 to -149). Without it ptxas scales a subnormal input by 2^24
first and subtracts 24 after (FMUL, FSETP, FSEL and a predicated FADD beside the MUFU.LG2,
read from the SASS of sm_90a): four ALU instructions, still a fifth of `log2f`'s.

One entry holds what the compiler needs: the PTX (`format_asm`), what it computes
(`execute`, which the emulator calls: numpy's log2 in f32, correctly rounded, so within
the bound of the hardware's result; the hardware's own bits are not modelled), the bound
itself (`error_bound`, which the fuzzer's GPU model and the GPU test read) and the cost
(the special-function unit's 16 results a clock per SM: `pipe="sfu"`, `timing`). Held
against hardware by tests/gpu/test_lg2_entry_gpu.py (random inputs over the whole f32
range, zeros, subnormals, infinities, NaN, negatives).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tegula.arch.instructions import AsmOperand, Instruction

_SOURCE = ("PTX ISA lg2.approx.f32; error: CUDA programming guide, intrinsic functions "
           "(__log2f); rate: its arithmetic throughput table (16 results a clock per SM on "
           "cc 8.x and 9.0); latency: MUFU, about 20 cycles (approximate)")


@dataclass(frozen=True)
class SpecialFunctionInstr(Instruction):
    """One MUFU approximation of a unary f32 function `op`, with its documented error:
    at most `abs_error` for inputs in `abs_range`, else `ulp_error` ulps of the result.
    `extra_alu`: the ALU instructions ptxas adds around the MUFU one (the subnormal
    scaling), which the cost model charges beside it."""

    op: str = "log2"
    abs_error: float = 0.0
    abs_range: tuple[float, float] = (0.0, 0.0)
    ulp_error: float = 0.0
    extra_alu: int = 0

    def execute(self, x) -> np.ndarray:
        """What the instruction computes on f32 values, as the emulator models it: numpy's
        log2 in f32 (correctly rounded; the hardware's result lies within `error_bound`
        of it). Special inputs as the hardware: ±0 -> -inf, +inf -> +inf, a negative or
        NaN -> NaN, subnormals finite."""
        with np.errstate(all="ignore"):
            return np.log2(np.asarray(x, dtype=np.float32))

    def error_bound(self, x) -> np.ndarray:
        """The largest |hardware − exact| the documentation allows at each input `x`
        (float64; 0 where the result is exact: zeros, infinities, NaN, negatives). Its ulp
        bound counts from the correctly rounded result, so from the exact value it is half
        an ulp more (measured on an H100: 2.06 ulp at x = 0.26437166, session 12)."""
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(all="ignore"):
            exact = np.log2(x)
            finite = np.isfinite(exact)
            ulp = np.spacing(np.abs(exact).astype(np.float32)).astype(np.float64)
            near_one = (x >= self.abs_range[0]) & (x <= self.abs_range[1])
            bound = np.where(near_one, self.abs_error, (self.ulp_error + 0.5) * ulp)
        return np.where(finite, bound, 0.0)


#: `tg.log2`: log2 of f32 on the special-function unit.
LG2_APPROX = SpecialFunctionInstr(
    name="lg2.approx.f32", kind="sfu", ptx="lg2.approx.f32", template="lg2.approx.f32 {d}, {a};",
    operands=(AsmOperand("d", "out", 1, "f"), AsmOperand("a", "in", 1, "f")),
    min_cc=20, issue_cycles=8.0, latency_cycles=20.0, source=_SOURCE, pipe="sfu", pure=True,
    op="log2", abs_error=2.0 ** -22, abs_range=(0.5, 2.0), ulp_error=2.0, extra_alu=4)

SPECIAL_INSTRUCTIONS: tuple[SpecialFunctionInstr, ...] = (LG2_APPROX,)
_BY_OP = {i.op: i for i in SPECIAL_INSTRUCTIONS}


def special_function(op: str) -> SpecialFunctionInstr | None:
    """The MUFU entry computing the unary op `op` ("log2"), or None where the emitter
    prints a library function or a helper instead."""
    return _BY_OP.get(op)
