"""The synthesis driver: a traced kernel in, every layout and instruction decided out.

Steps, in order (each one module's job):
1. gemm anchors — MMA instruction + warp grid, fixing accumulator and operand layouts
   (`synth.gemm`);
2. propagation to a fixpoint; then, while register tiles are still open, the first copy
   between global memory and an open tile anchors it with a coalesced partition, and
   propagation resumes (`synth.propagate`, `synth.tv`);
3. every constraint checked; violated ones get an explicit conversion;
4. copies get their partition and vector width against global memory (`synth.copies`);
5. each shared buffer gets the layout and swizzle that minimize the cost of all its
   accesses, which also decides ldmatrix vs vector loads (`synth.shared`).

On sm_90a, between 4 and 5, a `tg.pipeline`'s run-ahead copies into wgmma operands may
become TMA boxes (`synth.copies.plan_tma_copy`), and such a pipeline gets producer and
consumer warp roles where the rule allows (`synth.roles`).

Decisions land on the IR: register tiles' `layout`, shared allocs' `layout`, and each op's
`choices` dict; `SynthesisResult` keeps the reasons for `explain`.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from tegula.arch.catalogue import cp_async_sizes
from tegula.arch.targets import Target
from tegula.errors import ResourceError, SynthesisError
from tegula.ir.ops import (Copy, Gemm, Rearrange, Reduce, TracedKernel, walk_ops,
                           wgmma_stage_reads_only)
from tegula.ir.values import GlobalTile, RegisterTile, SharedTile, describe
from tegula.synth.chains import gemm_chains
from tegula.synth.convert import choose_conversion
from tegula.synth.copies import (global_access_vector, global_vector_limit, needs_tail,
                                 plan_nested_ring, plan_tma_copy, plan_tma_stores,
                                 plan_bulk_adds)
from tegula.synth.gemm import WgmmaPlan, buffer_swizzle, operand_layout
from tegula.synth.pipeline import plan_pipelines
from tegula.synth.multicast import warn_if_nothing_is_multicast
from tegula.synth.roles import check_cluster, decide_warp_roles
from tegula.synth.propagate import (LayoutState, default_layout_for_unused,
                                    first_undecided_global_copy, insert_conversions, propagate)
from tegula.synth.scan import anchor_scans
from tegula.synth.search import search_plans
from tegula.synth.shared import SharedAccess, check_pinned_shared_layout, synthesize_shared_layout
from tegula.layout.cute import Layout
from tegula.layout.tv import coalesced_tv, match_values, tv_coords, tv_table


@dataclass
class SynthesisResult:
    """A synthesized kernel and the record of why each decision was made."""

    kernel: TracedKernel
    target: Target
    facts: dict
    reasons: dict = field(default_factory=dict)
    conversions: list = field(default_factory=list)
    shared_choices: dict = field(default_factory=dict)
    shared_offsets: dict = field(default_factory=dict)
    #: Why a shared buffer has the layout it has, where an instruction decided (wgmma).
    shared_reasons: dict = field(default_factory=dict)
    #: The end of the staging buffers of TMA-store epilogues (`copies.plan_tma_stores`).
    staging_end: int = 0
    #: Why the kernel's `tg.cluster` multicasts no TMA box ("" if it does or there is
    #: none): warned as a `ClusterWarning` (`synth/multicast.py`).
    cluster_unused: str = ""
    #: The most blocks per SM one role holds in a TMA pipeline the cost model kept in one
    #: role (`synth/roles.py`; 0: none): a launch grid (`grid_blocks`) that gives an SM
    #: fewer blocks may give it a producer warpgroup; no other grid changes the build.
    roles_grid_limit: int = 0

    @property
    def shared_bytes(self) -> int:
        """Bytes of shared memory the kernel's own buffers take (before scratch)."""
        end = self.staging_end
        for alloc in self.kernel.shared_allocs:
            end = max(end, self.shared_offsets[alloc.id] + alloc_bytes(alloc))
        return end


def alloc_bytes(alloc) -> int:
    return int(np.prod(alloc.shape)) * alloc.stages * alloc.dtype.bits // 8


