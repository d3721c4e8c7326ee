"""Inline-PTX pieces of generated kernels: helper device functions and matrix instructions.

The generated source includes no header at all (see `expr.py` for why), so conversions and
atomic adds are helper functions around inline PTX. The PTX of each comes from its
catalogue entry (`arch.convert`, `arch.minmax`, `arch.logic`, `arch.special`,
`arch.memory.RED_ADD`, printed by `format_asm`); only the software forms below an entry's
min_cc (f8 conversions, 16-bit arithmetic, the bf16-CAS add: `SOFTWARE_FORMS`, checked
against their entries) are C.
Helpers are emitted only when the kernel uses them (`prelude(used)`), so a plain copy
kernel stays short.

Matrix instructions are keyed by the thread IR's `Mma.instr` name
(`"mma.m16n8k16.f32.f16.f16.f32"`: shape, then the d, a, b, c types), which is the key of
an entry of the instruction catalogue (`tegula.arch`); `mma_instr` finds it, and the
emitter prints the entry's own PTX template and register counts — there is no second table
of MMA shapes and types here.
"""
from __future__ import annotations

import re

from tegula.arch.convert import FLOAT_TO_INT, INT_TO_FLOAT, cvt
from tegula.arch.instructions import PTX_TYPE, MmaInstr
from tegula.arch.logic import LOP3
from tegula.arch.memory import RED_ADD
from tegula.arch.minmax import nan_minmax
from tegula.arch.special import LG2_APPROX
from tegula.arch.tma import get_async
from tegula.arch.mma import MMA_INSTRUCTIONS
from tegula.codegen.expr import CodegenError

# --------------------------------------------------------------------------------------
# Helper device functions
# --------------------------------------------------------------------------------------

def _cvt(ptx: str, **operands: str) -> str:
    """The asm statement of the catalogue's conversion `ptx` on C operands."""
    return cvt(ptx).format_asm(**operands)


def _cc(ptx: str) -> int:
    """__CUDA_ARCH__ from which the conversion `ptx` exists (its entry's min_cc)."""
    return 10 * cvt(ptx).min_cc


def _red(dtype_name: str) -> str:
    """The asm statement of the catalogue's global atomic add for a tegula dtype name, on
    the helpers' parameters `p` (pointer) and `v` (value)."""
    return RED_ADD[dtype_name].format_asm(addr="p", v="v")


