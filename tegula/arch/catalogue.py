"""Looking instructions up: by name, by target, by what they must do.

Names are the catalogue keys thread IR uses:

* MMA: ``mma.m16n8k16.f32.f16.f16.f32`` (``mma.m{M}n{N}k{K}.{d}.{a}.{b}.{c}`` in PTX type
  spelling: f32 f16 bf16 e4m3 e5m2 s8 u8 s32);
* vector accesses: ``ld.global.v4.b32``, ``st.shared.b16``, ``ld.global.u8`` … (the PTX
  mnemonic; see `tegula.arch.memory`);
* ``cp.async.cg.shared.global.16``, ``cp.async.ca.shared.global.4`` …,
  ``cp.async.commit_group``; ``cp.async.wait_group.N`` via `cp_async_wait(N)`;
* ``ldmatrix.x4``, ``ldmatrix.x2.trans``, ``stmatrix.x1`` …;
* ``shfl.sync.bfly.b32``, ``shfl.sync.idx.b32``, ``shfl.sync.down.b32``, ``shfl.sync.up.b32``;
* Hopper (`tegula.arch.wgmma`, `tegula.arch.tma`): ``wgmma.m64n128k16.f32.f16.f16`` …;
  ``tma.load.2d``, ``tma.load.2d.multicast``, ``tma.store.2d``, ``tma.reduce.add.2d``,
  ``cp.async.bulk.commit_group``,
  ``cp.async.bulk.wait_group[.read].N``, ``mbarrier.init``, ``mbarrier.arrive``,
  ``mbarrier.arrive.expect_tx``, ``mbarrier.try_wait.parity``,
  ``fence.proxy.async.shared::cta``, ``fence.mbarrier_init.release.cluster``,
  ``wgmma.fence``, ``wgmma.commit_group``, ``wgmma.wait_group.N``, ``bar.sync``,
  ``bar.arrive``, ``setmaxnreg.{inc,dec}.N``, ``elect.sync``;
* conversions and 16-bit arithmetic (`tegula.arch.convert`): ``cvt.rn.bf16.f32``,
  ``add.rn.f16x2`` …; NaN-propagating ``max.NaN.f32`` / ``min.NaN.f32`` (`tegula.arch.minmax`);
  ``lop3.b32`` with constant operands (`tegula.arch.logic`);
* special functions on the MUFU unit (`tegula.arch.special`): ``lg2.approx.f32``;
* `tg.last_arrival` (`tegula.arch.arrivals`): ``atom.acq_rel.gpu.global.inc.u32``,
  ``bar.red.or.pred``.
"""
from __future__ import annotations

from types import MappingProxyType
from typing import Mapping

from tegula.arch.arrivals import ARRIVAL_INSTRUCTIONS
from tegula.arch.convert import CONVERT_INSTRUCTIONS
from tegula.arch.instructions import Instruction, MatrixInstr, MemInstr, MmaInstr, ShuffleInstr
from tegula.arch.memory import (MATRIX_INSTRUCTIONS, MEMORY_INSTRUCTIONS, SHUFFLE_INSTRUCTIONS,
                                cp_async_wait)
from tegula.arch.logic import LOGIC_INSTRUCTIONS
from tegula.arch.minmax import MINMAX_INSTRUCTIONS
from tegula.arch.mma import MMA_INSTRUCTIONS
from tegula.arch.special import SPECIAL_INSTRUCTIONS
from tegula.arch.tma import ASYNC_INSTRUCTIONS, get_async
from tegula.arch.wgmma import WGMMA_INSTRUCTIONS
from tegula.arch.targets import Target, get_target
from tegula.dtypes import DType
from tegula.errors import TegulaError

ALL_INSTRUCTIONS: tuple[Instruction, ...] = (
    MMA_INSTRUCTIONS + MEMORY_INSTRUCTIONS + MATRIX_INSTRUCTIONS + SHUFFLE_INSTRUCTIONS
    + WGMMA_INSTRUCTIONS + ASYNC_INSTRUCTIONS + CONVERT_INSTRUCTIONS + MINMAX_INSTRUCTIONS
    + LOGIC_INSTRUCTIONS + SPECIAL_INSTRUCTIONS + ARRIVAL_INSTRUCTIONS)

_BY_NAME: Mapping[str, Instruction] = MappingProxyType({i.name: i for i in ALL_INSTRUCTIONS})
_SHUFFLE_BY_IR_MODE = {s.ir_mode: s for s in SHUFFLE_INSTRUCTIONS}


def get_instruction(name: str) -> Instruction:
    """The entry called `name` (also accepts ``cp.async.wait_group.N`` and the
    parametrised Hopper names of `tegula.arch.tma.get_async`)."""
    found = _BY_NAME.get(name)
    if found is not None:
        return found
    if name.startswith("cp.async.wait_group."):
        return cp_async_wait(int(name.rsplit(".", 1)[1]))
    if name.rpartition(".")[2].isdigit() and name.startswith(
            ("cp.async.bulk.wait_group", "wgmma.wait_group", "setmaxnreg")):
        return get_async(name)
    raise TegulaError(f"no instruction {name!r} in the catalogue")


