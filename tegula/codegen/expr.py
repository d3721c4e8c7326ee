"""C spelling of thread-IR index expressions, element values and element types.

Element types are spelled without any CUDA header (`cuda_fp16.h`, `cuda_bf16.h` and
`cuda_fp8.h` are not built into NVRTC 13 — the `nvidia-cuda-nvrtc` wheel ships none of
them — so relying on them would tie every compile to a toolkit install). Instead:

* every register and memory element has a *storage* type — the raw bits: `float`, `int`,
  `unsigned short` for f16/bf16, `unsigned char` for the f8s and for packed 4-bit values
  (one nibble per register, in the low bits), `signed char` for i8, `bool`;
* element arithmetic happens in a *compute* type — `float` for every float type, `int` for
  every integer type, `bool` — and results are rounded back to the element type with PTX
  `cvt.rn` (round to nearest even), exactly like the emulator's "compute in f32 and round
  on every write" rule. For + - * / of f16/bf16 operands one f32 operation followed by one
  rounding gives the correctly rounded result, so nothing is lost by this.

Math functions use CUDA's accurate single-precision library (`expf`, `logf`, `tanhf`,
`sqrtf` with IEEE rounding, …: a few ulp at most), not the `__expf` intrinsics whose error
grows with |x|. Lowering that wants the fast path can express it (e.g. `exp2` of a
pre-scaled value: `tg_exp2` is one `ex2.approx.ftz`, results below 2^-126 flushed to 0;
`tg_log2` is the catalogue's `lg2.approx.f32`, |error| <= 2^-22 near 1, `arch.special`):
the base-2 functions are the fast ones.

Index width: extents are `int` kernel parameters and strides `long long`, so any index
that multiplies a coordinate by a stride is computed in 64 bits by C's usual conversions
(tensors over 2^31 elements address correctly), while coordinates, bounds checks and
shared-memory offsets stay in fast 32-bit arithmetic.
"""
from __future__ import annotations

import math
import struct
from typing import Callable

import numpy as np

from tegula.dtypes import DType
from tegula.errors import TegulaError
from tegula.lower.async_ir import Elect
from tegula.lower.thread_ir import (
    BinOp, Binary, Bits, Cast, Const, Expr, IndexValue, Literal, LoadScalar, Reg, RegRead, Select,
    Unary, Value, Var, Where,
)


class CodegenError(TegulaError):
    """The thread IR asks for something the CUDA emitter cannot print (a lowering bug)."""


# --------------------------------------------------------------------------------------
# Element types
# --------------------------------------------------------------------------------------

def storage_type(dtype: DType) -> str:
    """The C type holding one element's bits in registers and memory."""
    if dtype.name == "f32":
        return "float"
    if dtype.name == "i32":
        return "int"
    if dtype.name == "bool":
        return "bool"
    if dtype.name == "i8":
        return "signed char"
    if dtype.bits == 16:
        return "unsigned short"
    if dtype.bits in (8, 4):
        return "unsigned char"
    raise CodegenError(f"no C storage type for element type {dtype}")


def compute_type(dtype: DType) -> str:
    """The C type element arithmetic is done in."""
    if dtype.name == "bool":
        return "bool"
    return "float" if dtype.is_float else "int"


#: Helper functions (defined in `ptx.PRELUDE_HELPERS`) converting storage bits to compute
#: values and back, per float type narrower than 32 bits.
_TO_FLOAT = {"f16": "tg_f16_to_f32", "bf16": "tg_bf16_to_f32",
             "f8e4m3": "tg_e4m3_to_f32", "f8e5m2": "tg_e5m2_to_f32"}
_FROM_FLOAT = {"f16": "tg_f32_to_f16", "bf16": "tg_f32_to_bf16",
               "f8e4m3": "tg_f32_to_e4m3", "f8e5m2": "tg_f32_to_e5m2"}


#: Paired forms of `_FROM_FLOAT` for the 16-bit floats: two compute values -> one 32-bit
#: word (the first in the low half).
_PAIR_FROM_FLOAT = {"f16": "tg_f32x2_to_f16x2", "bf16": "tg_f32x2_to_bf16x2"}