#: name -> (C source, helpers it calls). Conversions round to nearest even; the f8 ones
#: saturate to the largest finite value (like `cvt.rn.satfinite`). Hardware f8 conversions
#: exist from sm_89; older targets get an exact software version.
_HELPERS: dict[str, tuple[str, tuple[str, ...]]] = {
    # max/min where a NaN operand gives NaN (torch.maximum semantics; fmaxf drops it):
    # the catalogue's max.NaN / min.NaN entries (`arch.minmax`), one instruction.
    **{f"tg_{op}_nan": (f"""\
__device__ __forceinline__ float tg_{op}_nan(float a, float b) {{
  float r; {nan_minmax(op).format_asm(d="r", a="a", b="b")} return r;
}}""", ()) for op in ("max", "min")},
    # Two bitwise ops with constants, `(a op1 B) op2 C`, as one lop3 (`arch.logic`): the
    # constants immediate, so ptxas keeps them in registers instead of a MOV a use.
    "tg_lop3": (f"""\
template <unsigned LUT, unsigned B, unsigned C>
__device__ __forceinline__ unsigned tg_lop3(unsigned a) {{
  unsigned d; {LOP3.format_asm(d="d", a="a", b="B", c="C", lut="LUT")} return d;
}}""", ()),
    # One lane of the warp (the catalogue's elect.sync, full mask): `Elect` in conditions.
    "tg_elect_one": (f"""\
__device__ __forceinline__ unsigned tg_elect_one() {{
  unsigned elected; {get_async("elect.sync").format_asm(d="elected")} return elected;
}}""", ()),
    # Integer / (truncating, as C) and // and % with floor semantics (torch.floor_divide /
    # torch.remainder, as the emulator). C leaves x / 0 and INT_MIN / -1 undefined, so both
    # are defined here as the emulator computes them: x / 0 == x // 0 == -1, x % 0 == x
    # (keeping x == (x // y) * y + x % y), INT_MIN / -1 and INT_MIN // -1 wrap to INT_MIN.
    # exp2 as one MUFU.EX2: `exp2f` keeps results below 2^-126 (denormals) by scaling the
    # argument and squaring (a compare and two multiplies around every exp2, three more
    # issue slots than the exponential itself); results below 2^-126 flush to 0 here,
    # as the emulator's exp2 does.
    "tg_exp2": ("""\
__device__ __forceinline__ float tg_exp2(float x) {
  float r; asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x)); return r;
}""", ()),
    # log2 as the catalogue's lg2.approx.f32 (`arch.special`: MUFU.LG2, subnormal inputs
    # scaled by ptxas, |error| <= 2^-22 near 1, 2 ulp elsewhere) where `log2f` is ~20
    # instructions.
    "tg_log2": (f"""\
__device__ __forceinline__ float tg_log2(float x) {{
  float r; {LG2_APPROX.format_asm(d="r", a="x")} return r;
}}""", ()),
    "tg_abs_int": ("""\
__device__ __forceinline__ int tg_abs_int(int a) {
  return a < 0 ? (int)(0u - (unsigned)a) : a;
}""", ()),
    "tg_div": ("""\
__device__ __forceinline__ int tg_div(int a, int b) {
  if (b == 0) return -1;
  if (b == -1) return (int)(0u - (unsigned)a);
  return a / b;
}""", ()),
    "tg_floordiv": ("""\
__device__ __forceinline__ int tg_floordiv(int a, int b) {
  if (b == 0) return -1;
  if (b == -1) return (int)(0u - (unsigned)a);
  int q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}""", ()),
    "tg_mod": ("""\
__device__ __forceinline__ int tg_mod(int a, int b) {
  if (b == 0) return a;
  if (b == -1) return 0;
  int r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}""", ()),
    # Conversions print the catalogue's cvt entries (`arch.convert`).
    "tg_f32_to_i32": (f"""\
__device__ __forceinline__ int tg_f32_to_i32(float f) {{
  int i; {FLOAT_TO_INT.format_asm(d="i", a="f")} return i;
}}""", ()),
    "tg_i32_to_f32": (f"""\
__device__ __forceinline__ float tg_i32_to_f32(int i) {{
  float f; {INT_TO_FLOAT.format_asm(d="f", a="i")} return f;
}}""", ()),
    "tg_f16_to_f32": (f"""\
__device__ __forceinline__ float tg_f16_to_f32(unsigned short h) {{
  float f; {_cvt("cvt.f32.f16", d="f", a="h")} return f;
}}""", ()),
    "tg_f32_to_f16": (f"""\
__device__ __forceinline__ unsigned short tg_f32_to_f16(float f) {{
  unsigned short h; {_cvt("cvt.rn.f16.f32", d="h", a="f")} return h;
}}""", ()),
    "tg_bf16_to_f32": ("""\
__device__ __forceinline__ float tg_bf16_to_f32(unsigned short h) {
  return __uint_as_float(((unsigned)h) << 16);  // bf16 is the top half of an f32
}""", ()),
    "tg_f32_to_bf16": (f"""\
__device__ __forceinline__ unsigned short tg_f32_to_bf16(float f) {{
  unsigned short h; {_cvt("cvt.rn.bf16.f32", d="h", a="f")} return h;
}}""", ()),
    # Two f32 -> one 32-bit word of two 16-bit floats (lo in the low half), each rounded
    # as the one-element helpers do. The emitter rounds adjacent elements of a register
    # array with them (`cuda._Emitter.block`): ptxas serializes a wgmma pipeline (warning
    # C7514) when its accumulator is rounded one element at a time for bounds-checked
    # stores, which the paired form avoids.
    "tg_f32x2_to_f16x2": (f"""\
__device__ __forceinline__ unsigned tg_f32x2_to_f16x2(float lo, float hi) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {_cc("cvt.rn.f16x2.f32")}
  unsigned p; {_cvt("cvt.rn.f16x2.f32", d="p", a="hi", b="lo")} return p;
#else
  return (unsigned)tg_f32_to_f16(lo) | ((unsigned)tg_f32_to_f16(hi) << 16);
#endif
}}""", ("tg_f32_to_f16",)),
    "tg_f32x2_to_bf16x2": (f"""\
__device__ __forceinline__ unsigned tg_f32x2_to_bf16x2(float lo, float hi) {{
  unsigned p; {_cvt("cvt.rn.bf16x2.f32", d="p", a="hi", b="lo")} return p;
}}""", ()),
    "tg_fp8_sw": ("""\
// Exact software f8 conversions for targets without cvt.*.e4m3x2/e5m2x2 (before sm_89).
__device__ __forceinline__ unsigned char tg_f32_to_fp8_sw(float x, int man_bits, int bias,
                                                          float max_finite, unsigned max_code) {
  const unsigned sign = (__float_as_uint(x) >> 24) & 0x80u;
  const float a = fabsf(x);
  if (a != a) return 0x7f;                               // NaN
  if (a >= max_finite) return sign | max_code;           // saturate (infinities included)
  const int emin = 1 - bias;
  int e = (int)((__float_as_uint(a) >> 23) & 0xff) - 127; // binade of a (f32 normal range)
  if (e < emin) e = emin;                                 // subnormals share one quantum
  const float q = rintf(ldexpf(a, man_bits - e));         // round to nearest even
  return sign | (((unsigned)(e - emin) << man_bits) + (unsigned)q);  // carry bumps the exponent
}
__device__ __forceinline__ float tg_fp8_to_f32_sw(unsigned char c, int man_bits, int bias,
                                                  bool finite_only) {
  const unsigned mag = c & 0x7fu, e = mag >> man_bits, m = mag & ((1u << man_bits) - 1);
  float v;
  if (finite_only && mag == 0x7fu) v = __int_as_float(0x7fffffff);
  else if (!finite_only && e == (0x7fu >> man_bits)) v = m ? __int_as_float(0x7fffffff)
                                                           : __int_as_float(0x7f800000);
  else if (e == 0) v = ldexpf((float)m, 1 - bias - man_bits);
  else v = ldexpf((float)(m + (1u << man_bits)), (int)e - bias - man_bits);
  return (c & 0x80u) ? -v : v;
}""", ()),
    "tg_f32_to_e4m3": (f"""\
__device__ __forceinline__ unsigned char tg_f32_to_e4m3(float f) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {_cc("cvt.rn.satfinite.e4m3x2.f32")}
  unsigned short p;
  {_cvt("cvt.rn.satfinite.e4m3x2.f32", d="p", a="0.0f", b="f")}
  return (unsigned char)(p & 0xff);  // the second source lands in the low byte
#else
  return tg_f32_to_fp8_sw(f, 3, 7, 448.0f, 0x7eu);
#endif
}}""", ("tg_fp8_sw",)),
    "tg_f32_to_e5m2": (f"""\
__device__ __forceinline__ unsigned char tg_f32_to_e5m2(float f) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {_cc("cvt.rn.satfinite.e5m2x2.f32")}
  unsigned short p;
  {_cvt("cvt.rn.satfinite.e5m2x2.f32", d="p", a="0.0f", b="f")}
  return (unsigned char)(p & 0xff);
#else
  return tg_f32_to_fp8_sw(f, 2, 15, 57344.0f, 0x7bu);
#endif
}}""", ("tg_fp8_sw",)),
    "tg_e4m3_to_f32": (f"""\
__device__ __forceinline__ float tg_e4m3_to_f32(unsigned char c) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {_cc("cvt.rn.f16x2.e4m3x2")}
  unsigned h2;
  {_cvt("cvt.rn.f16x2.e4m3x2", d="h2", a="(unsigned short)c")}
  return tg_f16_to_f32((unsigned short)(h2 & 0xffffu));  // exact: f16 holds every e4m3
#else
  return tg_fp8_to_f32_sw(c, 3, 7, true);
#endif
}}""", ("tg_fp8_sw", "tg_f16_to_f32")),
    "tg_e5m2_to_f32": (f"""\
__device__ __forceinline__ float tg_e5m2_to_f32(unsigned char c) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {_cc("cvt.rn.f16x2.e5m2x2")}
  unsigned h2;
  {_cvt("cvt.rn.f16x2.e5m2x2", d="h2", a="(unsigned short)c")}
  return tg_f16_to_f32((unsigned short)(h2 & 0xffffu));
#else
  return tg_fp8_to_f32_sw(c, 2, 15, false);
#endif
}}""", ("tg_fp8_sw", "tg_f16_to_f32")),
    # Atomic adds whose result is unused: `red` (fire-and-forget) rather than `atom`,
    # printed through the catalogue's entries (`arch.memory.RED_ADD`).
    "tg_red_add_f32": (f"""\
__device__ __forceinline__ void tg_red_add_f32(float* p, float v) {{
  {_red("f32")}
}}""", ()),
    "tg_red_add_s32": (f"""\
__device__ __forceinline__ void tg_red_add_s32(int* p, int v) {{
  {_red("i32")}
}}""", ()),
    "tg_red_add_f16": (f"""\
__device__ __forceinline__ void tg_red_add_f16(unsigned short* p, unsigned short v) {{
  {_red("f16")}
}}""", ()),
    "tg_red_add_bf16": (f"""\
__device__ __forceinline__ void tg_red_add_bf16(unsigned short* p, unsigned short v) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {10 * RED_ADD["bf16"].min_cc}
  {_red("bf16")}
#else
  // No bf16 atomic before sm_90: compare-and-swap the aligned 32-bit word holding it.
  unsigned* word = reinterpret_cast<unsigned*>(reinterpret_cast<unsigned long long>(p) & ~3ull);
  const unsigned shift = (reinterpret_cast<unsigned long long>(p) & 2ull) ? 16u : 0u;
  unsigned old = *word, assumed;
  do {{
    assumed = old;
    const unsigned short sum = tg_f32_to_bf16(
        tg_bf16_to_f32((unsigned short)(assumed >> shift)) + tg_bf16_to_f32(v));
    old = atomicCAS(word, assumed, (assumed & ~(0xffffu << shift)) | ((unsigned)sum << shift));
  }} while (old != assumed);
#endif
}}""", ("tg_f32_to_bf16", "tg_bf16_to_f32")),
}


