"""`tegula explain`: what the compiler decided for a kernel, and why, and what it costs.

For one build (`tegula.build.Build`) the report lists

* every tensor — global arguments with the facts they were specialized on, shared
  buffers with their synthesized (swizzled) layout in CuTe notation and how it was
  chosen, register tiles with their thread-value layout and the reason synthesis gave;
* the layout conversions synthesis inserted;
* every op with the instructions it issues: catalogue instruction, vector width, bytes
  per thread and per warp instruction (Hexcute Table III), warp instructions per block,
  shared-memory wavefronts against the conflict-free ideal;
* resources: shared memory per block (the kernel's buffers plus lowering's scratch) and
  registers per thread estimated from the thread IR's liveness (`synth/registers.py`),
  against the limit the launch's thread count allows; with a compiled cubin
  (`explain(..., compile=True)`, `tegula explain --compile`, `tegula compile`) also the
  compiler's own count (ptxas: registers, spill stores/loads, stack);
* the analytical cost model's prediction (`tegula.synth.cost`).

`explain(kernel, **constexprs)` (exported as `tegula.explain`) builds and explains in one
call; `write_svgs(build, folder)` draws each distinct register TV layout and each shared
buffer coloured by bank, on one page. This module sits above the pipeline (like
`tegula.build`).
"""
from __future__ import annotations

import math
import os
from typing import Any

from tegula.ir.ops import ForLoop, IfThen, Op, walk_ops
from tegula.ir.printer import op_text
from tegula.ir.values import GlobalTile, RegisterTile, describe
from tegula.synth.cost import CountedUse, estimate, instruction_uses, loop_label, register_words
from tegula.synth.registers import estimate_registers, per_thread_limit


def explain(kernel: Any, grid: Any = None, shapes: dict | None = None,
            target: str | None = None, compile: bool = False, **constexprs: Any) -> str:
    """Build `kernel` with these constexprs (default facts: row-major tensors) and explain
    it; `grid` and `shapes` (tensor name -> shape) add a whole-grid time prediction, and a
    grid of ints is built for as a launch on it is (its block count is the `grid_blocks`
    build fact); `compile=True` also builds the cubin and adds the compiler's resource
    report (needs NVRTC or nvcc, no GPU)."""
    from tegula.build import DEFAULT_TARGET, build

    dims = (grid,) if isinstance(grid, int) else tuple(grid) if grid is not None else ()
    if dims and all(isinstance(d, int) and d > 0 for d in dims) and \
            "grid_blocks" not in constexprs:
        constexprs = dict(constexprs, grid_blocks=math.prod(dims))
    result = build(kernel, constexprs, target=target or DEFAULT_TARGET)
    return explain_build(result, grid=grid, shapes=shapes,
                         compiled=compile_report(result) if compile else None)


def compile_report(build: Any) -> Any:
    """Compile a build's CUDA source and return ptxas's report of it (a
    `runtime.compiler.PtxasReport`; `CompileError` when no compiler is found)."""
    from tegula.runtime.compiler import compile_cuda_report

    return compile_cuda_report(build.cuda_source(), build.thread_kernel.name,
                               build.target.sm)[1]


def explain_build(build: Any, grid: Any = None, shapes: dict | None = None,
                  scalars: dict | None = None, compiled: Any = None) -> str:
    """The whole report for one build (see the module docstring); `compiled` is the
    compiler's report of its cubin (`compile_report`), when one was built."""
    sections = [_header(build), _tensors(build), _conversions(build), _ops(build),
                _resources(build, compiled), _prediction(build, grid, shapes, scalars)]
    return "\n\n".join(s for s in sections if s) + "\n"


def _where(loc) -> str:
    return f"line {loc.lineno}" if loc is not None else "-"