def to_compute(c: str, dtype: DType, used: set[str]) -> str:
    """C expression of the compute value of storage expression `c` (records helpers used)."""
    if dtype.name in _TO_FLOAT:
        used.add(_TO_FLOAT[dtype.name])
        return f"{_TO_FLOAT[dtype.name]}({c})"
    if dtype.name == "i4":
        return f"((((int)({c}) & 15) ^ 8) - 8)"
    if dtype.name == "u4":
        return f"((int)({c}) & 15)"
    if dtype.name in ("i8", "u8"):
        return f"(int)({c})"
    return c


def from_compute(c: str, dtype: DType, used: set[str]) -> str:
    """C expression of the storage bits of compute expression `c` (rounding to nearest even)."""
    if dtype.name in _FROM_FLOAT:
        used.add(_FROM_FLOAT[dtype.name])
        return f"{_FROM_FLOAT[dtype.name]}({c})"
    if dtype.name in ("i4", "u4"):
        return f"(unsigned char)((int)({c}) & 15)"
    if dtype.name == "f32":
        return c
    return f"({storage_type(dtype)})({c})"


def round_compute(c: str, dtype: DType, used: set[str]) -> str:
    """`c` (a compute value) rounded to what `dtype` can hold, still as a compute value."""
    if dtype.name in ("f32", "i32", "bool"):
        return c
    return to_compute(from_compute(c, dtype, used), dtype, used)


# --------------------------------------------------------------------------------------
# Bit patterns of constants (fills and literals), computed on the host
# --------------------------------------------------------------------------------------

def _fp8_decode(code: int, exp_bits: int, man_bits: int, fn: bool) -> float:
    """Value of an 8-bit float code (fn: the e4m3 'finite' flavour without infinities)."""
    bias = (1 << (exp_bits - 1)) - 1
    sign = -1.0 if code & 0x80 else 1.0
    e = (code >> man_bits) & ((1 << exp_bits) - 1)
    m = code & ((1 << man_bits) - 1)
    top = (1 << exp_bits) - 1
    if fn and e == top and m == (1 << man_bits) - 1:
        return math.nan
    if not fn and e == top:
        return sign * math.inf if m == 0 else math.nan
    if e == 0:
        return sign * math.ldexp(m, 1 - bias - man_bits)
    return sign * math.ldexp(m + (1 << man_bits), e - bias - man_bits)


def _fp8_encode(value: float, exp_bits: int, man_bits: int, fn: bool) -> int:
    """Round to nearest even, saturating to the largest finite value (`cvt.rn.satfinite`)."""
    if math.isnan(value):
        return 0x7F
    max_code = 0x7E if fn else 0x7B
    sign = 0x80 if math.copysign(1.0, value) < 0 else 0
    a = abs(value)
    if a >= _fp8_decode(max_code, exp_bits, man_bits, fn):
        return sign | max_code
    best, best_err = 0, math.inf
    for code in range(max_code + 1):
        err = abs(_fp8_decode(code, exp_bits, man_bits, fn) - a)
        if err < best_err or (err == best_err and code % 2 == 0):
            best, best_err = code, err
    return sign | best


def element_bits(value: float, dtype: DType) -> int:
    """The storage bit pattern of `value` rounded (to nearest even) to `dtype`."""
    if dtype.name == "f32":
        return struct.unpack("<I", struct.pack("<f", float(value)))[0]
    if dtype.name == "f16":
        with np.errstate(over="ignore"):  # out of range rounds to inf, as cvt.rn does
            return int(np.array(value, dtype=np.float16).view(np.uint16))
    if dtype.name == "bf16":
        bits = struct.unpack("<I", struct.pack("<f", float(value)))[0]
        if math.isnan(value):
            return 0x7FC0
        bits += 0x7FFF + ((bits >> 16) & 1)
        return (bits >> 16) & 0xFFFF
    if dtype.name == "f8e4m3":
        return _fp8_encode(value, 4, 3, fn=True)
    if dtype.name == "f8e5m2":
        return _fp8_encode(value, 5, 2, fn=False)
    if dtype.name == "bool":
        return 1 if value else 0
    return int(value) & ((1 << dtype.bits) - 1)