def synthesize(kernel: TracedKernel, target: Target, facts: dict,
               warp_specialize: bool | None = None,
               load_path: str | None = None,
               consumers: str | None = None,
               atomic_path: str | None = None,
               grid_blocks: int | None = None) -> SynthesisResult:
    """Decide every layout and instruction of `kernel` for `target` under `facts`
    (tensor name → TensorFacts). Raises SynthesisError / ResourceError on bad input.
    `warp_specialize` is the kernel option (`synth/roles.py`): None splits a TMA + wgmma
    pipeline into producer/consumer roles where the rule applies, True requires it, False
    keeps one role. `load_path` is the build option: "cp.async" keeps pipelined copies off
    TMA, None or "tma" takes TMA where it qualifies. `consumers` is the build option of a
    warp-specialized pipeline's consumer schedule (`synth/roles.py` `CONSUMER_SCHEDULES`).
    `atomic_path` is the build option of `tg.atomic_add`s: "red" keeps them element-wise,
    None stages them for TMA reduce-adds where they qualify without costing blocks per SM,
    "bulk" where they qualify at all (`plan_bulk_adds`). `grid_blocks` is the build option
    of the launch's block count where known (the warp-roles price, `synth/cost_roles.py`)."""
    _check_static_shapes(kernel)
    state = LayoutState()
    for tile in _register_tiles(kernel):
        if tile.pinned and tile.layout is not None:
            _check_pinned_layout(tile, kernel.threads)
            state.set(tile, tile.layout, f"pinned by the kernel{_at_line(tile.loc)}")
    _anchor_gemms(kernel, state, target)
    anchor_scans(kernel, state)
    propagate(kernel.body, state)
    _anchor_global_copies(kernel, state, facts)
    for tile in _register_tiles(kernel):
        if state.get(tile) is None:
            state.set(tile, default_layout_for_unused(tile, kernel.threads),
                      "no op constrains it: elements spread over threads in order")
            propagate(kernel.body, state)
    result = SynthesisResult(kernel, target, facts, reasons=state.reasons)
    result.conversions = insert_conversions(kernel, state)
    for tile in _register_tiles(kernel):
        tile.layout = state.get(tile)
    _plan_conversions(kernel)
    _plan_global_copies(kernel, facts, target)
    _plan_tma_copies(kernel, facts, load_path, target)
    check_cluster(kernel, target)
    result.roles_grid_limit = decide_warp_roles(kernel, warp_specialize, consumers, target,
                                            grid_blocks)
    result.cluster_unused = warn_if_nothing_is_multicast(kernel, target)
    _plan_shared_copies(kernel)
    _synthesize_shared(kernel, result)
    _settle_async_copies(kernel, target)
    plan_pipelines(kernel)
    _check_packed_accesses(kernel)
    result.staging_end = plan_tma_stores(kernel, facts, result.shared_bytes,
                                         target.smem_per_block_max)
    if atomic_path != "red":
        result.staging_end = plan_bulk_adds(kernel, facts, result.shared_bytes, target,
                                            keep_occupancy=atomic_path is None)
    _check_shared_budget(result)
    return result


def _register_tiles(kernel: TracedKernel) -> list[RegisterTile]:
    """Every register tile the kernel touches, in first-use order, each once."""
    seen: dict[int, RegisterTile] = {}
    for tile in kernel.register_tiles:
        seen.setdefault(tile.id, tile)
    from tegula.ir.ops import tiles_read, tiles_written
    for op in walk_ops(kernel.body):
        for tile in tiles_written(op) + tiles_read(op):
            if isinstance(tile, RegisterTile):
                seen.setdefault(tile.id, tile)
    return list(seen.values())


def _check_static_shapes(kernel: TracedKernel) -> None:
    for tile in _register_tiles(kernel):
        if not all(isinstance(s, int) for s in tile.shape):
            raise SynthesisError(f"register tile {describe(tile)} needs a shape known at "
                                 f"compile time (use constexpr tile sizes)", loc=tile.loc)


def _at_line(loc) -> str:
    return f" at line {loc.lineno}" if loc is not None else ""