def _header(build: Any) -> str:
    k = build.traced
    consts = ", ".join(f"{name}={value!r}" for name, value in k.constexprs.items())
    threads = build.thread_kernel.threads
    extra = threads - k.threads  # a warp-specialized pipeline's producer warpgroup
    roles = (f": {k.threads} for the tiles + a {extra}-thread producer warpgroup"
             if extra else "")
    if extra > 128:  # ping-pong: consumer warpgroups each running the tiles (synth/roles.py)
        roles = (f": {(threads - 128) // k.threads} consumer warpgroups of {k.threads} "
                 f"threads, each running whole tiles, + a 128-thread producer warpgroup")
    unused = getattr(build.synthesis, "cluster_unused", "")  # synth/multicast.py
    cluster = (f"\nclusters of {k.cluster[0]}x{k.cluster[1]} blocks multicast nothing "
               f"(ClusterWarning): {unused}" if unused else "")
    return (f"kernel {k.name} ({consts}) for {build.target}\n"
            f"{threads} threads per block ({threads // 32} warps){roles}{cluster}")


# --------------------------------------------------------------------------- tensors

def _tensors(build: Any) -> str:
    lines = ["== tensors"]
    for arg in build.traced.args:
        facts = build.facts.get(arg.name)
        lines.append(f"  {arg.name}: global tensor<{arg.dtype}, rank {arg.rank}>"
                     f"{'  ' + _facts_text(facts) if facts is not None else ''}")
    for alloc in build.traced.shared_allocs:
        lines += _shared_lines(build, alloc)
    for tile in _register_tiles(build):
        values = tile.layout[1].size if tile.layout is not None else 0
        lines.append(f"  {describe(tile)} ({_where(tile.loc)}): {values} values per thread")
        lines.append(f"      layout {tile.layout}" + ("  (pinned)" if tile.pinned else ""))
        why = build.synthesis.reasons.get(tile.id, "pinned by the kernel" if tile.pinned else "?")
        lines.append(f"      because: {why}")
    return "\n".join(lines)


def _facts_text(facts: Any) -> str:
    """The facts a global tensor was specialized on, in words."""
    parts = []
    contiguous = getattr(facts, "contiguous_dim", None)
    if contiguous is not None:
        parts.append(f"dim {contiguous} contiguous")
    align = getattr(facts, "align_bytes", None)
    if align:
        parts.append(f"{align}-byte aligned")
    divisors = getattr(facts, "extent_divisors", None)
    if divisors:
        parts.append("extents divisible by " + "x".join(str(d) for d in divisors))
    return ", ".join(parts)


def _shared_lines(build: Any, alloc: Any) -> list[str]:
    from tegula.synth.synthesize import alloc_bytes

    dims = "x".join(str(s) for s in alloc.shape)
    offset = build.synthesis.shared_offsets.get(alloc.id, 0)
    lines = [f"  %{alloc.name}: shared<{dims}, {alloc.dtype}> x{alloc.stages} stages "
             f"({_where(alloc.loc)}): {alloc_bytes(alloc)} B at byte {offset}",
             f"      layout {alloc.layout}" + ("  (pinned)" if alloc.pinned else "")]
    choice = build.synthesis.shared_choices.get(alloc.id)
    decided = getattr(build.synthesis, "shared_reasons", {}).get(alloc.id)
    if decided:
        why = decided
    elif alloc.pinned:
        why = "pinned by the kernel"
    elif choice is None:
        why = "no op accesses it: compact, last dim contiguous"
    else:
        why = (f"the cheapest of {choice.candidates_tried} candidate layouts (contiguous dim "
               f"x swizzle) for its accesses, cost {choice.cost} (issue slots + wavefronts)")
    lines.append(f"      because: {why}")
    return lines


def _register_tiles(build: Any) -> list[RegisterTile]:
    """Register tiles in declaration order, then any that ops introduced (conversions)."""
    seen: dict[int, RegisterTile] = {t.id: t for t in build.traced.register_tiles}
    for op in walk_ops(build.traced.body):
        for tile in _op_tiles(op):
            if isinstance(tile, RegisterTile):
                seen.setdefault(tile.id, tile)
    return list(seen.values())


def _op_tiles(op: Op) -> list:
    from tegula.ir.ops import tiles_read, tiles_written
    return tiles_written(op) + tiles_read(op)


