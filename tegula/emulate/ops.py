"""Compilers for thread-IR memory and warp statements: each returns a closure over the
block state that executes the statement for all threads at once (see machine.py)."""
from __future__ import annotations

from typing import Callable

import numpy as np

from tegula.arch import cp_async_sizes, get_mma, ldmatrix, shuffle
from tegula.arch.formats import tensor_core_nan
from tegula.arch.memory import VECTOR_BYTES, vector_refusal  # the catalogue's ld/st widths
from tegula.arch.instructions import MmaInstr
from tegula.dtypes import DType
from tegula.emulate.errors import EmulationError
from tegula.emulate.exprs import compile_expr
from tegula.emulate.global_races import tracker
from tegula.emulate.memory import bank_wavefronts, block_writer, several_writers
from tegula.emulate.state import BlockState, RegFile, lanes_doing, per_thread, write_regs
from tegula.emulate.stats import OpStats
from tegula.emulate.values import bits_dtype, from_bits, round_to, to_bits
from tegula.lower.thread_ir import (Const, CpAsync, GlobalAtomicAdd, GlobalLoad, GlobalStore,
                                    LdMatrix, Mma, SharedBuffer, SharedLoad, SharedStore, Shuffle)

Run = Callable[[BlockState], None]


class Ctx:
    """What statement compilers need from the kernel."""

    def __init__(self, regfile: RegFile, tensor_dtypes: dict[str, DType],
                 shared: dict[str, SharedBuffer]):
        self.regfile = regfile
        self.tensor_dtypes = tensor_dtypes
        self.shared = shared

    def tensor(self, name: str, what: str) -> DType:
        if name not in self.tensor_dtypes:
            raise EmulationError(f"{what}: no tensor parameter {name!r}")
        return self.tensor_dtypes[name]

    def buffer(self, name: str, what: str) -> SharedBuffer:
        if name not in self.shared:
            raise EmulationError(f"{what}: no shared buffer {name!r}")
        return self.shared[name]


def vector_bytes(dt: DType, count: int, what: str, allowed=VECTOR_BYTES) -> int:
    """Bytes one access of `count` elements moves; must be a hardware vector width."""
    refusal = vector_refusal(dt.bits, count, allowed)
    if refusal is not None:
        raise EmulationError(f"{what} ({dt}): {refusal}")
    return dt.bits * count // 8


def _check_dtype(reg_dt: DType, mem_dt: DType, what: str) -> None:
    if reg_dt != mem_dt:
        raise EmulationError(f"{what}: register type {reg_dt} differs from memory type {mem_dt}")


def values_to_bytes(vals: np.ndarray, dt: DType) -> np.ndarray:
    """[n, count] storage values -> [n, bytes] uint8 (packed nibbles for 4-bit types)."""
    bits = to_bits(vals, dt)
    if dt.is_packed:
        return (bits[:, 0::2] | (bits[:, 1::2] << 4)).astype(np.uint8)
    width = int(np.prod(bits.shape[1:], dtype=np.int64)) * bits.itemsize  # none: 0 rows
    return np.ascontiguousarray(bits).view(np.uint8).reshape(vals.shape[0], width)


def bytes_to_values(data: np.ndarray, dt: DType, count: int) -> np.ndarray:
    """[n, bytes] uint8 -> [n, count] storage values."""
    if dt.is_packed:
        out = np.empty((data.shape[0], count), dtype=np.uint8)
        out[:, 0::2], out[:, 1::2] = data & 0xF, data >> 4
        return from_bits(out, dt)
    bits = np.ascontiguousarray(data).view(bits_dtype(dt)).reshape(data.shape[0], count)
    return from_bits(bits, dt)


def _misaligned(what: str, where: str, byte_offs: np.ndarray, align: int) -> None:
    bad = byte_offs % align != 0
    if bad.any():
        raise EmulationError(f"{what}: misaligned {align}-byte access to {where}: byte "
                             f"offset {int(byte_offs[bad][0])} is not a multiple of {align}")


