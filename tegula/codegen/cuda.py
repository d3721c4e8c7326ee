"""Thread IR → one CUDA C++ `extern "C" __global__` function with inline PTX.

The printed kernel is self-contained (no `#include`): element types are stored as raw bits
(`expr.py`), conversions/atomics/matrix instructions are PTX helpers (`ptx.py`), and the
parameter list comes from `params.param_list`, which the runtime also packs from.

Memory statements move `count` consecutive elements as *one* access of count*elem bytes:
16 bytes through `tg_v4` (a 16-byte-aligned struct of four words), 8 through `tg_v2`, and
4/2/1 bytes through plain scalar types — plain C accesses, so the compiler sees them as
loads and stores (`ld.global.nc` for read-only tensors, `LDG.E.128` in SASS) and the 32-bit
words are packed/unpacked to registers with shifts that compile to nothing or `PRMT`.
cp.async, ldmatrix, mma, shuffles and atomics are inline PTX — all but the atomics printed
by their `tegula.arch` catalogue entry's `format_asm`, so the PTX text lives once; shared
addresses for them come from one `__cvta_generic_to_shared` of the dynamic shared memory
base.
The asynchronous statements (mbarriers, TMA, wgmma, warp roles: `lower/async_ir.py`) are
printed by `async_stmts.py`, a base class of the emitter.
"""
from __future__ import annotations

import re

from tegula.arch.catalogue import cp_async, cp_async_sizes
from tegula.arch.catalogue import ldmatrix as ldmatrix_entry
from tegula.arch.catalogue import shuffle as shuffle_entry
from tegula.arch.instructions import ptx_type
from tegula.arch.memory import (CP_ASYNC_COMMIT, RED_ADD, cp_async_asm, cp_async_wait,
                                vector_refusal)
from tegula.dtypes import DType
from tegula.errors import TegulaError
from tegula.lower.async_ir import Elect
from tegula.lower.thread_ir import (
    Assign, Barrier, Comment, Const, CpAsync, CpAsyncCommit, CpAsyncWait, Expr, For,
    GlobalAtomicAdd, GlobalLoad, GlobalStore, If, LdMatrix, Let, Mma, Reg, RegArray, RegRead,
    SharedBuffer, SharedLoad, SharedStore, Shuffle, Stmt, TensorParam, ThreadKernel, Value,
)

from tegula.codegen import lop3
from tegula.codegen.async_stmts import AsyncStatements, tensor_maps, uses_async
from tegula.codegen.expr import (
    CodegenError, ValuePrinter, element_bits, index_c, index_helpers, storage_type,
)
from tegula.codegen.params import TENSOR_MAP_STRUCT, param_list
from tegula.codegen.ptx import VECTOR_TYPES, mma_instr, prelude

_INDENT = "  "
#: Access width in bits -> (C type of the access, its 32-bit word fields).
_ACCESS = {8: ("unsigned char", None), 16: ("unsigned short", None), 32: ("unsigned", None),
           64: ("tg_v2", ("x", "y")), 128: ("tg_v4", ("x", "y", "z", "w"))}


#: Names the generated function defines itself or C++ reserves (the common ones).
_RESERVED = frozenset(
    "tid bid_x bid_y bid_z smem smem_saddr threadIdx blockIdx blockDim gridDim int float "
    "double char short long unsigned signed bool void const for if else while do return "
    "break continue switch case default struct union class template typename auto static "
    "extern inline asm volatile register sizeof true false min max".split())

