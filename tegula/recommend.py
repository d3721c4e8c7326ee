"""Tile recommendation (TileLang §4.2): propose the constexprs a user leaves open.

    result = tg.recommend(kernel, shapes={"a": (4096, 4096), ...}, top_k=5)
    print(result)              # the top-k with predicted times, and why each other lost
    result.best                # {"BM": 128, "BN": 128, ...}

A constexpr is *open* when the call does not fix it and the kernel declares no default
for it, or declares a set of values (`BM: tg.constexpr(choices=(64, 128, 256)) = 128`).
Open constexprs without declared values try `DEFAULT_VALUES` (powers of two for tile
extents); `space={"BM": [...], "threads": [...]}` overrides both.

The method, deterministic and independent of the order values are listed in:
1. Enumerate the combinations of the open values, each list sorted, in lexicographic
   order of the names; at most `budget` (default `DEFAULT_BUDGET`) are built and scored,
   spread evenly over the whole space (every `n / budget`-th), and the rest are counted
   as not tried in the report.
2. Build each (trace, synthesis, lowering: no compiler, no GPU). A combination the
   compiler refuses, whose shared memory exceeds the target's per-block limit, or whose
   registers (estimated from liveness, `synth/registers.py`) exceed what a block of its
   threads allows, is dropped with the reason.
3. Score the rest by the cost model's predicted time for the whole grid
   (`synth/cost.py`), the grid from `grid(config)` or inferred from the output tiles
   (`infer_grid`); ties go to the smaller config key, so the ranking does not depend on
   the enumeration order.
4. The load path is a decision too: where a combination's pipelined copies took TMA (the
   synthesis default), the same combination with `load_path="cp.async"` (a build option)
   is a branch, bounded: it is built and scored only if its floor — the time of its tensor
   work, L2 and DRAM bytes alone, which no load path or occupancy can beat
   (`CostEstimate.floor_cycles`) — is below the k-th best time found so far; otherwise it
   is reported as pruned. A pruned branch could not have entered the top k, so the top k
   is exact whatever the visiting order. On a predicted tie the TMA build ranks first (the
   synthesis default; the model often ties the two where L2 bandwidth bounds both). Pass
   `load_path=` to fix it, or list it in `space=` to score every value.
5. The orientation of a GEMM is a decision when asked for: `orientation=("a", "b", "c")`
   names the tensors of a kernel computing c = a @ b.T, and every combination is scored
   as written ("C") and transposed ("Cᵀ": the kernel computes cᵀ = b @ aᵀ, a and b
   exchanged, c an (N, M) tensor the caller reads as its transpose). It matters where
   the tiles are not symmetric in M and N, e.g. 16 tokens against a wgmma's 64-row M.
   The grid is inferred, or a function of the config, which then sees
   `config["orientation"]`. On a tie "C" ranks first (the smaller key).

The cluster shape is a constexpr of the kernels that take one (the persistent GEMM's
`CLUSTER`, `tg.cluster`): list it in `space=` (e.g. `{"CLUSTER": [1, 2]}`) and the cost
model weighs what a cluster changes: a multicast box read from L2 once for the cluster
(each SM still receives all of it), each stage coupled to every block of it
(`synth/cost.py`); on the H100 clusters of 2 never ran faster, and the model agrees.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from tegula.errors import TegulaError

#: Values tried for an open constexpr that declares none.
DEFAULT_VALUES = (16, 32, 64, 128, 256)
#: How many combinations `recommend` builds and scores unless told otherwise.
DEFAULT_BUDGET = 256


@dataclass
class Candidate:
    """One combination: its constexprs (and `threads`), the predicted seconds and the
    cost estimate behind them, or why it was dropped."""

    config: dict
    seconds: float | None = None
    estimate: Any = None
    dropped: str | None = None
    uses_tma: bool = False            # some pipelined copy of its build is a TMA box
    build: Any = field(default=None, repr=False)   # what was built, with score(keep_build=)
    launches: str = ""               # a plan's kernels (recommend_plans)

    @property
    def key(self) -> str:
        return ",".join(f"{k}={self.config[k]!r}" for k in sorted(self.config))


@dataclass
class Recommendation:
    """What `recommend` found: `ranked` candidates (fastest first), `dropped` ones with
    reasons, how many combinations existed and how many were `not_tried` (budget)."""

    kernel: str
    target: str
    open_names: tuple
    ranked: list = field(default_factory=list)
    dropped: list = field(default_factory=list)
    pruned: list = field(default_factory=list)   # load-path branches cut by the bound
    combinations: int = 0
    not_tried: int = 0
    top_k: int = 5
    assumed: tuple = ()          # open names tried with DEFAULT_VALUES

    @property
    def best(self) -> dict | None:
        return dict(self.ranked[0].config) if self.ranked else None

    @property
    def top(self) -> list:
        return self.ranked[:self.top_k]

    def __str__(self) -> str:
        lines = [f"recommendation for {self.kernel} on {self.target}: open "
                 f"{', '.join(self.open_names) or '(none)'}; {self.combinations} "
                 f"combination(s), {self.combinations - self.not_tried} scored by the cost "
                 f"model"]
        if self.not_tried:
            lines.append(f"  budget: {self.not_tried} combination(s) not tried (raise the "
                         f"budget to score them)")
        if self.assumed:
            lines.append(f"  {', '.join(self.assumed)}: no declared values; tried "
                         f"{DEFAULT_VALUES} (declare tg.constexpr(choices=...) or pass space=)")
        if not self.ranked:
            lines.append("  no combination fits (see the reasons below)")
        best = self.ranked[0] if self.ranked else None
        for i, c in enumerate(self.top, 1):
            runs = f"{c.launches}; " if c.launches else ""
            lines.append(f"  {i}. {c.key}: {c.seconds * 1e6:.2f} us predicted "
                         f"({runs}{_summary(c.estimate)})" + ("" if c is best else
                                                       f"; {_why_lost(c, best)}"))
        rest = self.ranked[self.top_k:]
        if rest:
            lines.append(f"  the other {len(rest)} that fit, and why they lost:")
            lines += [f"    {c.key}: {c.seconds * 1e6:.2f} us; {_why_lost(c, best)}"
                      for c in rest]
        if self.dropped:
            lines.append(f"  dropped ({len(self.dropped)}):")
            lines += [f"    {c.key}: {c.dropped}" for c in self.dropped]
        if self.pruned:
            lines.append(f"  branches pruned by the bound, not built "
                         f"({len(self.pruned)}):")
            lines += [f"    {c.key}: {c.dropped}" for c in self.pruned]
        return "\n".join(lines)


def _summary(est: Any) -> str:
    return (f"{est.bound}-bound, {est.blocks} blocks in {est.waves} wave(s), "
            f"{est.blocks_per_sm}/SM, {est.shared_bytes} B shared, ~{est.registers} regs")


def _why_lost(c: Candidate, best: Candidate) -> str:
    """Why `c` is predicted slower than `best`, from the numbers that differ most."""
    a, b = c.estimate, best.estimate
    if c.seconds <= best.seconds * (1 + 1e-9):
        return "tied with #1 (the same predicted time; ties are ordered by the config key)"
    slower = f"{(c.seconds / best.seconds - 1) * 100:.1f}% slower than #1"
    first = "first launch " if c.launches else ""   # a plan's figures: its first launch's
    reasons = [f"{first}{a.waves} wave(s) x {a.block_cycles:,.0f} cycles vs {b.waves} x "
               f"{b.block_cycles:,.0f}"]
    if c.launches != best.launches:
        reasons.insert(0, f"runs {c.launches} where #1 runs {best.launches}")
    if a.blocks_per_sm != b.blocks_per_sm:
        reasons.append(f"{a.blocks_per_sm} block(s)/SM vs {b.blocks_per_sm} "
                       f"(limited by {a.occupancy_limit})")
    if a.bound != b.bound:
        reasons.append(f"{a.bound}-bound where #1 is {b.bound}-bound")
    clustered = [n for n in a.notes if n.startswith("clusters of")]
    if clustered and not any(n.startswith("clusters of") for n in b.notes):
        reasons.append(clustered[0].split(" (CLUSTER_COUPLING")[0])  # what the cluster did
    return f"{slower}: " + "; ".join(reasons)


def open_constexprs(kernel: Any, fixed: Mapping[str, Any],
                    space: Mapping[str, Any] | None = None) -> tuple[dict, tuple]:
    """{name: sorted candidate values} for the open constexprs (module docstring), and the
    names that took `DEFAULT_VALUES`."""
    space = dict(space or {})
    values: dict[str, tuple] = {}
    assumed = []
    for p in kernel.params:
        if p.kind != "constexpr" or p.name in fixed:
            continue
        declared = getattr(p, "choices", None)
        if p.name in space:
            values[p.name] = _sorted(space.pop(p.name), p.name)
        elif declared:
            values[p.name] = _sorted(declared, p.name)
        elif _has_no_default(p):
            values[p.name] = DEFAULT_VALUES
            assumed.append(p.name)
    for option in ("threads", "load_path"):  # build options searched like constexprs
        if option in space:
            values[option] = _sorted(space.pop(option), option)
    if space:
        raise TegulaError(f"recommend {kernel.name}: space names {', '.join(sorted(space))}, "
                          f"which are not open constexprs of the kernel (its constexprs: "
                          f"{', '.join(kernel.constexpr_names) or '(none)'}; fixed: "
                          f"{', '.join(sorted(fixed)) or '(none)'})")
    return dict(sorted(values.items())), tuple(assumed)


def _has_no_default(param: Any) -> bool:
    import inspect
    return param.default is inspect.Parameter.empty


def _sorted(values: Any, name: str) -> tuple:
    items = tuple(values) if isinstance(values, (list, tuple, set, frozenset, range)) else None
    if not items:
        raise TegulaError(f"the values of {name} must be a non-empty list, got {values!r}")
    return tuple(sorted(set(items), key=lambda v: (type(v).__name__, v)))


def combinations(values: Mapping[str, tuple], budget: int) -> tuple[list[dict], int]:
    """The combinations to score, at most `budget`, spread evenly over the lexicographic
    enumeration; and the count of all combinations."""
    names = list(values)
    total = 1
    for v in values.values():
        total *= len(v)
    if budget <= 0:
        raise TegulaError(f"recommend: the budget must be positive, got {budget}")
    if total <= budget:
        picks = range(total)
    else:
        picks = sorted({i * total // budget for i in range(budget)})
    combos = []
    for index in picks:
        combo, rest = {}, index
        for name in reversed(names):   # mixed-radix digits, the last name fastest
            combo[name] = values[name][rest % len(values[name])]
            rest //= len(values[name])
        combos.append({n: combo[n] for n in names})
    return combos, total


def infer_grid(traced: Any, shapes: Mapping[str, tuple]) -> tuple | None:
    """The grid that covers every output tile placed at `block_id(axis) * extent` (as
    `t.tile((BM, BN), (m, n))` does), or None when no written tile is placed by a block
    index (then pass `grid=`)."""
    from tegula.ir.ops import tiles_written, walk_ops
    from tegula.ir.scalar import BlockIndex, ScalarBinOp, ScalarConst
    from tegula.ir.values import GlobalTile

    grid = [0, 0, 0]
    for op in walk_ops(traced.body):
        for tile in tiles_written(op):
            if not isinstance(tile, GlobalTile) or tile.arg.name not in shapes:
                continue
            for dim, origin in enumerate(tile.origin):
                axis, step = _block_times_constant(origin, BlockIndex, ScalarBinOp, ScalarConst)
                if axis is not None and dim < len(shapes[tile.arg.name]):
                    extent = int(shapes[tile.arg.name][dim])
                    grid[axis] = max(grid[axis], -(-extent // step))
    if not any(grid):
        return None
    return tuple(max(1, g) for g in grid)


def _block_times_constant(x, BlockIndex, ScalarBinOp, ScalarConst) -> tuple:  # noqa: N803
    """(axis, c) when `x` is `block_id(axis) * c` (either order) or `block_id(axis)`."""
    if isinstance(x, BlockIndex):
        return x.axis, 1
    if isinstance(x, ScalarBinOp) and x.op == "*":
        for a, b in ((x.lhs, x.rhs), (x.rhs, x.lhs)):
            if isinstance(a, BlockIndex) and isinstance(b, ScalarConst) and b.value > 0:
                return a.axis, b.value
    return None, 0


def shapes_of(kernel: Any, args: tuple, shapes: Mapping[str, Any] | None) -> tuple[dict, dict]:
    """(tensor shapes, scalar values) by parameter name, from positional `args` (arrays,
    tensors or shape tuples for tensors; ints for scalars) and `shapes`. Shapes are in
    elements: an array holding a packed 4-bit tensor (`u4`, `i4`: two elements per byte)
    has half as many along its last dim, which is doubled here as a launch does; a shape
    tuple is taken as given, in elements."""
    found: dict[str, tuple] = {}
    scalars: dict[str, int] = {}
    runtime = [p for p in kernel.params if p.kind != "constexpr"]
    if len(args) > len(runtime):
        raise TegulaError(f"recommend {kernel.name}: {len(args)} arguments for "
                          f"{len(runtime)} tensor/scalar parameters")
    for p, a in zip(runtime, args):
        if p.kind == "scalar":
            scalars[p.name] = int(a)
        else:
            shape = tuple(int(d) for d in (a if isinstance(a, tuple) else a.shape))
            if not isinstance(a, tuple) and p.spec.dtype.is_packed and shape:
                shape = shape[:-1] + (2 * shape[-1],)
            found[p.name] = shape
    for name, shape in (shapes or {}).items():
        found[name] = tuple(int(d) for d in shape)
    missing = [p.name for p in runtime if p.kind == "tensor" and p.name not in found]
    if missing:
        raise TegulaError(f"recommend {kernel.name}: no shape for {', '.join(missing)} (pass "
                          f"arrays, or shapes={{'{missing[0]}': (M, N)}}; on the command line "
                          f"--shape {missing[0]}=MxN)")
    return found, scalars


def recommend(kernel: Any, *args: Any, shapes: Mapping[str, Any] | None = None,
              grid: Callable[[dict], Any] | tuple | None = None, top_k: int = 5,
              target: str | None = None, budget: int = DEFAULT_BUDGET,
              space: Mapping[str, Any] | None = None,
              orientation: tuple[str, str, str] | None = None, **fixed: Any) -> Recommendation:
    """Rank the combinations of `kernel`'s open constexprs by predicted time (module
    docstring). `args`: the launch's tensors (or their shapes) and scalars in order, or
    `shapes` by name; `grid`: a tuple, or a function of the config dict (as Triton's
    `grid=lambda meta: ...`), else inferred; `orientation`: the names (a, b, c) of a
    kernel computing c = a @ b.T, to score each combination in both orientations (module
    docstring, step 5); `fixed`: constexprs not to vary."""
    from tegula.build import DEFAULT_TARGET

    target = target or DEFAULT_TARGET
    tensor_shapes, scalars = shapes_of(kernel, args, shapes)
    values, assumed = open_constexprs(kernel, fixed, space)
    if orientation is not None:
        _check_orientation(kernel, orientation, tensor_shapes, grid)
        values = dict(sorted({**values, "orientation": ORIENTATIONS}.items()))
        orientation = tuple(orientation)
    combos, total = combinations(values, budget)
    result = Recommendation(kernel.name, str(target), tuple(values), combinations=total,
                            not_tried=total - len(combos), top_k=top_k, assumed=assumed)
    branch_load_path = "load_path" not in fixed and "load_path" not in values
    for combo in combos:
        candidate = score(kernel, combo, fixed, tensor_shapes, scalars, grid, target,
                          orientation)
        (result.ranked if candidate.dropped is None else result.dropped).append(candidate)
        if branch_load_path and candidate.uses_tma:
            _branch_load_path(result, candidate, kernel, fixed, tensor_shapes, scalars,
                              grid, target, orientation)
    # On a predicted tie the synthesis default (TMA) goes first, then the smaller key.
    result.ranked.sort(key=lambda c: (c.seconds, c.config.get("load_path") == "cp.async",
                                      c.key))
    for found in (result.dropped, result.pruned):
        found.sort(key=lambda c: c.key)
    return result


def _branch_load_path(result: Recommendation, candidate: Candidate, kernel: Any,
                      fixed: Mapping[str, Any], shapes: dict, scalars: dict, grid: Any,
                      target: Any, gemm_names: tuple | None) -> None:
    """Score `candidate`'s combination on cp.async instead of TMA, unless its floor
    already exceeds the k-th best time (module docstring, step 4)."""
    tma_config = dict(candidate.config)
    candidate.config["load_path"] = "tma"
    variant = {**tma_config, "load_path": "cp.async"}
    times = sorted(c.seconds for c in result.ranked)
    kth = times[result.top_k - 1] if len(times) >= result.top_k else None
    floor = candidate.estimate.floor_cycles / (candidate.estimate.clock_ghz * 1e9)
    if kth is not None and floor > kth:
        result.pruned.append(Candidate(variant, dropped=(
            f"its floor (tensor work, L2 and DRAM bytes) is {floor * 1e6:.2f} us, over the "
            f"#{result.top_k} time found before it, {kth * 1e6:.2f} us")))
        return
    scored = score(kernel, variant, fixed, shapes, scalars, grid, target, gemm_names)
    (result.ranked if scored.dropped is None else result.dropped).append(scored)


def score(kernel: Any, combo: dict, fixed: Mapping[str, Any], shapes: dict, scalars: dict,
          grid: Any, target: Any, gemm_names: tuple | None = None,
          keep_build: bool = False, ptxas: bool = False) -> Candidate:
    """Build one combination and predict its time, or say why it does not fit; a combo
    with `orientation` "Cᵀ" runs the GEMM c = a @ b.T named by `gemm_names` (a, b, c)
    transposed. `keep_build` keeps the build on the candidate (to compile it). `ptxas`
    compiles it (a CUDA compiler, no GPU) and predicts with ptxas's register count, not
    the liveness estimate; a build ptxas spills is dropped."""
    from tegula.build import build
    from tegula.ir.ops import walk_ops
    from tegula.synth.cost import estimate
    from tegula.synth.registers import estimate_registers, over_limit

    candidate = Candidate(dict(combo))
    combo = dict(combo)
    shapes = _oriented(shapes, combo.pop("orientation", "C"), gemm_names)
    try:
        built = build(kernel, {**fixed, **combo}, _facts(kernel, shapes), target=target)
        launch_grid = _launch_grid(kernel, built, candidate, grid, shapes)
        # the build a launch on this grid runs (its block count is a build fact: the same
        # build unless the grid changes the warp roles the cost model decides)
        blocks = math.prod((launch_grid,) if isinstance(launch_grid, int) else launch_grid)
        if blocks > 0 and "grid_blocks" not in {**fixed, **combo}:
            built = build(kernel, {**fixed, **combo, "grid_blocks": int(blocks)},
                          _facts(kernel, shapes), target=target)
    except TegulaError as err:
        if isinstance(err, GridError):
            raise
        candidate.dropped = "the compiler refuses it: " + str(err).strip().splitlines()[0]
        return candidate
    tk, tgt = built.thread_kernel, built.target
    if tk.shared_bytes > tgt.smem_per_block_max:
        candidate.dropped = (f"shared memory {tk.shared_bytes} B over the {tgt.name} limit of "
                             f"{tgt.smem_per_block_max} B per block")
        return candidate
    registers = None
    if ptxas:
        from tegula.explain import compile_report
        report = compile_report(built)
        if report.spills:
            candidate.dropped = (f"ptxas spills it ({report.registers} registers, "
                                 f"{report.spill_stores} B of spill stores)")
            return candidate
        registers = report.registers
    over = [] if ptxas else over_limit(tgt, tk.threads, estimate_registers(tk),
                                       tk.blocks_per_sm)
    if over:
        candidate.dropped = over[0] + ": would spill"
        return candidate
    candidate.build = built if keep_build else None
    candidate.estimate = estimate(built, launch_grid, shapes, scalars, registers)
    candidate.seconds = candidate.estimate.seconds
    candidate.uses_tma = any(getattr(op, "choices", {}).get("instr") == "tma"
                             for op in walk_ops(built.traced.body))
    return candidate


class GridError(TegulaError):
    """recommend cannot tell a combination's launch grid."""