def _bank_stats(state: BlockState, baddr: np.ndarray, lanes: np.ndarray, nbytes: int):
    """(wavefronts, ideal) of one warp-level shared access by `lanes`."""
    full = np.zeros(state.warps * 32, dtype=np.int64)
    act = np.zeros(state.warps * 32, dtype=bool)
    full[: state.threads] = baddr
    act[: state.threads] = lanes
    return bank_wavefronts(full.reshape(-1, 32), act.reshape(-1, 32), nbytes)


# ---------------------------------------------------------------------- global

def compile_global(s: GlobalLoad | GlobalStore, ctx: Ctx, st: OpStats, what: str) -> Run:
    """GlobalLoad / GlobalStore of `count` consecutive elements per thread."""
    load = isinstance(s, GlobalLoad)
    reg = s.dst if load else s.src
    dt = ctx.tensor(s.tensor, what)
    _check_dtype(reg.array.dtype, dt, what)
    nbytes = vector_bytes(dt, s.count, what)
    locate = ctx.regfile.locator(reg, s.count, what)
    index, pred = compile_expr(s.index), (compile_expr(s.pred) if s.pred is not None else None)
    count, name, ar = s.count, s.tensor, np.arange(s.count, dtype=np.int64)
    fill = round_to(np.asarray(s.fill), dt)[()] if load else None
    bits, elem_bits = nbytes, dt.bits

    def run(state: BlockState) -> None:
        arr, col = locate(state)
        do = lanes_doing(state, pred)
        lanes = np.flatnonzero(do)
        t = state.tensors[name]
        idx = per_thread(index(state.env), state.threads)[lanes]
        offs = idx[:, None] + ar
        t.check(offs, what)
        if bits > 1:
            _misaligned(what, f"tensor {name!r}", idx * elem_bits // 8, bits)
        if load:
            if pred is not None:
                skip = state.mask & ~do
                if skip.any():
                    arr[skip, col:col + count] = fill
            if state.smem.check_races and t.races is not None:  # written: races possible
                t.races.read(t, offs, lanes[:, None], state, what)
            arr[lanes, col:col + count] = t.load(offs)
        else:
            values = arr[lanes, col:col + count]
            if state.smem.check_races:
                _one_writer_each(offs, lanes, name, what)
                tracker(t).write(t, offs, values, lanes[:, None], state, what)
            t.store(offs, values, block_writer(state.bid, state.cluster))
        st.add(state.active_warps(), len(lanes) * bits)
    return run


def _one_writer_each(offs: np.ndarray, lanes: np.ndarray, tensor: str, what: str) -> None:
    """Raise if two threads store to one element of `tensor` in the same instruction."""
    tids = np.broadcast_to(lanes[:, None], offs.shape)
    clash = several_writers(offs, tids)
    if clash is not None:
        i = int(np.flatnonzero(clash.ravel())[0])
        element = int(offs.ravel()[i])
        writers = np.unique(tids.ravel()[offs.ravel() == element])
        raise EmulationError(f"{what}: several writers in one instruction: threads "
                             f"{', '.join(map(str, writers[:4]))} all store element {element} "
                             f"of tensor {tensor!r} (replicas must be predicated off)")


def compile_atomic(s: GlobalAtomicAdd, ctx: Ctx, st: OpStats, what: str) -> Run:
    dt = ctx.tensor(s.tensor, what)
    _check_dtype(s.src.array.dtype, dt, what)
    locate = ctx.regfile.locator(s.src, 1, what)
    index, pred = compile_expr(s.index), (compile_expr(s.pred) if s.pred is not None else None)
    name = s.tensor

    def run(state: BlockState) -> None:
        arr, col = locate(state)
        lanes = np.flatnonzero(lanes_doing(state, pred))
        t = state.tensors[name]
        offs = per_thread(index(state.env), state.threads)[lanes]
        t.check(offs, what)
        if state.smem.check_races:  # adds commute with adds, not with other blocks' reads
            tracker(t).write(t, offs, arr[lanes, col], lanes, state, what, commutes=True)
        t.atomic_add(offs, arr[lanes, col])
        st.add(state.active_warps(), len(lanes) * max(1, dt.bits // 8))
    return run


# ---------------------------------------------------------------------- shared

def _shared_addrs(state: BlockState, buf: SharedBuffer, offs: np.ndarray, count: int,
                  nbytes: int, what: str) -> np.ndarray:
    """Byte addresses of element offsets `offs` (checked in range and aligned)."""
    if offs.size and (offs.min() < 0 or offs.max() + count > buf.size):
        bad = offs[(offs < 0) | (offs + count > buf.size)][0]
        raise EmulationError(f"{what}: out-of-bounds access to shared buffer {buf.name!r} "
                             f"({buf.size} elements): elements {int(bad)}..{int(bad) + count - 1}")
    baddr = buf.byte_offset + offs * buf.dtype.bits // 8
    if nbytes > 1:
        _misaligned(what, f"shared buffer {buf.name!r}", baddr, nbytes)
    return baddr


def compile_shared(s: SharedLoad | SharedStore, ctx: Ctx, st: OpStats, what: str) -> Run:
    load = isinstance(s, SharedLoad)
    reg = s.dst if load else s.src
    buf = ctx.buffer(s.buffer, what)
    dt = buf.dtype
    _check_dtype(reg.array.dtype, dt, what)
    nbytes = vector_bytes(dt, s.count, what)
    locate = ctx.regfile.locator(reg, s.count, what)
    offset, pred = compile_expr(s.offset), (compile_expr(s.pred) if s.pred is not None else None)
    count, bytes_ar = s.count, np.arange(nbytes, dtype=np.int64)

    def run(state: BlockState) -> None:
        arr, col = locate(state)
        do = lanes_doing(state, pred)
        lanes = np.flatnonzero(do)
        offs = per_thread(offset(state.env), state.threads)
        baddr = _shared_addrs(state, buf, offs[lanes], count, nbytes, what)
        addrs = baddr[:, None] + bytes_ar
        if load:
            if pred is not None:  # predicated off: the registers get 0, as the emitter writes
                skip = state.mask & ~do
                if skip.any():
                    arr[skip, col:col + count] = 0
            data = state.smem.read(addrs, lanes, what)
            arr[lanes, col:col + count] = bytes_to_values(data, dt, count)
        else:
            state.smem.write(addrs, values_to_bytes(arr[lanes, col:col + count], dt), lanes, what)
        full = np.zeros(state.threads, dtype=np.int64)
        full[lanes] = baddr
        wf, ideal = _bank_stats(state, full, do, nbytes)
        st.add(state.active_warps(), len(lanes) * nbytes, wf, ideal)
    return run


def compile_cp_async(s: CpAsync, ctx: Ctx, st: OpStats, what: str) -> Run:
    """cp.async: copies at issue; the shared bytes stay 'in flight' for the race model."""
    dt = ctx.tensor(s.tensor, what)
    buf = ctx.buffer(s.buffer, what)
    _check_dtype(buf.dtype, dt, what)
    nbytes = vector_bytes(dt, s.count, what, allowed=cp_async_sizes())
    offset, index = compile_expr(s.offset), compile_expr(s.index)
    pred = compile_expr(s.pred) if s.pred is not None else None
    count, name = s.count, s.tensor
    ar, bytes_ar = np.arange(count, dtype=np.int64), np.arange(nbytes, dtype=np.int64)

    def run(state: BlockState) -> None:
        copy = lanes_doing(state, pred)
        lanes = np.flatnonzero(state.mask)
        offs = per_thread(offset(state.env), state.threads)[lanes]
        baddr = _shared_addrs(state, buf, offs, count, nbytes, what)
        data = np.zeros((len(lanes), nbytes), dtype=np.uint8)  # src-size 0: zero fill
        sel = copy[lanes]
        if sel.any():
            t = state.tensors[name]
            idx = per_thread(index(state.env), state.threads)[lanes[sel]]
            goffs = idx[:, None] + ar
            t.check(goffs, what)
            _misaligned(what, f"tensor {name!r}", idx * dt.bits // 8, nbytes)
            if state.smem.check_races and t.races is not None:
                t.races.read(t, goffs, lanes[sel][:, None], state, what)
            data[sel] = values_to_bytes(t.load(goffs), dt)
        group = state.smem.open_group(lanes)
        state.smem.write(baddr[:, None] + bytes_ar, data, lanes, what, async_group=group)
        full = np.zeros(state.threads, dtype=np.int64)
        full[lanes] = baddr
        wf, ideal = _bank_stats(state, full, state.mask, nbytes)
        st.add(state.active_warps(), int(sel.sum()) * nbytes, wf, ideal)
    return run


# ---------------------------------------------------------------------- warp collectives

def compile_ldmatrix(s: LdMatrix, ctx: Ctx, st: OpStats, what: str) -> Run:
    """ldmatrix: lanes 8j+r address row r of matrix j; the entry's `load` says which
    lane gets which element."""
    instr = ldmatrix(s.num, s.trans)
    dt = s.dst.array.dtype
    buf = ctx.buffer(s.buffer, what)
    for dtype in (buf.dtype, dt):
        refusal = instr.operand_refusal(dtype.bits)
        if refusal is not None:
            raise EmulationError(f"{what}: ldmatrix from {buf.name} ({buf.dtype}) into "
                                 f"registers of {dt}: {refusal}")
    locate = ctx.regfile.locator(s.dst, 2 * s.num, what)
    offset, num = compile_expr(s.offset), s.num
    addr_lanes = np.arange(32) < 8 * num
    bytes_ar = np.arange(16, dtype=np.int64)

    def run(state: BlockState) -> None:
        arr, col = locate(state)
        warps = state.full_warps(what)
        offs = per_thread(offset(state.env), state.threads).reshape(-1, 32)[warps, : 8 * num]
        baddr = _shared_addrs(state, buf, offs.ravel(), 16 * 8 // buf.dtype.bits, 16, what)
        tids = (warps[:, None] * 32 + np.arange(8 * num)).ravel()
        rows = state.smem.read(baddr[:, None] + bytes_ar, tids, what)  # [W*8num, 16]
        rows = np.ascontiguousarray(rows).view(np.uint16).reshape(len(warps), num, 8, 8)
        vals = from_bits(instr.load(rows), dt)  # [W, 32, 2num], the entry's semantics
        lanes = (warps[:, None] * 32 + np.arange(32)).ravel()
        arr[lanes, col:col + 2 * num] = vals.reshape(-1, 2 * num)
        full = np.zeros((state.warps, 32), dtype=np.int64)
        full[warps, : 8 * num] = baddr.reshape(len(warps), -1)
        act = np.zeros((state.warps, 32), dtype=bool)
        act[warps] = addr_lanes
        wf, ideal = bank_wavefronts(full, act, 16)
        st.add(len(warps), len(warps) * 128 * num, wf, ideal)
    return run


def _reg_list(regs, ctx: Ctx, what: str) -> tuple:
    """Locators for a register list: ("slice", locator, n) when the registers are
    consecutive constant-indexed elements of one array (the usual fragment), else
    ("list", [locator per register])."""
    first = regs[0]
    if all(isinstance(r.index, Const) and r.array == first.array for r in regs) and \
            [r.index.value for r in regs] == list(range(first.index.value,
                                                        first.index.value + len(regs))):
        return ("slice", ctx.regfile.locator(first, len(regs), what), len(regs))
    return ("list", [ctx.regfile.locator(r, 1, what) for r in regs])


def _gather(locs: tuple, state: BlockState, lanes: np.ndarray) -> np.ndarray:
    """Values of a register list for `lanes`: [len(lanes), n]."""
    if locs[0] == "slice":
        arr, c = locs[1](state)
        return arr[lanes, c:c + locs[2]]
    return np.stack([arr[lanes, c] for arr, c in (loc(state) for loc in locs[1])], axis=1)


def _scatter(locs: tuple, state: BlockState, lanes: np.ndarray, vals: np.ndarray) -> None:
    """Write [len(lanes), n] values into a register list."""
    if locs[0] == "slice":
        arr, c = locs[1](state)
        arr[lanes, c:c + locs[2]] = vals
        return
    for v, loc in enumerate(locs[1]):
        arr, c = loc(state)
        arr[lanes, c] = vals[:, v]


def compile_mma(s: Mma, ctx: Ctx, st: OpStats, what: str) -> Run:
    """mma.sync: the lanes' A, B, C fragments go through the catalogue entry's `execute`
    (D = A·Bᵀ + C through its TV layouts), rounded to the accumulator type."""
    instr: MmaInstr = get_mma(s.instr)
    for regs, dt, nv, label in ((s.a, instr.a_dtype, instr.a_values, "a"),
                                (s.b, instr.b_dtype, instr.b_values, "b"),
                                (s.c, instr.c_dtype, instr.c_values, "c"),
                                (s.d, instr.c_dtype, instr.c_values, "d")):
        if len(regs) != nv:
            raise EmulationError(f"{what}: operand {label} has {len(regs)} registers, "
                                 f"{s.instr} takes {nv} values per lane")
        for r in regs:
            _check_dtype(r.array.dtype, dt, f"{what} operand {label}")
    la, lb = _reg_list(s.a, ctx, what), _reg_list(s.b, ctx, what)
    lc, ld = _reg_list(s.c, ctx, what), _reg_list(s.d, ctx, what)
    is_int = not instr.c_dtype.is_float
    work = np.int64 if is_int else np.float64
    cdt = instr.c_dtype

    def run(state: BlockState) -> None:
        warps = state.full_warps(what)
        nw = len(warps)
        lanes = (warps[:, None] * 32 + np.arange(32)).ravel()
        a, b, c = (_gather(loc, state, lanes).astype(work).reshape(nw, 32, -1)
                   for loc in (la, lb, lc))
        vals = instr.execute(a, b, c)  # [W, 32, Vc], the entry's semantics
        # mma.sync's entry computes in the working type; its NaN is canonical once rounded
        _scatter(ld, state, lanes, tensor_core_nan(round_to(vals.reshape(nw * 32, -1), cdt)))
        st.add(nw)
    return run


def compile_shuffle(s: Shuffle, ctx: Ctx, st: OpStats, what: str) -> Run:
    instr = shuffle(s.mode)
    for r in (s.dst, s.src):
        if r.array.dtype.bits > 32:
            raise EmulationError(f"{what}: shuffles move 32-bit values, {r.array.dtype} is wider")
    src_loc = ctx.regfile.locator(s.src, 1, what)
    dst_loc = ctx.regfile.locator(s.dst, 1, what)
    arg = compile_expr(s.arg)
    dst_dt = s.dst.array.dtype

    def run(state: BlockState) -> None:
        warps = state.full_warps(what)
        sarr, scol = src_loc(state)
        vals = sarr[:, scol].reshape(-1, 32)
        a = arg(state.env)
        if isinstance(a, np.ndarray):
            a = per_thread(a, state.threads).reshape(-1, 32)[warps]
        lane = np.broadcast_to(np.arange(32), (len(warps), 32))
        src = instr.source_lane(lane, a)
        out = np.take_along_axis(vals[warps], src, axis=1)
        darr, dcol = dst_loc(state)
        lanes = (warps[:, None] * 32 + np.arange(32)).ravel()
        darr[lanes, dcol] = round_to(out.ravel(), dst_dt)
        st.add(len(warps))
    return run


__all__ = ["Ctx", "compile_global", "compile_atomic", "compile_shared", "compile_cp_async",
           "compile_ldmatrix", "compile_mma", "compile_shuffle", "write_regs"]