#: Functions CUDA's device headers declare with C linkage (the math library, as listed in
#: CUDA 13's crt/math_functions.h, and the C library calls device code may make): an
#: `extern "C"` kernel of the same name does not compile ("more than one instance of
#: overloaded function has C linkage"), so a kernel may not be named like one.
CUDA_C_FUNCTIONS = frozenset("""
    abs acos acosf acosh acoshf asin asinf asinh asinhf atan atan2 atan2f atanf atanh atanhf
    cbrt cbrtf ceil ceilf copysign copysignf cos cosf cosh coshf cospi cospif cyl_bessel_i0
    cyl_bessel_i0f cyl_bessel_i1 cyl_bessel_i1f erf erfc erfcf erfcinv erfcinvf erfcx erfcxf
    erff erfinv erfinvf exp exp10 exp10f exp2 exp2f expf expm1 expm1f fabs fabsf fdim fdimf
    floor floorf fma fmaf fmax fmaxf fmin fminf fmod fmodf frexp frexpf hypot hypotf ilogb
    ilogbf isfinite isinf isnan j0 j0f j1 j1f jn jnf labs ldexp ldexpf lgamma lgammaf llabs
    llmax llmin llrint llrintf llround llroundf log log10 log10f log1p log1pf log2 log2f logb
    logbf logf lrint lrintf lround lroundf max min modf modff nan nanf nearbyint nearbyintf
    nextafter nextafterf norm norm3d norm3df norm4d norm4df normcdf normcdff normcdfinv
    normcdfinvf normf pow powf rcbrt rcbrtf remainder remainderf remquo remquof rhypot rhypotf
    rint rintf rnorm rnorm3d rnorm3df rnorm4d rnorm4df rnormf round roundf rsqrt rsqrtf
    scalbln scalblnf scalbn scalbnf signbit sin sincos sincosf sincospi sincospif sinf sinh
    sinhf sinpi sinpif sqrt sqrtf tan tanf tanh tanhf tgamma tgammaf trunc truncf ullmax
    ullmin umax umin y0 y0f y1 y1f yn ynf
    printf malloc free memcpy memset assert abort clock clock64
""".split())


def target_sm(target: str) -> int:
    """The SM version number of a target name: "sm_90a" -> 90."""
    match = re.fullmatch(r"sm_(\d+)[a-z]?", target)
    if match is None:
        raise CodegenError(f"unknown target {target!r} (expected like 'sm_80' or 'sm_90a')")
    return int(match.group(1))


def emit_cuda(kernel: ThreadKernel, target: str = "sm_90a") -> str:
    """CUDA C++ source of `kernel`: one `extern "C" __global__` function named `kernel.name`."""
    return _Emitter(kernel, target).emit()


def _bits_expr(c: str, dtype: DType) -> str:
    """An element's storage bits as an `unsigned` (for packing words)."""
    if dtype.name == "f32":
        return f"__float_as_uint({c})"
    if dtype.bits == 4:
        return f"((unsigned){c} & 15u)"
    if dtype.bits == 8:
        return f"(unsigned)(unsigned char){c}"
    return f"(unsigned){c}"


def _from_bits(word: str, dtype: DType, shift: int) -> str:
    """Element `dtype` whose bits start at bit `shift` of `unsigned` expression `word`."""
    src = f"({word} >> {shift})" if shift else word
    if dtype.name == "f32":
        return f"__uint_as_float({word})"
    if dtype.name == "i32":
        return f"(int){word}"
    if dtype.name == "bool":
        return f"((({src}) & 0xffu) != 0u)"
    if dtype.bits == 4:
        return f"(unsigned char)({src} & 15u)"
    return f"({storage_type(dtype)}){src}"


def _access(count: int, dtype: DType, what: str) -> tuple[int, str, tuple]:
    """(bits, C type, fields) of one vector access of `count` elements of `dtype`."""
    bits = count * dtype.bits
    refusal = vector_refusal(dtype.bits, count)
    if refusal is not None:
        raise CodegenError(f"{what} ({dtype}): {refusal}")
    ctype, fields = _ACCESS[bits]  # how C spells each width the catalogue has
    return bits, ctype, fields


def _reads_array(v: Value, array: RegArray) -> bool:
    """Whether value `v` reads an element of register array `array`."""
    if isinstance(v, RegRead):
        return v.reg.array is array
    return any(_reads_array(getattr(v, f), array) for f in ("x", "y", "cond", "if_true",
                                                             "if_false") if hasattr(v, f))