def _launch_grid(kernel: Any, built: Any, candidate: Candidate, grid: Any, shapes: dict):
    """The launch grid of `candidate`'s build: a callable grid sees every constexpr's value
    (defaults too), as a launch's does, and the orientation where it is searched."""
    seen = dict(built.traced.constexprs)
    if "orientation" in candidate.config:
        seen["orientation"] = candidate.config["orientation"]
    launch_grid = grid(seen) if callable(grid) else grid
    if launch_grid is None:
        launch_grid = infer_grid(built.traced, shapes)
        if launch_grid is None:
            raise GridError(f"recommend {kernel.name}: cannot infer the grid (no output "
                            f"tile is placed at block_id(axis) * extent); pass grid= (a "
                            f"tuple or a function of the config, e.g. lambda c: "
                            f"(cdiv(M, c['BM']), cdiv(N, c['BN']))) or --grid")
    return launch_grid


@dataclass
class Launch:
    """One kernel launch of a plan: `args` the launch's tensors (arrays of the right
    shapes, or shape tuples) and scalars in parameter order, `constexprs` with the build
    options (`threads`, `warp_specialize`, ...)."""

    kernel: Any
    grid: tuple
    args: tuple
    constexprs: dict


def recommend_plans(name: str, coordinate: str, plans: Mapping[str, list], top_k: int = 5,
                    target: str | None = None, budget: int = DEFAULT_BUDGET
                    ) -> Recommendation:
    """Rank whole launch plans where a decision changes more than constexprs: each value
    of `coordinate` (e.g. a constant operand's pre-packed layout: "plain" or "fragment")
    has its own kernels, so `plans[value]` lists (config, [Launch, ...]) pairs, and a
    plan's predicted time is the sum of its launches' (a split-K product and its sum).
    One ranking over every value, `config[coordinate]` naming it: the decision is a
    coordinate of the same decision vector the constexprs are. Branch and bound: a plan
    whose first launch's floor (`CostEstimate.floor_cycles`) is over the k-th best total
    found so far is pruned, not scored further (its total is at least that floor, so the
    top k is exact in any visiting order). At most `budget` plans are scored, spread
    evenly over the values in sorted order; the rest are reported as not tried."""
    from tegula.build import DEFAULT_TARGET

    target = target or DEFAULT_TARGET
    listed = [(value, config, launches) for value in sorted(plans)
              for config, launches in plans[value]]
    if budget <= 0:
        raise TegulaError(f"recommend {name}: the budget must be positive, got {budget}")
    picks = range(len(listed)) if len(listed) <= budget else \
        sorted({i * len(listed) // budget for i in range(budget)})
    result = Recommendation(name, str(target), (coordinate,), combinations=len(listed),
                            not_tried=len(listed) - len(picks), top_k=top_k)
    for i in picks:
        value, config, launches = listed[i]
        candidate = _score_plan({coordinate: value, **config}, launches, target, result)
        found = result.ranked if candidate.seconds is not None else \
            result.pruned if candidate.dropped.startswith("pruned") else result.dropped
        found.append(candidate)
    result.ranked.sort(key=lambda c: (c.seconds, c.key))
    for found in (result.dropped, result.pruned):
        found.sort(key=lambda c: c.key)
    return result


def _score_plan(config: dict, launches: list, target: Any,
                result: Recommendation) -> Candidate:
    """A plan's candidate: the sum of its launches' predicted times (the first launch's
    estimate kept for the report), dropped with the first launch that does not fit, or
    pruned by the first launch's floor (`recommend_plans`)."""
    total, first = 0.0, None
    for number, launch in enumerate(launches):
        shapes, scalars = shapes_of(launch.kernel, launch.args, None)
        scored = score(launch.kernel, launch.constexprs, {}, shapes, scalars,
                       tuple(launch.grid), target)
        if scored.dropped:
            return Candidate(config, dropped=f"{launch.kernel.name}: {scored.dropped}")
        if number == 0:
            first = scored.estimate
            times = sorted(c.seconds for c in result.ranked)
            kth = times[result.top_k - 1] if len(times) >= result.top_k else None
            floor = first.floor_cycles / (first.clock_ghz * 1e9)
            if kth is not None and floor > kth:
                return Candidate(config, dropped=(
                    f"pruned: {launch.kernel.name}'s floor (tensor work, L2 and DRAM bytes) "
                    f"is {floor * 1e6:.2f} us, over the #{result.top_k} time found before "
                    f"it, {kth * 1e6:.2f} us"))
        total += scored.seconds
    more = f" + {len(launches) - 1} more launch(es)" if len(launches) > 1 else ""
    candidate = Candidate(config, seconds=total, estimate=first)
    candidate.launches = f"{launches[0].kernel.name}{more}"
    return candidate


#: The two orientations of a GEMM c = a @ b.T: as written, or transposed — the kernel
#: computes cᵀ = b @ aᵀ, with a and b exchanged and c stored as its (N, M) transpose.
ORIENTATIONS = ("C", "Cᵀ")


def _oriented(shapes: dict, orientation: str, gemm_names: tuple | None) -> dict:
    """The tensor shapes the kernel sees in `orientation`; `gemm_names`: the (a, b, c) of
    its c = a @ b.T."""
    if orientation == "C":
        return shapes
    a, b, c = gemm_names
    return dict(shapes, **{a: shapes[b], b: shapes[a], c: tuple(reversed(shapes[c]))})


def _check_orientation(kernel: Any, names: Any, shapes: dict, grid: Any) -> None:
    """`orientation=(a, b, c)` names three rank-2 tensors of `kernel` with c = a @ b.T's
    shapes, and the grid follows the orientation (inferred or a function of the config)."""
    where = f"recommend {kernel.name}: orientation={tuple(names)!r}"
    if not (isinstance(names, (tuple, list)) and len(names) == 3):
        raise TegulaError(f"{where}: give the names (a, b, c) of the kernel's tensors for "
                          f"c = a @ b.T, e.g. orientation=('a', 'b', 'c')")
    missing = [n for n in names if n not in shapes]
    if missing:
        raise TegulaError(f"{where}: {', '.join(map(repr, missing))} is not a tensor parameter "
                          f"with a shape (tensors: {', '.join(sorted(shapes))})")
    a, b, c = (tuple(shapes[n]) for n in names)
    if not (len(a) == len(b) == len(c) == 2 and a[1] == b[1] and c == (a[0], b[0])):
        raise TegulaError(f"{where}: the shapes {names[0]}={a}, {names[1]}={b}, {names[2]}={c} "
                          f"are not those of {names[2]} = {names[0]} @ {names[1]}.T (M x K, N x "
                          f"K, M x N)")
    if grid is not None and not callable(grid):
        raise TegulaError(f"{where}: a fixed grid {tuple(grid)} cannot follow the "
                          f"orientation; leave grid out (inferred from the output tiles) or "
                          f"pass a function of the config, which sees config['orientation']")


def _facts(kernel: Any, shapes: dict) -> dict:
    """Facts of contiguous, 16-byte-aligned tensors of these shapes (what a launch on fresh
    torch tensors would see)."""
    from tegula.synth.facts import TensorFacts

    facts = {}
    for p in kernel.params:
        if p.kind == "tensor" and p.name in shapes:
            shape = shapes[p.name]
            strides = tuple(int(_prod(shape[d + 1:])) for d in range(len(shape)))
            facts[p.name] = TensorFacts.of(shape, strides, 0, max(1, p.spec.dtype.bits) / 8)
    return facts


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


__all__ = ["recommend", "recommend_plans", "Launch", "Recommendation", "Candidate",
           "infer_grid", "open_constexprs",
           "combinations", "DEFAULT_VALUES", "DEFAULT_BUDGET"]
