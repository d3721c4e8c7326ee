"""What a synthesized kernel issues: the cost model's first layer (`synth/cost.py` is the
second, the estimate of time).

`instruction_uses(kernel, target)`: for every op, the instructions it issues per block and
per execution (`InstrUse`: catalogue instruction, vector width, bytes per thread and per
warp, warp instructions, shared-memory wavefronts vs the ideal, global bytes, block-wide
barriers), tagged with the runtime loops around it. This is `tegula explain`'s table
(Hexcute Table III's "bytes per instruction"). Read off the *typed tile IR* (every op's
`choices`, every tile's layout), so synthesis and the autotuner can use it before
lowering. Also here: the runtime loops' trip counts for a problem size (`loop_weights`)
and the resources that set occupancy (`occupancy`, register words).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tegula.arch.catalogue import cp_async, get_instruction, ldmatrix, vector_access
from tegula.arch.convert import FLOAT_TO_INT, INT_TO_FLOAT
from tegula.arch.special import special_function
from tegula.arch.memory import RED_ADD
from tegula.arch.tma import tma_load, tma_reduce_add
from tegula.arch.targets import Target
from tegula.ir.ops import (AtomicAdd, Copy, Elementwise, Fill, ForLoop, Gemm, IfThen, Indices,
                           Op, Rearrange, Reduce, TracedKernel, walk_ops)
from tegula.ir.scalar import (BlockIndex, GridSize, ScalarArg, ScalarBinOp, ScalarConst, SMCount,
                              TensorExtent)
from tegula.ir.values import GlobalTile, RegisterTile, SharedTile
from tegula.layout.tv import distinct_values, tv_table
from tegula.synth.registers import ADDRESS_OVERHEAD
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
    global_bytes: float = 0
    pipe_cycles: float = 1.0
    flops: int = 0
    barriers: int = 0            # block-wide barriers (bar.sync) per execution
    #: Blocks of a cluster a multicast TMA box lands in (1: not multicast). Each block then
    #: issues 1/multicast of the box, so L2 serves this block 1/multicast of
    #: `global_bytes`; the whole box still lands in its shared memory, and what an SM
    #: receives is what bounds it (`synth/cost.py`).
    multicast: int = 1

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


def _register_instructions(tile: RegisterTile, vector: int, warps: int,
                           distinct: bool = False) -> int:
    """Warp instructions to move a register tile `vector` elements at a time; `distinct`:
    only the registers holding an element no earlier one of the thread holds (global
    loads and stores of a broadcast tile, e.g. a (BM, 1) scale column in an accumulator's
    layout, are issued once per distinct element: `lower/copy.py`)."""
    if tile.layout is None:
        return warps
    values = len(distinct_values(tile.layout)) if distinct else tile.layout[1].size
    return max(1, values // max(1, vector)) * warps


def _copy_uses(op: Copy, kernel: TracedKernel, target: Target) -> list[InstrUse]:
    src, dst, ch = op.src, op.dst, op.choices
    warps = _warps(kernel)
    vector = ch.get("vector", 1)
    if isinstance(src, GlobalTile) and isinstance(dst, SharedTile) and ch.get("instr") == "tma":
        # One thread issues one box; the tensor memory accelerator moves it.
        box = ch["tma"]
        instr = tma_load(len(box.box))
        ctas = ch["multicast"].ctas if ch.get("multicast") else 1
        return [InstrUse("G2S", instr.name, 0, 0, box.blocks, instr.pipe,
                         global_bytes=box.box_bytes,   # one box per swizzle span
                         multicast=ctas)]
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
        return [_global_use("G2R", True, src, vector,
                            _register_instructions(dst, vector, warps, distinct=True))]
    if isinstance(src, RegisterTile) and isinstance(dst, GlobalTile):
        return [_global_use("R2G", False, dst, vector,
                            _register_instructions(src, vector, warps, distinct=True))]
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
    """What lowering issues (`lower/compute.py: lower_reduce`): per-thread combines, then a
    butterfly shuffle and combine per distinct output register along each lane bit the
    reduction combines; then, along the warp bits it combines, the exchange through a
    shared scratch row (`_reduce_across_warps`): a store per distinct output register,
    then every thread loads and combines the partials of the `2^bits - 1` other warps of
    its group (31 each at 1,024 threads over a row, where one had been counted), and three
    block-wide barriers. Bits along which threads hold copies of the same data combine
    nothing (`reduction_thread_bits`)."""
    from tegula.lower.compute import reduction_thread_bits
    warps = _warps(kernel)
    alu = InstrUse("ALU", "alu", 1, 0, _values(op.x) * warps, "alu")
    if op.out.layout is None or op.x.layout is None:
        return [alu]
    rows = len(distinct_values(op.out.layout))
    bits = reduction_thread_bits(op.x.layout, op.out.layout, kernel.threads)
    lane_bits = sum(1 for b in bits if b < 5)
    warp_bits = len(bits) - lane_bits
    shuffles = lane_bits * rows * warps
    shfl = get_instruction("shfl.sync.bfly.b32")
    uses = [alu] + ([InstrUse("ALU", shfl.name, 1, 4, shuffles, shfl.pipe),
                     InstrUse("ALU", "alu", 1, 0, shuffles, "alu")] if shuffles else [])
    if warp_bits:
        eb = 4  # partials are exchanged as 32-bit words
        for op_name, per_register in (("st", 1), ("ld", 2 ** warp_bits - 1)):
            instr = vector_access(op_name, "shared", eb)
            count = rows * warps * per_register
            uses.append(InstrUse("RED", instr.name, 1, eb, count, instr.pipe, count, count,
                                 barriers=3 if op_name == "st" else 0))
        uses.append(InstrUse("ALU", "alu", 1, 0, rows * warps * (2 ** warp_bits - 1), "alu"))
    return uses


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
    if isinstance(op, Elementwise) and _int_conversion(op) is not None:
        return _conversion_entry_uses(op, kernel, target)
    if isinstance(op, (Elementwise, Fill, Indices)):
        out = op.dst if isinstance(op, Fill) else op.out
        alu = InstrUse("ALU", "alu", 1, 0, _values(out) * _warps(kernel), "alu")
        return [alu] + _special_function_uses(op, alu.warp_instructions, target)
    if isinstance(op, AtomicAdd) and "bulk_add" in op.choices:
        return _bulk_add_uses(op, kernel)
    if isinstance(op, AtomicAdd):
        eb = _elem_bytes(op.src)
        entry = RED_ADD.get(op.dst.dtype.name) if isinstance(op.dst, GlobalTile) else None
        instr = entry.name if entry is not None else "red.add"  # no entry: named generically
        return [InstrUse("R2G", instr, 1, eb, _values(op.src) * _warps(kernel), "global",
                         global_bytes=_elements(op.dst) * eb)]
    return []


def _bulk_add_uses(op: AtomicAdd, kernel: TracedKernel) -> list[InstrUse]:
    """A `tg.atomic_add` staged through shared memory (`choices["bulk_add"]`, lowered by
    `lower/hopper.py: lower_tma_store`): the threads' st.shared of the tile, two barriers
    per round, and one TMA reduce-add per box, which moves the tile's bytes."""
    plan = op.choices["bulk_add"]
    warps, eb = _warps(kernel), _elem_bytes(op.src)
    st = vector_access("st", "shared", plan.vector * eb)
    rounds = plan.boxes // plan.slots
    reduce = tma_reduce_add(len(plan.dims))
    return [InstrUse("R2S", st.name, plan.vector, plan.vector * eb,
                     _register_instructions(op.src, plan.vector, warps), st.pipe,
                     barriers=2 * rounds),
            InstrUse("S2G", reduce.name, 0, 0, plan.boxes, reduce.pipe,
                     global_bytes=_elements(op.dst) * eb)]