#: The helpers holding a software form of a catalogue entry (their `#else` branch, what
#: targets before the entry's min_cc run): helper -> the entry it stands in for. A form
#: computes what its entry does (`convert` / `execute`, which the emulator calls):
#: tests/codegen/test_software_forms.py runs the f8 and bf16-atomic forms' C on the CPU
#: against the entries, tests/gpu/test_entry_semantics_gpu.py every form on the GPU
#: (guards forced false); a helper with an `#else` missing here fails the first.
SOFTWARE_FORMS: dict[str, str] = {
    "tg_f32x2_to_f16x2": "cvt.rn.f16x2.f32",
    "tg_f32_to_e4m3": "cvt.rn.satfinite.e4m3x2.f32",
    "tg_f32_to_e5m2": "cvt.rn.satfinite.e5m2x2.f32",
    "tg_e4m3_to_f32": "cvt.rn.f16x2.e4m3x2",
    "tg_e5m2_to_f32": "cvt.rn.f16x2.e5m2x2",
    "tg_red_add_bf16": "red.global.add.noftz.bf16",
    **{f"tg_{t}{x2}_{op}": f"{op}.rn.{t}{x2}" for t in ("f16", "bf16") for x2 in ("", "x2")
       for op in ("add", "sub", "mul")},
}


