"""CUDA for the asynchronous thread IR (`lower/async_ir.py`): mbarriers, TMA, bulk groups,
proxy fences, wgmma with shared-memory descriptors, named barriers and warp roles.

Every PTX instruction is printed by its `tegula.arch` catalogue entry (`format_asm`; the
`mbarrier.try_wait` retry loop is part of that entry's PTX); this module only decides the
C around it — which thread issues it, the run-time part of a wgmma descriptor, the
operand fences that pin wgmma accumulators between `wgmma.fence` and `wgmma.wait_group`,
the branches of `Roles` — and refuses with a `CodegenError` what would otherwise compile
into a kernel that hangs or reads the wrong bytes: a statement the target lacks (naming
the statement and the target), a `__syncthreads` inside a role, a warpgroup-collective
role that splits a warpgroup, a barrier index past its array or an mbarrier overlapping
a buffer, a swizzled buffer off its swizzle atom, a TMA box or descriptor the entries'
rules refuse.

Shared addresses are 32-bit shared-window addresses: `smem_saddr` (one
`__cvta_generic_to_shared` of the dynamic shared memory base, which is declared
`__align__(1024)` in kernels using these statements, as 128-byte swizzle needs) plus the
buffer's or mbarrier array's byte offset.
"""
from __future__ import annotations

from types import SimpleNamespace

import numpy as np

from tegula.arch import tma as tma_entries
from tegula.arch import wgmma as wgmma_entries
from tegula.arch.smem_matrix import SWIZZLE_MODES, encode_descriptor, swizzle_atom_bytes
from tegula.arch.tma import check_tma_box, get_async
from tegula.errors import TegulaError
from tegula.lower.async_ir import (
    ASYNC_STATEMENTS, BulkCommit, BulkWait, ClusterBarrier, FenceBarrierInit, FenceProxyAsync, MBarrierArrive,
    MBarrierArray, MBarrierInit, MBarrierWait, NamedBarrier, PrefetchTensorMap, Roles,
    SmemDesc, StMatrix,
    TensorMapParam,
    TmaLoad, TmaStore, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait,
)
from tegula.lower.thread_ir import (
    _FOLD, TID, Barrier, BinOp, Const, Expr, Reg, ThreadKernel, Var, walk,
)

from tegula.codegen.expr import CodegenError, index_c
from tegula.codegen.wgmma_fences import accumulator_arrays, fenced_accumulators


def uses_async(kernel: ThreadKernel) -> bool:
    """Whether `kernel` has mbarriers or any asynchronous statement (then the dynamic shared
    memory base is aligned to 1024 bytes)."""
    return bool(kernel.mbarriers) or any(isinstance(s, ASYNC_STATEMENTS)
                                         for s in walk(kernel.body))


#: Lane 0's thread index (`__shfl_sync`, declared by the emitter where used): equal to
#: `tid` divided by any multiple of 32, and known warp-uniform to ptxas, so that
#: expressions of the warpgroup index live in uniform registers.
WARP_TID = Var("tg_warp_tid")


