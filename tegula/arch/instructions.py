"""Instruction catalogue entries: frozen dataclasses describing one PTX instruction each.

Every entry carries what the three consumers need:

* **synthesis / cost model**: `min_cc` (and `available_on(target)`), operand dtypes,
  alignment, `timing(target)` -> (issue cycles, latency cycles);
* **the emulator**: operand thread-value layouts as CuTe `Layout`s (`tegula.layout.Layout`,
  (thread, value) -> flat index into the operand tile, colexicographic), from which it
  derives the instruction's semantics;
* **the code generator**: the PTX text, via `format_asm`.

How the code generator emits an entry (`format_asm`)
----------------------------------------------------
Each entry has a `template` — the PTX instruction with named operand groups in braces,
e.g. ``"ld.global.v4.b32 {d}, [{addr}];"`` — and `operands`, one `AsmOperand` per group
(name, direction, register count, inline-asm constraint letter). The code generator calls

    instr.format_asm(d=["r0", "r1", "r2", "r3"], addr=["(const void*)p"])

with one C++ expression per 32-bit (or 16/64-bit, per the constraint) register of each
group, and gets a complete statement::

    asm volatile("ld.global.v4.b32 {%0, %1, %2, %3}, [%4];\\n"
                 : "=r"(r0), ... : "l"(...) : "memory");

Groups of more than one register print as ``{%i, %j, ...}``; single registers print as
``%i``, or ``{%i}`` where the operand is a PTX vector (`AsmOperand.vector`). Outputs are numbered before inputs, in `operands` order. Constraint letters are
GCC/NVCC's: ``r`` = 32-bit (uint32_t lvalue), ``h`` = 16-bit (unsigned short), ``l`` =
64-bit (a generic pointer for global addresses), ``f`` = float. Shared-memory addresses
are 32-bit shared-window addresses (``(unsigned)__cvta_generic_to_shared(ptr)``).

Entries marked `pure` (conversions) print ``asm(...)`` without ``volatile``.

Predication: `format_asm(..., pred="cond")` wraps the instruction as
``{ .reg .pred p; setp.ne.b32 p, %k, 0; @p <instr> }`` with `cond` as an extra "r" input;
output registers become read-write ("+r") so the values the generated code placed in them
beforehand (the fill value) survive where the predicate is false. `cp.async` instead
zero-fills through its src-size operand (`format_asm(..., pred=...)` does that for you).

Register packing of values: operands narrower than 32 bits are packed into .b32 registers,
element 0 in the low half (`values_per_reg`); the value order of a TV layout is the
element order across the register list (register 0 low, register 0 high, register 1 low…).
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np

from tegula.dtypes import DType
from tegula.errors import TegulaError
from tegula.layout import Layout
from tegula.layout.algebra import coalesce


@dataclass(frozen=True)
class AsmOperand:
    """One operand group of an inline-asm statement.

    `direction` is "out" or "in"; `count` the number of registers in the group;
    `constraint` the inline-asm letter (r, h, l, f); `name` the placeholder in `template`.
    `vector`: the PTX operand is a vector expression, braced even with one register
    (mma's operands, ldmatrix's destination and stmatrix's source: `{%0}`, which ptxas
    requires; a bare `%0` there is "Vector expected").
    """

    name: str
    direction: str
    count: int
    constraint: str
    vector: bool = False


@dataclass(frozen=True)
class Instruction:
    """Fields common to every catalogue entry.

    `name` is the catalogue key (what thread IR statements name); `kind` the family
    ("mma", "ld.global", "st.global", "ld.shared", "st.shared", "cp.async", "ldmatrix",
    "stmatrix", "shfl", "cp.async.commit", "cp.async.wait"); `ptx` the PTX mnemonic with all
    modifiers; `issue_cycles` / `latency_cycles` are default timing numbers (see
    `timing`); `source` says where the numbers come from. `pipe` is the SM unit the
    instruction occupies, the resource the cost model charges it to: "tensor" (MMA),
    "shared" (ld/st.shared, ldmatrix/stmatrix: the 128 B/clk shared-memory pipe),
    "global" (ld/st.global, cp.async), "tma", "alu" (shuffles and other ALU work), "sfu"
    (the special-function unit's rate: conversions between f32 and s32) or "sync"
    (barriers, fences, group commit/wait).
    """

    name: str
    kind: str
    ptx: str
    template: str
    operands: tuple[AsmOperand, ...]
    min_cc: int = 80
    issue_cycles: float = 1.0
    latency_cycles: float = 1.0
    align_bytes: int = 1
    clobbers_memory: bool = False
    source: str = ""
    pipe: str = "alu"
    #: The instruction only computes its outputs from its inputs (no memory, no other
    #: effect): printed as plain `asm(...)`, which the compiler may move, merge or drop
    #: like arithmetic (conversions); every other entry prints `asm volatile(...)`.
    pure: bool = False

    def available_on(self, target) -> bool:
        """True when `target` (a `Target`) supports the instruction."""
        return target.cc >= self.min_cc

    def timing(self, target) -> tuple[float, float]:
        """(issue cycles per warp instruction on one SM sub-partition, latency cycles)."""
        return float(self.issue_cycles), float(self.latency_cycles)

    def operand_refusal(self, elem_bits: int, count: int = 1) -> str | None:
        """Why `count` elements of `elem_bits` bits per thread are not what this entry
        moves, or None where they are. The one operand predicate synthesis, the emitter
        and the emulator ask (each puts it in its own error, naming the statement)."""
        return None

    def accepts(self, elem_bits: int, count: int = 1) -> bool:
        """Whether `count` elements of `elem_bits` bits per thread are this entry's
        operand (`operand_refusal` says why not)."""
        return self.operand_refusal(elem_bits, count) is None

    def throughput(self, target) -> float:
        """Instructions per clock one whole SM sustains when this entry's pipe is the
        limit: each of the target's sub-partitions accepts one every `timing` issue
        cycles. (Derived, not stored: a second number would drift from the issue cycles.)
        Entries whose issue cycles are already per SM (wgmma) override it."""
        issue, _ = self.timing(target)
        return target.subpartitions / issue if issue else float("inf")

    # ------------------------------------------------------------------ code generation

    def asm_order(self) -> list[AsmOperand]:
        """Operand groups in inline-asm numbering order: outputs, then inputs."""
        return [o for o in self.operands if o.direction == "out"] + \
               [o for o in self.operands if o.direction == "in"]

    def asm_text(self) -> str:
        """The PTX statement with operands numbered %0, %1, … in `asm_order` (the string
        inside `asm("…")`, without the trailing newline escape)."""
        placeholders: dict[str, str] = {}
        index = 0
        for op in self.asm_order():
            nums = [f"%{index + i}" for i in range(op.count)]
            index += op.count
            braced = op.count > 1 or op.vector
            placeholders[op.name] = "{" + ", ".join(nums) + "}" if braced else nums[0]
        return self.template.format(**placeholders)

    def registers(self, group: str) -> int:
        """How many registers the asm operand group `group` takes."""
        for op in self.operands:
            if op.name == group:
                return op.count
        raise TegulaError(f"{self.name}: no operand group {group!r}")

    def format_asm(self, pred: str | None = None, **groups: Sequence[str] | str) -> str:
        """A complete `asm volatile(...)` statement with C++ operand expressions filled in.

        `groups` maps each operand group name to its register expressions (a string is
        taken as a one-register group). See the module docstring for the conventions.
        """
        outs: list[str] = []
        ins: list[str] = []
        for op in self.asm_order():
            exprs = groups.get(op.name)
            if exprs is None:
                raise TegulaError(f"{self.name}: operand group {op.name!r} missing")
            exprs = [exprs] if isinstance(exprs, str) else list(exprs)
            if len(exprs) != op.count:
                raise TegulaError(f"{self.name}: operand group {op.name!r} needs {op.count} "
                                  f"register(s), got {len(exprs)}")
            if op.direction == "out":
                mode = "+" if pred is not None else "="
                outs += [f'"{mode}{op.constraint}"({e})' for e in exprs]
            else:
                ins += [f'"{op.constraint}"({e})' for e in exprs]
        extra = set(groups) - {o.name for o in self.operands}
        if extra:
            raise TegulaError(f"{self.name}: unknown operand group(s) {sorted(extra)}")
        text = self.asm_text()
        if pred is not None:
            index = sum(o.count for o in self.operands)
            ins.append(f'"r"((int)({pred}))')
            text = ("{ .reg .pred p; setp.ne.b32 p, %" + str(index) + ", 0; @p " + text + " }")
        clob = ' : "memory"' if self.clobbers_memory else ""
        asm = "asm" if self.pure else "asm volatile"
        return f'{asm}("{text}\\n" : {", ".join(outs)} : {", ".join(ins)}{clob});'


def tv_table(layout: Layout, threads: int = 32) -> np.ndarray:
    """A TV layout as an int64 array [threads, values] of flat tile indices."""
    flat = np.asarray(layout.all_offsets(), dtype=np.int64)
    values = flat.size // threads
    # all_offsets enumerates the flat (t, v) index t + threads*v, so v is the slow axis.
    table = flat.reshape(values, threads).T.copy()
    table.setflags(write=False)
    return table


@dataclass(frozen=True)
class MmaInstr(Instruction):
    """A warp-wide `mma.sync.aligned` D = A·Bᵀ + C on an (M, N, K) tile.

    TV layouts (32 lanes, values in PTX register element order) -> flat index into:
      `a_tv`: A as (M, K), index m + M*k;   `b_tv`: B as (N, K), index n + N*k;
      `c_tv`: C and D as (M, N), index m + M*n.
    `operand_class` selects the target's tensor throughput ("f16" or "8bit").
    """

    shape_mnk: tuple[int, int, int] = (16, 8, 16)
    a_dtype: DType | None = None
    b_dtype: DType | None = None
    c_dtype: DType | None = None
    a_tv: Layout | None = None
    b_tv: Layout | None = None
    c_tv: Layout | None = None
    operand_class: str = "f16"

    @property
    def d_dtype(self) -> DType:
        return self.c_dtype

    @property
    def a_values(self) -> int:
        return self.a_tv.size // 32

    @property
    def b_values(self) -> int:
        return self.b_tv.size // 32

    @property
    def c_values(self) -> int:
        return self.c_tv.size // 32

    def values(self, which: str) -> int:
        """Values of operand `which` ("a", "b", "c", "d") one lane holds."""
        return {"a": self.a_values, "b": self.b_values, "c": self.c_values,
                "d": self.c_values}[which]

    def values_per_reg(self, which: str) -> int:
        """How many values of operand `which` ("a", "b", "c", "d") share a .b32 register."""
        dt = {"a": self.a_dtype, "b": self.b_dtype, "c": self.c_dtype, "d": self.c_dtype}[which]
        return 32 // dt.bits

    def tables(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(a, b, c) TV layouts as int64 [32, values] arrays (cached)."""
        cached = _TABLE_CACHE.get(self.name)
        if cached is None:
            cached = (tv_table(self.a_tv), tv_table(self.b_tv), tv_table(self.c_tv))
            _TABLE_CACHE[self.name] = cached
        return cached

    @property
    def flops(self) -> int:
        m, n, k = self.shape_mnk
        return 2 * m * n * k

    def execute(self, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
        """What the instruction computes (the emulator's semantics of the entry): the
        per-lane fragments of W warps (a [W, 32, a_values], b and c likewise, in the
        caller's working type, float64 or int64) placed through the TV layouts, and D's
        fragments [W, 32, c_values] = A·Bᵀ + C read back through `c_tv`. The caller
        rounds D to the accumulator type."""
        m, n, k = self.shape_mnk
        ta, tb, tc = self.tables()
        nw = a.shape[0]
        full_a = np.zeros((nw, m * k), dtype=a.dtype)
        full_b = np.zeros((nw, n * k), dtype=b.dtype)
        full_c = np.zeros((nw, m * n), dtype=c.dtype)
        full_a[:, ta.ravel()] = a.reshape(nw, -1)
        full_b[:, tb.ravel()] = b.reshape(nw, -1)
        full_c[:, tc.ravel()] = c.reshape(nw, -1)
        # index m + M*k -> [w, k, m]; n + N*k -> [w, k, n]; C: m + M*n -> [w, n, m]
        d = np.einsum("wkm,wkn->wnm", full_a.reshape(nw, k, m), full_b.reshape(nw, k, n)) \
            + full_c.reshape(nw, n, m)
        return d.reshape(nw, m * n)[:, tc]

    def timing(self, target) -> tuple[float, float]:
        """Issue cycles = M*N*K FMAs at a quarter of the SM's tensor rate (one tensor core
        per sub-partition); latency is the measured number stored in the entry."""
        rate = target.tensor_rate(self.operand_class) / 4
        m, n, k = self.shape_mnk
        issue = m * n * k / rate if rate else float("inf")
        return issue, float(self.latency_cycles)


_TABLE_CACHE: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


@dataclass(frozen=True)
class MemInstr(Instruction):
    """A per-thread vector load or store of `nbytes` bytes (ld/st .global/.shared), or one
    `cp.async` of `nbytes` bytes. `space` is "global" or "shared" ("global->shared" for
    cp.async); addresses must be aligned to `align_bytes` (= the access size).
    `cache` is "ca"/"cg" for cp.async."""

    space: str = "global"
    nbytes: int = 4
    cache: str = ""

    @property
    def regs(self) -> int:
        """Number of .b32 registers the access moves (1 for 1- and 2-byte accesses)."""
        return max(1, self.nbytes // 4)

    def operand_refusal(self, elem_bits: int, count: int = 1) -> str | None:
        """A vector access moves exactly `nbytes` per thread."""
        if elem_bits * count != 8 * self.nbytes:
            return (f"{self.name} moves {self.nbytes} bytes per thread, not {count} x "
                    f"{elem_bits}-bit elements")
        return None


@dataclass(frozen=True)
class MatrixInstr(Instruction):
    """`ldmatrix` / `stmatrix` `.m8n8.x{num}[.trans].shared.b16`.

    `tv`: (32 lanes, 2*num values) -> flat index into `num` 8x8 matrices of b16,
    index = row + 8*col + 64*matrix, where *row* is the row a lane addressed (the 16
    contiguous bytes at one lane's address) and *col* the element within it. Value 2j+v of
    a lane belongs to matrix j (register j of the instruction, element v of it).
    Addresses: lane 8j + r supplies the address of row r of matrix j, for lanes
    0 … 8*num-1 (`address_lanes`); each address must be 16-byte aligned.

    Synthesis and lowering ask the inverse question — which lane and register receive a
    given element (`holder`), and which hold the start of the row a lane addresses
    (`row_holder`) — and both answers are read off `tv`, never written out again.
    """

    num: int = 1
    trans: bool = False
    tv: Layout | None = None

    #: Registers of a lane per matrix: value 2j + v belongs to matrix j.
    VALUES_PER_MATRIX = 2

    @property
    def address_lanes(self) -> int:
        return 8 * self.num

    def operand_refusal(self, elem_bits: int, count: int = 1) -> str | None:
        """ldmatrix/stmatrix move .b16 elements: a lane's register holds two of them in
        the fragment order `tv` states; other widths would need other fragments."""
        if elem_bits != 16:
            return f"{self.kind} moves 16-bit elements (.b16), not {elem_bits}-bit ones"
        return None

    def holder(self, matrix: int, row: int, col: int) -> tuple[int, int]:
        """(lane, value) that receives element `col` of row `row` (the 16 bytes one lane
        addresses) of matrix `matrix`, by the entry's TV layout."""
        try:
            return self._holders()[(matrix, row, col)]
        except KeyError:
            raise TegulaError(f"{self.name}: no element (matrix {matrix}, row {row}, col "
                              f"{col}); it moves {self.num} 8x8 matrices") from None

    def row_holder(self, lane):
        """(holder lane, holder value) of the first element of the row that address lane
        `lane` (8j + r: row r of matrix j) supplies. `lane` may be an int, a numpy array
        or a symbolic index expression of the thread IR: the answer is computed with
        // % * + only, from layouts fitted to `tv` (lane(r), value(r) over the bits of r,
        then + 2j), so lowering can print it as an address computation."""
        lane_of_row, value_of_row = self._row_layouts()
        matrix, row = lane // 8, lane % 8
        return lane_of_row(row), matrix * self.VALUES_PER_MATRIX + value_of_row(row)

    def _holders(self) -> dict:
        cached = _HOLDER_CACHE.get(self.name)
        if cached is None:
            table = self.table()  # [lane, value] -> row + 8*col + 64*matrix
            cached = {}
            for lane in range(table.shape[0]):
                for value in range(table.shape[1]):
                    index = int(table[lane, value])
                    cached[(index // 64, index % 8, (index // 8) % 8)] = (lane, value)
            _HOLDER_CACHE[self.name] = cached
        return cached

    def _row_layouts(self) -> tuple[Layout, Layout]:
        """Layouts row -> holder lane and row -> holder value (within matrix 0) of each
        row's first element, fitted to the TV layout (the map is linear in r's bits)."""
        holders = [self.holder(0, r, 0) for r in range(8)]
        return (_fit_bit_linear([lane for lane, _ in holders], self.name),
                _fit_bit_linear([value for _, value in holders], self.name))

    def load(self, rows: np.ndarray) -> np.ndarray:
        """What an ldmatrix delivers (the emulator's semantics of the entry): the 16-bit
        elements of the rows the lanes addressed, rows[w, j, r, c] = column c of row r of
        matrix j in warp w, -> each lane's registers [W, 32, 2*num] through `tv`."""
        w = rows.shape[0]
        mats = rows.transpose(0, 1, 3, 2).reshape(w, 64 * self.num)  # [w, r + 8c + 64j]
        return mats[:, self.table()]

    def store(self, values: np.ndarray) -> np.ndarray:
        """What an stmatrix writes (the inverse of `load`): each lane's registers
        [W, 32, 2*num] through `tv` -> rows[w, j, r, c], column c of the row r of matrix j
        that lane 8j + r addressed."""
        w = values.shape[0]
        mats = np.zeros((w, 64 * self.num), dtype=values.dtype)
        mats[:, self.table()] = values                              # [w, r + 8c + 64j]
        return mats.reshape(w, self.num, 8, 8).transpose(0, 1, 3, 2)

    def table(self) -> np.ndarray:
        key = self.name
        cached = _MATRIX_CACHE.get(key)
        if cached is None:
            cached = tv_table(self.tv)
            _MATRIX_CACHE[key] = cached
        return cached


_MATRIX_CACHE: dict[str, np.ndarray] = {}
_HOLDER_CACHE: dict[str, dict] = {}


def _fit_bit_linear(values: list[int], what: str) -> Layout:
    """The coalesced layout L over (2, 2, …) with L(i) = values[i] for every i, where the
    values are a sum of one stride per set bit of i (a CuTe layout of power-of-two modes);
    refused where they are not."""
    bits = len(values).bit_length() - 1
    strides = tuple(values[1 << b] - values[0] for b in range(bits))
    layout = coalesce(Layout((2,) * bits, strides))
    if values[0] != 0 or [layout(i) for i in range(len(values))] != list(values):
        raise TegulaError(f"{what}: the ldmatrix row holders {values} are not a layout of "
                          f"the row's bits")
    return layout


@dataclass(frozen=True)
class ShuffleInstr(Instruction):
    """`shfl.sync.{mode}.b32` with the full member mask. `mode` is the PTX mode
    (bfly, idx, down, up) and `ir_mode` the thread-IR spelling (xor, idx, down, up);
    `clamp` the c operand (0x1f for bfly/idx/down, 0 for up: whole-warp segments)."""

    mode: str = "bfly"
    ir_mode: str = "xor"
    clamp: int = 0x1F

    def source_lane(self, lane: np.ndarray, arg) -> np.ndarray:
        """The lane each lane reads (its own lane where the source is out of range).

        Every mode uses only the low five bits of the lane argument (PTX: `bval = b[4:0]`;
        seen on an H200: bfly with 33 reads lane ^ 1, not the own lane)."""
        lane = np.asarray(lane, dtype=np.int64)
        arg = np.asarray(arg, dtype=np.int64) & 31
        if self.mode == "bfly":
            src = lane ^ arg
        elif self.mode == "idx":
            src = np.broadcast_to(arg, lane.shape)
        elif self.mode == "down":
            src = lane + arg
        else:
            src = lane - arg
        return np.where((src >= 0) & (src < 32), src, lane)


def template_groups(template: str) -> set[str]:
    """The operand group names a template refers to (for consistency checks)."""
    return set(re.findall(r"\{(\w+)\}", template))


PTX_TYPE: Mapping[str, str] = {
    "f32": "f32", "f16": "f16", "bf16": "bf16", "f8e4m3": "e4m3", "f8e5m2": "e5m2",
    "i8": "s8", "u8": "u8", "i32": "s32",
}


def ptx_type(dtype: DType) -> str:
    """The PTX spelling of an element type (f16, bf16, e4m3, s8, s32, ...)."""
    try:
        return PTX_TYPE[dtype.name]
    except KeyError:
        raise TegulaError(f"{dtype} has no PTX matrix-operand spelling") from None