def _int_conversion(op: Elementwise):
    """The catalogue's cvt entry a cast between a float and an integer type issues per
    element (`codegen/expr.py`), or None (also for i8/u8/i4/u4 to float: two ALU
    operations by the magic-number add)."""
    if op.op != "cast" or not op.inputs or not isinstance(op.inputs[0], RegisterTile):
        return None
    src, dst = op.inputs[0].dtype, op.out.dtype
    if src.is_float and not dst.is_float and dst.name != "bool":
        return FLOAT_TO_INT
    if dst.is_float and src.name == "i32":
        return INT_TO_FLOAT
    return None


def _conversion_entry_uses(op: Elementwise, kernel: TracedKernel,
                           target: Target) -> list[InstrUse]:
    """A float <-> int cast: one cvt a register on the entry's pipe (the special-function
    unit's rate), and for i8/u8 the emitter's clamp (two ALU operations)."""
    entry, warps = _int_conversion(op), _warps(kernel)
    count = _values(op.out) * warps
    uses = [InstrUse("CVT", entry.name, 1, 0, count, entry.pipe,
                     pipe_cycles=1 / entry.throughput(target))]
    if op.out.dtype.name in ("i8", "u8"):
        uses.append(InstrUse("ALU", "alu", 1, 0, 2 * count, "alu"))
    return uses