def element_value(value: float, dtype: DType) -> float:
    """`value` rounded to `dtype` (as the kernel would hold it)."""
    bits = element_bits(value, dtype)
    if dtype.name == "f32":
        return struct.unpack("<f", struct.pack("<I", bits))[0]
    if dtype.name == "f16":
        return float(np.array(bits, dtype=np.uint16).view(np.float16))
    if dtype.name == "bf16":
        return struct.unpack("<f", struct.pack("<I", bits << 16))[0]
    if dtype.name == "f8e4m3":
        return _fp8_decode(bits, 4, 3, fn=True)
    if dtype.name == "f8e5m2":
        return _fp8_decode(bits, 5, 2, fn=False)
    if dtype.is_signed and bits >= 1 << (dtype.bits - 1):
        return bits - (1 << dtype.bits)
    return bits


def float_literal(value: float) -> str:
    """An exact C `float` literal (hex-bits form for non-finite values)."""
    if math.isnan(value):
        return "__int_as_float(0x7fffffff)"
    if math.isinf(value):
        return "__int_as_float(0x7f800000)" if value > 0 else "__int_as_float(0xff800000)"
    as_f32 = struct.unpack("<f", struct.pack("<f", value))[0]
    text = repr(as_f32)
    if "e" not in text and "." not in text and "inf" not in text:
        text += ".0"
    # Parenthesized when negative, so that no operator printed before it can absorb the
    # sign (`-` applied to "-2.5f" would print the decrement "--2.5f").
    return f"({text}f)" if text.startswith("-") else f"{text}f"


def int_literal(value: int) -> str:
    """An exact C `int` literal of `value` (every integer element type computes in `int`).

    A C integer literal is unsigned-looking text whose type is the first of int, long, long
    long that holds it: `-2147483648` is unary minus applied to the *long* 2147483648, so
    `max(x, -2147483648)` with an int `x` matches several overloads (NVRTC rejects it) and
    in arithmetic it would widen the expression to 64 bits. INT_MIN is therefore spelled
    `(-2147483647 - 1)`, an int, and negative literals are parenthesized (no "--7").
    i4, i8, u4, u8 and i32 values all fit an int, so this prints each of them exactly.
    """
    value = int(value)
    if not -2**31 <= value < 2**31:
        raise CodegenError(f"integer literal {value} does not fit the int that integer "
                           "elements compute in")
    if value == -2**31:
        return "(-2147483647 - 1)"
    return f"({value})" if value < 0 else str(value)


# --------------------------------------------------------------------------------------
# Index expressions
# --------------------------------------------------------------------------------------

#: C precedence levels (smaller binds tighter) of the index operators.
_PREC = {"*": 5, "//": 5, "%": 5, "+": 6, "-": 6, "<<": 7, ">>": 7, "<": 9, "<=": 9, ">": 9,
         ">=": 9, "==": 10, "!=": 10, "&": 11, "^": 12, "|": 13, "and": 14, "or": 15}
_C_OP = {"//": "/", "and": "&&", "or": "||"}
#: Index operators printed as calls of `codegen/ptx.py` helpers (the emitter defines the
#: helpers an index text names: `index_helpers`).
_FLOOR_HELPERS = {"floordiv": "tg_floordiv", "mod": "tg_mod"}


def index_helpers(text: str) -> set[str]:
    """The helpers of `_FLOOR_HELPERS` (and `tg_elect_one`) that generated C text calls."""
    return {h for h in (*_FLOOR_HELPERS.values(), "tg_elect_one") if f"{h}(" in text}


def index_c(e: Expr, rename: Callable[[str], str] | None = None) -> str:
    """C source of an index expression, parenthesized by C precedence (not fully)."""
    return _index(e, rename or (lambda n: n))[0]