def descriptor_base(offset: Expr, bits: int) -> tuple[Expr, int] | None:
    """`offset` (elements of `bits` bits) as (a run-time base, a count of 16 bytes) whose
    sum it is, the base written warp-uniformly (`WARP_TID`): the gemm's k-steps then share
    one base and each adds its constant to the descriptor's start field. None where the
    base is not provably a multiple of 16 bytes (then shifting each part apart would not
    be the shifted sum) or depends on the thread index other than through its warp."""
    base, constant = _split_constant(offset)
    if (constant * bits) % 128 or (_known_multiple(base) * bits) % 128:
        return None
    uniform = _warp_uniform(base)
    return None if uniform is None else (uniform, constant * bits // 128)


def _split_constant(e: Expr) -> tuple[Expr, int]:
    """(rest, c) with e == rest + c: the constant addends of e's top-level sum."""
    if isinstance(e, Const):
        return Const(0), e.value
    if isinstance(e, BinOp) and e.op in ("+", "-"):
        (lhs, a), (rhs, b) = _split_constant(e.lhs), _split_constant(e.rhs)
        return (lhs + rhs, a + b) if e.op == "+" else (lhs - rhs, a - b)
    return e, 0


def _known_multiple(e: Expr) -> int:
    """An integer every value of `e` is a multiple of (0: e is 0; 1: nothing known)."""
    if isinstance(e, Const):
        return abs(e.value)
    if isinstance(e, BinOp) and e.op in ("+", "-"):
        return int(np.gcd(_known_multiple(e.lhs), _known_multiple(e.rhs)))
    if isinstance(e, BinOp) and e.op == "*":
        return _known_multiple(e.lhs) * _known_multiple(e.rhs)
    return 1


def _warp_uniform(e: Expr) -> Expr | None:
    """`e` with each `tid // k` (k a multiple of 32: the same for a warp's lanes) reading
    `WARP_TID`; None where `tid` appears otherwise (the value may differ between lanes)."""
    if e == TID:
        return None
    if isinstance(e, BinOp):
        if e.op in ("//", "floordiv") and e.lhs == TID and isinstance(e.rhs, Const) \
                and e.rhs.value > 0 and e.rhs.value % 32 == 0:
            return BinOp(e.op, WARP_TID, e.rhs)
        lhs, rhs = _warp_uniform(e.lhs), _warp_uniform(e.rhs)
        return None if lhs is None or rhs is None else BinOp(e.op, lhs, rhs)
    if isinstance(e, (Const, Var)):
        return e
    return None


def tensor_maps(kernel: ThreadKernel) -> dict[str, TensorMapParam]:
    return {p.name: p for p in kernel.params if isinstance(p, TensorMapParam)}


def _statement_name(s) -> str:
    return type(s).__name__


def _thread_values(e: Expr, tid: np.ndarray) -> np.ndarray | None:
    """The value of index expression `e` for every thread index in `tid` (numpy), or None
    when it reads anything but `tid` and constants."""
    if isinstance(e, Const):
        return np.full(tid.shape, e.value, dtype=np.int64)
    if isinstance(e, Var):
        return tid if e.name == "tid" else None
    if isinstance(e, BinOp) and e.op in _FOLD:
        lhs, rhs = _thread_values(e.lhs, tid), _thread_values(e.rhs, tid)
        if lhs is None or rhs is None:
            return None
        if e.op in ("//", "%") and not np.all(rhs > 0):
            return None
        return np.vectorize(_FOLD[e.op], otypes=[np.int64])(lhs, rhs)
    return None


class AsyncStatements:
    """Print rules for the `async_ir` statements; a base of the CUDA emitter (`cuda.py`),
    which provides `kernel`, `target`, `line`, `block`, `reg`, `shared_buffer`,
    `shared_saddr` and `temp`."""

    # ---- targets and entries ---------------------------------------------------------

    def entry(self, name: str, stmt):
        """The catalogue entry `name` (`tegula.arch.tma.get_async`: mbarriers, TMA, bulk
        groups, fences, named barriers, setmaxnreg, wgmma ordering) for statement `stmt`,
        checked against the target."""
        try:
            instr = get_async(name)
        except TegulaError as e:
            raise CodegenError(f"{_statement_name(stmt)}: {e}") from None
        return self.require(instr, stmt)

    def require(self, instr, stmt):
        """`instr` if the target has it (the entry's own `available_on`: wgmma and
        setmaxnreg need the arch-specific sm_90a); else a `CodegenError` naming the
        statement, the instruction and the target."""
        target = SimpleNamespace(cc=self.sm, arch_suffix="a" if self.target.endswith("a")
                                 else "")
        if not instr.available_on(target):
            raise CodegenError(
                f"{_statement_name(stmt)} ({instr.ptx}) cannot be compiled for "
                f"{self.target} (kernel {self.kernel.name}): TMA, mbarriers, bulk groups "
                f"and proxy fences need sm_90, wgmma and setmaxnreg sm_90a")
        return instr

    # ---- addresses -------------------------------------------------------------------

    def mbarrier(self, name: str, index: Expr, stmt) -> str:
        """32-bit shared address of mbarrier `name[index]`."""
        arrays = {m.name: m for m in self.kernel.mbarriers}
        array: MBarrierArray | None = arrays.get(name)
        if array is None:
            raise CodegenError(f"{_statement_name(stmt)} names mbarrier array {name!r}, which "
                               f"is not in kernel {self.kernel.name}'s mbarriers")
        if isinstance(index, Const) and not 0 <= index.value < array.count:
            raise CodegenError(f"{_statement_name(stmt)}: mbarrier {name}[{index.value}] is "
                               f"outside its {array.count} barriers")
        if isinstance(index, Const):
            return f"{name}_saddr + {8 * index.value}u" if index.value else f"{name}_saddr"
        return f"{name}_saddr + (unsigned)({index_c(index)}) * 8u"

    def check_mbarrier_placement(self, m: MBarrierArray) -> None:
        """mbarriers are 8-byte aligned and live for the whole kernel, so they may share no
        byte with a data buffer (a store there would corrupt a barrier's phase silently)."""
        if m.byte_offset % 8:
            raise CodegenError(f"mbarrier array {m.name} at byte {m.byte_offset} of shared "
                               f"memory: mbarriers are 8-byte aligned")
        for b in self.kernel.shared:
            end = b.byte_offset + b.size * b.dtype.bits // 8
            if m.byte_offset < end and b.byte_offset < m.end:
                raise CodegenError(f"mbarrier array {m.name} (bytes {m.byte_offset}.."
                                   f"{m.end - 1}) overlaps shared buffer {b.name} (bytes "
                                   f"{b.byte_offset}..{end - 1})")

    def tensor_map(self, name: str, stmt) -> TensorMapParam:
        tmap = tensor_maps(self.kernel).get(name)
        if tmap is None:
            raise CodegenError(f"{_statement_name(stmt)} names tensor map {name!r}, which is "
                               f"no TensorMapParam of kernel {self.kernel.name}")
        return tmap

    def swizzled_buffer(self, buffer: str, swizzle: int, dtype, stmt):
        """The shared buffer an async-proxy access with `swizzle` reads or writes, checked:
        element type, and (swizzled) a base aligned to the 8-row swizzle atom, since the
        hardware swizzles absolute shared addresses."""
        b = self.shared_buffer(buffer)
        if swizzle not in SWIZZLE_MODES:
            raise CodegenError(f"{_statement_name(stmt)}: swizzle {swizzle} bytes is not one "
                               f"of {SWIZZLE_MODES}")
        if dtype is not None and b.dtype.bits != dtype.bits:
            raise CodegenError(f"{_statement_name(stmt)}: shared buffer {b.name} holds "
                               f"{b.dtype}, the operation moves {dtype}")
        atom = swizzle_atom_bytes(swizzle)
        if b.byte_offset % atom:
            raise CodegenError(f"{_statement_name(stmt)}: shared buffer {b.name} starts at byte "
                               f"{b.byte_offset}, not a multiple of {atom} (the "
                               f"{swizzle or 'un'}-swizzled atom the hardware addresses)")
        return b

    def guarded(self, pred: Expr | None, text: str) -> None:
        self.line(text if pred is None else f"if ({index_c(pred)}) {text}")

    # ---- mbarriers -------------------------------------------------------------------

    def _MBarrierInit(self, s: MBarrierInit) -> None:
        if not 1 <= s.count < (1 << 20):
            raise CodegenError(f"MBarrierInit: arrival count {s.count} of {s.barrier} is "
                               f"outside 1 .. 2^20-1")
        self.guarded(s.pred, self.entry("mbarrier.init", s).format_asm(
            bar=self.mbarrier(s.barrier, s.index, s), count=f"{s.count}u"))

    def _FenceBarrierInit(self, s: FenceBarrierInit) -> None:
        self.line(self.entry("fence.mbarrier_init.release.cluster", s).format_asm())

    def _MBarrierArrive(self, s: MBarrierArrive) -> None:
        bar = self.mbarrier(s.barrier, s.index, s)
        if not 0 <= s.tx_bytes < (1 << 20):
            raise CodegenError(f"MBarrierArrive: expect-tx of {s.tx_bytes} bytes on "
                               f"{s.barrier} is outside 0 .. 2^20-1")
        if s.cta is not None:
            if s.tx_bytes:
                raise CodegenError(f"MBarrierArrive on {s.barrier} of CTA {index_c(s.cta)}: a "
                                   f"remote arrive carries no expect-tx bytes")
            self.check_cta(s.cta, s)
            text = self.entry("mbarrier.arrive.shared::cluster", s).format_asm(
                bar=bar, cta=f"(unsigned)({index_c(s.cta)})")
        elif s.tx_bytes:
            text = self.entry("mbarrier.arrive.expect_tx", s).format_asm(
                bar=bar, tx=f"{s.tx_bytes}u")
        else:
            text = self.entry("mbarrier.arrive", s).format_asm(bar=bar)
        self.guarded(s.pred, text)

    def cluster_size(self) -> int:
        x, y, z = self.kernel.cluster
        return x * y * z

    def check_cta(self, cta: Expr, stmt) -> None:
        """A constant CTA rank must be inside the kernel's cluster (a run-time one is
        lowering's to keep inside)."""
        if isinstance(cta, Const) and not 0 <= cta.value < self.cluster_size():
            raise CodegenError(f"{_statement_name(stmt)}: CTA {cta.value} is outside the "
                               f"kernel's cluster {tuple(self.kernel.cluster)}")

    def _ClusterBarrier(self, s: ClusterBarrier) -> None:
        self.line(self.entry("barrier.cluster.arrive", s).format_asm())
        self.line(self.entry("barrier.cluster.wait", s).format_asm())

    def _MBarrierWait(self, s: MBarrierWait) -> None:
        # The entry's PTX retries try_wait until the phase has completed.
        self.line(f"// wait: phase of {s.barrier}[{index_c(s.index)}] with parity "
                  f"{index_c(s.parity)}" + (" again (ends ptxas's scheduling region)"
                                            if s.repeat else ""))
        self.line(self.entry("mbarrier.try_wait.parity", s).format_asm(
            bar=self.mbarrier(s.barrier, s.index, s),
            parity=f"(unsigned)({index_c(s.parity)})"))

    # ---- TMA and bulk groups ---------------------------------------------------------

    def tma_operands(self, s: TmaLoad | TmaStore) -> tuple[TensorMapParam, dict[str, object]]:
        """The tensor map a TMA statement names and its asm operands: the buffer's shared
        address (the box checked against the map: rank, element type, swizzle atom, the
        entry's box rules), the map's generic address, the coordinates."""
        tmap = self.tensor_map(s.tensor_map, s)
        what = f"{_statement_name(s)} {s.tensor_map} <-> {s.buffer}"
        if len(s.coords) != len(tmap.dims) or len(tmap.box) != len(tmap.dims):
            raise CodegenError(f"{what}: {len(s.coords)} coordinates and a box of rank "
                               f"{len(tmap.box)} for a rank-{len(tmap.dims)} tensor map")
        b = self.swizzled_buffer(s.buffer, tmap.swizzle, tmap.dtype, s)
        start = b.byte_offset
        if isinstance(s.offset, Const):  # a run-time offset is lowering's to keep aligned
            start += s.offset.value * b.dtype.bits // 8
        try:
            check_tma_box(tmap.box, tmap.dtype, tmap.swizzle, start)
        except TegulaError as e:
            raise CodegenError(f"{what}: {e}") from None
        return tmap, {"tmap": f"reinterpret_cast<unsigned long long>(&{tmap.name})",
                      "coords": [f"(int)({index_c(c)})" for c in s.coords],
                      "smem": self.shared_saddr(b, s.offset)}

    def _TmaLoad(self, s: TmaLoad) -> None:
        tmap, ops = self.tma_operands(s)
        ops = {"dst": ops["smem"], "tmap": ops["tmap"], "coords": ops["coords"],
               "bar": self.mbarrier(s.barrier, s.barrier_index, s)}
        if s.multicast:
            # The box lands at the same offset of every CTA in the mask, each completing
            # the transaction bytes on its own barrier at the same offset.
            ctas = self.cluster_size()
            if not 0 < s.multicast < (1 << ctas):
                raise CodegenError(
                    f"TmaLoad {s.tensor_map} -> {s.buffer}: multicast mask {s.multicast:#x} "
                    f"names CTAs outside the kernel's cluster of {ctas} "
                    f"{self.kernel.cluster}")
            ops["mask"] = f"(unsigned short){s.multicast:#x}"
        instr = self.require(tma_entries.tma_load(len(tmap.dims), bool(s.multicast)), s)
        self.guarded(s.pred, instr.format_asm(**ops))

    def _TmaStore(self, s: TmaStore) -> None:
        tmap, ops = self.tma_operands(s)
        if s.reduce not in ("", "add"):
            raise CodegenError(f"TmaStore {s.tensor_map} <- {s.buffer}: no bulk reduction "
                               f"{s.reduce!r} (the catalogue has add)")
        entry = tma_entries.tma_reduce_add if s.reduce else tma_entries.tma_store
        instr = self.require(entry(len(tmap.dims)), s)
        if s.reduce and tmap.dtype != instr.dtype:
            raise CodegenError(f"TmaStore {s.tensor_map} <- {s.buffer}: the bulk add is "
                               f"issued for {instr.dtype} tensors, not {tmap.dtype}")
        self.guarded(s.pred, instr.format_asm(tmap=ops["tmap"], coords=ops["coords"],
                                              src=ops["smem"]))

    def _PrefetchTensorMap(self, s: PrefetchTensorMap) -> None:
        tmap = self.tensor_map(s.tensor_map, s)
        self.line(self.entry("prefetch.tensormap", s).format_asm(
            tmap=f"reinterpret_cast<unsigned long long>(&{tmap.name})"))

    def _BulkCommit(self, s: BulkCommit) -> None:
        self.line(self.entry("cp.async.bulk.commit_group", s).format_asm())

    def _BulkWait(self, s: BulkWait) -> None:
        read = ".read" if s.read_only else ""
        self.line(self.entry(f"cp.async.bulk.wait_group{read}.{s.pending}", s).format_asm())

    def _StMatrix(self, s: StMatrix) -> None:
        """The registers packed in pairs (element 0 low, as the fragment order says) into
        the entry's 32-bit source words."""
        from tegula.arch.catalogue import stmatrix
        if s.num not in (1, 2, 4) or len(s.src) != 2 * s.num:
            raise CodegenError(f"StMatrix .x{s.num} into {s.buffer}: {len(s.src)} registers "
                               f"(x1, x2, x4 store 2, 4, 8)")
        instr = self.require(stmatrix(s.num, s.trans), s)
        b = self.shared_buffer(s.buffer)
        for dtype in {b.dtype, *(r.array.dtype for r in s.src)}:
            refusal = instr.operand_refusal(dtype.bits)
            if refusal is not None:
                raise CodegenError(f"StMatrix into {b.name} ({b.dtype}): {refusal}")
        self.line(instr.format_asm(addr=self.shared_saddr(b, s.offset),
                                   s=self.mma_inputs(list(s.src))))

    def _FenceProxyAsync(self, s: FenceProxyAsync) -> None:
        self.line(self.entry("fence.proxy.async.shared::cta", s).format_asm())

    # ---- wgmma -----------------------------------------------------------------------

    def descriptor(self, desc: SmemDesc, dtype, s: Wgmma) -> str:
        """The 64-bit matrix descriptor as a C expression: the catalogue's encoding of every
        field but the start address (a compile-time constant), or-ed with the start
        address's field, (shared address >> 4) & 0x3FFF, computed at run time."""
        b = self.swizzled_buffer(desc.buffer, desc.swizzle, dtype, s)
        try:
            const = encode_descriptor(0, desc.leading_bytes, desc.stride_bytes, desc.swizzle)
        except TegulaError as e:
            raise CodegenError(f"Wgmma {s.instr}: descriptor of {desc.buffer}: {e}") from None
        if isinstance(desc.offset, Const):
            start = b.byte_offset + desc.offset.value * b.dtype.bits // 8
            lines = swizzle_atom_bytes(desc.swizzle) // 128 if desc.swizzle else 1
            if start % 16 or (start // 128) % lines:
                raise CodegenError(
                    f"Wgmma {s.instr}: operand in {desc.buffer} starts at shared byte {start}, "
                    f"which is not 16-byte aligned inside the first 128-byte line of its "
                    f"{desc.swizzle}-byte swizzle atom (that needs the descriptor's base "
                    f"offset, which tegula does not use)")
        split = descriptor_base(desc.offset, b.dtype.bits)
        if split is None:
            saddr = self.shared_saddr(b, desc.offset)
            return f"(0x{const:016x}ull | (unsigned long long)((({saddr}) >> 4) & 0x3FFFu))"
        # The low word's run-time part is one C expression for every k-step of a gemm (the
        # compiler computes it once, warp-uniform: in uniform registers); each wgmma adds
        # its own constant, one add. Adding to the 14-bit start field cannot carry out of
        # it (shared addresses stay below 228 KB, 0x3900 in 16-byte units), and the high
        # word is a constant.
        base, sixteens = split
        saddr = self.shared_saddr(b, base)
        high, low = const >> 32, const & 0xFFFFFFFF
        return (f"((0x{high:08x}ull << 32) | (unsigned)(0x{low:08x}u + ((({saddr}) >> 4) & "
                f"0x3FFFu) + {sixteens}u))")

    def _WgmmaFence(self, s: WgmmaFence) -> None:
        instr = self.entry("wgmma.fence", s)
        self.fence_accumulators(s, "finish writing the accumulators before wgmma.fence")
        self.line(instr.format_asm())

    def _WgmmaCommit(self, s: WgmmaCommit) -> None:
        self.line(self.entry("wgmma.commit_group", s).format_asm())

    def _WgmmaWait(self, s: WgmmaWait) -> None:
        self.line(self.entry(f"wgmma.wait_group.{s.pending}", s).format_asm())
        self.fence_accumulators(s, "no accumulator access moves above the wait")

    def fence_accumulators(self, s: WgmmaFence | WgmmaWait, why: str) -> None:
        """An empty asm reading and writing wgmma accumulator registers (CUTLASS's
        `warpgroup_fence_operand`). The wgmma asm writes them, but *when* they hold the
        result is decided by `wgmma.wait_group`, which names no register: without this,
        the C compiler may move a read of an accumulator above the wait, or a write (the
        next tile's zeroing) below `wgmma.fence` — reading or clobbering registers an
        in-flight wgmma still owns (undefined in PTX). It names only the accumulators of
        the wgmmas the fence opens, or that may be in flight at the wait
        (`wgmma_fences.py`): a named register is read there, so naming a dead one would
        keep it alive."""
        if getattr(self, "_fenced", None) is None:
            self._fenced = fenced_accumulators(self.kernel.body)
        arrays = self._fenced.get(id(s))
        if arrays is None:   # not reached by the flow: fence everything, as is safe
            arrays = self.accumulator_arrays()
        if not arrays:
            return
        self.line(f"// {why} (operand fence: {', '.join(a.name for a in arrays)})")
        for array in arrays:
            if array.dtype.bits == 16:  # packed pairs, as the wgmma reads them
                regs = [f'"+r"(*reinterpret_cast<unsigned*>(&{array.name}[{i}]))'
                        for i in range(0, array.size, 2)]
            else:
                constraint = "f" if array.dtype.name == "f32" else "r"
                regs = [f'"+{constraint}"({array.name}[{i}])' for i in range(array.size)]
            for start in range(0, len(regs), 64):
                self.line(f'asm volatile("" : {", ".join(regs[start:start + 64])} :: "memory");')

    def accumulator_arrays(self) -> list:
        """The register arrays any `Wgmma` of the kernel accumulates into (computed once)."""
        if getattr(self, "_accumulator_arrays", None) is None:
            self._accumulator_arrays = accumulator_arrays(self.kernel.body)
        return self._accumulator_arrays

    def _Wgmma(self, s: Wgmma) -> None:
        try:
            instr = wgmma_entries.get_wgmma(s.instr)
        except TegulaError as e:
            raise CodegenError(f"Wgmma: {e}") from None
        self.require(instr, s)
        if self.kernel.threads % 128:
            raise CodegenError(f"Wgmma {s.instr} in kernel {self.kernel.name} of "
                               f"{self.kernel.threads} threads: wgmma runs on whole "
                               f"warpgroups of 128 threads")
        if isinstance(s.a, SmemDesc):
            a: str | list[str] = self.descriptor(s.a, instr.a_dtype, s)
        else:
            a = self.wgmma_registers(s, list(s.a), instr.a_dtype, instr.a_values, "A")
        d = self.wgmma_registers(s, s.d, instr.acc_dtype, instr.acc_values, "accumulator")
        try:
            text = instr.format_asm(d=d, a=a, b=self.descriptor(s.b, instr.b_dtype, s),
                                    scale_d=index_c(s.scale_d), trans_a=s.trans_a,
                                    trans_b=s.trans_b)
        except TegulaError as e:
            raise CodegenError(f"Wgmma: {e}") from None
        self.line(text)

    def wgmma_registers(self, s: Wgmma, regs: list[Reg], dtype, values: int,
                        what: str) -> list[str]:
        """One C expression per 32-bit asm operand of a fragment: the register itself for
        32-bit types (an lvalue: accumulators are read-write), packed pairs otherwise
        (A operands only: packed accumulators would need unpacking after the asm)."""
        if len(regs) != values:
            raise CodegenError(f"Wgmma {s.instr}: {len(regs)} {what} registers, the "
                               f"instruction takes {values} values per thread")
        for r in regs:
            if r.array.dtype != dtype:
                raise CodegenError(f"Wgmma {s.instr}: {what} register {r.array.name} holds "
                                   f"{r.array.dtype}, the instruction needs {dtype}")
        if dtype.bits == 32:
            return [self.reg(r) for r in regs]
        if what != "A":
            return self.packed_accumulator_words(s, regs)
        return self.mma_inputs(regs)  # packed into 32-bit words, element 0 low

    def packed_accumulator_words(self, s: Wgmma, regs: list[Reg]) -> list[str]:
        """16-bit accumulators as 32-bit lvalues over their own storage: the asynchronous
        wgmma reads and writes them until its wait_group, so they cannot go through
        temporaries unpacked after the asm (as mma.sync's do). Each register pair (low half
        first) must be two neighbouring elements of one array, starting at an even index
        (the array is declared 4-byte aligned, `accumulator_alignment`)."""
        words = []
        for low, high in zip(regs[::2], regs[1::2]):
            if not (isinstance(low.index, Const) and isinstance(high.index, Const)
                    and low.array is high.array and low.index.value % 2 == 0
                    and high.index.value == low.index.value + 1):
                raise CodegenError(f"Wgmma {s.instr}: the 16-bit accumulators {self.reg(low)} "
                                   f"and {self.reg(high)} share a 32-bit register, so they must "
                                   f"be neighbours of one array at an even index")
            words.append(f"*reinterpret_cast<unsigned*>(&{self.reg(low)})")
        return words

    # ---- thread groups ---------------------------------------------------------------

    def _NamedBarrier(self, s: NamedBarrier) -> None:
        if not 1 <= s.id <= 15:
            raise CodegenError(f"NamedBarrier id {s.id}: ids are 1 to 15 (0 is "
                               f"__syncthreads)")
        if s.threads <= 0 or s.threads % 32 or s.threads > self.kernel.threads:
            raise CodegenError(f"NamedBarrier {s.id}: {s.threads} threads is not a positive "
                               f"multiple of 32 up to the block's {self.kernel.threads}")
        if s.after and not s.arrive:
            self.line(self.entry("bar.sync.after", s).format_asm(
                id=str(s.id), threads=str(s.threads), after=self.register_words_xor(s.after)))
            return
        name = "bar.arrive" if s.arrive else "bar.sync"
        self.line(self.entry(name, s).format_asm(id=str(s.id), threads=str(s.threads)))

    def register_words_xor(self, regs) -> str:
        """The xor of `regs`' 32-bit words (narrower registers packed as an mma's inputs,
        consecutive ones sharing a word): one value depending on every one of them."""
        regs = list(regs)
        dtype = regs[0].array.dtype
        if any(r.array.dtype != dtype for r in regs) or dtype.bits > 32 or \
                len(regs) % (32 // dtype.bits):
            raise CodegenError(f"NamedBarrier after: registers of one type of at most 32 "
                               f"bits filling whole words, got {[self.reg(r) for r in regs]}")
        words = self.mma_inputs(regs)
        return "(" + " ^ ".join(words) + ")"

    def _Roles(self, s: Roles) -> None:
        if not s.roles:
            raise CodegenError("Roles with no role")
        self.check_warpgroup_roles(s)
        for i, (role, cond) in enumerate(_shared_bodies_once(s.roles)):
            for inner in walk(role.body):
                if isinstance(inner, Barrier):
                    raise CodegenError(
                        f"role {role.name!r} ({role.loc or 'no source line'}) contains a "
                        f"__syncthreads (Barrier): the other roles never reach it, so the "
                        f"block would hang; roles meet at mbarriers and named barriers")
            keyword = "if" if i == 0 else "} else if"
            self.line(f"{keyword} ({index_c(cond)}) {{  // role {role.name}"
                      + (f": {role.loc}" if role.loc else ""))
            if role.max_registers is not None:
                self.depth += 1
                self.line(self.set_max_registers(role, s))
                self.depth -= 1
            self.block(role.body)
        self.line("}")

    def check_warpgroup_roles(self, s: Roles) -> None:
        """A role that sets its register budget or issues wgmmas runs warpgroup-collective
        `.sync.aligned` instructions, so it must hold whole warpgroups (128 consecutive
        threads from a multiple of 128); a split warpgroup is undefined behaviour on the
        GPU (a hang or garbage), so it is refused here where the conditions depend on
        `tid` alone (each thread runs the first role whose condition holds)."""
        tid = np.arange(self.kernel.threads)
        taken = np.zeros(self.kernel.threads, dtype=bool)
        for role in s.roles:
            cond = _thread_values(role.cond, tid)
            if cond is None:
                return  # depends on more than tid: lowering's to keep uniform
            mine = cond.astype(bool) & ~taken
            taken |= mine
            collective = role.max_registers is not None or any(
                isinstance(x, (Wgmma, WgmmaFence, WgmmaCommit, WgmmaWait))
                for x in walk(role.body))
            if not collective:
                continue
            groups = np.zeros(-(-self.kernel.threads // 128) * 128, dtype=bool)
            groups[:self.kernel.threads] = mine
            groups = groups.reshape(-1, 128)
            split = np.flatnonzero(groups.any(axis=1) & ~groups.all(axis=1))
            if split.size:
                g = int(split[0])
                raise CodegenError(
                    f"role {role.name!r} ({role.loc or 'no source line'}) holds "
                    f"{int(groups[g].sum())} of the 128 threads of warpgroup {g} (threads "
                    f"{128 * g}..{128 * g + 127}; condition {index_c(role.cond)}), but its "
                    f"setmaxnreg/wgmma are warpgroup-collective: a role must hold whole "
                    f"warpgroups")

    def set_max_registers(self, role, s: Roles) -> str:
        """`setmaxnreg.inc` when the role asks for more than the block's even share of the
        register file (what `__launch_bounds__(threads, 1)` lets ptxas allocate), `.dec`
        otherwise."""
        self.sets_registers = True  # launch bounds (threads, 1): see `register_share`
        try:
            instr = tma_entries.setmaxnreg(role.max_registers,
                                           increase=role.max_registers > self.register_share())
        except TegulaError as e:
            raise CodegenError(f"role {role.name!r} ({role.loc or 'no source line'}): "
                               f"{e}") from None
        return self.require(instr, s).format_asm()

    def register_share(self) -> int:
        """Registers per thread of one block alone on an SM (65536 / threads, a multiple
        of 8, at most 255): what ptxas allocates at most under `__launch_bounds__(threads, 1)`."""
        return tma_entries.register_share(self.kernel.threads)


def _shared_bodies_once(roles: list) -> list:
    """(role, condition) to emit: neighbouring roles with equal bodies and register budgets
    (the consumer warpgroups taking turns, `lower/warp_roles.py`) are one branch whose
    condition is theirs joined by `||` (each thread runs the first role whose condition
    holds, so the branch holds exactly their threads): the GPU runs one copy of the code."""
    merged: list = []
    for role in roles:
        prev = merged[-1][0] if merged else None
        if prev is not None and prev.body == role.body and \
                prev.max_registers == role.max_registers:
            merged[-1] = (prev, BinOp("or", merged[-1][1], role.cond))
        else:
            merged.append((role, role.cond))
    return merged