def _check_pinned_layout(tile: RegisterTile, threads: int) -> None:
    """A pinned TV layout must be (thread, value) -> tile index with one thread mode entry
    per thread of the block, and cover the tile exactly (no element missing or outside):
    no instruction can serve anything else, so say so at the line that pinned it."""
    layout, size = tile.layout, int(np.prod(tile.shape))
    where = f"the layout {layout} pinned for {describe(tile)}"
    if not isinstance(layout, Layout) or layout.rank != 2:
        raise SynthesisError(f"{where} is not a thread-value layout: it needs two modes, "
                             f"(thread, value) -> tile index", loc=tile.loc)
    if layout[0].size != threads:
        raise SynthesisError(f"{where} distributes the tile over {layout[0].size} threads, but "
                             f"the kernel runs {threads} threads per block", loc=tile.loc)
    image = np.unique(layout.all_offsets())
    if image.min() < 0 or image.max() >= size or len(image) != size:
        outside = f" and reaches index {int(image.max())}" if image.max() >= size else ""
        raise SynthesisError(f"{where} must map (thread, value) onto the {size} elements of the "
                             f"tile, but it covers {np.count_nonzero(image < size)} of them"
                             f"{outside}", loc=tile.loc)


def _anchor_gemms(kernel: TracedKernel, state: LayoutState, target: Target) -> None:
    gemms = [op for op in walk_ops(kernel.body) if isinstance(op, Gemm)]
    if not gemms:
        return
    plans, search = search_plans(gemms, gemm_chains(gemms, kernel.body), kernel.threads,
                                 target)
    gemms[0].choices["search"] = search  # printed by explain
    for op in gemms:
        plan = plans[id(op)]
        op.choices["plan"] = plan
        why = f"accumulator of {plan.describe()}"
        if not state.set(op.c, plan.c_tv, why) and not _same_function(state.get(op.c), plan.c_tv):
            raise SynthesisError(f"gemm: the accumulator {describe(op.c)} already has the layout "
                                 f"{state.get(op.c)} ({state.reasons.get(op.c.id)}), but "
                                 f"{plan.describe()} needs {plan.c_tv}", loc=op.loc,
                                 other_loc=op.c.loc)
        for operand, tv, role in ((op.a, plan.a_tv, "A"), (op.b, plan.b_tv, "B")):
            if isinstance(operand, RegisterTile) and \
                    not state.set(operand, tv, f"{role} operand of {plan.atom.name}"):
                _check_register_operand(op, operand, tv, role, plan, state)


def _check_register_operand(op: Gemm, operand: RegisterTile, tv: Layout, role: str, plan,
                            state: LayoutState) -> None:
    """A register operand whose layout was decided before this gemm (pinned, or by an
    earlier gemm) must hold, in each thread, the fragment elements the MMA reads."""
    have = state.get(operand)
    if match_values(have, tv_table(tv)) is None:
        raise SynthesisError(f"gemm: operand {role.lower()} {describe(operand)} has the layout "
                             f"{have} ({state.reasons.get(operand.id)}), but {plan.describe()} "
                             f"reads its {role} operand in the layout {tv}; the threads do not "
                             f"hold the elements the MMA needs (drop the pinned layout, or "
                             f"convert with tg.rearrange)", loc=op.loc, other_loc=operand.loc)


def _same_function(a, b) -> bool:
    return a is not None and np.array_equal(a.all_offsets(), b.all_offsets())


def _anchor_global_copies(kernel: TracedKernel, state: LayoutState, facts: dict) -> None:
    """While a register tile moved to/from global memory has no layout, give the first
    such tile the coalesced partition of its global tile, and propagate."""
    while True:
        found = first_undecided_global_copy(kernel.body, state)
        if found is None:
            return
        op, reg, view = found
        dim, width = global_vector_limit(view, facts, allow_tail=view.arg.dtype.bits >= 8)
        if dim is None:
            dim, width = len(view.shape) - 1, 1
        width = _fitting_width(tuple(reg.shape), dim, width, kernel.threads)
        # A tile reduced along its contiguous dim keeps each row inside a warp, so the
        # reduction needs shuffles only (no shared-memory round trip between warps).
        reduced = _reduced_along(kernel, tuple(reg.shape), dim)
        tv = coalesced_tv(tuple(reg.shape), dim, width, kernel.threads,
                          contiguous_threads=32 if reduced else None)
        state.set(reg, tv, f"coalesced {width}-element vectors along dim {dim} of "
                           f"{view.arg.name}{', rows within a warp' if reduced else ''} "
                           f"(anchor: copy at line {op.loc.lineno if op.loc else '?'})")
        propagate(kernel.body, state)