def _half_helper(op: str, dtype: str) -> tuple[str, tuple[str, ...]]:
    """`tg_{dtype}_{op}(a, b)`: one 16-bit float + - or * on storage bits, the catalogue's
    `{op}.rn.{dtype}` (ptxas pairs neighbours into HADD2/HMUL2); before the entry's
    min_cc (bf16 before sm_90), the f32 operation rounded once, which is the same value."""
    ptx, c_op = f"{op}.rn.{dtype}", {"add": "+", "sub": "-", "mul": "*"}[op]
    to_f32, from_f32 = f"tg_{dtype}_to_f32", f"tg_f32_to_{dtype}"
    return (f"""\
__device__ __forceinline__ unsigned short tg_{dtype}_{op}(unsigned short a, unsigned short b) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {_cc(ptx)}
  unsigned short d; {_cvt(ptx, d="d", a="a", b="b")} return d;
#else
  return {from_f32}({to_f32}(a) {c_op} {to_f32}(b));
#endif
}}""", (to_f32, from_f32))


def _half2_helper(op: str, dtype: str) -> tuple[str, tuple[str, ...]]:
    """`tg_{dtype}x2_{op}(a, b)`: `tg_{dtype}_{op}` on both 16-bit halves of 32-bit words
    at once (the catalogue's `{op}.rn.{dtype}x2`, one HADD2/HMUL2)."""
    ptx, one = f"{op}.rn.{dtype}x2", f"tg_{dtype}_{op}"
    return (f"""\
__device__ __forceinline__ unsigned tg_{dtype}x2_{op}(unsigned a, unsigned b) {{
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= {_cc(ptx)}
  unsigned d; {_cvt(ptx, d="d", a="a", b="b")} return d;
#else
  return (unsigned){one}((unsigned short)a, (unsigned short)b)
      | ((unsigned){one}((unsigned short)(a >> 16), (unsigned short)(b >> 16)) << 16);
#endif
}}""", (one,))