def _conversions(build: Any) -> str:
    conversions = build.synthesis.conversions
    if not conversions:
        return "== layout conversions: none (every op found its operands in the layout it needs)"
    lines = ["== layout conversions inserted by synthesis"]
    for op in conversions:
        choice = op.choices.get("conversion")
        how = "shared-memory round trip (one st.shared and one ld.shared per element)"
        if getattr(choice, "kind", "shared") != "shared":
            how = choice.describe()
        lines.append(f"  {_where(op.loc)}: %{op.x.name} {op.x.layout}\n"
                     f"      -> %{op.out.name} {op.out.layout}\n      by {how}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- ops

_HEAD = (f"      {'path':<8} {'instruction':<30} {'vec':>4} {'B/thr':>6} {'B/warp':>7} "
         f"{'instrs':>7} {'wavefronts':>11} {'conflicts':>9}")


def _ops(build: Any) -> str:
    uses = instruction_uses(build.traced, build.target)
    by_op: dict[int, list[CountedUse]] = {}
    for counted in uses:
        by_op.setdefault(id(counted.op), []).append(counted)
    lines = ["== ops (instrs and wavefronts per block, per execution of the op)"]
    _op_lines(build.traced.body, by_op, lines, depth=1)
    return "\n".join(lines)


def _op_lines(ops: list[Op], by_op: dict, lines: list[str], depth: int) -> None:
    pad = "  " * depth
    for op in ops:
        if isinstance(op, ForLoop):
            kind = f"pipeline, {op.stages} stages" if op.stages > 1 else "range"
            if any(o.choices.get("instr") == "tma" for o in op.body):
                kind += f"; TMA boxes into an mbarrier ring of {op.stages}"
            lines.append(f"{pad}for ({kind}) {loop_label(op)}{_roles_note(op, pad)}")
            if op.choices.get("pipeline") is not None:  # synth/pipeline.py: its load stage
                lines.append(f"{pad}    load stage: {op.choices['pipeline'].describe()}")
            elif op.choices.get("pipeline_skipped"):  # nothing runs ahead, and why
                lines.append(f"{pad}    not pipelined: {op.choices['pipeline_skipped']}")
            _op_lines(op.body, by_op, lines, depth + 1)
            continue
        if isinstance(op, IfThen):
            lines.append(f"{pad}if {op.cond} ({_where(op.loc)})")
            _op_lines(op.then, by_op, lines, depth + 1)
            if op.otherwise:
                lines.append(f"{pad}else")
                _op_lines(op.otherwise, by_op, lines, depth + 1)
            continue
        lines.append(f"{pad}{_where(op.loc)}: {op_text(op)}{_op_note(op)}")
        counted = by_op.get(id(op), [])
        if counted:
            lines.append(_HEAD)
            lines += [_use_line(c.use) for c in counted]


def _roles_note(loop: ForLoop, pad: str) -> str:
    """How a TMA pipeline's work is split among warps (`synth/roles.py`), and why not."""
    plan = loop.choices.get("roles")
    if plan is not None:
        return f"\n{pad}    roles: {plan.describe()}"
    skipped = loop.choices.get("roles_skipped")
    if skipped:
        return (f"\n{pad}    one role (thread 0 expects the bytes and issues after a block "
                f"barrier, every thread waits on the phase and computes); not "
                f"warp-specialized: {skipped}")
    return ""


def _op_note(op: Op) -> str:
    """A short note on the decision behind an op (gemm plan, copy partition)."""
    plan = op.choices.get("plan")
    if plan is not None:
        note = f"\n      {plan.describe()}"
        others = getattr(plan, "candidates", ())[1:4]  # the runners-up, where synthesis kept them
        for candidate in others:
            parts = candidate if isinstance(candidate, tuple) else (candidate,)
            note += "\n        over: " + ", ".join(_candidate_part(x) for x in parts)
        search = op.choices.get("search")  # synth/search.py's JointSearch, on the first gemm
        if search is not None and (search.groups > 1 or search.truncated):
            note += f"\n      {search.describe()}"
        return note
    if op.choices.get("scan") is not None:  # synth/scan.py's ScanPlan
        return f"\n      {op.choices['scan'].describe()}"
    if op.choices.get("tma_store") is not None:  # synth/copies.py's TmaStorePlan
        return f"\n      {op.choices['tma_store'].describe()}"
    if op.choices.get("bulk_add") is not None:  # a tg.atomic_add's (plan_bulk_adds)
        return f"\n      {op.choices['bulk_add'].describe()}"
    if op.choices.get("bulk_add_skipped"):
        return f"\n      one red.global.add per element: {op.choices['bulk_add_skipped']}"
    if op.choices.get("instr") == "tma":
        box = op.choices["tma"]
        boxes = f"{box.blocks} TMA boxes" if box.blocks > 1 else "TMA box"  # one per span
        return (f"\n      {boxes} {'x'.join(map(str, box.box))} of {op.src.arg.name} (tensor-map "
                f"dims {box.dims}), {box.swizzle} B swizzle, {box.box_bytes} B per stage, "
                f"zero fill past the edge")
    note = (f"\n      TMA not used: {op.choices['tma_skipped']}"
            if op.choices.get("tma_skipped") else "")
    if op.choices.get("tma_store_skipped"):
        note += f"\n      TMA store not used: {op.choices['tma_store_skipped']}"
    if "tv" in op.choices and isinstance(getattr(op, "src", None), GlobalTile) \
            and not isinstance(getattr(op, "dst", None), RegisterTile):
        return note + (f"\n      partition {op.choices['tv']}, {op.choices.get('vector', 1)}-"
                       f"element vectors along tile dim {op.choices.get('dim')}")
    return note


def _candidate_part(x: Any) -> str:
    """One field of a gemm plan candidate (instruction, warp grid, score) in words."""
    if hasattr(x, "name"):
        return x.name
    if hasattr(x, "wm") and hasattr(x, "wn"):
        return f"{x.wm}x{x.wn} warp grid"
    if isinstance(x, (int, float)):
        return f"score {x:g}"
    return str(x)


def _use_line(u: Any) -> str:
    moved = u.thread_bytes > 0
    waves = f"{u.wavefronts}/{u.ideal_wavefronts}" if u.ideal_wavefronts else "-"
    conflicts = str(u.conflicts) if u.ideal_wavefronts else "-"
    return (f"      {u.role:<8} {u.instr:<30} {u.vector if u.vector else '-':>4} "
            f"{u.thread_bytes if moved else '-':>6} {u.warp_bytes if moved else '-':>7} "
            f"{u.warp_instructions:>7} {waves:>11} {conflicts:>9}")


# --------------------------------------------------------------------------- resources

def _resources(build: Any, compiled: Any = None) -> str:
    tk = build.thread_kernel
    own = build.synthesis.shared_bytes
    total = tk.shared_bytes
    lines = ["== resources per block",
             f"  shared memory: {total} B = {own} B of kernel buffers + {total - own} B of "
             f"scratch (conversions, reductions); the target allows "
             f"{build.target.smem_per_block_max} B"]
    live = estimate_registers(tk)
    limit = per_thread_limit(build.target, tk.threads, tk.blocks_per_sm)
    at = f" at {tk.blocks_per_sm} blocks per SM (blocks_per_sm)" if tk.blocks_per_sm else ""
    lines.append(f"  registers per thread: {live.describe()}; a block of {tk.threads} "
                 f"threads allows {limit}{at}")
    for role in live.roles:
        budget = f", budget {role.budget}" if role.budget is not None else ""
        lines.append(f"      role {role.role.split(' (')[0]}: ~{role.registers}{budget}")
    arrays = ", ".join(f"{a.name}[{a.size}] {a.dtype}" for a in tk.registers)
    if arrays:
        lines.append(f"      arrays ({register_words(tk)} words in all): {arrays}")
    if compiled is not None:
        lines.append("  " + str(compiled).replace("\n", "\n  "))
        if any(r.budget is not None for r in live.roles):
            lines.append(f"      (warp roles set their budgets with setmaxnreg: ptxas "
                         f"allocates the launch's share, {compiled.registers}, and the "
                         f"roles adjust it at run time)")
    return "\n".join(lines)


def _prediction(build: Any, grid: Any, shapes: dict | None, scalars: dict | None) -> str:
    cost = estimate(build, grid, shapes, scalars)
    text = "== predicted time (analytical model, tegula.synth.cost)\n" + str(cost)
    if cost.blocks and "grid_blocks" not in build.constexprs:
        text += "".join(f"\n  note: {n}" for n in _grid_roles_notes(build, cost.blocks))
    return text


def _grid_roles_notes(build: Any, blocks: int) -> list[str]:
    """Where the cost model kept a TMA pipeline in one role for a full grid but would give
    it a producer warpgroup for this launch's `blocks` (a build made without the grid, e.g.
    by `tegula.build.build`; a launch passes its grid as the `grid_blocks` build option,
    `synth/cost_roles.py`)."""
    from tegula.synth.cost_roles import grid_sm_blocks, why_no_producer
    on_sm = grid_sm_blocks(blocks, build.target)
    if on_sm is None:
        return []
    return [f"this grid gives an SM at most {on_sm} block(s): the cost model would give the "
            f"pipeline at line {loop.loc.lineno if loop.loc else '?'} a producer warpgroup; "
            f"a launch on this grid builds for it (grid_blocks={blocks})"
            for loop in walk_ops(build.traced.body)
            if isinstance(loop, ForLoop) and loop.choices.get("roles_skipped", "").startswith(
                "a producer warpgroup does not pay")
            and not why_no_producer(build.traced, loop, build.target, blocks)]


# --------------------------------------------------------------------------- pictures

def write_svgs(build: Any, folder: str, only: list[str] | None = None) -> list[str]:
    """Draw the kernel's layouts onto one SVG page, `folder/KERNEL.svg`: each distinct
    register TV layout and each shared buffer coloured by bank, once (tiles sharing a layout
    and shape share a picture, titled with all their names); `only` restricts it to the
    named tiles (`r0`, `s1`, ...). Returns the paths written (one, or none when nothing
    matched)."""
    pictures = _pictures(build, only)
    if not pictures:
        return []
    os.makedirs(folder, exist_ok=True)
    return [_save(folder, f"{build.traced.name}.svg", _stack(pictures))]


def tile_names(build: Any) -> list[str]:
    """The names `write_svgs(only=...)` accepts: register tiles, then shared buffers."""
    return [t.name for t in _register_tiles(build)] + \
        [a.name for a in build.traced.shared_allocs]


def _pictures(build: Any, only: list[str] | None) -> list[str]:
    """The SVG documents of the page, deduplicated by (kind, layout, shape)."""
    from tegula.layout import render

    wanted = None if only is None else {name.lstrip("%") for name in only}
    groups: dict[tuple, list[str]] = {}
    drawers: dict[tuple, Any] = {}
    for tile in _register_tiles(build):
        if tile.layout is None or len(tile.shape) > 2 or \
                (wanted is not None and tile.name not in wanted):
            continue
        key = ("register", str(tile.layout), tuple(tile.shape))
        groups.setdefault(key, []).append(describe(tile))
        drawers[key] = lambda title, t=tile: render.svg_tv_layout(
            t.layout, tuple(t.shape), title=f"{title}: {t.layout}")
    for alloc in build.traced.shared_allocs:
        if alloc.layout is None or len(alloc.shape) > 2 or \
                (wanted is not None and alloc.name not in wanted):
            continue
        key = ("shared", str(alloc.layout), tuple(alloc.shape), str(alloc.dtype))
        groups.setdefault(key, []).append(f"%{alloc.name}")
        drawers[key] = lambda title, a=alloc: render.svg_shared_layout(
            a.layout, tuple(a.shape), max(1, a.dtype.bits // 8), build.target.banks,
            build.target.bank_bytes, title=f"{title} ({a.dtype}): {a.layout}")
    return [drawers[key](", ".join(names)) for key, names in groups.items()]


def _stack(pictures: list[str]) -> str:
    """SVG documents stacked top to bottom in one document (nested <svg> elements)."""
    import re

    parts, y, width = [], 0.0, 0.0
    for svg in pictures:
        head = re.match(r'<svg [^>]*width="([\d.]+)" height="([\d.]+)"', svg)
        w, h = float(head.group(1)), float(head.group(2))
        parts.append(svg.replace("<svg ", f'<svg x="0" y="{y:g}" ', 1))
        y, width = y + h + 10, max(width, w)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width:g}" height="{y:g}" '
            f'viewBox="0 0 {width:g} {y:g}">\n' + "\n".join(parts) + "\n</svg>\n")


def _save(folder: str, name: str, text: str) -> str:
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


__all__ = ["explain", "explain_build", "write_svgs", "tile_names"]