def get_mma(name: str) -> MmaInstr:
    """The MMA entry called `name`, e.g. "mma.m16n8k16.f32.f16.f16.f32"."""
    instr = get_instruction(name)
    if not isinstance(instr, MmaInstr):
        raise TegulaError(f"{name!r} is not an MMA instruction")
    return instr


def catalogue(target: str | Target) -> list[Instruction]:
    """Every entry available on `target`, in catalogue order."""
    t = get_target(target)
    return [i for i in ALL_INSTRUCTIONS if i.available_on(t)]


def mma_for(a_dtype: DType, b_dtype: DType, acc_dtype: DType,
            target: str | Target) -> list[MmaInstr]:
    """MMA entries computing acc += a·bᵀ with these types on `target`, best first.

    "Best" = largest K first (fewer instructions and fewer operand registers moved per
    FMA for the same tile), then lowest issue cycles per FMA.
    """
    t = get_target(target)
    found = [i for i in MMA_INSTRUCTIONS
             if i.a_dtype == a_dtype and i.b_dtype == b_dtype and i.c_dtype == acc_dtype
             and i.available_on(t)]

    def key(i: MmaInstr) -> tuple:
        m, n, k = i.shape_mnk
        issue, _ = i.timing(t)
        return (-k, issue / (m * n * k), i.name)

    return sorted(found, key=key)


def mma_accumulators(a_dtype: DType, b_dtype: DType,
                     target: str | Target | None = None) -> tuple[DType, ...]:
    """Accumulator types the MMA entries (mma.sync, then wgmma) offer for operands (a, b),
    in catalogue order, on `target` (any target when None); () when no entry multiplies
    them. The language's `tg.gemm` type check reads this, so a new MMA entry is a new
    multipliable type (f32 x f32 exists only as sm_90a's tf32 wgmma)."""
    t = get_target(target) if target is not None else None
    found: list[DType] = []
    for i in MMA_INSTRUCTIONS:
        if i.a_dtype == a_dtype and i.b_dtype == b_dtype and i.c_dtype not in found \
                and (t is None or i.available_on(t)):
            found.append(i.c_dtype)
    for w in WGMMA_INSTRUCTIONS:
        if w.a_dtype == a_dtype and w.b_dtype == b_dtype and w.acc_dtype not in found \
                and (t is None or w.available_on(t)):
            found.append(w.acc_dtype)
    return tuple(found)


def vector_access(op: str, space: str, nbytes: int) -> MemInstr:
    """The ld/st entry moving `nbytes` (1, 2, 4, 8, 16) per thread; `op` "ld" or "st",
    `space` "global" or "shared"."""
    for i in MEMORY_INSTRUCTIONS:
        if i.kind == f"{op}.{space}" and i.nbytes == nbytes:
            return i
    raise TegulaError(f"no {op}.{space} of {nbytes} bytes (vector accesses are 1, 2, 4, 8 "
                      "or 16 bytes)")


def cp_async(nbytes: int, cache: str | None = None) -> MemInstr:
    """The cp.async entry for `nbytes`; `cache` "cg" (16 bytes only) or "ca"; by default
    .cg for 16 bytes (streams through L2, keeps L1 for others) and .ca otherwise."""
    cache = cache or ("cg" if nbytes == 16 else "ca")
    name = f"cp.async.{cache}.shared.global.{nbytes}"
    if name not in _BY_NAME:
        raise TegulaError(f"no cp.async.{cache} of {nbytes} bytes (.ca: 4, 8, 16; .cg: 16)")
    return _BY_NAME[name]  # type: ignore[return-value]


def cp_async_sizes(target: str | Target | None = None) -> tuple[int, ...]:
    """Bytes per lane a cp.async entry copies (available on `target`; any when None),
    ascending: what synthesis may plan as cp.async and what the emulator accepts."""
    t = get_target(target) if target is not None else None
    return tuple(sorted({i.nbytes for i in MEMORY_INSTRUCTIONS if i.kind == "cp.async"
                         and (t is None or i.available_on(t))}))


def ldmatrix(num: int, trans: bool = False) -> MatrixInstr:
    """The ldmatrix .x{num} entry (num 1, 2, 4)."""
    return get_instruction(f"ldmatrix.x{num}{'.trans' if trans else ''}")  # type: ignore


def stmatrix(num: int, trans: bool = False) -> MatrixInstr:
    """The stmatrix .x{num} entry (num 1, 2, 4; cc >= 90)."""
    return get_instruction(f"stmatrix.x{num}{'.trans' if trans else ''}")  # type: ignore


def shuffle(mode: str) -> ShuffleInstr:
    """The shuffle entry for a thread-IR mode ("xor", "idx", "down", "up") or PTX mode."""
    found = _SHUFFLE_BY_IR_MODE.get(mode) or _BY_NAME.get(f"shfl.sync.{mode}.b32")
    if found is None:
        raise TegulaError(f"no shuffle mode {mode!r} (xor, idx, down, up)")
    return found  # type: ignore[return-value]
