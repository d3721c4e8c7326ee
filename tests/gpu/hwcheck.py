"""Micro-kernels that check the instruction catalogue against the hardware.

Every builder here derives its register <-> memory mapping *from the catalogue's TV
layouts* (never from a second transcription of the PTX tables), so a wrong catalogue entry
makes the kernel compute the wrong thing on a GPU, and `tests/gpu/test_instructions.py`
fails. Two families:

* **Thread-IR kernels** (`ThreadKernel`s, printed by the CUDA emitter and executable by the
  emulator): `mma_kernel`, `ldmatrix_kernel`, `shuffle_kernel`, `cp_async_kernel`,
  `vector_kernel`. They check the catalogue's operand layouts *and* the emitter's rules
  for each statement, and the emulator must agree with the GPU on them bit for bit.
* **Raw kernels** (`RawKernel`: CUDA source whose instruction is the catalogue entry's own
  `format_asm` text, plus a signature-only ThreadKernel for the runtime's argument
  packing): `raw_mma_kernel`, `raw_matrix_kernel` (ldmatrix *and* stmatrix; the
  emulator's `StMatrix` is checked against its host model on the CPU,
  `tests/emulate/test_async_stmatrix.py`), `raw_cp_async_kernel`, `raw_shuffle_kernel`. They check the
  catalogue's PTX templates and operand groups, which the emitter does not use.

The expected results are computed on the host by the `expected_*` / `pack_*` functions from
the same catalogue tables (`tv_table`, `MatrixInstr.table`, `ShuffleInstr.source_lane`).

This is test support that sits *above* the pipeline (it builds thread IR and reads the
codegen parameter list), like `tegula.build`; nothing in `tegula.arch` imports it.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tegula.arch.catalogue import cp_async, get_mma, ldmatrix, shuffle, stmatrix
from tegula.arch.instructions import MatrixInstr, MmaInstr, tv_table
from tegula.arch.memory import cp_async_asm
from tegula.dtypes import DType, f16, i32
from tegula.layout import Layout
from tegula.lower.thread_ir import (
    TID, Assign, Barrier, Comment, Const, CpAsync, CpAsyncCommit, CpAsyncWait, Expr,
    GlobalLoad, GlobalStore, LdMatrix, Literal, Mma, Reg, RegArray, SharedBuffer, SharedLoad,
    SharedStore, Shuffle, TensorParam, ThreadKernel, Var,
)

# --------------------------------------------------------------------------------------
# TV layouts as index expressions
# --------------------------------------------------------------------------------------


def _leaves(layout: Layout) -> list[tuple[int, int]]:
    """(extent, stride) of every leaf mode of `layout`, colexicographic order."""
    flat = layout.flatten()
    shape, stride = flat.shape, flat.stride
    if isinstance(shape, int):
        return [(shape, stride)]
    return list(zip(shape, stride))


def _thread_part(mode: Layout, t):
    """The offset the thread mode of a TV layout contributes for thread `t` (an `Expr` or a
    numpy array): sum over leaves of ((t // prefix) % extent) * stride."""
    total, prefix = 0, 1
    for extent, stride in _leaves(mode):
        total = total + ((t // prefix) % extent) * stride
        prefix *= extent
    return total


def tv_exprs(tv: Layout, threads: int = 32, tid: Expr = TID) -> list[Expr]:
    """For each value v of a (thread, value) layout, the flat tile index it maps thread `tid`
    to, as an index expression. Checked against `tv_table` (the catalogue's own reading of
    the layout) for every (thread, value), so the expressions *are* the catalogue entry."""
    thread_mode, value_mode = tv[0], tv[1]
    values = tv.size // threads
    table = tv_table(tv, threads)
    lanes = np.arange(threads, dtype=np.int64)
    exprs = []
    for v in range(values):
        const = int(value_mode(v))
        got = _thread_part(thread_mode, lanes) + const
        if not np.array_equal(np.broadcast_to(got, (threads,)), table[:, v]):
            raise AssertionError(f"TV expression of {tv} disagrees with tv_table at value {v}")
        exprs.append(_thread_part(thread_mode, tid) + const)
    return exprs


# --------------------------------------------------------------------------------------
# Thread-IR kernels
# --------------------------------------------------------------------------------------

def mma_kernel(name: str) -> ThreadKernel:
    """One warp runs catalogue MMA `name` once: `d = a @ b.T + c` for a (M, K), b (N, K),
    c and d (M, N), all row-major tensors of the entry's types.

    Lane t loads A value v from a[idx % M, idx // M] with idx = a_tv(t, v) (likewise B by
    b_tv, C by c_tv), one scalar load per value, runs the instruction, and stores D value v
    to d at c_tv(t, v). Grid: 1 block."""
    instr = get_mma(name)
    m, n, _ = instr.shape_mnk
    operands = (("a", instr.a_dtype, instr.a_tv, m), ("b", instr.b_dtype, instr.b_tv, n),
                ("c", instr.c_dtype, instr.c_tv, m))
    regs = {op: RegArray(f"{op}_frag", dt, tv.size // 32) for op, dt, tv, _ in operands}
    regs["d"] = RegArray("d_frag", instr.c_dtype, instr.c_values)
    body: list = [Comment(f"fragments of {name} loaded by the catalogue's TV layouts")]

    def addr(tensor: str, idx: Expr, rows: int) -> Expr:
        return (idx % rows) * Var(f"{tensor}_stride0") + (idx // rows) * Var(f"{tensor}_stride1")

    for op, _, tv, rows in operands:
        for v, idx in enumerate(tv_exprs(tv)):
            body.append(GlobalLoad(Reg(regs[op], Const(v)), op, addr(op, idx, rows), 1))
    frag = {op: [Reg(r, Const(v)) for v in range(r.size)] for op, r in regs.items()}
    body.append(Mma(name, d=frag["d"], a=frag["a"], b=frag["b"], c=frag["c"]))
    for v, idx in enumerate(tv_exprs(instr.c_tv)):
        body.append(GlobalStore("d", addr("d", idx, m), Reg(regs["d"], Const(v)), 1))
    safe = name.replace(".", "_")
    return ThreadKernel(
        name=f"hw_{safe}", threads=32,
        params=[TensorParam("a", instr.a_dtype, 2), TensorParam("b", instr.b_dtype, 2),
                TensorParam("c", instr.c_dtype, 2),
                TensorParam("d", instr.c_dtype, 2, writes=True)],
        registers=list(regs.values()), shared=[], body=body)


def mma_reference(name: str, a: np.ndarray, b: np.ndarray, c: np.ndarray) -> np.ndarray:
    """`a @ b.T + c` in float64 (floats) or int64 (integers), before the output rounding."""
    instr = get_mma(name)
    work = np.float64 if instr.c_dtype.is_float else np.int64
    return a.astype(work) @ b.astype(work).T + c.astype(work)


def row_slot(r, rows: int):
    """Where lane-addressed row r (0 … rows-1) lives in the shared tile, in 16-byte rows:
    an odd multiplier modulo a power of two is a bijection that is not the identity, so a
    layout that ignored the lanes' addresses could not pass."""
    return (r * 5 + 3) % rows


def ldmatrix_kernel(num: int, trans: bool) -> ThreadKernel:
    """One warp: `tile` (64*num f16, from `src`) -> ldmatrix .x{num}[.trans] -> `out`.

    Lane 8j + r gives the address of row r of matrix j: 16-byte row `row_slot(8j + r)` of
    the tile. Each lane stores its 2*num registers to out[lane, :]. Expected: see
    `expected_ldmatrix`. Grid: 1 block; `src` (64*num,), `out` (32, 2*num), both f16."""
    vec = 2 * num  # elements per lane when filling the tile: 4*num bytes
    stage, frag = RegArray("stage", f16, vec), RegArray("frag", f16, vec)
    tile = SharedBuffer("tile", f16, 64 * num, 0)
    rows = 8 * num
    body = [Comment("fill the tile: lane t writes elements t*2num …"),
            GlobalLoad(Reg(stage, Const(0)), "src", TID * vec * Var("src_stride0"), vec),
            SharedStore("tile", TID * vec, Reg(stage, Const(0)), vec),
            Barrier(),
            Comment(f"ldmatrix.x{num}{'.trans' if trans else ''}, lane-addressed rows"),
            LdMatrix(Reg(frag, Const(0)), num, trans, "tile", row_slot(TID % rows, rows) * 8),
            GlobalStore("out", TID * Var("out_stride0"), Reg(frag, Const(0)), vec)]
    return ThreadKernel(
        name=f"hw_ldmatrix_x{num}{'_trans' if trans else ''}", threads=32,
        params=[TensorParam("src", f16, 1), TensorParam("out", f16, 2, writes=True)],
        registers=[stage, frag], shared=[tile], body=body)


def _matrix_coords(instr: MatrixInstr) -> tuple[np.ndarray, np.ndarray]:
    """For every (lane, value) of a matrix instruction: the tile element it touches when
    lanes address rows at `row_slot` (flat element index into the 64*num tile)."""
    table = instr.table()  # [32, 2num] -> row + 8*col + 64*matrix
    row, col, mat = table % 8, (table // 8) % 8, table // 64
    rows = 8 * instr.num
    return row_slot(8 * mat + row, rows) * 8 + col, table


def expected_ldmatrix(num: int, trans: bool, src: np.ndarray) -> np.ndarray:
    """What `ldmatrix_kernel` must write to out (32, 2*num), per the catalogue table."""
    elem, _ = _matrix_coords(ldmatrix(num, trans))
    return src.reshape(-1)[elem]


SHUFFLE_DTYPES = ("f32", "f16", "u8")


def shuffle_kernel(mode: str, arg: Expr | int, dtype: DType, threads: int = 64) -> ThreadKernel:
    """`out[t] = x[src(t)]` by one shuffle (thread-IR `mode`: xor, idx, down, up) with lane
    argument `arg` (a constant or an expression of `tid`), over two warps."""
    src, dst = RegArray("v", dtype, 1), RegArray("w", dtype, 1)
    arg = arg if isinstance(arg, Expr) else Const(arg)
    body = [GlobalLoad(Reg(src, Const(0)), "x", TID * Var("x_stride0"), 1),
            Shuffle(Reg(dst, Const(0)), Reg(src, Const(0)), mode, arg),
            GlobalStore("out", TID * Var("out_stride0"), Reg(dst, Const(0)), 1)]
    return ThreadKernel(
        name=f"hw_shfl_{mode}_{dtype.name}", threads=threads,
        params=[TensorParam("x", dtype, 1), TensorParam("out", dtype, 1, writes=True)],
        registers=[src, dst], shared=[], body=body)


def expected_shuffle(mode: str, args: np.ndarray, x: np.ndarray) -> np.ndarray:
    """`x` after the shuffle, per `ShuffleInstr.source_lane` (args: one per thread)."""
    instr = shuffle(mode)
    lane = np.arange(x.size) % 32
    warp_base = np.arange(x.size) - lane
    src = instr.source_lane(lane, np.asarray(args, dtype=np.int64))
    return x[warp_base + src]


#: A value no kernel writes by accident (the sentinel shared memory holds beforehand).
SENTINEL = 3.0


def _slot(t: Expr, threads: int) -> Expr:
    """A permutation of the threads (threads a power of two) that is not the identity."""
    return (t * 5 + 1) % threads


def slot_of(threads: int) -> np.ndarray:
    """`_slot` on the host: slot_of(n)[t] is where thread t's data lands."""
    return (np.arange(threads) * 5 + 1) % threads


def cp_async_pred(t):
    """Which threads' cp.async copies (the others zero-fill): t % 3 != 0."""
    return (t % 3).ge(1) if isinstance(t, Expr) else (t % 3) >= 1


def cp_async_kernel(dtype: DType, count: int, threads: int = 32) -> ThreadKernel:
    """cp.async of `count` elements per thread (4, 8 or 16 bytes) from x[t*count …] to
    shared slot `_slot(t)`, zero-filled where `cp_async_pred(t)` is false. Shared memory is
    first filled with SENTINEL so a missing zero-fill shows. out[t*count …] = slot t."""
    n = threads * count
    buf = SharedBuffer("buf", dtype, n, 0)
    r = RegArray("r", dtype, count)
    body = [*[Assign(Reg(r, Const(i)), Literal(SENTINEL, dtype)) for i in range(count)],
            SharedStore("buf", TID * count, Reg(r, Const(0)), count),
            Barrier(),
            CpAsync("buf", _slot(TID, threads) * count, "x", TID * count * Var("x_stride0"),
                    count, pred=cp_async_pred(TID)),
            CpAsyncCommit(), CpAsyncWait(0), Barrier(),
            SharedLoad(Reg(r, Const(0)), "buf", TID * count, count),
            GlobalStore("out", TID * count * Var("out_stride0"), Reg(r, Const(0)), count)]
    return ThreadKernel(
        name=f"hw_cp_async_{dtype.name}_x{count}", threads=threads,
        params=[TensorParam("x", dtype, 1), TensorParam("out", dtype, 1, writes=True)],
        registers=[r], shared=[buf], body=body)


def expected_cp_async(x: np.ndarray, count: int, threads: int = 32) -> np.ndarray:
    """What `cp_async_kernel` writes: slot(t) holds x's chunk t, or zeros where off."""
    chunks = x.reshape(threads, count)
    out = np.zeros_like(chunks)
    t = np.arange(threads)
    on = cp_async_pred(t)
    out[slot_of(threads)[on]] = chunks[on]
    return out.reshape(-1)


def load_pred(t):
    """Which threads' predicated loads read memory (the others get the fill): t % 5 < 3."""
    return (t % 5).lt(3) if isinstance(t, Expr) else (t % 5) < 3


def store_pred(t):
    """Which threads' predicated stores write: t % 7 >= 2."""
    return (t % 7).ge(2) if isinstance(t, Expr) else (t % 7) >= 2


#: The fill value of predicated-off global loads (representable in every type tested).
FILL = 5.0

#: (dtype name, elements per access) for every vector width 1, 2, 4, 8, 16 bytes.
VECTOR_CASES = (("u8", 1), ("i8", 2), ("f16", 1), ("u8", 4), ("f16", 2), ("f32", 1),
                ("i32", 1), ("bf16", 4), ("f32", 2), ("f8e4m3", 8), ("f16", 8), ("f32", 4),
                ("i32", 4), ("u8", 16), ("bf16", 8))


def vector_kernel(dtype: DType, count: int, space: str, threads: int = 64) -> ThreadKernel:
    """Vector accesses of `count` elements per thread, with predication.

    space "global": x[t] chunk -> load where `load_pred` (else FILL) -> store to out chunk t
    where `store_pred` (else out keeps what it held).
    space "shared": buffer filled with SENTINEL; x chunk t stored to slot `_slot(t)` where
    `store_pred`; loaded back from slot t where `load_pred` (else 0); stored to out chunk t.
    """
    r = RegArray("r", dtype, count)
    reg0 = Reg(r, Const(0))
    chunk = TID * count
    if space == "global":
        body = [GlobalLoad(reg0, "x", chunk * Var("x_stride0"), count, pred=load_pred(TID),
                           fill=FILL),
                GlobalStore("out", chunk * Var("out_stride0"), reg0, count,
                            pred=store_pred(TID))]
        shared = []
    else:
        shared = [SharedBuffer("buf", dtype, threads * count, 0)]
        body = [*[Assign(Reg(r, Const(i)), Literal(SENTINEL, dtype)) for i in range(count)],
                SharedStore("buf", chunk, reg0, count),
                Barrier(),
                GlobalLoad(reg0, "x", chunk * Var("x_stride0"), count),
                SharedStore("buf", _slot(TID, threads) * count, reg0, count,
                            pred=store_pred(TID)),
                Barrier(),
                SharedLoad(reg0, "buf", chunk, count, pred=load_pred(TID)),
                GlobalStore("out", chunk * Var("out_stride0"), reg0, count)]
    return ThreadKernel(
        name=f"hw_{space}_{dtype.name}_x{count}", threads=threads,
        params=[TensorParam("x", dtype, 1), TensorParam("out", dtype, 1, writes=True)],
        registers=[r], shared=shared, body=body)


def expected_vector(space: str, x: np.ndarray, out_before: np.ndarray, count: int,
                    fill: float, sentinel: float, threads: int = 64) -> np.ndarray:
    """What `vector_kernel` leaves in out (all arrays in one storage type; `fill` and
    `sentinel` already converted to it)."""
    t = np.arange(threads)
    chunks = x.reshape(threads, count)
    if space == "global":
        out = out_before.reshape(threads, count).copy()
        loaded = np.where(load_pred(t)[:, None], chunks, fill)
        out[store_pred(t)] = loaded[store_pred(t)]
        return out.reshape(-1)
    buf = np.full_like(chunks, sentinel)
    on = store_pred(t)
    buf[slot_of(threads)[on]] = chunks[on]
    out = np.where(load_pred(t)[:, None], buf, 0)
    return out.astype(x.dtype).reshape(-1)


# --------------------------------------------------------------------------------------
# Raw kernels from the catalogue's PTX templates
# --------------------------------------------------------------------------------------

@dataclass
class RawKernel:
    """CUDA source of one kernel and a body-less ThreadKernel giving its signature (the
    runtime packs launch arguments from it: `CompiledKernel(signature, cubin, source, …)`)."""

    signature: ThreadKernel
    source: str

    @property
    def name(self) -> str:
        return self.signature.name


def _raw(name: str, threads: int, params: list[TensorParam], body: list[str],
         shared: list[SharedBuffer] = ()) -> RawKernel:
    from tegula.codegen.params import param_list  # codegen's parameter conventions

    sig = ThreadKernel(name=name, threads=threads, params=list(params), registers=[],
                       shared=list(shared), body=[Comment("raw CUDA kernel (hwcheck)")])
    decl = ",\n    ".join(p.declaration for p in param_list(sig))
    lines = [f'extern "C" __global__ void __launch_bounds__({threads})',
             f"{name}(\n    {decl})", "{", "  const int lane = (int)threadIdx.x;"]
    if shared:
        lines += ["  extern __shared__ __align__(128) unsigned char smem[];",
                  "  const unsigned saddr = (unsigned)__cvta_generic_to_shared(smem);"]
    lines += ["  " + b for b in body] + ["}", ""]
    return RawKernel(sig, "\n".join(lines))


def pack_words(values_bits: np.ndarray, bits: int) -> np.ndarray:
    """[lanes, values] bit patterns -> [lanes, words] uint32, element 0 in the low bits
    (the catalogue's register packing convention)."""
    per = 32 // bits
    v = values_bits.astype(np.uint64).reshape(values_bits.shape[0], -1, per)
    shifts = (np.arange(per, dtype=np.uint64) * bits)
    return (v << shifts).sum(axis=2).astype(np.uint32)


def unpack_words(words: np.ndarray, bits: int) -> np.ndarray:
    """Inverse of `pack_words`: [lanes, words] uint32 -> [lanes, values] bit patterns."""
    per = 32 // bits
    w = words.astype(np.uint64)[:, :, None]
    shifts = np.arange(per, dtype=np.uint64) * bits
    return ((w >> shifts) & ((1 << bits) - 1)).reshape(words.shape[0], -1)


def raw_mma_kernel(name: str) -> RawKernel:
    """One warp runs `get_mma(name).format_asm(...)` on fragments packed on the host.

    a (32, A words), b (32, B words), c (32, C regs) and d (32, C regs), all i32 words:
    lane t's operand registers in the catalogue's register order (`fragments`).
    """
    instr = get_mma(name)
    groups = {o.name: o for o in instr.operands}
    body: list[str] = []
    exprs: dict[str, list[str]] = {}
    for op in ("a", "b", "c", "d"):
        g = groups[op]
        if g.constraint == "f":
            body.append(f"float {op}r[{g.count}];")
        else:
            body.append(f"unsigned {op}r[{g.count}];")
        exprs[op] = [f"{op}r[{i}]" for i in range(g.count)]
        if op != "d":
            for i in range(g.count):
                word = f"(unsigned){op}[lane * {op}_stride0 + {i}]"
                body.append(f"{op}r[{i}] = " + (f"__uint_as_float({word});"
                                                  if g.constraint == "f" else f"{word};"))
    body.append(instr.format_asm(**exprs))
    g = groups["d"]
    for i in range(g.count):
        val = f"__float_as_int(dr[{i}])" if g.constraint == "f" else f"(int)dr[{i}]"
        body.append(f"d[lane * d_stride0 + {i}] = {val};")
    params = [TensorParam(op, i32, 2) for op in "abc"] + [TensorParam("d", i32, 2, writes=True)]
    return _raw(f"raw_{name.replace('.', '_')}", 32, params, body)


def fragments(instr: MmaInstr, which: str, matrix_bits: np.ndarray) -> np.ndarray:
    """Pack an operand (bit patterns of A (M, K), B (N, K) or C (M, N)) into each lane's
    registers by the catalogue TV layout: [32, registers] uint32 (32-bit values: one each)."""
    m, n, _ = instr.shape_mnk
    tv = {"a": instr.a_tv, "b": instr.b_tv, "c": instr.c_tv}[which]
    rows = {"a": m, "b": n, "c": m}[which]
    dt = {"a": instr.a_dtype, "b": instr.b_dtype, "c": instr.c_dtype}[which]
    table = tv_table(tv)
    vals = matrix_bits[table % rows, table // rows]
    return pack_words(vals, dt.bits) if dt.bits < 32 else vals.astype(np.uint32)


def unfragment(instr: MmaInstr, words: np.ndarray) -> np.ndarray:
    """D's bit patterns (M, N) from each lane's registers [32, registers], by c_tv."""
    m, n, _ = instr.shape_mnk
    bits = instr.c_dtype.bits
    vals = unpack_words(words, bits) if bits < 32 else words.astype(np.uint64)
    table = tv_table(instr.c_tv)
    out = np.zeros((m, n), dtype=np.uint64)
    out[table % m, table // m] = vals
    return out


def raw_matrix_kernel(op: str, num: int, trans: bool) -> RawKernel:
    """ldmatrix or stmatrix through the catalogue's `format_asm`, lanes addressing rows at
    `row_slot`.

    ldmatrix: `src` (64*num,) i16 bits -> shared tile -> instruction -> out (32, num) words.
    stmatrix: `src` (32, num) words -> instruction -> shared tile -> out (64*num,) bits.
    Expected: `expected_raw_matrix`."""
    instr = ldmatrix(num, trans) if op == "ldmatrix" else stmatrix(num, trans)
    rows = 8 * num
    addr = f"saddr + (unsigned)(((((lane % {rows}) * 5 + 3) % {rows})) * 16)"
    words = [f"w[{i}]" for i in range(num)]
    tile = SharedBuffer("tile", f16, 64 * num, 0)
    body = [f"unsigned w[{num}];",
            "unsigned short* const tile = reinterpret_cast<unsigned short*>(smem);"]
    if op == "ldmatrix":
        body += [f"for (int i = 0; i < {2 * num}; ++i) "
                 f"tile[lane * {2 * num} + i] = src[(lane * {2 * num} + i) * src_stride0];",
                 "__syncthreads();",
                 instr.format_asm(d=words, addr=addr),
                 *[f"out[lane * out_stride0 + {i}] = (int)w[{i}];" for i in range(num)]]
        params = [TensorParam("src", f16, 1), TensorParam("out", i32, 2, writes=True)]
    else:
        body += [*[f"w[{i}] = (unsigned)src[lane * src_stride0 + {i}];" for i in range(num)],
                 instr.format_asm(addr=addr, s=words),
                 "__syncthreads();",
                 f"for (int i = 0; i < {2 * num}; ++i) "
                 f"out[(lane * {2 * num} + i) * out_stride0] = tile[lane * {2 * num} + i];"]
        params = [TensorParam("src", i32, 2), TensorParam("out", f16, 1, writes=True)]
    t = "_trans" if trans else ""
    return _raw(f"raw_{op}_x{num}{t}", 32, params, body, [tile])


def expected_raw_matrix(op: str, num: int, trans: bool, src_bits: np.ndarray) -> np.ndarray:
    """Host model of `raw_matrix_kernel` from the catalogue table (16-bit patterns in,
    the kernel's output out: words (32, num) for ldmatrix, bits (64*num,) for stmatrix)."""
    instr = ldmatrix(num, trans) if op == "ldmatrix" else stmatrix(num, trans)
    elem, _ = _matrix_coords(instr)
    if op == "ldmatrix":
        return pack_words(src_bits.reshape(-1)[elem], 16)
    lane_vals = unpack_words(src_bits.astype(np.uint32), 16)  # [32, 2num]
    out = np.zeros(64 * num, dtype=np.uint64)
    out[elem] = lane_vals
    return out


def raw_cp_async_kernel(nbytes: int, cache: str, threads: int = 32) -> RawKernel:
    """`cp_async_asm(cp_async(nbytes, cache), …)` of one chunk per thread into slot
    `_slot(t)`, predicated by `cp_async_pred` (zero-fill), over a SENTINEL-filled buffer.
    x and out are i32 words ((threads * nbytes/4,)). Expected: `expected_cp_async(x,
    nbytes // 4)` (the sentinel words of zero-filled chunks must have become 0)."""
    instr = cp_async(nbytes, cache)
    words = nbytes // 4
    buf = SharedBuffer("buf", i32, threads * words, 0)
    slot = f"((lane * 5 + 1) % {threads})"
    dst = f"saddr + (unsigned)({slot} * {nbytes})"
    src = f"(const void*)(x + lane * {words})"
    body = ["int* const buf = reinterpret_cast<int*>(smem);",
            f"for (int i = 0; i < {words}; ++i) buf[lane * {words} + i] = 0x5a5a5a5a;",
            "__syncthreads();",
            cp_async_asm(instr, dst, src, pred="lane % 3 != 0"),
            'asm volatile("cp.async.commit_group;\\n" ::: "memory");',
            'asm volatile("cp.async.wait_group 0;\\n" ::: "memory");',
            "__syncthreads();",
            f"for (int i = 0; i < {words}; ++i) out[lane * {words} + i] = buf[lane * {words} + i];"]
    params = [TensorParam("x", i32, 1), TensorParam("out", i32, 1, writes=True)]
    return _raw(f"raw_cp_async_{cache}_{nbytes}", threads, params, body, [buf])


def raw_shuffle_kernel(mode: str, threads: int = 64) -> RawKernel:
    """`shuffle(mode).format_asm(...)` (PTX mode: bfly, idx, down, up): out[t] = x[src],
    the lane argument read from `arg[t]`. All i32."""
    instr = shuffle(mode)
    body = ["unsigned d;",
            instr.format_asm(d="d", a="(unsigned)x[lane]", b="(unsigned)arg[lane]"),
            "out[lane] = (int)d;"]
    params = [TensorParam("x", i32, 1), TensorParam("arg", i32, 1),
              TensorParam("out", i32, 1, writes=True)]
    return _raw(f"raw_shfl_{instr.mode}", threads, params, body)


__all__ = [
    "tv_exprs", "mma_kernel", "mma_reference", "row_slot", "ldmatrix_kernel",
    "expected_ldmatrix", "shuffle_kernel", "expected_shuffle", "SHUFFLE_DTYPES", "SENTINEL",
    "slot_of", "cp_async_pred", "cp_async_kernel", "expected_cp_async", "load_pred",
    "store_pred", "FILL", "VECTOR_CASES", "vector_kernel", "expected_vector", "RawKernel",
    "pack_words", "unpack_words", "raw_mma_kernel", "fragments", "unfragment",
    "raw_matrix_kernel", "expected_raw_matrix", "raw_cp_async_kernel", "raw_shuffle_kernel",
]