class _Emitter(AsyncStatements):
    """Prints one ThreadKernel; collects which PTX helpers the body uses."""

    def __init__(self, kernel: ThreadKernel, target: str):
        self.kernel = kernel
        self.sm = target_sm(target)
        self.target = target
        self.used: set[str] = set()
        self.lines: list[str] = []
        self.depth = 1
        self.tensors = {p.name: p for p in kernel.params if isinstance(p, TensorParam)}
        self.buffers = {b.name: b for b in kernel.shared}
        self.values = ValuePrinter(self.reg, index_c, self.used)
        self.temp_count = 0
        self.sets_registers = False  # a role has max_registers (set by _Roles)

    # ---- the whole function ----------------------------------------------------------

    def check_names(self) -> None:
        """Every parameter, register array and buffer needs a distinct, usable C name."""
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.kernel.name):
            raise CodegenError(f"kernel name {self.kernel.name!r} is not a C identifier")
        names = [spec.name for spec in param_list(self.kernel)]
        names += [r.name for r in self.kernel.registers] + [b.name for b in self.kernel.shared]
        names += [f"{b.name}_saddr" for b in self.kernel.shared]
        names += [m.name + suffix for m in self.kernel.mbarriers for suffix in ("", "_saddr")]
        seen: set[str] = set(_RESERVED)
        for n in names:
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", n) or n.startswith("tg_"):
                raise CodegenError(f"{n!r} is not a usable C name (the tg_ prefix is the "
                                   f"emitter's)")
            if n in seen:
                raise CodegenError(f"the name {n!r} is used twice (or is reserved) in "
                                   f"kernel {self.kernel.name}")
            seen.add(n)

    def emit(self) -> str:
        self.check_names()
        self.statements(self.kernel.body)
        body = "\n".join(self.lines)
        self.used |= index_helpers(body)  # the user's scalar // and % (tg_floordiv, tg_mod)
        if "tg_elect_one" in self.used:  # an `Elect` in a condition
            self.entry("elect.sync", Elect())
        params = ",\n    ".join(p.declaration for p in param_list(self.kernel))
        head = [f"// Generated by tegula from thread IR kernel `{self.kernel.name}` "
                f"for {self.target}.",
                "// Self-contained: f16/bf16 are held as unsigned short bits, f8 and 4-bit as",
                "// unsigned char; arithmetic is in float/int and rounds with cvt.rn.",
                VECTOR_TYPES]
        if tensor_maps(self.kernel):
            head.append(TENSOR_MAP_STRUCT)
        helpers = prelude(self.used)
        if helpers:
            head.append(helpers)
        head.append(f'extern "C" __global__ void __launch_bounds__({self.launch_bounds()})\n'
                    f"{self.kernel.name}(\n    {params})\n{{")
        return "\n".join(head + self.declarations(body) + [body, "}", ""])

    def launch_bounds(self) -> str:
        """`threads`, or `threads, 1` when a role sets its register budget (`setmaxnreg`
        adjusts from what ptxas allocated; one block per SM makes that the block's even
        share of the register file, which `set_max_registers` compares against), or
        `threads, blocks` for the `blocks_per_sm` build option (registers capped so that
        many blocks fit an SM; `build` refuses it together with setmaxnreg)."""
        if self.sets_registers:
            return f"{self.kernel.threads}, 1"
        if self.kernel.blocks_per_sm:
            return f"{self.kernel.threads}, {self.kernel.blocks_per_sm}"
        return str(self.kernel.threads)

    def declarations(self, body: str) -> list[str]:
        """Index variables, shared-memory views and register arrays the body refers to."""
        def used(name: str) -> bool:
            return re.search(rf"\b{re.escape(name)}\b", body) is not None

        out = []
        for name, init in (("tid", "(int)threadIdx.x"), ("bid_x", "(int)blockIdx.x"),
                           ("bid_y", "(int)blockIdx.y"), ("bid_z", "(int)blockIdx.z"),
                           ("tg_grid_x", "(int)gridDim.x"), ("tg_grid_y", "(int)gridDim.y"),
                           ("tg_grid_z", "(int)gridDim.z"),
                           # lane 0's: warp-uniform to ptxas (wgmma descriptors' warpgroup)
                           ("tg_warp_tid", "__shfl_sync(0xffffffffu, (int)threadIdx.x, 0)")):
            if used(name):
                out.append(f"{_INDENT}const int {name} = {init};")
        if used("tg_num_sms"):  # tg.num_sms(): PTX's SM-identifier count, read at run time
            out.append(f'{_INDENT}int tg_num_sms; asm("mov.u32 %0, %%nsmid;" : "=r"(tg_num_sms));')
        mbarriers = self.kernel.mbarriers
        if self.kernel.shared or mbarriers:
            # 128-byte swizzle (TMA boxes, wgmma operands) addresses 1024-byte atoms.
            align = 1024 if uses_async(self.kernel) else 128
            out.append(f"{_INDENT}extern __shared__ __align__({align}) unsigned char smem[];")
            if any(used(f"{b.name}_saddr") for b in self.kernel.shared + mbarriers):
                out.append(f"{_INDENT}// shared-window address of smem, for cp.async/ldmatrix")
                out.append(f"{_INDENT}const unsigned smem_saddr = "
                           f"(unsigned)__cvta_generic_to_shared(smem);")
            for b in self.kernel.shared:
                t = storage_type(b.dtype)
                if used(b.name):
                    out.append(f"{_INDENT}{t}* const {b.name} = "
                               f"reinterpret_cast<{t}*>(smem + {b.byte_offset});"
                               f"  // {b.size} x {b.dtype}")
                if used(f"{b.name}_saddr"):
                    out.append(f"{_INDENT}const unsigned {b.name}_saddr = "
                               f"smem_saddr + {b.byte_offset}u;")
            for m in mbarriers:
                self.check_mbarrier_placement(m)
                if used(f"{m.name}_saddr"):
                    out.append(f"{_INDENT}const unsigned {m.name}_saddr = "
                               f"smem_saddr + {m.byte_offset}u;  // {m.count} mbarriers")
        packed = {a.name for a in self.accumulator_arrays() if a.dtype.bits == 16}
        for r in self.kernel.registers:
            # 16-bit wgmma accumulators are read as 32-bit pairs (packed_accumulator_words)
            align = "__align__(4) " if r.name in packed else ""
            out.append(f"{_INDENT}{align}{storage_type(r.dtype)} {r.name}[{r.size}];  // {r.dtype}")
        return out

    # ---- helpers ---------------------------------------------------------------------

    def line(self, text: str) -> None:
        self.lines.append(_INDENT * self.depth + text)

    def temp(self, stem: str) -> str:
        """A fresh local name (the `tg_` prefix is reserved for the emitter)."""
        self.temp_count += 1
        return f"tg_{stem}{self.temp_count}"

    def reg(self, r: Reg, offset: int = 0) -> str:
        """C lvalue of register element `r` + offset, bounds-checked where constant."""
        index = r.index + offset if offset else r.index
        if isinstance(index, Const) and not 0 <= index.value < r.array.size:
            raise CodegenError(f"register {r.array.name}[{index.value}] is outside its "
                               f"{r.array.size} elements")
        return f"{r.array.name}[{index_c(index)}]"

    def block(self, stmts: list[Stmt]) -> None:
        self.depth += 1
        self.statements(stmts)
        self.depth -= 1

    def statements(self, stmts: list[Stmt]) -> None:
        """Print `stmts` in order, adjacent 16-bit roundings as pairs (`_rounded_pair`),
        two chained bitwise ops with constants as one lop3 (`codegen/lop3.py`)."""
        i, bitwise = 0, {}   # straight-line facts for lop3: cleared at any other statement
        while i < len(stmts):
            if i + 1 < len(stmts) and self._rounded_pair(stmts[i], stmts[i + 1]):
                for s in stmts[i:i + 2]:
                    lop3.note(bitwise, s)
                i += 2
                continue
            s = stmts[i]
            if isinstance(s, Assign):
                self._assign_lop3(s, bitwise)
                lop3.note(bitwise, s)
            else:
                if not isinstance(s, Comment):
                    bitwise.clear()
                self.stmt(s)
            i += 1

    def _assign_lop3(self, s: Assign, bitwise: dict) -> None:
        """Print Assign `s`, as one `tg_lop3` where it is `(x op b) op c` through a
        register `bitwise` knows (`lop3.fused`)."""
        found = lop3.fused(bitwise, s)
        if found is None:
            self.stmt(s)
            return
        x, lut, b, c = found
        self.values.used.add("tg_lop3")
        word = self.values.compute(x)
        self.line(f"{self.reg(s.dst)} = ({storage_type(s.dst.array.dtype)})"
                  f"tg_lop3<{lut:#x}u, {b:#x}u, {c:#x}u>((unsigned)({word}));")

    def _rounded_pair(self, lo: Stmt, hi: Stmt) -> bool:
        """Print two Assigns to adjacent elements (even, odd) of one f16/bf16 register
        array as one paired conversion (`ValuePrinter.store_pair`), if they are such a
        pair and the second does not read the array the first writes; True if printed.
        Same bits as two Assigns, but ptxas keeps a wgmma pipeline whose accumulator is
        rounded this way, where one-element roundings feeding bounds-checked stores made
        it wait for every wgmma (warning C7514, the README GEMM's epilogue)."""
        if not (isinstance(lo, Assign) and isinstance(hi, Assign)
                and lo.dst.array is hi.dst.array and isinstance(lo.dst.index, Const)
                and isinstance(hi.dst.index, Const) and lo.dst.index.value % 2 == 0
                and hi.dst.index.value == lo.dst.index.value + 1
                and not _reads_array(hi.value, lo.dst.array)):
            return False
        word = self.values.store_pair(lo.value, hi.value, lo.dst.array.dtype)
        if word is None:
            return False
        pair = self.temp("pair")
        self.line(f"const unsigned {pair} = {word};")
        self.line(f"{self.reg(lo.dst)} = (unsigned short)({pair} & 0xffffu);")
        self.line(f"{self.reg(hi.dst)} = (unsigned short)({pair} >> 16);")
        return True

    def global_address(self, tensor: str, index: Expr) -> tuple[str, DType]:
        """C pointer expression to element `index` of a tensor parameter, and its dtype."""
        p = self.tensors.get(tensor)
        if p is None:
            raise CodegenError(f"statement names tensor {tensor!r}, which is no parameter")
        if p.dtype.bits == 4:  # two elements per byte, element 0 in the low nibble
            return f"({tensor} + (({index_c(index)}) >> 1))", p.dtype
        return f"({tensor} + ({index_c(index)}))", p.dtype

    def shared_buffer(self, name: str) -> SharedBuffer:
        b = self.buffers.get(name)
        if b is None:
            raise CodegenError(f"statement names shared buffer {name!r}, which is not declared")
        return b

    def shared_saddr(self, b: SharedBuffer, offset: Expr) -> str:
        """32-bit shared-window address of element `offset` of buffer `b`."""
        scale = b.dtype.bits / 8
        off = index_c(offset)
        if scale == 0.5:
            return f"{b.name}_saddr + (unsigned)(({off}) >> 1)"
        return f"{b.name}_saddr + (unsigned)({off}) * {int(scale)}u"

    # ---- statements ------------------------------------------------------------------

    def stmt(self, s: Stmt) -> None:
        handler = getattr(self, f"_{type(s).__name__}", None)
        if handler is None:
            raise CodegenError(f"the CUDA emitter has no rule for {type(s).__name__}")
        handler(s)

    def _Comment(self, s: Comment) -> None:
        for text in s.text.splitlines() or [""]:
            self.line(f"// tile op: {text}")

    def _Assign(self, s: Assign) -> None:
        self.line(f"{self.reg(s.dst)} = {self.values.store(s.value, s.dst.array.dtype)};")

    def _Barrier(self, s: Barrier) -> None:
        self.line("__syncthreads();")

    def _Let(self, s: Let) -> None:
        # Coordinate bases are small: int. Wide values involve strides: 64-bit, like the
        # emitter's other stride arithmetic.
        ctype = "long long" if s.wide else "int"
        self.line(f"const {ctype} {s.var.name} = {index_c(s.value)};")

    def _For(self, s: For) -> None:
        if not isinstance(s.step, int) or s.step <= 0:  # the loop below tests `< stop`
            raise CodegenError(f"internal: loop {s.var.name} has step {s.step!r}; lowering "
                               f"gives every loop a positive constant step")
        if s.unroll:
            self.line("#pragma unroll")
        v = s.var.name
        self.line(f"for (int {v} = {index_c(s.start)}; {v} < {index_c(s.stop)}; {v} += {s.step}) {{")
        self.block(s.body)
        self.line("}")

    def _If(self, s: If) -> None:
        self.line(f"if ({index_c(s.cond)}) {{")
        self.block(s.then)
        if s.otherwise:
            self.line("} else {")
            self.block(s.otherwise)
        self.line("}")

    # ---- vector loads and stores -----------------------------------------------------

    def vector_load(self, dst: Reg, count: int, dtype: DType, ptr: str, const: bool,
                    pred: Expr | None, fill: float, what: str) -> None:
        """`count` elements at `ptr` (typed storage pointer) into dst… as one access."""
        self.check_dtype(dst, dtype, what)
        bits, ctype, fields = _access(count, dtype, what)
        qual = "const " if const else ""
        fill_bits = element_bits(fill, dtype)
        if count == 1 and dtype.bits >= 8:  # a scalar access straight into the register
            src = f"*{ptr}"
            if pred is None:
                self.line(f"{self.reg(dst)} = {src};  // {what}")
            else:
                fill_c = _from_bits(f"{fill_bits}u", dtype, 0)
                self.line(f"{self.reg(dst)} = ({index_c(pred)}) ? {src} : {fill_c};  // {what}")
            return
        tmp = self.temp("ld")
        access = f"*reinterpret_cast<{qual}{ctype}*>({ptr})"
        self.line(f"{{  // {what}: {count} x {dtype}, one {bits // 8}-byte access")
        self.depth += 1
        if pred is None:
            self.line(f"const {ctype} {tmp} = {access};")
        else:
            word_fill = self.fill_word(fill_bits, dtype, min(bits, 32))
            init = f"{{{', '.join([word_fill] * len(fields))}}}" if fields else word_fill
            self.line(f"{ctype} {tmp} = {init};")
            self.line(f"if ({index_c(pred)}) {tmp} = {access};")
        words = [f"{tmp}.{f}" for f in fields] if fields else [f"(unsigned){tmp}"]
        per_word = min(bits, 32) // dtype.bits
        for i in range(count):
            word = words[i // per_word]
            self.line(f"{self.reg(dst, i)} = {_from_bits(word, dtype, (i % per_word) * dtype.bits)};")
        self.depth -= 1
        self.line("}")

    @staticmethod
    def fill_word(fill_bits: int, dtype: DType, word_bits: int) -> str:
        value = 0
        for i in range(word_bits // dtype.bits):
            value |= fill_bits << (i * dtype.bits)
        return f"0x{value:x}u"

    def pack_words(self, src: Reg, count: int, dtype: DType) -> list[str]:
        """Unsigned word expressions holding registers src… (at most 32 bits each)."""
        bits = count * dtype.bits
        per_word = min(bits, 32) // dtype.bits
        words = []
        for w in range(count // per_word):
            parts = []
            for j in range(per_word):
                e = _bits_expr(self.reg(src, w * per_word + j), dtype)
                parts.append(f"({e} << {j * dtype.bits})" if j else e)
            words.append(" | ".join(parts) if len(parts) == 1 else f"({' | '.join(parts)})")
        return words

    def vector_store(self, src: Reg, count: int, dtype: DType, ptr: str,
                     pred: Expr | None, what: str) -> None:
        self.check_dtype(src, dtype, what)
        bits, ctype, fields = _access(count, dtype, what)
        guard = f"if ({index_c(pred)}) " if pred is not None else ""
        if count == 1 and dtype.bits >= 8:
            self.line(f"{guard}*{ptr} = {self.reg(src)};  // {what}")
            return
        words = self.pack_words(src, count, dtype)
        value = f"{ctype}{{{', '.join(words)}}}" if fields else f"({ctype}){words[0]}"
        self.line(f"// {what}: {count} x {dtype}, one {bits // 8}-byte access")
        self.line(f"{guard}*reinterpret_cast<{ctype}*>({ptr}) = {value};")

    @staticmethod
    def check_dtype(r: Reg, dtype: DType, what: str) -> None:
        if r.array.dtype.bits != dtype.bits:
            raise CodegenError(f"{what}: register array {r.array.name} holds {r.array.dtype} "
                               f"but the memory holds {dtype}")

    def _GlobalLoad(self, s: GlobalLoad) -> None:
        ptr, dtype = self.global_address(s.tensor, s.index)
        const = not self.tensors[s.tensor].writes
        self.vector_load(s.dst, s.count, dtype, ptr, const, s.pred, s.fill,
                         f"load {s.tensor}")

    def _GlobalStore(self, s: GlobalStore) -> None:
        ptr, dtype = self.global_address(s.tensor, s.index)
        if not self.tensors[s.tensor].writes:
            raise CodegenError(f"store to tensor {s.tensor!r}, whose parameter is read-only "
                               f"(TensorParam.writes is False)")
        self.vector_store(s.src, s.count, dtype, ptr, s.pred, f"store {s.tensor}")

    def _SharedLoad(self, s: SharedLoad) -> None:
        b = self.shared_buffer(s.buffer)
        ptr = self.shared_pointer(b, s.offset)
        self.vector_load(s.dst, s.count, b.dtype, ptr, True, s.pred, 0.0, f"load {b.name}")

    def _SharedStore(self, s: SharedStore) -> None:
        b = self.shared_buffer(s.buffer)
        ptr = self.shared_pointer(b, s.offset)
        self.vector_store(s.src, s.count, b.dtype, ptr, s.pred, f"store {b.name}")

    @staticmethod
    def shared_pointer(b: SharedBuffer, offset: Expr) -> str:
        if b.dtype.bits == 4:
            return f"({b.name} + (({index_c(offset)}) >> 1))"
        return f"({b.name} + ({index_c(offset)}))"

    def _LastArrivalStmt(self, s) -> None:
        from tegula.codegen.arrivals import emit_last_arrival  # tg.last_arrival
        emit_last_arrival(self, s)

    def _GlobalAtomicAdd(self, s: GlobalAtomicAdd) -> None:
        ptr, dtype = self.global_address(s.tensor, s.index)
        instr = RED_ADD.get(dtype.name)
        if instr is None:
            raise CodegenError(f"no atomic add for {dtype} (tensor {s.tensor}); the "
                               f"catalogue has red.global.add for {', '.join(RED_ADD)}")
        helper = "tg_red_add_" + ptx_type(dtype)  # ptx.py's helper around the entry
        self.check_dtype(s.src, dtype, f"atomic add {s.tensor}")
        self.used.add(helper)
        guard = f"if ({index_c(s.pred)}) " if s.pred is not None else ""
        self.line(f"{guard}{helper}({ptr}, {self.reg(s.src)});")

    # ---- asynchronous copies, ldmatrix, mma, shuffles --------------------------------

    def _CpAsync(self, s: CpAsync) -> None:
        b = self.shared_buffer(s.buffer)
        ptr, dtype = self.global_address(s.tensor, s.index)
        nbytes = s.count * dtype.bits // 8
        if nbytes not in cp_async_sizes() or dtype.bits != b.dtype.bits:
            raise CodegenError(f"cp.async of {s.count} x {dtype} into {b.name} ({b.dtype}): "
                               f"needs 4, 8 or 16 bytes of one element width")
        # The catalogue's choice: .cg (bypass L1) for 16-byte copies, .ca for smaller ones.
        instr = cp_async(nbytes)
        saddr = self.shared_saddr(b, s.offset)
        if s.pred is None:
            self.line(cp_async_asm(instr, saddr, ptr))
            return
        # src-size 0 zero-fills the destination without reading; the source pointer then
        # falls back to the tensor base so no out-of-range address is ever formed.
        self.line("{")
        self.depth += 1
        self.line(f"const bool tg_p = {index_c(s.pred)};")
        self.line(cp_async_asm(instr, saddr, f"tg_p ? {ptr} : {s.tensor}", pred="tg_p"))
        self.depth -= 1
        self.line("}")

    def _CpAsyncCommit(self, s: CpAsyncCommit) -> None:
        self.line(CP_ASYNC_COMMIT.format_asm())

    def _CpAsyncWait(self, s: CpAsyncWait) -> None:
        self.line(cp_async_wait(int(s.pending)).format_asm())

    def _LdMatrix(self, s: LdMatrix) -> None:
        if s.num not in (1, 2, 4):
            raise CodegenError(f"ldmatrix .x{s.num}: only x1, x2 and x4 exist")
        b = self.shared_buffer(s.buffer)
        instr = ldmatrix_entry(s.num, s.trans)
        for dtype in (b.dtype, s.dst.array.dtype):
            refusal = instr.operand_refusal(dtype.bits)
            if refusal is not None:
                raise CodegenError(f"ldmatrix from {b.name} ({b.dtype}) into "
                                   f"{s.dst.array.name} ({s.dst.array.dtype}): {refusal}")
        words = [self.temp("lm") for _ in range(s.num)]
        self.line("{")
        self.depth += 1
        self.line(f"unsigned {', '.join(words)};")
        self.line(instr.format_asm(d=words, addr=self.shared_saddr(b, s.offset)))
        per_word = 32 // b.dtype.bits
        self.unpack(words, [Reg(s.dst.array, s.dst.index + i)
                            for i in range(per_word * s.num)], b.dtype)
        self.depth -= 1
        self.line("}")

    def unpack(self, words: list[str], dst: list[Reg], dtype: DType) -> None:
        """Split 32-bit words into the registers `dst`, in order (low bits first)."""
        per_word = 32 // dtype.bits
        for w, word in enumerate(words):
            for j in range(per_word):
                self.line(f"{self.reg(dst[w * per_word + j])} = "
                          f"{_from_bits(word, dtype, j * dtype.bits)};")

    def _Mma(self, s: Mma) -> None:
        instr = mma_instr(s.instr)  # the catalogue entry: PTX text, counts, minimum SM
        if instr.min_cc > self.sm:
            raise CodegenError(f"{s.instr} needs sm_{instr.min_cc}, the target is {self.target}")
        for operand, regs in (("a", s.a), ("b", s.b), ("c", s.c), ("d", s.d)):
            if len(regs) != instr.values(operand):
                raise CodegenError(f"{s.instr}: operand {operand} has {len(regs)} registers, "
                                   f"the instruction takes {instr.values(operand)} per lane")
        self.line("{")
        self.depth += 1
        d, d_words = self.mma_outputs(s.d, instr)
        c = self.mma_accumulator_inputs(s.c)
        if (len(d), len(c)) != (instr.registers("d"), instr.registers("c")):
            raise CodegenError(f"{s.instr}: accumulator registers of {s.c[0].array.dtype} do "
                               f"not pack into the instruction's {instr.registers('c')}")
        self.line(instr.format_asm(d=d, a=self.mma_inputs(s.a), b=self.mma_inputs(s.b), c=c))
        if d_words:
            self.unpack(d_words, s.d, s.d[0].array.dtype)
        self.depth -= 1
        self.line("}")

    def mma_inputs(self, regs: list[Reg]) -> list[str]:
        """Operand registers packed into 32-bit words (consecutive Regs pair up)."""
        dtype = regs[0].array.dtype
        per_word = 32 // dtype.bits
        words = []
        for w in range(len(regs) // per_word):
            parts = [_bits_expr(self.reg(r), dtype) for r in regs[w * per_word:(w + 1) * per_word]]
            parts = [p if j == 0 else f"({p} << {j * dtype.bits})" for j, p in enumerate(parts)]
            words.append(parts[0] if len(parts) == 1 else f"({' | '.join(parts)})")
        return words

    def mma_accumulator_inputs(self, regs: list[Reg]) -> list[str]:
        """C's expressions: 32-bit registers themselves, 16-bit ones packed in pairs."""
        if regs[0].array.dtype.bits == 32:
            return [self.reg(r) for r in regs]
        return self.mma_inputs(regs)

    def mma_outputs(self, regs: list[Reg], instr) -> tuple[list[str], list[str]]:
        """D's lvalues; 16-bit accumulators go through temporaries to unpack after."""
        if regs[0].array.dtype.bits == 32:
            return [self.reg(r) for r in regs], []
        words = [self.temp("mma_d") for _ in range(instr.registers("d"))]
        self.line(f"unsigned {', '.join(words)};")
        return words, words

    def _Shuffle(self, s: Shuffle) -> None:
        try:
            instr = shuffle_entry(s.mode)  # the catalogue entry: PTX mode, clamp, operands
        except TegulaError:
            raise CodegenError(f"unknown shuffle mode {s.mode!r}") from None
        dtype = s.src.array.dtype
        if dtype.bits > 32 or s.dst.array.dtype.bits != dtype.bits:
            raise CodegenError(f"shuffle of {dtype} into {s.dst.array.dtype}")
        w = self.temp("sh")
        self.line("{")
        self.depth += 1
        self.line(f"unsigned {w};")
        self.line(instr.format_asm(d=w, a=_bits_expr(self.reg(s.src), dtype),
                                   b=f"(int)({index_c(s.arg)})"))
        self.line(f"{self.reg(s.dst)} = {_from_bits(w, dtype, 0)};")
        self.depth -= 1
        self.line("}")