def _index(e: Expr, rename: Callable[[str], str]) -> tuple[str, int]:
    """(C text, precedence level of its outermost operator)."""
    if isinstance(e, Const):
        v = e.value
        text = f"{v}LL" if abs(v) >= 2**31 else str(v)
        return (f"({text})", 0) if v < 0 else (text, 0)
    if isinstance(e, Var):
        return rename(e.name), 0
    if isinstance(e, Elect):  # the catalogue's elect.sync (`codegen/ptx.py`)
        return "tg_elect_one()", 0
    if isinstance(e, BinOp):
        if e.op in ("min", "max"):
            return (f"{e.op}({_index(e.lhs, rename)[0]}, {_index(e.rhs, rename)[0]})", 0)
        if e.op in _FLOOR_HELPERS:  # the user's scalar `//` / `%`: floor semantics
            return (f"{_FLOOR_HELPERS[e.op]}({_index(e.lhs, rename)[0]}, "
                    f"{_index(e.rhs, rename)[0]})", 0)
        prec = _PREC[e.op]
        lhs, lp = _index(e.lhs, rename)
        rhs, rp = _index(e.rhs, rename)
        # Left-associative: a left operand of equal level needs no parentheses, a right one does.
        if lp > prec:
            lhs = f"({lhs})"
        if rp >= prec and rp != 0:
            rhs = f"({rhs})"
        return f"{lhs} {_C_OP.get(e.op, e.op)} {rhs}", prec
    if isinstance(e, LoadScalar):
        # Each coordinate times the tensor's stride parameter; read as an int (i8/u8 too).
        terms = [f"({_index(c, rename)[0]}) * {rename(f'{e.tensor}_stride{d}')}"
                 for d, c in enumerate(e.coords)]
        return f"((int){e.tensor}[{' + '.join(terms) or '0'}])", 0
    if isinstance(e, Select):
        c = _index(e.cond, rename)[0]
        t = _index(e.if_true, rename)[0]
        f = _index(e.if_false, rename)[0]
        return f"({c} ? {t} : {f})", 0
    raise CodegenError(f"not an index expression: {e!r}")


# --------------------------------------------------------------------------------------
# Element values
# --------------------------------------------------------------------------------------

_FLOAT_UNARY = {"exp": "expf({})", "exp2": "tg_exp2({})", "log": "logf({})", "log2": "tg_log2({})",
                "sqrt": "sqrtf({})", "rsqrt": "rsqrtf({})", "sin": "sinf({})",
                "cos": "cosf({})", "tanh": "tanhf({})", "abs": "fabsf({})",
                "sigmoid": "(1.0f / (1.0f + expf(-({}))))", "erf": "erff({})",
                "neg": "(-{})"}
#: Float -> integer conversions saturate to the integer type (the emulator's rule).
_NARROW_INT_RANGE = {"i8": (-128, 127), "u8": (0, 255)}

# Narrow integers to float by the magic-number trick rather than `(float)`, which is an
# I2F at a quarter of the FP32 rate on sm_80/sm_90 (the bottleneck of dequantizing 4-bit
# weights at memory speed): an integer 0 <= v < 2^23 OR-ed into the bits of 2^23 is the
# float 2^23 + v exactly, so one LOP3 and one FADD give v; signed values are offset into
# the mantissa of 1.5·2^23 first (exact for |v| < 2^22). Exact for every value of the type.
_MAGIC_TO_FLOAT = {
    "u4": "(__int_as_float(0x4B000000 | ({})) - 8388608.0f)",
    "u8": "(__int_as_float(0x4B000000 | ({})) - 8388608.0f)",
    "i4": "(__int_as_float(0x4B400000 + ({})) - 12582912.0f)",
    "i8": "(__int_as_float(0x4B400000 + ({})) - 12582912.0f)",
}
# 16-bit float element ops in their own type rather than through f32: + - * of two
# f16 (bf16) values as one PTX add/sub/mul.rn (`tg_f16_add`, ...: ptxas pairs
# neighbouring ones into HADD2/HMUL2, where the f32 route costs two conversions and a
# rounding per element), and a narrow integer to f16/bf16 by the magic number of that
# type: the integer added into the mantissa of 1024.0 (f16) or 128.0 (bf16), which is
# then subtracted, exactly. Both give the value the emulator computes (f32, rounded once).
_HALF_OPS = ("add", "sub", "mul")
_HALF_MAGIC = {("f16", "u4"): 0x6400, ("f16", "u8"): 0x6400, ("f16", "i4"): 0x6408,
               ("f16", "i8"): 0x6480, ("bf16", "u4"): 0x4300, ("bf16", "i4"): 0x4308}
#: Integer - and abs wrap like the emulator (-INT_MIN == INT_MIN): C's signed negation of
#: INT_MIN is undefined (a compiler may then fold `-x < 0` to `x > 0`), so through unsigned.
_INT_UNARY = {"abs": "tg_abs_int({})", "neg": "(int)(0u - (unsigned)({}))", "not": "(~{})"}
_ARITH = {"add": "+", "sub": "-", "mul": "*", "div": "/"}
_BOOL_LOGIC = {"and": "&&", "or": "||", "xor": "!="}
_INT_LOGIC = {"and": "&", "or": "|", "xor": "^"}
_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