#: Special-function unit results per clock per SM (ex2, lg2, rsqrt, sin, cos, tanh.approx:
#: the CUDA programming guide's throughput table, compute capability 8.0 to 9.0).
SFU_LANES_PER_CLK = 16


#: Elementwise ops that run on the special-function unit (MUFU), with how many of its
#: instructions each takes on floating-point values: ex2/lg2/rsqrt/sin/cos/tanh.approx,
#: a reciprocal for a division, two for pow (lg2 then ex2) and sigmoid (ex2 then rcp).
SPECIAL_FUNCTION_OPS = {"exp": 1, "exp2": 1, "log": 1, "log2": 1, "sqrt": 1, "rsqrt": 1,
                        "sin": 1, "cos": 1, "tanh": 1, "div": 1, "pow": 2, "sigmoid": 2}


def _special_function_uses(op: Op, warp_instructions: int, target: Target) -> list[InstrUse]:
    """The special-function unit's share of a floating-point elementwise op: 16 lanes per
    clock per SM (`SFU_LANES_PER_CLK`), so a warp instruction holds it 2 SM cycles — in
    the attention forward, the exponentials of the scores take about half the tensor
    cores' time (FlashAttention-3 §3). An op with a catalogue entry (`tg.log2`:
    `arch.special`) is charged at the entry's rate, with the ALU instructions ptxas adds
    around it."""
    count = SPECIAL_FUNCTION_OPS.get(getattr(op, "op", ""), 0)
    if not count or not op.out.dtype.is_float:
        return []
    entry = special_function(op.op)
    if entry is not None:
        return [InstrUse("SFU", entry.name, 1, 0, warp_instructions, entry.pipe,
                         pipe_cycles=1 / entry.throughput(target)),
                InstrUse("ALU", "alu", 1, 0, entry.extra_alu * warp_instructions, "alu")]
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
    arguments by name, the block whose loop bounds are being evaluated, the launch's grid
    (`tg.num_programs`) and the GPU's SM count (`tg.num_sms`): a persistent kernel's tile
    loop steps by the grid, so without them it would count one tile per block."""

    shapes: dict = field(default_factory=dict)
    scalars: dict = field(default_factory=dict)
    block: tuple = (0, 0, 0)
    grid: tuple | None = None
    sm_count: int | None = None

    def at(self, block: tuple) -> "ProblemSize":
        """The same launch, evaluated for `block`."""
        return ProblemSize(self.shapes, self.scalars, block, self.grid, self.sm_count)

    def value(self, x) -> int:
        """The int value of a tile-IR scalar; `_Unknown` when it needs a missing input."""
        if isinstance(x, int):
            return x
        if isinstance(x, ScalarConst):
            return x.value
        if isinstance(x, BlockIndex):
            return self.block[x.axis]
        if isinstance(x, GridSize) and self.grid is not None:
            return (tuple(self.grid) + (1, 1, 1))[x.axis]
        if isinstance(x, SMCount) and self.sm_count is not None:
            return self.sm_count
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
        # A LoopIndex (an inner bound depending on an outer loop), a grid size or SM count
        # not given, or a value loaded from memory: not known to the model.
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


def loop_weights(uses: list[CountedUse], size: ProblemSize, grid: tuple | None,
                 busiest: bool = False) -> tuple[dict, list[str]]:
    """How many times per block each loop nest runs its body, where bounds depend on the
    block averaged over the grid's blocks (or, `busiest`, their most); unresolved loops
    count once and are named."""
    weights: dict = {}
    unresolved: list[str] = []
    for nest in dict.fromkeys(u.loops for u in uses):
        depends = any(_mentions_block(x) for loop in nest for x in (loop.start, loop.stop))
        blocks = _blocks(grid) if depends and grid else [size.block]
        products = []
        for block in blocks:
            here = size.at(block)
            product = 1
            for loop in nest:
                try:
                    product *= trip_count(loop, here)
                except _Unknown:
                    label = loop_label(loop)
                    if label not in unresolved:
                        unresolved.append(label)
            products.append(product)
        weights[nest] = max(products) if busiest else sum(products) / len(products)
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
