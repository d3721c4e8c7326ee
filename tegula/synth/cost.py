"""The analytical cost model: what a synthesized kernel issues, and how long it should take.

Two layers, both read off the *typed tile IR* (every op's `choices`, every tile's layout),
so synthesis and the autotuner can use them before lowering:

1. `instruction_uses(kernel, target)`: for every op, the instructions it issues per block
   and per execution (`InstrUse`: catalogue instruction, vector width, bytes per thread
   and per warp, warp instructions, shared-memory wavefronts vs the ideal, global bytes),
   tagged with the runtime loops around it. This is `tegula explain`'s table (Hexcute
   Table III's "bytes per instruction").
2. `estimate(build, grid, shapes)`: a roofline over those counts (TileLang §4.2) with
   Hexcute §VI's issue cycles per instruction. Per block at full SM rates (the SM is
   shared with the other blocks resident with it, `blocks_per_sm`, from threads / shared
   memory / registers — registers from the thread IR's liveness, `synth/registers.py`,
   with a spill note only past the launch's per-thread limit):

   * tensor  = MMA instructions / the entry's `throughput` (instructions per clock per
     SM: for mma.sync the target's 4 sub-partitions, one tensor core each, over the
     entry's issue cycles; a wgmma's issue cycles are already the whole SM's);
   * shared  = shared-memory wavefronts of 128 B at `Target.shared_bytes_per_clk` (128:
     one wavefront per clock per SM);
   * issue   = all warp instructions / the sub-partitions' schedulers (one instruction
     per clock each);
   * special functions = exp2/log2/rsqrt/... warp instructions at 16 lanes per clock;
   * pipes   = the 2-norm of those four (`PIPE_OVERLAP_NORM`): the same warps feed
     every pipe, so two demands of similar size overlap imperfectly;
   * L2      = the block's global bytes at the SM's share of L2 -> SM bandwidth;
   * load latency = per loop iteration, one load latency over the loads in flight
     (Little's law, `pipeline_latency_cycles`; a TMA stage's latency includes its own
     bytes, the box completing as a whole), shared by the blocks resident at once;
   * barrier latency = block-wide barriers (cross-warp reductions, shared round-trip
     conversions) x `BARRIER_CYCLES`, a stall likewise shared by the resident blocks;
   * DRAM    = the grid's DRAM bytes at the GPU's DRAM bandwidth.

   The grid takes what its busiest SM takes: it runs ⌈blocks / SMs⌉ blocks (a partial
   last wave costs its blocks, not a whole wave), so its time is the largest of those
   blocks' pipes, L2 and latency terms and the DRAM time, plus one global-load latency
   per round of resident blocks (the pipeline fill, which nothing overlaps). When the tensors' shapes are known, DRAM
   traffic for the grid is capped by their footprint (each byte read from DRAM once,
   re-reads hit L2) — the usual GEMM case, where per-block global bytes overstate DRAM
   traffic by the reuse factor. `block_cycles` is one block's time with `blocks_per_sm`
   of its kind on its SM, for `explain`.

Assumptions, said plainly: no dependency stalls beyond the fill and load latencies;
instruction-cache and launch overheads are not modelled; boundary tiles are counted as
full tiles; both branches of a `tg.if_` count; ALU work (elementwise, address arithmetic)
only counts toward issue slots, roughly. It ranks candidates and sanity-checks speeds; it
does not predict to the microsecond. Its rank correlation with measured times, per kernel
family, is recorded in docs/performance.md (`benchmarks/cost_model_check.py`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tegula.arch.catalogue import cp_async, get_instruction, ldmatrix, vector_access
from tegula.arch.memory import RED_ADD
from tegula.arch.tma import tma_load
from tegula.arch.targets import Target
from tegula.ir.ops import (AtomicAdd, Copy, Elementwise, Fill, ForLoop, Gemm, IfThen, Indices,
                           Op, Rearrange, Reduce, TracedKernel, walk_ops)
from tegula.ir.scalar import BlockIndex, ScalarArg, ScalarBinOp, ScalarConst, TensorExtent
from tegula.ir.values import GlobalTile, RegisterTile, SharedTile
from tegula.layout.tv import distinct_values, tv_table
from tegula.synth.registers import (ADDRESS_OVERHEAD, RegisterEstimate, estimate_registers,
                                    over_limit, per_thread_limit)
from tegula.synth.shared import wavefronts

#: Registers a thread needs beyond its register tiles before lowering (addresses, loop
#: counters, predicates): the liveness estimate's calibrated overhead (synth/registers.py).
REGISTER_OVERHEAD = ADDRESS_OVERHEAD


@dataclass(frozen=True)
class InstrUse:
    """One kind of instruction an op issues, per block and per execution of the op.

    `role` is the data path in Hexcute's notation (G2S global→shared, S2R, R2S, G2R, R2G,
    S2G, MMA, CVT for layout conversions, ALU); `instr` the catalogue name (or "alu" /
    "mov" for arithmetic and register moves); `vector` elements per thread per
    instruction; `thread_bytes` bytes one thread moves per instruction (0 when nothing is
    moved); `pipe` which unit it occupies: the catalogue entry's `pipe` ("global",
    "shared", "tensor", "tma", "alu"), "alu" for arithmetic; `pipe_cycles` the SM clock
    cycles one instruction keeps that pipe busy (1 / the entry's `throughput`)."""

    role: str
    instr: str
    vector: int
    thread_bytes: int
    warp_instructions: int
    pipe: str
    wavefronts: int = 0
    ideal_wavefronts: int = 0
    global_bytes: int = 0
    pipe_cycles: float = 1.0
    flops: int = 0
    barriers: int = 0            # block-wide barriers (bar.sync) per execution

    @property
    def warp_bytes(self) -> int:
        """Bytes one warp instruction moves (32 lanes × thread bytes)."""
        return 32 * self.thread_bytes

    @property
    def conflicts(self) -> int:
        """Shared-memory wavefronts beyond the conflict-free ideal."""
        return self.wavefronts - self.ideal_wavefronts


@dataclass(frozen=True)
class CountedUse:
    """An `InstrUse` of `op`, inside the runtime loops `loops` (outermost first)."""

    op: Op
    use: InstrUse
    loops: tuple = ()


# --------------------------------------------------------------------------- instruction uses

def _elem_bytes(tile) -> int:
    """Bytes of one element accessed alone (a scratch conversion moves one element per
    instruction; a 4-bit element still takes a byte access)."""
    return max(1, tile.dtype.bits // 8)


def _bytes(dtype, count: int) -> int:
    """Bytes `count` elements of `dtype` take in memory: from bits, so packed 4-bit
    elements count half a byte each (two share a byte)."""
    return -(-count * dtype.bits // 8)


def _elements(tile) -> int:
    return int(np.prod(tile.shape))


def _warps(kernel: TracedKernel) -> int:
    return max(1, kernel.threads // 32)


def _shared_use(role: str, plan, dtype, target: Target) -> InstrUse:
    """The use of a shared-memory AccessPlan (ldmatrix or a vector ld/st.shared) of
    `dtype` elements."""
    nbytes = _bytes(dtype, plan.vector)
    if plan.instr == "ldmatrix":
        instr = ldmatrix(plan.ldmatrix_num, plan.trans)
        return InstrUse(role, instr.name, plan.vector, nbytes,
                        plan.instructions, instr.pipe, plan.wavefronts,
                        plan.ideal_wavefronts, pipe_cycles=1 / instr.throughput(target))
    op = "st" if plan.instr == "st.shared" else "ld"
    instr = vector_access(op, "shared", nbytes)
    return InstrUse(role, instr.name, plan.vector, nbytes, plan.instructions, instr.pipe,
                    plan.wavefronts, plan.ideal_wavefronts)


def _global_use(role: str, load: bool, tile: GlobalTile, vector: int,
                warp_instructions: int) -> InstrUse:
    # Bits, not whole bytes: a vector of 32 4-bit elements is one 16-byte access.
    nbytes = _bytes(tile.dtype, vector)
    instr = vector_access("ld" if load else "st", "global", nbytes)
    return InstrUse(role, instr.name, vector, nbytes, warp_instructions, instr.pipe,
                    global_bytes=_bytes(tile.dtype, _elements(tile)))


def _register_instructions(tile: RegisterTile, vector: int, warps: int) -> int:
    """Warp instructions to move a register tile `vector` elements at a time."""
    values = tile.layout[1].size if tile.layout is not None else 1
    return max(1, values // max(1, vector)) * warps


def _copy_uses(op: Copy, kernel: TracedKernel, target: Target) -> list[InstrUse]:
    src, dst, ch = op.src, op.dst, op.choices
    warps = _warps(kernel)
    vector = ch.get("vector", 1)
    if isinstance(src, GlobalTile) and isinstance(dst, SharedTile) and ch.get("instr") == "tma":
        # One thread issues one box; the tensor memory accelerator moves it.
        box = ch["tma"]
        instr = tma_load(len(box.box))
        return [InstrUse("G2S", instr.name, 0, 0, box.blocks, instr.pipe,
                         global_bytes=box.box_bytes)]  # one box per swizzle span
    if isinstance(src, GlobalTile) and isinstance(dst, SharedTile):
        plan = ch.get("dst_shared")
        if ch.get("instr") == "cp.async":
            width = min(vector, plan.vector) if plan else vector
            instr = cp_async(_bytes(src.dtype, width))
            count = plan.instructions if plan else _elements(src) // width // 32
            return [InstrUse("G2S", instr.name, width, _bytes(src.dtype, width), count,
                             instr.pipe, plan.wavefronts if plan else 0,
                             plan.ideal_wavefronts if plan else 0,
                             global_bytes=_bytes(src.dtype, _elements(src)))]
        count = _elements(src) // max(1, vector) // 32
        uses = [_global_use("G2R", True, src, vector, count)]
        return uses + ([_shared_use("R2S", plan, dst.dtype, target)] if plan else [])
    if isinstance(src, SharedTile) and isinstance(dst, GlobalTile):
        plan = ch.get("src_shared")
        count = _elements(dst) // max(1, vector) // 32
        uses = [_shared_use("S2R", plan, src.dtype, target)] if plan else []
        return uses + [_global_use("R2G", False, dst, vector, count)]
    if isinstance(src, GlobalTile) and isinstance(dst, RegisterTile):
        return [_global_use("G2R", True, src, vector, _register_instructions(dst, vector, warps))]
    if isinstance(src, RegisterTile) and isinstance(dst, GlobalTile):
        return [_global_use("R2G", False, dst, vector, _register_instructions(src, vector, warps))]
    if isinstance(src, SharedTile) and "src_shared" in ch:
        return [_shared_use("S2R", ch["src_shared"], src.dtype, target)]
    if isinstance(dst, SharedTile) and "dst_shared" in ch:
        return [_shared_use("R2S", ch["dst_shared"], dst.dtype, target)]
    if isinstance(src, RegisterTile) and isinstance(dst, RegisterTile):
        return [InstrUse("R2R", "mov", 1, 0, _register_instructions(dst, 1, warps), "alu")]
    return []


def _gemm_uses(op: Gemm, kernel: TracedKernel, target: Target) -> list[InstrUse]:
    plan = op.choices["plan"]
    rm, rn, rk = plan.repeats
    count = rm * rn * rk * plan.grid.wm * plan.grid.wn
    uses = []
    for role, tile in (("a", op.a), ("b", op.b)):
        if isinstance(tile, SharedTile) and f"{role}_shared" in op.choices:
            uses.append(_shared_use(f"S2R ({role.upper()})", op.choices[f"{role}_shared"],
                                    tile.dtype, target))
    uses.append(InstrUse("MMA", plan.atom.name, 0, 0, count, plan.atom.pipe,
                         pipe_cycles=1 / plan.atom.throughput(target),
                         flops=count * plan.atom.flops))
    return uses


def _values(tile: RegisterTile) -> int:
    return tile.layout[1].size if tile.layout is not None else max(1, _elements(tile) // 128)


def _reduce_uses(op: Reduce, kernel: TracedKernel) -> list[InstrUse]:
    """Per-thread combines, then butterfly shuffles across the lanes of a warp that share
    an output element: log2(lanes holding it) rounds per distinct output register; then,
    where an output element's partials sit in several warps, lowering's exchange through a
    shared scratch row (`lower/compute.py: _reduce_across_warps`): a store and a load per
    distinct output register, and three block-wide barriers."""
    warps = _warps(kernel)
    alu = InstrUse("ALU", "alu", 1, 0, _values(op.x) * warps, "alu")
    if op.out.layout is None:
        return [alu]
    table = tv_table(op.out.layout)
    distinct = distinct_values(op.out.layout)
    lanes = max(np.unique(table[:32, v], return_counts=True)[1].max() for v in distinct)
    shuffles = int(math.log2(lanes)) * len(distinct) * warps
    shfl = get_instruction("shfl.sync.bfly.b32")
    uses = [alu] + ([InstrUse("ALU", shfl.name, 1, 4, shuffles, shfl.pipe)] if shuffles else [])
    if _spans_warps(table, distinct):
        eb = 4  # partials are exchanged as 32-bit words
        for op_name in ("st", "ld"):
            instr = vector_access(op_name, "shared", eb)
            uses.append(InstrUse("RED", instr.name, 1, eb, len(distinct) * warps, instr.pipe,
                                 len(distinct) * warps, len(distinct) * warps,
                                 barriers=3 if op_name == "st" else 0))
    return uses


def _spans_warps(table: np.ndarray, values) -> bool:
    """Whether some output element of a reduction is held by threads of different warps
    (after the reduction every thread that held a partial holds the result)."""
    warp_of = np.arange(table.shape[0]) // 32
    for v in values:
        elements = table[:, v]
        for element in np.unique(elements):
            if len(np.unique(warp_of[elements == element])) > 1:
                return True
    return False


def _conversion_uses(op: Rearrange, kernel: TracedKernel) -> list[InstrUse]:
    """A layout conversion as synthesis planned it (`choices["conversion"]`): register
    moves, warp shuffles, or (the default) a round trip through a shared scratch tile, one
    element per instruction (as lowering emits it), with its bank conflicts counted."""
    warps = _warps(kernel)
    eb = _elem_bytes(op.x)
    choice = op.choices.get("conversion")
    kind = getattr(choice, "kind", "shared")
    if kind == "registers":
        return [InstrUse("CVT", "mov", 1, 0, _values(op.out) * warps, "alu")]
    if kind == "shuffle":
        shfl = get_instruction("shfl.sync.idx.b32")
        return [InstrUse("CVT", shfl.name, 1, 4, choice.instructions * warps, shfl.pipe)]
    st, ld = vector_access("st", "shared", eb), vector_access("ld", "shared", eb)
    uses = []
    for instr, tile, values in ((st, op.x, distinct_values(op.x.layout)),
                                (ld, op.out, range(_values(op.out)))):
        waves, ideal = _scratch_wavefronts(tile.layout, eb, list(values))
        # lowering fences the scratch with three barriers (before, between, after)
        uses.append(InstrUse("CVT", instr.name, 1, eb, len(values) * warps, instr.pipe,
                             waves, ideal, barriers=3 if instr is st else 0))
    return uses


def _scratch_wavefronts(tv, elem_bytes: int, values: list) -> tuple[int, int]:
    """Wavefronts of one-element accesses to a compact scratch tile (element i at byte
    i * elem_bytes) by the registers `values` of a TV layout, and the ideal count."""
    table = tv_table(tv)[:, values] * elem_bytes           # threads x values: byte addresses
    per_warp = table.reshape(-1, 32, len(values)).transpose(0, 2, 1).reshape(-1, 32)
    return wavefronts(per_warp, elem_bytes), per_warp.shape[0]


def op_uses(op: Op, kernel: TracedKernel, target: Target) -> list[InstrUse]:
    """The instructions `op` issues per block and per execution (empty for loops and
    branches, whose bodies are counted op by op)."""
    if isinstance(op, Copy):
        return _copy_uses(op, kernel, target)
    if isinstance(op, Gemm):
        return _gemm_uses(op, kernel, target)
    if isinstance(op, Reduce):
        return _reduce_uses(op, kernel)
    if isinstance(op, Rearrange):
        return _conversion_uses(op, kernel)
    if isinstance(op, (Elementwise, Fill, Indices)):
        out = op.dst if isinstance(op, Fill) else op.out
        alu = InstrUse("ALU", "alu", 1, 0, _values(out) * _warps(kernel), "alu")
        return [alu] + _special_function_uses(op, alu.warp_instructions)
    if isinstance(op, AtomicAdd):
        eb = _elem_bytes(op.src)
        entry = RED_ADD.get(op.dst.dtype.name) if isinstance(op.dst, GlobalTile) else None
        instr = entry.name if entry is not None else "red.add"  # no entry: named generically
        return [InstrUse("R2G", instr, 1, eb, _values(op.src) * _warps(kernel), "global",
                         global_bytes=_elements(op.dst) * eb)]
    return []


#: Elementwise ops that run on the special-function unit (MUFU), with how many of its
#: instructions each takes on floating-point values: ex2/lg2/rsqrt/sin/cos/tanh.approx,
#: a reciprocal for a division, two for pow (lg2 then ex2) and sigmoid (ex2 then rcp).
SPECIAL_FUNCTION_OPS = {"exp": 1, "exp2": 1, "log": 1, "log2": 1, "sqrt": 1, "rsqrt": 1,
                        "sin": 1, "cos": 1, "tanh": 1, "div": 1, "pow": 2, "sigmoid": 2}


def _special_function_uses(op: Op, warp_instructions: int) -> list[InstrUse]:
    """The special-function unit's share of a floating-point elementwise op: 16 lanes per
    clock per SM (`SFU_LANES_PER_CLK`), so a warp instruction holds it 2 SM cycles — in
    the attention forward, the exponentials of the scores take about half the tensor
    cores' time (FlashAttention-3 §3)."""
    count = SPECIAL_FUNCTION_OPS.get(getattr(op, "op", ""), 0)
    if not count or not op.out.dtype.is_float:
        return []
    # Arithmetic, so no catalogue entry names it ("alu"); the role and pipe say which unit.
    return [InstrUse("SFU", "alu", 1, 0, count * warp_instructions, "sfu",
                     pipe_cycles=32 / SFU_LANES_PER_CLK)]


def instruction_uses(kernel: TracedKernel, target: Target) -> list[CountedUse]:
    """Every op's instruction uses, in program order, with the loops around it."""
    found: list[CountedUse] = []

    def visit(ops: list[Op], loops: tuple) -> None:
        for op in ops:
            if isinstance(op, ForLoop):
                visit(op.body, loops + (op,))
            elif isinstance(op, IfThen):
                visit(op.then, loops)
                visit(op.otherwise, loops)
            else:
                found.extend(CountedUse(op, use, loops) for use in op_uses(op, kernel, target))

    visit(kernel.body, ())
    return found


# --------------------------------------------------------------------------- trip counts

class _Unknown(Exception):
    """A scalar the caller gave no value for (a tensor extent, a scalar argument)."""


@dataclass(frozen=True)
class ProblemSize:
    """What the model may know about one launch: tensor shapes by argument name, scalar
    arguments by name, and the block whose loop bounds are being evaluated."""

    shapes: dict = field(default_factory=dict)
    scalars: dict = field(default_factory=dict)
    block: tuple = (0, 0, 0)

    def value(self, x) -> int:
        """The int value of a tile-IR scalar; `_Unknown` when it needs a missing input."""
        if isinstance(x, int):
            return x
        if isinstance(x, ScalarConst):
            return x.value
        if isinstance(x, BlockIndex):
            return self.block[x.axis]
        if isinstance(x, TensorExtent):
            if x.tensor not in self.shapes:
                raise _Unknown(str(x))
            return int(self.shapes[x.tensor][x.dim])
        if isinstance(x, ScalarArg):
            if x.name not in self.scalars:
                raise _Unknown(x.name)
            return int(self.scalars[x.name])
        if isinstance(x, ScalarBinOp):
            a, b = self.value(x.lhs), self.value(x.rhs)
            return {"+": a + b, "-": a - b, "*": a * b, "min": min(a, b), "max": max(a, b),
                    "//": a // b if b else -1, "%": a % b if b else a}[x.op]
        # A LoopIndex (an inner bound depending on an outer loop), a grid size, the SM
        # count or a value loaded from memory: not known to the model.
        raise _Unknown(str(x))


def _mentions_block(x) -> bool:
    if isinstance(x, BlockIndex):
        return True
    if isinstance(x, ScalarBinOp):
        return _mentions_block(x.lhs) or _mentions_block(x.rhs)
    return False


def trip_count(loop: ForLoop, size: ProblemSize) -> int:
    """Iterations of a runtime loop for this problem size (and block)."""
    start, stop = size.value(loop.start), size.value(loop.stop)
    return max(0, -(-(stop - start) // loop.step))


def loop_label(loop: ForLoop) -> str:
    """How reports name a loop: its line and bounds."""
    line = f"line {loop.loc.lineno}" if loop.loc else "a loop"
    return f"{line}: {loop.var} in [{loop.start}, {loop.stop}) step {loop.step}"


def _blocks(grid: tuple) -> list[tuple]:
    """Every block index of `grid`, or an even sample of 4096 of them (for loops whose
    bounds depend on the block, e.g. causal attention)."""
    gx, gy, gz = (tuple(grid) + (1, 1, 1))[:3]
    total = gx * gy * gz
    step = max(1, total // 4096)
    return [(i % gx, (i // gx) % gy, i // (gx * gy)) for i in range(0, total, step)]


def loop_weights(uses: list[CountedUse], size: ProblemSize,
                 grid: tuple | None) -> tuple[dict, list[str]]:
    """How many times per block (averaged over the grid's blocks where bounds depend on
    the block) each loop nest runs its body; unresolved loops count once and are named."""
    weights: dict = {}
    unresolved: list[str] = []
    for nest in dict.fromkeys(u.loops for u in uses):
        depends = any(_mentions_block(x) for loop in nest for x in (loop.start, loop.stop))
        blocks = _blocks(grid) if depends and grid else [size.block]
        total = 0
        for block in blocks:
            here = ProblemSize(size.shapes, size.scalars, block)
            product = 1
            for loop in nest:
                try:
                    product *= trip_count(loop, here)
                except _Unknown:
                    label = loop_label(loop)
                    if label not in unresolved:
                        unresolved.append(label)
            total += product
        weights[nest] = total / len(blocks)
    return weights, unresolved


# --------------------------------------------------------------------------- resources

def register_words(thread_kernel) -> int:
    """32-bit registers a thread's register arrays take (narrow types packed)."""
    return sum(-(-a.size * a.dtype.bits // 32) for a in thread_kernel.registers)


def register_words_from_tiles(kernel: TracedKernel) -> int:
    """The same from the tile IR, before lowering: register tiles plus gemm operand
    fragments (which lowering loads into temporaries)."""
    words = 0
    for tile in kernel.register_tiles:
        if tile.layout is not None:
            words += -(-tile.layout[1].size * tile.dtype.bits // 32)
    for op in walk_ops(kernel.body):
        if isinstance(op, Gemm) and "plan" in op.choices:
            plan = op.choices["plan"]
            for tile, tv in ((op.a, plan.a_tv), (op.b, plan.b_tv)):
                if isinstance(tile, SharedTile) and tv is not None:  # wgmma: no fragments
                    words += -(-tv[1].size * tile.dtype.bits // 32)
    return words


def _sets_registers(thread_kernel) -> bool:
    """Whether some warp role of the thread kernel sets its register budget (setmaxnreg).
    Lowering splits a kernel into roles at its top level (synthesis does not import
    lowering, so the statement is recognized by its `roles`)."""
    return any(r.max_registers is not None for s in thread_kernel.body
               for r in getattr(s, "roles", ()))


def occupancy(target: Target, threads: int, shared_bytes: int,
              registers: int) -> tuple[int, str]:
    """(blocks resident per SM, what limits it) from threads, shared memory, registers."""
    limits = {"the blocks-per-SM limit": target.max_blocks_per_sm,
              "threads per SM": target.max_threads_per_sm // threads}
    if shared_bytes:
        limits["shared memory"] = target.smem_per_sm // shared_bytes
    regs = min(registers, target.regs_per_thread_max)
    if regs:
        limits["registers"] = target.regs_per_sm // (regs * threads)
    name = min(limits, key=lambda k: limits[k])
    return limits[name], name


# --------------------------------------------------------------------------- the estimate

@dataclass(frozen=True)
class CostEstimate:
    """The model's numbers for one build (see the module docstring for the model).

    Per-block counts are per block for the whole kernel (runtime loops multiplied out
    where the problem size is known, else counted once: `unresolved_loops`). Cycle
    figures are SM clock cycles; `*_cycles` of resources are the block's demand at full
    SM rates, `block_cycles` the block's time on an SM it shares with
    `blocks_per_sm - 1` others. Grid figures are None without a grid."""

    target: str
    clock_ghz: float
    threads: int
    shared_bytes: int
    registers: int
    blocks_per_sm: int
    occupancy_limit: str
    global_bytes: float
    flops: float
    mma_instructions: float
    warp_instructions: float
    shared_wavefronts: float
    ideal_wavefronts: float
    tensor_cycles: float
    shared_cycles: float
    issue_cycles: float
    dram_cycles: float
    latency_cycles: float
    block_cycles: float
    bound: str
    grid: tuple | None = None
    blocks: int = 0
    waves: int = 0
    dram_bytes: float = 0.0
    grid_cycles: float | None = None
    unresolved_loops: tuple = ()
    notes: tuple = ()
    resources: tuple = ()        # ((name, cycles of the block on its shared SM), ...)
    #: A lower bound on the grid's cycles for any build of the same tiles whatever its
    #: load path or occupancy: its tensor work, L2 bytes and DRAM bytes alone.
    floor_cycles: float | None = None

    @property
    def block_seconds(self) -> float:
        return self.block_cycles / (self.clock_ghz * 1e9)

    @property
    def seconds(self) -> float | None:
        """Predicted time of the whole grid (None without a grid)."""
        return None if self.grid_cycles is None else self.grid_cycles / (self.clock_ghz * 1e9)

    @property
    def tflops(self) -> float | None:
        """Predicted tensor throughput of the grid (None without a grid or MMAs)."""
        if not self.seconds or not self.flops:
            return None
        return self.flops * self.blocks / self.seconds / 1e12

    def __str__(self) -> str:
        res = dict(self.resources)
        sfu = res.get("special-function (pipe)", 0.0) / max(1, self.blocks_per_sm)
        lines = [f"cost model ({self.target}, {self.clock_ghz} GHz): per block",
                 f"  global {self.global_bytes:,.0f} B, {self.mma_instructions:,.0f} MMA, "
                 f"{self.shared_wavefronts:,.0f} shared wavefronts (ideal "
                 f"{self.ideal_wavefronts:,.0f}), {self.warp_instructions:,.0f} warp instrs",
                 f"  cycles at full SM rates: tensor {self.tensor_cycles:,.0f}, shared "
                 f"{self.shared_cycles:,.0f}, issue {self.issue_cycles:,.0f}, special "
                 f"functions {sfu:,.0f} (together, imperfectly overlapped: "
                 f"{res.get('pipes', 0.0) / max(1, self.blocks_per_sm):,.0f}); DRAM share "
                 f"{self.dram_cycles:,.0f}; fill latency {self.latency_cycles:,.0f}",
                 f"  {self.blocks_per_sm} block(s)/SM (limited by {self.occupancy_limit}); "
                 f"block time {self.block_cycles:,.0f} cycles = "
                 f"{self.block_seconds * 1e6:.2f} us, {self.bound}-bound"]
        if self.grid_cycles is not None:
            rate = f", {self.tflops:.1f} TFLOP/s" if self.tflops else ""
            lines.append(f"  grid {self.grid}: {self.blocks} blocks in {self.waves} wave(s), "
                         f"DRAM {self.dram_bytes / 1e6:.2f} MB -> {self.seconds * 1e6:.2f} us"
                         f"{rate}")
        if self.unresolved_loops:
            lines.append("  runtime loops counted once (give tensor shapes for totals): " +
                         "; ".join(self.unresolved_loops))
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


def _footprint(kernel: TracedKernel, shapes: dict) -> float | None:
    """Bytes of every global tensor the kernel touches (None if a shape is unknown)."""
    total = 0.0
    for arg in kernel.args:
        if arg.name not in shapes:
            return None
        total += float(np.prod(shapes[arg.name])) * arg.dtype.bits / 8  # u4: half a byte
    return total


def estimate(build, grid=None, shapes: dict | None = None,
             scalars: dict | None = None) -> CostEstimate:
    """The cost model's estimate for `build` (a `tegula.build.Build`, or anything with
    `.traced`, `.target` and optionally `.thread_kernel`/`.synthesis`), launched on `grid`
    (int or tuple, optional) with tensor `shapes` and `scalars` by argument name."""
    kernel, target = build.traced, build.target
    if grid is not None:
        grid = (grid,) if isinstance(grid, int) else tuple(int(g) for g in grid)
    uses = instruction_uses(kernel, target)
    size = ProblemSize(dict(shapes or {}), dict(scalars or {}))
    weights, unresolved = loop_weights(uses, size, grid)
    totals = _totals(uses, weights)
    thread_kernel = getattr(build, "thread_kernel", None)
    threads, live = kernel.threads, None
    if thread_kernel is not None:
        # Registers from the thread IR's liveness; the block as launched (a warp-specialized
        # kernel adds its producer warpgroup).
        live, smem, threads = (estimate_registers(thread_kernel), thread_kernel.shared_bytes,
                               thread_kernel.threads)
        registers = live.registers
    else:
        smem = build.synthesis.shared_bytes
        registers = register_words_from_tiles(kernel) + REGISTER_OVERHEAD
    notes = spill_notes(target, threads, registers, live)
    if thread_kernel is not None and _sets_registers(thread_kernel):
        # A role sets its register budget (setmaxnreg): the kernel is compiled for one block
        # per SM, every thread holding the block's share of the register file.
        from tegula.arch.tma import register_share
        registers = register_share(threads)
    bps, limit = occupancy(target, threads, smem, registers)
    if _footprint(kernel, size.shapes) is None:
        notes.append("without every tensor's shape, each block's global bytes count as DRAM "
                     "traffic (no L2 reuse): an upper bound on memory time")
    if bps == 0:
        notes.append(f"a block does not fit on an SM ({limit}); counted as 1 per SM")
        bps = 1
    totals["pipeline"] = pipeline_latency_cycles(uses, weights, target)
    return _combine(kernel, target, totals, bps, limit, registers, smem, grid, size,
                    tuple(unresolved), tuple(notes), threads)


#: A TMA box's completion on a loaded H100: the box lands as a whole (one mbarrier
#: completes it), so a stage's wait is a latency plus the stage's bytes at the rate one
#: SM's TMA traffic is served. Calibrated on the H100 measurements of 2026-11-24 (fitted:
#: the README GEMM's 2-stage 128x256x64 (48 KB a stage, ~3,100 cycles an iteration) and the
#: attention forward with V as (D, S) (8 and 16 KB a stage, ~1,100 and ~1,400 cycles); the
#: attention with V as (S, D) was held out). cp.async pipelines fit the catalogue's
#: unloaded global-load latency, their 16-byte requests completing independently.
TMA_LATENCY_CYCLES = 800
TMA_BYTES_PER_CLK = 20


def pipeline_latency_cycles(uses: list[CountedUse], weights: dict, target: Target) -> float:
    """Cycles one block would wait on its loops' global loads if it were alone on its SM
    with all the bandwidth it wants: each iteration of a loop that loads from global memory
    waits one load latency, shared by the loads in flight (`S - 1` for a `tg.pipeline` of
    `S` stages, one when it is not pipelined). `_combine` divides this among the blocks
    resident on an SM: by Little's law an SM keeping `n` blocks' loads in flight sustains
    `n (S - 1) B / latency` bytes per clock, so the latency stops mattering once that
    exceeds the SM's share of L2 bandwidth (the L2 term). A TMA stage's wait is
    `TMA_LATENCY_CYCLES` plus its bytes at `TMA_BYTES_PER_CLK` (the box completes as a
    whole). (Measured on an H100: the README GEMM at 128x256x64 runs ~2x slower at 2
    stages than at 4 on TMA; on cp.async, 2 stages cost nothing at 3 blocks per SM.)"""
    unloaded = get_instruction("ld.global.v4.b32").latency_cycles
    per_loop: dict = {}          # loops -> (latency, TMA bytes per iteration)
    for counted in uses:
        u = counted.use
        if not counted.loops or not u.global_bytes or not u.role.startswith("G2"):
            continue
        latency, tma_bytes = per_loop.get(counted.loops, (unloaded, 0.0))
        if u.pipe == "tma":
            latency, tma_bytes = TMA_LATENCY_CYCLES, tma_bytes + u.global_bytes
        per_loop[counted.loops] = (latency, tma_bytes)
    return sum(weights[loops] * (latency + tma_bytes / TMA_BYTES_PER_CLK)
               / max(1, loops[-1].stages - 1)
               for loops, (latency, tma_bytes) in per_loop.items())


def spill_notes(target: Target, threads: int, registers: int,
                live: RegisterEstimate | None) -> list[str]:
    """Warnings where the register estimate exceeds what the launch allows a thread: the
    per-thread limit for `threads` (`__launch_bounds__`), or a role's setmaxnreg budget."""
    if live is None:  # before lowering: the tile-level sum
        limit = per_thread_limit(target, threads)
        reasons = [f"~{registers} registers per thread, over {limit}"] if registers > limit \
            else []
    else:
        reasons = over_limit(target, threads, live)
    return [f"{r}: ptxas may spill (`tegula compile`, `tegula explain --compile` or "
            f"explain(compile=True) show the compiler's count)" for r in reasons]


def _totals(uses: list[CountedUse], weights: dict) -> dict:
    """Per-block sums of the quantities the model uses."""
    t = dict(global_bytes=0.0, flops=0.0, mma=0.0, instrs=0.0, waves=0.0, ideal=0.0,
             tensor=0.0, sfu=0.0, barriers=0.0)
    for counted in uses:
        u, w = counted.use, weights[counted.loops]
        t["global_bytes"] += u.global_bytes * w
        t["flops"] += u.flops * w
        t["instrs"] += u.warp_instructions * w
        t["waves"] += u.wavefronts * w
        t["ideal"] += u.ideal_wavefronts * w
        t["barriers"] += u.barriers * w
        if u.pipe == "tensor":
            t["mma"] += u.warp_instructions * w
            t["tensor"] += u.warp_instructions * u.pipe_cycles * w
        if u.pipe == "sfu":
            t["sfu"] += u.warp_instructions * u.pipe_cycles * w
    return t


#: How a block's demands on the SM's pipes combine: the `PIPE_OVERLAP_NORM`-norm of
#: (tensor, shared memory, issue, special functions) rather than their maximum. The same
#: warps feed every pipe, so demands of similar size do not overlap perfectly: two equal
#: demands take ~1.4x either alone, one that dominates takes its own time. Fitted on the
#: mma.sync GEMM at 2048^3 (measured, H100, 2026-11-24), where 256-thread blocks — whose
#: smaller warp tiles read as many shared-memory bytes as their MMAs take cycles — ran
#: 15-22% slower than 128-thread blocks of the same tile; checked on 4096^3 (held out).
#: Rankings are the same for any norm from 1.5 to 3.
PIPE_OVERLAP_NORM = 2

#: What one block-wide barrier of a reduction or conversion exchange costs its block, in
#: cycles of stall (the dependency chain up to it is exposed; other resident blocks may
#: fill it): fitted on the attention forward (H100, 2026-11-24, V as (D, S), 64 keys a
#: block) where two warpgroups share each row, ~1,600 cycles per key block for its two
#: cross-warp reductions; checked on 32 keys a block and on V as (S, D).
BARRIER_CYCLES = 500

#: Special-function unit results per clock per SM (ex2, lg2, rsqrt, sin, cos, tanh.approx:
#: the CUDA programming guide's throughput table, compute capability 8.0 to 9.0).
SFU_LANES_PER_CLK = 16


def _combine(kernel: TracedKernel, target: Target, t: dict, bps: int, limit: str,
             registers: int, smem: int, grid, size: ProblemSize, unresolved: tuple,
             notes: tuple, threads: int) -> CostEstimate:
    """Per-block demands at full SM rates, then the grid: the busiest SM runs
    ⌈blocks / SMs⌉ blocks, `bps` at a time, and takes the longest of its pipes' work, its
    L2 bytes at its share of L2 bandwidth, and its loads' latency over the loads it keeps
    in flight; the GPU as a whole moves the DRAM bytes (module docstring)."""
    dram_per_clk = target.dram_gbps / target.clock_ghz  # bytes per SM clock, whole GPU
    blocks = int(np.prod(grid)) if grid is not None else 0
    dram_bytes = t["global_bytes"]
    footprint = _footprint(kernel, size.shapes)
    if blocks and footprint is not None and not unresolved:
        # Each byte comes from DRAM once; the blocks' re-reads of it hit L2.
        dram_bytes = min(dram_bytes, footprint / blocks)
    # A wavefront is one pass over every bank (32 x 4 B = 128 B).
    pipes = {"tensor": t["tensor"],
             "shared-memory": t["waves"] * (target.banks * target.bank_bytes)
             / target.shared_bytes_per_clk,
             "issue": t["instrs"] / target.subpartitions,
             "special-function": t["sfu"]}
    pipe_cycles = sum(v ** PIPE_OVERLAP_NORM for v in pipes.values()) ** (1 / PIPE_OVERLAP_NORM)
    # Per block at full SM rates; "load latency" is the block's wait alone (see
    # pipeline_latency_cycles), shared by the blocks resident with it.
    per_block = {"pipes": pipe_cycles}
    if target.l2_bytes_per_clk:
        per_block["L2"] = t["global_bytes"] * target.sm_count / target.l2_bytes_per_clk
        per_block["load latency"] = t.get("pipeline", 0.0) / bps
    # A block-wide barrier stalls the block's warps until the last one arrives, exposing
    # the dependency chain before it; other resident blocks may fill the stall.
    per_block["barrier latency"] = t["barriers"] * BARRIER_CYCLES / bps
    latency = get_instruction("ld.global.v4.b32").latency_cycles if t["global_bytes"] else 0.0
    dram_block = dram_bytes * target.sm_count / dram_per_clk  # every SM running such blocks
    resources = {**{k: bps * v for k, v in per_block.items()}, "DRAM": bps * dram_block}
    bound = max(resources, key=lambda k: resources[k])
    block_cycles = resources[bound] + latency
    if bound == "pipes":
        bound = max(pipes, key=lambda k: pipes[k])
    fields = dict(target=target.name, clock_ghz=target.clock_ghz, threads=threads,
                  shared_bytes=smem, registers=registers, blocks_per_sm=bps,
                  occupancy_limit=limit, global_bytes=t["global_bytes"], flops=t["flops"],
                  mma_instructions=t["mma"], warp_instructions=t["instrs"],
                  shared_wavefronts=t["waves"], ideal_wavefronts=t["ideal"],
                  tensor_cycles=pipes["tensor"], shared_cycles=pipes["shared-memory"],
                  issue_cycles=pipes["issue"], dram_cycles=bps * dram_block,
                  latency_cycles=latency, block_cycles=block_cycles,
                  bound=bound, unresolved_loops=unresolved, notes=notes,
                  resources=tuple(resources.items()) + tuple(
                      (f"{k} (pipe)", bps * v) for k, v in pipes.items()))
    if grid is None:
        return CostEstimate(**fields)
    waves = -(-blocks // (target.sm_count * bps))
    on_sm = -(-blocks // target.sm_count)           # blocks the busiest SM runs
    resident = min(bps, on_sm)
    sm_cycles = {k: on_sm * v for k, v in per_block.items()}
    if "load latency" in sm_cycles:  # the latency is shared by the blocks resident at once
        sm_cycles["load latency"] = on_sm * t.get("pipeline", 0.0) / resident
    sm_cycles["barrier latency"] = on_sm * t["barriers"] * BARRIER_CYCLES / resident
    sm_cycles["DRAM"] = dram_block * blocks / target.sm_count
    grid_bound = max(sm_cycles, key=lambda k: sm_cycles[k])
    # Each round of resident blocks waits for its first loads (the fill) unoverlapped.
    rounds = -(-on_sm // resident)
    floor = max(on_sm * max(pipes["tensor"], per_block.get("L2", 0.0)), sm_cycles["DRAM"])
    return CostEstimate(**fields, grid=grid, blocks=blocks, waves=waves,
                        dram_bytes=dram_bytes * blocks,
                        grid_cycles=sm_cycles[grid_bound] + rounds * latency,
                        floor_cycles=floor + latency)