def _reduced_along(kernel: TracedKernel, shape: tuple, dim: int) -> bool:
    """True if the kernel reduces a tile of this shape along `dim`."""
    return any(isinstance(op, Reduce) and op.axis == dim and tuple(op.x.shape) == shape
               for op in walk_ops(kernel.body))


def _fitting_width(shape: tuple, dim: int, width: int, threads: int) -> int:
    """Shrink the vector until the tile's extent along `dim` is whole vectors."""
    while width > 1 and shape[dim] % width:
        width //= 2
    return width


def _plan_conversions(kernel: TracedKernel) -> None:
    """Each layout conversion's mechanism, from the F2 conversion planner."""
    for op in walk_ops(kernel.body):
        if isinstance(op, Rearrange):
            op.choices["conversion"] = choose_conversion(
                op.x.layout, op.out.layout, tuple(op.x.shape), max(1, op.x.dtype.bits // 8))
            if op.x.dtype.bits < 8 and op.choices["conversion"].kind == "shared":
                # Shared memory is addressed in bytes: one 4-bit element has no store.
                raise SynthesisError(
                    f"changing the layout of {op.x} takes a shared-memory round trip, which "
                    f"cannot store single {op.x.dtype.bits}-bit elements; convert the tile "
                    f"to a byte-wide type first (e.g. .to(u8) or .to(f16))", loc=op.loc)


def _plan_global_copies(kernel: TracedKernel, facts: dict, target: Target) -> None:
    """Partition and vector width for every copy that touches global memory."""
    for op in walk_ops(kernel.body):
        if not isinstance(op, Copy):
            continue
        view = op.src if isinstance(op.src, GlobalTile) else op.dst
        other = op.dst if view is op.src else op.src
        if not isinstance(view, GlobalTile):
            continue
        if isinstance(other, RegisterTile):
            dim, width = global_access_vector(view, other.layout, facts)
            op.choices.update(tv=other.layout, vector=width, dim=dim,
                              tail=needs_tail(view, facts, width),
                              instr="ld.global" if view is op.src else "st.global")
            continue
        dim, width = global_vector_limit(view, facts)
        if dim is None:
            dim, width = len(view.shape) - 1, 1
        width = _fitting_width(tuple(view.shape), dim, width, kernel.threads)
        op.choices.update(tv=coalesced_tv(tuple(view.shape), dim, width, kernel.threads),
                          vector=width, dim=dim)
        bytes_ = width * view.dtype.bits // 8
        async_ok = view is op.src and bytes_ in cp_async_sizes(target)
        op.choices["instr"] = "cp.async" if async_ok else (
            "ld.global+st.shared" if view is op.src else "ld.shared+st.global")


def _plan_shared_copies(kernel: TracedKernel) -> None:
    """A copy between two shared tiles goes through registers: a coalesced partition with
    16-byte vectors along the source view's last dim where the extent allows (each side's
    shared layout may narrow its own accesses; lowering takes the narrower)."""
    for op in walk_ops(kernel.body):
        if isinstance(op, Copy) and isinstance(op.src, SharedTile) \
                and isinstance(op.dst, SharedTile):
            shape, dim = tuple(op.src.shape), len(op.src.shape) - 1
            width = _fitting_width(shape, dim, max(1, 128 // op.src.dtype.bits), kernel.threads)
            op.choices.update(tv=coalesced_tv(shape, dim, width, kernel.threads), vector=width,
                              dim=dim, instr="ld.shared+st.shared")


def _settle_async_copies(kernel: TracedKernel, target: Target) -> None:
    """cp.async moves 4, 8 or 16 bytes per lane (`arch.cp_async_sizes`). A copy planned as cp.async from the global
    side alone may have its vector narrowed by the shared layout chosen afterwards (a
    transposed reader wants the other order); below 4 bytes it is staged through registers."""
    for op in walk_ops(kernel.body):
        if isinstance(op, Copy) and op.choices.get("instr") == "cp.async":
            width = min(op.choices["vector"], op.choices["dst_shared"].vector)
            if width * op.dst.dtype.bits // 8 not in cp_async_sizes(target):
                op.choices["instr"] = "ld.global+st.shared"


def _check_packed_accesses(kernel: TracedKernel) -> None:
    """Memory is addressed in bytes, so a 4-bit tile moves in vectors of an even number of
    elements; a copy whose layouts leave single nibbles (a transpose of packed data) would
    need nibble shuffles in registers, which the compiler does not generate."""
    for op in walk_ops(kernel.body):
        if not isinstance(op, Copy) or not op.src.dtype.is_packed:
            continue
        widths = [op.choices[k] if k == "vector" else op.choices[k].vector
                  for k in ("vector", "src_shared", "dst_shared") if k in op.choices]
        odd = [w for w in widths if w % 2]
        if odd:
            raise SynthesisError(f"copy {describe(op.src)} -> {describe(op.dst)}: {op.src.dtype} "
                                 f"elements are stored two per byte, but the layouts give "
                                 f"{odd[0]}-element accesses; keep both sides of a packed copy "
                                 f"in the same (contiguous) order", loc=op.loc)


def _alloc_coords(tile: SharedTile, tv) -> np.ndarray:
    """Buffer coordinates (threads × values × rank) of a shared tile view's elements."""
    coords = tv_coords(tv, tuple(tile.shape))
    if tile.permutation:
        inverse = np.argsort(tile.permutation)
        coords = coords[..., inverse]
    return coords


def _shared_accesses(kernel: TracedKernel) -> dict:
    """Every access to each shared buffer, by alloc id: (op, role, SharedAccess)."""
    accesses: dict = {a.id: [] for a in kernel.shared_allocs}
    for op in walk_ops(kernel.body):
        if isinstance(op, Copy) and op.choices.get("instr") != "tma":  # TMA: no threads
            for tile, write in ((op.src, False), (op.dst, True)):
                if not isinstance(tile, SharedTile):
                    continue
                other = op.src if write else op.dst  # the side that is not `tile`
                tv = other.layout if isinstance(other, RegisterTile) else op.choices.get("tv")
                if tv is None:
                    raise SynthesisError(f"copy between two shared tiles is not supported yet "
                                         f"({describe(op.src)} -> {describe(op.dst)})", loc=op.loc)
                vector = op.choices.get("vector", 0) if not isinstance(other, RegisterTile) else 0
                access = SharedAccess(_alloc_coords(tile, tv), write, tile.dtype.bits, vector,
                                      ldmatrix=isinstance(other, RegisterTile),
                                      op_name=f"copy line {op.loc.lineno if op.loc else '?'}")
                accesses[tile.alloc.id].append((op, "dst" if write else "src", access))
        elif isinstance(op, Gemm) and not isinstance(op.choices["plan"], WgmmaPlan):
            plan = op.choices["plan"]
            for tile, tv, role in ((op.a, plan.a_tv, "a"), (op.b, plan.b_tv, "b")):
                if isinstance(tile, SharedTile):
                    access = SharedAccess(_alloc_coords(tile, tv), False, tile.dtype.bits,
                                          ldmatrix=True, op_name=f"gemm {role.upper()} operand")
                    accesses[tile.alloc.id].append((op, role, access))
    return accesses


def _synthesize_shared(kernel: TracedKernel, result: SynthesisResult) -> None:
    offset = 0
    all_accesses = _shared_accesses(kernel)
    wgmma_layouts = wgmma_operand_layouts(kernel)
    for alloc in kernel.shared_allocs:
        if alloc.pinned:
            check_pinned_shared_layout(alloc)
        entries = all_accesses[alloc.id]
        fixed = wgmma_layouts.get(alloc.id)
        if fixed is not None:
            # wgmma reads the buffer through descriptors, which only describe the canonical
            # layout; TMA writes it that way too, and other accesses are planned under it.
            # The swizzle works on absolute addresses: start on a swizzle atom.
            alloc.layout = fixed
            offset = -(-offset // WGMMA_BUFFER_ALIGN) * WGMMA_BUFFER_ALIGN
            result.shared_reasons[alloc.id] = (
                f"wgmma operand: the canonical buffer its descriptors (and TMA boxes) "
                f"address, {_swizzle_bytes_of(alloc)} B swizzle in blocks of one swizzle "
                f"span along its contiguous dim, aligned to {WGMMA_BUFFER_ALIGN} B")
        if entries:
            choice = synthesize_shared_layout(alloc, [a for _, _, a in entries], fixed)
            alloc.layout = choice.layout
            result.shared_choices[alloc.id] = choice
            for (op, role, _), plan in zip(entries, choice.plans):
                op.choices[f"{role}_shared"] = plan
        elif alloc.layout is None:
            from tegula.synth.shared import base_layout
            alloc.layout = base_layout(tuple(alloc.shape), len(alloc.shape) - 1)
        result.shared_offsets[alloc.id] = offset
        offset += -(-alloc_bytes(alloc) // 128) * 128


#: Alignment of wgmma operand buffers: the largest swizzle atom (1024 bytes for 128-byte
#: swizzle), so a buffer's stages and rows line up with the hardware's XOR pattern.
WGMMA_BUFFER_ALIGN = 1024


def wgmma_operand_layouts(kernel: TracedKernel) -> dict:
    """alloc id -> the canonical layout wgmma reads it in, for every wgmma operand buffer
    (one buffer read by two wgmma gemms, K-major or MN-major, gets the same layout: the
    buffer's contiguous row decides it, `gemm.buffer_swizzle`)."""
    layouts = {}
    for op in walk_ops(kernel.body):
        plan = op.choices.get("plan") if isinstance(op, Gemm) else None
        if isinstance(plan, WgmmaPlan):
            for tile, swizzle in ((op.a, plan.swizzle_a), (op.b, plan.swizzle_b)):
                if not isinstance(tile, SharedTile):  # A from registers
                    continue
                rows, cols = tile.alloc.shape
                layouts[tile.alloc.id] = operand_layout(rows, cols, tile.dtype, swizzle)
    return layouts


def _plan_tma_copies(kernel: TracedKernel, facts: dict, load_path: str | None = None,
                     target=None) -> None:
    """Copies a `tg.pipeline` runs ahead into wgmma operand buffers become TMA boxes, with
    an mbarrier ring (`lower/hopper.py`), when every such copy of the loop qualifies (one
    mechanism per loop); otherwise they stay cp.async/ld+st, and lowering fences them for
    wgmma's async proxy. Each copy records why it is not TMA (`tma_skipped`)."""
    wgmma_buffers = wgmma_operand_layouts(kernel)
    for loop, depth in _loops_with_depth(kernel.body):
        producers = [o for o in loop.body if isinstance(o, Copy)
                     and isinstance(o.src, GlobalTile) and isinstance(o.dst, SharedTile)
                     and o.dst.alloc.stages > 1]
        if loop.stages < 2 or not producers:
            continue
        plans, problem = [], ""
        if load_path == "cp.async":
            problem = "the build option load_path='cp.async' (the caller's or the search's)"
        for op in producers if not problem else ():
            layout = wgmma_buffers.get(op.dst.alloc.id)
            if layout is not None:
                plan, problem = plan_tma_copy(op, facts, _swizzle_bytes(op.dst))
            elif _pinned_row_major(op.dst.alloc) and (target is None or target.cc >= 90):
                # a stage the threads read themselves, in the row-major order the kernel
                # pinned (the W4A16 fragment kernel's weight words): one unswizzled box of
                # whole rows (`row_major`: boxes of 16-byte columns would land densely,
                # not at the pinned row pitch). TMA exists from sm_90 on: sm_80/sm_89 keep
                # cp.async (they were planned TMA boxes here, which their code cannot issue)
                plan, problem = plan_tma_copy(op, facts, 0, row_major=True)
            else:
                problem = f"{describe(op.dst)} is not a wgmma operand buffer"
                plan = None
            if problem:
                break
            plans.append(plan)
        ring = None
        if not problem and depth > 0:  # e.g. a persistent kernel's tile loop around it
            rest = [o for o in loop.body if not any(o is p for p in producers)]
            staged = {op.dst.alloc.id for op in producers}
            ring, problem = plan_nested_ring(kernel.body, loop,
                                             wgmma_stage_reads_only(rest, staged))
        if not problem and loop.step != 1:
            problem = "the pipeline's step is not 1"
        if not problem:
            problem = _other_stage_read(loop, {op.dst.alloc.id for op in producers})
        for op in producers:
            if problem:
                if op.dst.alloc.id in wgmma_buffers:
                    op.choices["tma_skipped"] = problem
            else:
                op.choices.update(instr="tma", tma=plans[producers.index(op)])
        if ring is not None and not problem:
            loop.choices["ring"] = ring


def _pinned_row_major(alloc) -> bool:
    """Whether a shared buffer's layout is one the kernel pinned to its tile's row-major
    order (what a TMA box with no swizzle writes), its stages whole 128-byte lines (where
    TMA writes a box: buffers start on one)."""
    stage_bytes = int(np.prod(alloc.shape)) * alloc.dtype.bits // 8
    if not alloc.pinned or alloc.layout is None or stage_bytes % 128:
        return False
    shape = tuple(alloc.shape)
    strides = tuple(int(np.prod(shape[d + 1:])) for d in range(len(shape)))
    layout = alloc.layout
    return (tuple(layout.shape) == shape and all(
        e == 1 or got == want for e, got, want in zip(shape, tuple(layout.stride), strides)))


def _other_stage_read(loop, allocs: set) -> str:
    """Why the mbarrier ring cannot serve the loop's reads of its TMA buffers ("" if it
    can): the ring makes stage k ready at iteration k and refills the previous one, so
    every read must be of stage k (the loop index itself)."""
    from tegula.ir.ops import tiles_read
    from tegula.ir.scalar import LoopIndex
    for op in walk_ops(loop.body):
        for tile in tiles_read(op):
            if isinstance(tile, SharedTile) and tile.alloc.id in allocs and not (
                    isinstance(tile.stage, LoopIndex) and tile.stage.name == loop.var.name):
                return (f"{describe(tile)} is read at a stage other than the pipeline's "
                        f"index {loop.var.name} (line {op.loc.lineno if op.loc else '?'})")
    return ""


def _loops_with_depth(ops: list, depth: int = 0):
    """Every run-time loop with the number of run-time loops around it."""
    from tegula.ir.ops import ForLoop, IfThen
    for op in ops:
        if isinstance(op, ForLoop):
            yield op, depth
            yield from _loops_with_depth(op.body, depth + 1)
        elif isinstance(op, IfThen):
            yield from _loops_with_depth(op.then, depth)
            yield from _loops_with_depth(op.otherwise, depth)


def _swizzle_bytes(tile) -> int:
    """The swizzle mode in bytes of a canonical wgmma buffer (`gemm.buffer_swizzle`)."""
    return _swizzle_bytes_of(tile.alloc)


def _swizzle_bytes_of(alloc) -> int:
    return buffer_swizzle(alloc)


def _check_shared_budget(result: SynthesisResult) -> None:
    limit = result.target.smem_per_block_max
    if result.shared_bytes > limit:
        allocs = ", ".join(f"%{a.name}: shared<{'x'.join(map(str, a.shape))}, {a.dtype}> "
                           f"x{a.stages} stages = {alloc_bytes(a)} B"
                           for a in result.kernel.shared_allocs)
        biggest = max(result.kernel.shared_allocs, key=alloc_bytes)
        raise ResourceError(f"the kernel's shared buffers need {result.shared_bytes} bytes "
                            f"({allocs}), more than the {limit} bytes a block may use on "
                            f"{result.target.name}; use smaller tiles or fewer stages",
                            loc=biggest.loc)