def _is_half_op(v: Value) -> bool:
    """True for the values `ValuePrinter._half` computes in 16 bits: + - * of two values
    of its f16/bf16 type, and a cast of a narrow integer to it (by the magic number)."""
    name = v.dtype.name
    if name not in ("f16", "bf16"):
        return False
    if isinstance(v, Binary):
        return v.op in _HALF_OPS and v.x.dtype == v.dtype == v.y.dtype
    return isinstance(v, Cast) and (name, v.x.dtype.name) in _HALF_MAGIC


def _power_of_two(v: Value) -> int | None:
    """k if `v` is the integer literal 2^k (k >= 1), else None."""
    if isinstance(v, Literal) and not v.dtype.is_float and v.dtype.name != "bool":
        n = int(v.value)
        if n >= 2 and n & (n - 1) == 0:
            return n.bit_length() - 1
    return None


def _same_half_op(lo: Value, hi: Value) -> bool:
    """True if two values are the same 16-bit op (`_is_half_op`) of the same types, so
    that one paired instruction computes both."""
    if not (_is_half_op(lo) and _is_half_op(hi)) or type(lo) is not type(hi):
        return False
    if isinstance(lo, Binary):
        return lo.op == hi.op
    return lo.x.dtype == hi.x.dtype


class ValuePrinter:
    """Prints `Value` trees as C compute expressions; `reg_c` spells a register element."""

    def __init__(self, reg_c: Callable[[Reg], str], index_c_fn: Callable[[Expr], str],
                 used: set[str]):
        self.reg_c = reg_c
        self.index_c = index_c_fn
        self.used = used

    def store(self, v: Value, dtype: DType) -> str:
        """C expression of the storage bits of `v` converted to `dtype` (for an Assign)."""
        if isinstance(v, Bits) and v.dtype == dtype:
            return self._bits_of(v)
        if v.dtype == dtype and dtype.name in ("f16", "bf16"):
            if isinstance(v, RegRead):  # a register copy: the bits, not a round trip
                return self.reg_c(v.reg)
            native = self._half(v)
            if native is not None:
                return native
        if isinstance(v, Cast) and v.dtype == dtype:
            v = _Retyped(v.x, dtype)
        return from_compute(self.compute(v, rounded=False), dtype, self.used)

    def store_pair(self, lo: Value, hi: Value, dtype: DType) -> str | None:
        """C expression of one 32-bit word holding `lo` (low half) and `hi` converted to
        the 16-bit float `dtype` by one paired conversion (`tg_f32x2_to_f16x2`, rounding
        each as `store` does), or None for other types."""
        if dtype.bits != 16:
            # Only 16-bit halves pair into a word (an i32 tg.bitcast of f32 values was
            # packed into 16-bit halves here, truncating every element: session 10).
            return None
        helper = _PAIR_FROM_FLOAT.get(dtype.name)
        if lo.dtype == hi.dtype == dtype and (_same_half_op(lo, hi) or (
                isinstance(lo, Bits) and isinstance(hi, Bits))):
            return self._half_pair(lo, hi)
        if helper is None or any(v.dtype == dtype and (_is_half_op(v) or isinstance(
                v, (RegRead, Bits))) for v in (lo, hi)):
            return None  # copied or computed in 16 bits (`store`): nothing to round
        halves = [self.compute(_Retyped(v.x, dtype) if isinstance(v, Cast) and v.dtype == dtype
                               else v, rounded=False) for v in (lo, hi)]
        self.used.add(helper)
        return f"{helper}({halves[0]}, {halves[1]})"

    def _half(self, v: Value) -> str | None:
        """The storage bits of a 16-bit float value computed in its own type (see
        `_HALF_OPS`), or None where `v` is no such op."""
        if not _is_half_op(v):
            return None
        name = v.dtype.name
        if isinstance(v, Binary):
            self.used.add(f"tg_{name}_{v.op}")
            return f"tg_{name}_{v.op}({self._bits(v.x)}, {self._bits(v.y)})"
        magic = _HALF_MAGIC[(name, v.x.dtype.name)]
        self.used.add(f"tg_{name}_sub")
        return (f"tg_{name}_sub((unsigned short)({magic:#x} + {self.compute(v.x)}), "
                f"(unsigned short){magic:#x})")

    def _half_pair(self, lo: Value, hi: Value) -> str:
        """One 32-bit word of two 16-bit float values (`lo` in the low half), computed two
        at a time where both are the same op (`tg_f16x2_sub`, ...: one HADD2), so that
        the operands are words too: two narrow integers 16 bits apart in one register
        become one mask and OR (the magic number of both halves at once)."""
        if isinstance(lo, Bits) and isinstance(hi, Bits) and lo.x == hi.x and \
                (lo.part, hi.part) == (0, 1) and lo.x.dtype.bits == 32:
            return self._word(lo.x)           # both halves of one word: the word itself
        if not _same_half_op(lo, hi):
            return f"((unsigned){self._bits(lo)} | ((unsigned){self._bits(hi)} << 16))"
        name = lo.dtype.name
        if isinstance(lo, Binary):
            self.used.add(f"tg_{name}x2_{lo.op}")
            return (f"tg_{name}x2_{lo.op}({self._half_pair(lo.x, hi.x)}, "
                    f"{self._half_pair(lo.y, hi.y)})")
        magic = _HALF_MAGIC[(name, lo.x.dtype.name)]
        self.used.add(f"tg_{name}x2_sub")
        return (f"tg_{name}x2_sub((unsigned)({magic:#x} + {self.compute(lo.x)}) | "
                f"((unsigned)({magic:#x} + {self.compute(hi.x)}) << 16), "
                f"{magic * 0x10001:#x}u)")

    def _word(self, v: Value) -> str:
        """The bits of a 32-bit value as an unsigned int."""
        c = self.compute(v)
        return f"__float_as_uint({c})" if v.dtype.name == "f32" else f"((unsigned)({c}))"

    def _bits_of(self, v: "Bits") -> str:
        """The storage expression of `tg.bitcast`'s value: x's bits (its part-th half)."""
        if v.x.dtype.bits == 32:
            word = self._word(v.x)
            if v.dtype.bits == 16:
                return f"(unsigned short)({word} >> {16 * v.part})"
            return f"__uint_as_float({word})" if v.dtype.name == "f32" else f"(int)({word})"
        return self._bits(v.x)                # 16-bit to 16-bit: the same bits

    def _bits(self, v: Value) -> str:
        """The storage bits of `v` rounded to its 16-bit float type."""
        if isinstance(v, Bits):
            return self._bits_of(v)
        native = self._half(v)
        if native is not None:
            return native
        if isinstance(v, RegRead):
            return self.reg_c(v.reg)
        if isinstance(v, Literal):
            return f"(unsigned short){element_bits(v.value, v.dtype):#x}"
        if isinstance(v, Where) and isinstance(v.if_true, Literal) and \
                isinstance(v.if_false, Literal):   # a per-register constant, foldable
            return (f"({self.compute(v.cond)} ? {self._bits(v.if_true)} : "
                    f"{self._bits(v.if_false)})")
        return from_compute(self.compute(v, rounded=False), v.dtype, self.used)

    def compute(self, v: Value, rounded: bool = True) -> str:
        """C compute-type expression of `v`; `rounded=False` when the consumer rounds."""
        native = self._half(v)
        if native is not None:
            return to_compute(native, v.dtype, self.used)
        if isinstance(v, Bits):
            return to_compute(self._bits_of(v), v.dtype, self.used)
        if isinstance(v, _Retyped):
            return self._convert(self.compute(v.x), v.x.dtype, v.dtype)
        if isinstance(v, RegRead):
            return to_compute(self.reg_c(v.reg), v.dtype, self.used)
        if isinstance(v, Literal):
            return self._literal(v)
        if isinstance(v, IndexValue):  # rounded to its type like any value (2049 in f16)
            text = self._convert(f"({self.index_c(v.expr)})", v.source, v.dtype)
        elif isinstance(v, Cast):
            text = self._convert(self.compute(v.x), v.x.dtype, v.dtype)
        elif isinstance(v, Unary):
            text = self._unary(v)
        elif isinstance(v, Binary):
            text = self._binary(v)
        elif isinstance(v, Where):
            return (f"({self.compute(v.cond)} ? {self.compute(v.if_true)} : "
                    f"{self.compute(v.if_false)})")
        else:
            raise CodegenError(f"not an element value: {v!r}")
        return round_compute(text, v.dtype, self.used) if rounded else text

    def _literal(self, v: Literal) -> str:
        if v.dtype.name == "bool":
            return "true" if v.value else "false"
        if v.dtype.is_float:
            return float_literal(element_value(v.value, v.dtype))
        return int_literal(element_value(v.value, v.dtype))

    def _convert(self, c: str, src: DType, dst: DType) -> str:
        """Convert a compute value of `src` to the compute type of `dst` (C semantics)."""
        s, d = compute_type(src), compute_type(dst)
        if d == "bool":
            return c if s == "bool" else f"({c} != 0)"
        if s == d:
            return c
        if d == "float" and src.name in _MAGIC_TO_FLOAT:
            return _MAGIC_TO_FLOAT[src.name].format(c)
        if s == "float" and d == "int":
            # The catalogue's cvt.rzi.s32.f32 (saturating, NaN -> 0); storing it in 8 bits
            # would then wrap (300.0 -> 44), so clamp to the type first, as the emulator.
            self.used.add("tg_f32_to_i32")
            if dst.name in _NARROW_INT_RANGE:
                low, high = _NARROW_INT_RANGE[dst.name]
                return f"max({low}, min({high}, tg_f32_to_i32({c})))"
            return f"tg_f32_to_i32({c})"
        if s == "int" and d == "float":  # the catalogue's cvt.rn.f32.s32
            self.used.add("tg_i32_to_f32")
            return f"tg_i32_to_f32({c})"
        return f"({d})({c})"

    def _unary(self, v: Unary) -> str:
        x = self.compute(v.x)
        if v.op == "not" and compute_type(v.x.dtype) == "bool":
            return f"(!{x})"
        table = _FLOAT_UNARY if compute_type(v.dtype) == "float" else _INT_UNARY
        if v.op not in table:
            raise CodegenError(f"unary op {v.op!r} is not defined for {v.dtype}")
        if table is _INT_UNARY and v.op == "abs":
            self.used.add("tg_abs_int")
        if table is _FLOAT_UNARY and v.op in ("exp2", "log2"):
            self.used.add(f"tg_{v.op}")
        return table[v.op].format(x)

    def _binary(self, v: Binary) -> str:
        x, y = self.compute(v.x), self.compute(v.y)
        is_float = compute_type(v.x.dtype) == "float" or compute_type(v.y.dtype) == "float"
        if v.op == "div" and not is_float and compute_type(v.dtype) == "int":
            # C's x / 0 and INT_MIN / -1 are undefined: the helper gives the emulator's -1
            # and INT_MIN (two's complement wrap) instead of whatever the compiler assumes.
            self.used.add("tg_div")
            return f"tg_div({x}, {y})"
        if v.op in _ARITH:
            if not is_float and v.op != "div" and compute_type(v.dtype) == "int":
                # Wrap around like the emulator: signed overflow is undefined in C, so
                # i32 + - * go through unsigned arithmetic (two's complement on the GPU).
                return f"(int)((unsigned)({x}) {_ARITH[v.op]} (unsigned)({y}))"
            return f"({x} {_ARITH[v.op]} {y})"
        if v.op in _COMPARE:
            return f"({x} {_COMPARE[v.op]} {y})"
        if v.op in ("max", "min"):
            if not is_float:
                return f"{v.op}({x}, {y})"
            # fmaxf/fminf drop a NaN operand; tegula propagates it, as torch does.
            self.used.add(f"tg_{v.op}_nan")
            return f"tg_{v.op}_nan({x}, {y})"
        if v.op == "pow":
            return f"powf({x}, {y})"
        shift = _power_of_two(v.y) if v.op in ("floordiv", "mod") and not is_float else None
        if shift is not None:   # floor semantics by a power of two: an arithmetic shift, a mask
            return f"({x} >> {shift})" if v.op == "floordiv" else f"({x} & {(1 << shift) - 1})"
        if v.op in ("floordiv", "mod") and not is_float:
            # Floor semantics with defined results for 0 and -1 divisors (tegula/codegen/ptx.py)
            self.used.add(f"tg_{v.op}")
            return f"tg_{v.op}({x}, {y})"
        if v.op in ("and", "or", "xor"):
            table = _BOOL_LOGIC if compute_type(v.dtype) == "bool" else _INT_LOGIC
            return f"({x} {table[v.op]} {y})"
        raise CodegenError(f"binary op {v.op!r} is not defined")


class _Retyped(Value):
    """Internal: `x` converted to `dtype` without rounding (the consumer rounds)."""

    def __init__(self, x: Value, dtype: DType):
        self.x = x
        self.dtype = dtype

