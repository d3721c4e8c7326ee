"""The per-block execution state and small helpers shared by the statement compilers."""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from tegula.emulate.errors import EmulationError
from tegula.emulate.exprs import compile_expr
from tegula.emulate.memory import GlobalTensor, SharedMemory
from tegula.emulate.values import storage_dtype
from tegula.lower.thread_ir import Const, Reg, RegArray


class BlockState:
    """Everything one block's execution reads and writes.

    `mask` is the active-thread mask (bool [threads]); `full` says it is all True (the
    fast path). `loops` is the stack of (loop variable, current value) and `comment` the
    last thread-IR `Comment` seen — both only for error messages. `asyncs` is the block's
    `async_state.AsyncState` (None for kernels without asynchronous statements); `task`
    the `roles.RoleTask` this state runs (None outside `Roles`): each role has its own
    state (`for_role`) sharing registers, memory and `asyncs` with the block's. In a
    launch with clusters, `cluster` holds the blocks of this one's cluster (`rank` its
    place there) and `block_task` the coroutine the block runs as among them.
    """

    __slots__ = ("env", "regs", "mask", "full", "smem", "threads", "warps", "tid", "tensors",
                 "loops", "comment", "bid", "lane", "padded", "asyncs", "task", "cluster",
                 "rank", "block_task")

    def __init__(self, threads: int, env: dict, regs: dict[str, np.ndarray], smem: SharedMemory,
                 tensors: dict[str, GlobalTensor], bid: tuple[int, int, int]):
        self.threads = threads
        self.warps = -(-threads // 32)
        self.padded = self.warps * 32 != threads
        self.env = env
        self.regs = regs
        self.mask = np.ones(threads, dtype=bool)
        self.full = True
        self.smem = smem
        self.tid = np.arange(threads, dtype=np.int64)
        self.lane = self.tid % 32
        self.tensors = tensors
        self.loops: list[list[Any]] = []
        self.comment = ""
        self.bid = bid
        self.asyncs = None
        self.task = None
        self.cluster = None     # roles.Cluster of a clustered launch: the peer blocks
        self.rank = 0           # the block's rank in its cluster (%cluster_ctarank)
        self.block_task = None  # the RoleTask running this block among its cluster's

    def for_role(self, mask: np.ndarray) -> "BlockState":
        """A state for one role: the threads of `mask`, its own variables and loop stack,
        the block's registers, memory and asynchronous state."""
        role = BlockState(self.threads, dict(self.env), self.regs, self.smem, self.tensors,
                          self.bid)
        role.mask, role.full = mask, bool(mask.all())
        role.loops = [list(frame) for frame in self.loops]
        role.comment, role.asyncs = self.comment, self.asyncs
        role.cluster, role.rank = self.cluster, self.rank
        return role

    def where(self) -> str:
        """Where execution is, for error messages."""
        parts = [f"block {self.bid}"]
        if self.task is not None:
            parts.append(self.task.label())
        if self.loops:
            parts.append(", ".join(f"{n}={v}" for n, v in self.loops))
        if self.comment:
            parts.append(f"implementing: {self.comment}")
        return "; ".join(parts)

    def warp_any(self, lanes: np.ndarray) -> np.ndarray:
        """bool [warps]: which warps have a True lane in `lanes` (bool [threads])."""
        if self.padded:
            lanes = np.concatenate([lanes, np.zeros(self.warps * 32 - self.threads, dtype=bool)])
        return lanes.reshape(self.warps, 32).any(axis=1)

    def active_warps(self) -> int:
        """Number of warps with an active thread (the warp-level instruction count)."""
        if self.full:
            return self.warps
        return int(np.count_nonzero(self.warp_any(self.mask)))

    def full_warps(self, what: str) -> np.ndarray:
        """Indices of the warps executing a warp-collective instruction; each must be
        entirely active (shfl.sync/mma.sync/ldmatrix with the full member mask)."""
        if self.padded:
            raise EmulationError(f"{what}: warp-collective instruction in a block of "
                                 f"{self.threads} threads (not a multiple of 32)")
        if self.full:
            return np.arange(self.warps)
        m = self.mask.reshape(self.warps, 32)
        anyw, allw = m.any(axis=1), m.all(axis=1)
        if (anyw & ~allw).any():
            w = int(np.flatnonzero(anyw & ~allw)[0])
            raise EmulationError(f"{what}: warp {w} executes a warp-collective instruction "
                                 "with only part of its lanes active (divergent)")
        return np.flatnonzero(anyw)


def uniform_int(value: Any, state: BlockState, what: str) -> int:
    """A block-uniform integer from an evaluated expression (error if it varies)."""
    if isinstance(value, np.ndarray):
        vals = value if state.full else value[np.broadcast_to(state.mask, value.shape)]
        if vals.size == 0:
            return 0
        first = vals.flat[0]
        if not (vals == first).all():
            raise EmulationError(f"{what}: expected a block-uniform value, but it differs "
                                 f"between threads ({int(vals.min())}..{int(vals.max())})")
        return int(first)
    return int(value)


def per_thread(value: Any, threads: int) -> np.ndarray:
    """An evaluated expression as an int64 array [threads]."""
    if isinstance(value, np.ndarray) and value.shape == (threads,):
        return value.astype(np.int64, copy=False)
    return np.broadcast_to(np.asarray(value, dtype=np.int64), (threads,))


def lanes_doing(state: BlockState, pred_fn: Callable | None) -> np.ndarray:
    """bool [threads]: active threads whose predicate holds."""
    if pred_fn is None:
        return state.mask
    p = pred_fn(state.env)
    if isinstance(p, np.ndarray):
        return state.mask & p.astype(bool)
    return state.mask if p else np.zeros(state.threads, dtype=bool)


class RegFile:
    """Register arrays by name: their declarations and compiled locators."""

    def __init__(self, declared: list[RegArray]):
        self.arrays: dict[str, RegArray] = {}
        for r in declared:
            self.add(r)
        # Register arrays some wgmma writes asynchronously (`async_ir.Wgmma.d`) or reads as
        # its A fragment: accesses to them by other statements are checked (busy
        # accumulators, the wgmma.fence rule). Set before statements are compiled.
        self.wgmma_arrays: frozenset[str] = frozenset()

    def add(self, array: RegArray) -> None:
        old = self.arrays.get(array.name)
        if old is not None and old != array:
            raise EmulationError(f"register array {array.name!r} declared twice differently: "
                                 f"{old} and {array}")
        self.arrays[array.name] = array

    def allocate(self, threads: int) -> dict[str, np.ndarray]:
        """Fresh registers for a block: floats start as NaN so that reading an unwritten
        register shows up in the results; integers start as 0."""
        regs = {}
        for name, a in self.arrays.items():
            st = storage_dtype(a.dtype)
            fill = np.nan if st.kind == "f" else 0
            regs[name] = np.full((threads, a.size), fill, dtype=st)
        return regs

    def locator(self, reg: Reg, count: int, what: str,
                checked: bool = True) -> Callable[[BlockState], tuple]:
        """A closure `state -> (array [threads, size], first column)` for `count`
        consecutive registers starting at `reg` (index checked in range, block-uniform).
        Registers of a wgmma fragment array are checked against in-flight wgmmas unless
        `checked` is False (the wgmma's own access)."""
        plain = self._locator(reg, count, what)
        name = reg.array.name
        if not checked or name not in self.wgmma_arrays:
            return plain

        def locate_checked(state: BlockState):
            arr, col = plain(state)
            if state.asyncs is not None:
                state.asyncs.touch_regs(name, col, count, state.mask, what)
            return arr, col
        return locate_checked

    def _locator(self, reg: Reg, count: int, what: str) -> Callable[[BlockState], tuple]:
        self.add(reg.array)
        name, size = reg.array.name, reg.array.size
        if isinstance(reg.index, Const):
            col = reg.index.value
            if col < 0 or col + count > size:
                raise EmulationError(f"{what}: registers {name}[{col}..{col + count}) outside "
                                     f"the array of {size}")
            return lambda state: (state.regs[name], col)
        index = compile_expr(reg.index)

        def locate(state: BlockState):
            c = uniform_int(index(state.env), state, f"{what}: register index of {name}")
            if c < 0 or c + count > size:
                raise EmulationError(f"{what}: registers {name}[{c}..{c + count}) outside "
                                     f"the array of {size}")
            return state.regs[name], c
        return locate


def write_regs(state: BlockState, arr: np.ndarray, col: int, count: int, values: Any,
               lanes: np.ndarray | None = None) -> None:
    """Write `values` ([threads, count], [threads] or scalar) into registers of the lanes
    `lanes` (default: the active mask)."""
    if lanes is None:
        lanes = state.mask
        if state.full:
            if count == 1:
                arr[:, col] = values if np.ndim(values) <= 1 else values[:, 0]
            else:
                arr[:, col:col + count] = values
            return
    if count == 1:
        v = np.asarray(values)
        v = v[:, 0] if v.ndim == 2 else v
        arr[lanes, col] = v[lanes] if v.ndim == 1 else v
    else:
        v = np.asarray(values)
        arr[lanes, col:col + count] = v[lanes] if v.ndim == 2 else v