_HELPERS.update({f"tg_{dtype}_{op}": _half_helper(op, dtype)
                 for dtype in ("f16", "bf16") for op in ("add", "sub", "mul")})
_HELPERS.update({f"tg_{dtype}x2_{op}": _half2_helper(op, dtype)
                 for dtype in ("f16", "bf16") for op in ("add", "sub", "mul")})

#: Vector types for 8- and 16-byte accesses (defined here because no header is included).
VECTOR_TYPES = """\
struct __align__(8) tg_v2 { unsigned x, y; };         // one 8-byte access
struct __align__(16) tg_v4 { unsigned x, y, z, w; };  // one 16-byte access"""


def prelude(used: set[str]) -> str:
    """The helper definitions `used` needs (dependencies first), in a stable order."""
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order:
            return
        for dep in _HELPERS[name][1]:
            visit(dep)
        order.append(name)

    for name in _HELPERS:  # dict order: a fixed, readable order
        if name in used:
            visit(name)
    return "\n".join(_HELPERS[n][0] for n in order)


# --------------------------------------------------------------------------------------
# Matrix instructions
# --------------------------------------------------------------------------------------

#: Accepted spellings of operand types in instruction names: the PTX ones and tegula's
#: dtype names (i8, f8e4m3, ...), both mapped to the PTX spelling the catalogue keys use.
_TYPE_SPELLINGS = {**{ptx: ptx for ptx in PTX_TYPE.values()}, **PTX_TYPE}

_NAME_RE = re.compile(r"^(?:mma\.)?(?:sync\.aligned\.)?m(\d+)n(\d+)k(\d+)(?:\.row\.col)?"
                      r"\.(\w+)\.(\w+)\.(\w+)\.(\w+)$")


def mma_instr(name: str) -> MmaInstr:
    """The catalogue entry an `Mma` statement names (also accepted: the full PTX spelling
    and tegula dtype names); `CodegenError` if the name is not an MMA of the catalogue.
    Everything the emitter prints for it (PTX text, register counts, minimum SM) comes
    from this entry."""
    match = _NAME_RE.match(name)
    if match is None:
        raise CodegenError(f"cannot parse matrix instruction name {name!r} "
                           f"(expected like 'mma.m16n8k16.f32.f16.f16.f32')")
    m, n, k = (int(g) for g in match.groups()[:3])
    try:
        d, a, b, c = (_TYPE_SPELLINGS[t] for t in match.groups()[3:])
    except KeyError as e:
        raise CodegenError(f"{name}: unknown operand type {e.args[0]!r}") from None
    key = f"mma.m{m}n{n}k{k}.{d}.{a}.{b}.{c}"
    found = next((i for i in MMA_INSTRUCTIONS if i.name == key), None)
    if found is None:
        raise CodegenError(f"{name}: no mma.sync m{m}n{n}k{k} with types "
                           f"d={d} a={a} b={b} c={c} in the instruction catalogue")
    return found
