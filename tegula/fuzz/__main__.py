"""`python -m tegula.fuzz`: the differential fuzzer from the command line.

    python -m tegula.fuzz --minutes 30 --seed 7          # long mode: run, shrink, report
    python -m tegula.fuzz --programs 200 --seed 1        # a fixed number of programs
    python -m tegula.fuzz --seed 7 --program 1234        # show and rerun one program
    python -m tegula.fuzz --switches=-loop_rebind,-npot_tiles   # leave features out
    python -m tegula.fuzz --targets sm_90a,sm_80,sm_90  # targets each program runs for
    python -m tegula.fuzz --role-order listed           # warp roles in the fixed order
    python -m tegula.fuzz --seed 7 --tile-loop 12       # show and rerun one tile loop
    python -m tegula.fuzz --seed 7 --specialized 12     # one warp-specialized program
    python -m tegula.fuzz --seed 7 --split-merge 3      # one tg.last_arrival split-K GEMM
    python -m tegula.fuzz --seed 7 --gemm-chain 5       # one two-gemm chain (turns in its loop)

Every program runs for each target (default sm_90a and sm_80; sm_89 where sm_80 refuses,
e.g. 8-bit float GEMMs), against numpy and the targets against each other; the warp roles
of a warp-specialized build run in an interleaving drawn per program (`--role-order
random`, the default; reproducible from the seed and program). The summary says per target how many programs passed through
wgmma, TMA, cp.async, mma.sync and ldmatrix. Each failure (a wrong answer or an internal
error, naming its target) is printed as source and shrunk to a minimal kernel, printed
as source with the command that reproduces it. The exit status is 1 if any program failed.

Every `TILE_LOOP_EVERY`-th program is followed by a persistent tile-loop program
(`tile_loops`: tile maps and global reads that ping-pong consumers must not split), run
for sm_90a (synthesis's choice and ping-pong forced) and sm_80 against a sequential model;
every `SPECIALIZED_EVERY`-th by a warp-specialized GEMM program (`specialized`: built with
`warp_specialize=True`, some with a consumer schedule), judged like the others (every
other one under `--role-order stall` or `stall-reversed`); every `SPLIT_MERGE_EVERY`-th by a
split-K GEMM whose last block merges the splits (`split_merge`: `tg.last_arrival`), run
for sm_90a and sm_80 against a numpy model, relaunched on the same counters; and every
`GEMM_CHAIN_EVERY`-th by an attention-shaped chain of two gemms in a pipeline
(`gemm_chains`: on ping-pong consumers the two warpgroups take turns inside the loop).
"""
from __future__ import annotations

import argparse
import sys
import time

from tegula.fuzz import fuzz_program, make_program
from tegula.fuzz.generate import Switches
from tegula.fuzz.reference import Features
from tegula.fuzz.runner import ROLE_ORDERS, TARGETS, Tally
from tegula.fuzz.shrink import shrink
from tegula.fuzz.source import kernel_source
from tegula.fuzz.specialized import make_specialized_program

SHRINKS_PER_REASON = 2
#: A tile-loop program after every this many generated programs (each ~3 emulations).
TILE_LOOP_EVERY = 10
#: A warp-specialized program after every this many (`specialized`; ~0.5 s each).
SPECIALIZED_EVERY = 4
#: A split-K GEMM merged by its last block after every this many (~1 s each).
SPLIT_MERGE_EVERY = 8
#: A two-gemm chain after every this many (~2 s each).
GEMM_CHAIN_EVERY = 10


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tegula.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=None, help="run for this long")
    ap.add_argument("--programs", type=int, default=None, help="run this many programs")
    ap.add_argument("--program", type=int, default=None, help="show and run one program")
    ap.add_argument("--tile-loop", type=int, default=None,
                    help="show and run one tile-loop program")
    ap.add_argument("--specialized", type=int, default=None,
                    help="show and run one warp-specialized program")
    ap.add_argument("--split-merge", type=int, default=None,
                    help="show and run one split-K GEMM merged by its last block")
    ap.add_argument("--gemm-chain", type=int, default=None,
                    help="show and run one chain of two gemms in a pipeline")
    ap.add_argument("--start", type=int, default=0, help="index of the first program")
    ap.add_argument("--switches", default="", help="e.g. -loop_rebind,-pipelines,max_tile=256")
    ap.add_argument("--targets", default=",".join(TARGETS),
                    help="targets every program runs for, compared with numpy and each other")
    ap.add_argument("--role-order", choices=ROLE_ORDERS, default="random",
                    help="how warp roles interleave: random (drawn per program) or fixed")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--shrink-seconds", type=float, default=60.0)
    return ap.parse_args(argv)


def _features(switches: Switches) -> Features:
    return Features(nan_reductions=switches.nan_reductions)


def _flags(args) -> str:
    """The options a reproducing command must repeat."""
    return (f" --switches={args.switches}" if args.switches else "") + \
        (f" --targets {args.targets}" if _targets(args) != TARGETS else "") + \
        (f" --role-order {args.role_order}" if args.role_order != "random" else "")


def _targets(args) -> tuple:
    return tuple(filter(None, (t.strip() for t in args.targets.split(","))))


def _show_one(args, switches: Switches) -> int:
    index = args.program if args.program is not None else args.specialized
    make = make_program if args.program is not None else make_specialized_program
    program = make(args.seed, index, switches)
    print(kernel_source(program))
    verdict = fuzz_program(program, args.seed, index, _features(switches),
                           _targets(args), args.role_order)
    print(f"verdict: {verdict.status} {verdict.reason}\n{verdict.detail}")
    for target, (status, reason, paths) in verdict.targets.items():
        print(f"  {target}: {status} {reason} [{', '.join(sorted(paths)) or 'no async path'}]")
    return 1 if verdict.failed else 0


def _report_failure(args, switches, index: int, program, verdict, shrunk: dict,
                    option: str = "--program") -> None:
    try:
        _print_failure(args, switches, index, program, verdict, shrunk, option)
    finally:
        sys.stdout.flush()  # a long run's log shows each failure as it is found


def _print_failure(args, switches, index: int, program, verdict, shrunk: dict,
                   option: str) -> None:
    kind = "warp-specialized program" if option == "--specialized" else "program"
    print(f"\n=== {kind} {index} (seed {args.seed}), target {verdict.target}: "
          f"{verdict.status}: {verdict.reason}")
    print(kernel_source(program).rstrip())
    print(verdict.detail.rstrip())
    key = (verdict.status, verdict.reason)
    if args.no_shrink or shrunk.get(key, 0) >= SHRINKS_PER_REASON:
        print(f"reproduce: python -m tegula.fuzz --seed {args.seed} {option} {index}"
              + _flags(args))
        return
    shrunk[key] = shrunk.get(key, 0) + 1
    features = _features(switches)
    small, small_verdict, runs = shrink(
        program, lambda p: fuzz_program(p, args.seed, index, features, _targets(args),
                                        args.role_order), verdict,
        budget_s=args.shrink_seconds)
    print(f"--- minimal kernel ({runs} shrink runs):")
    print(kernel_source(small).rstrip())
    print(small_verdict.detail.rstrip()[-2000:])
    print(f"reproduce the original: python -m tegula.fuzz --seed {args.seed} {option} {index}"
          + _flags(args))


def main(argv=None) -> int:
    args = _parse(argv)
    switches = Switches.parse(args.switches)
    if args.program is not None or args.specialized is not None:
        return _show_one(args, switches)
    if args.tile_loop is not None:
        return _run_tile_loop(args.seed, args.tile_loop, {}, show=True)
    if args.split_merge is not None:
        return _run_extra("split_merge", args.seed, args.split_merge, {}, show=True)
    if args.gemm_chain is not None:
        return _run_extra("gemm_chain", args.seed, args.gemm_chain, {}, show=True)
    if args.minutes is None and args.programs is None:
        args.programs = 100
    deadline = time.monotonic() + 60 * args.minutes if args.minutes is not None else None
    tally, shrunk, loops, specialized = Tally(), {}, {}, Tally()
    merges, chains = {}, {}
    features = _features(switches)
    index = args.start
    started = time.monotonic()
    while True:
        if args.programs is not None and index - args.start >= args.programs:
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        program = make_program(args.seed, index, switches)
        verdict = fuzz_program(program, args.seed, index, features, _targets(args),
                               args.role_order)
        tally.add(verdict)
        if verdict.failed:
            _report_failure(args, switches, index, program, verdict, shrunk)
        if index % TILE_LOOP_EVERY == 0:
            _run_tile_loop(args.seed, index // TILE_LOOP_EVERY, loops)
        if index % SPECIALIZED_EVERY == 0:
            _run_specialized(args, switches, index // SPECIALIZED_EVERY, specialized, shrunk)
        if index % SPLIT_MERGE_EVERY == 0:
            _run_extra("split_merge", args.seed, index // SPLIT_MERGE_EVERY, merges)
        if index % GEMM_CHAIN_EVERY == 5:
            _run_extra("gemm_chain", args.seed, index // GEMM_CHAIN_EVERY, chains)
        index += 1
        if tally.programs % 500 == 0:
            print(f"[{time.monotonic() - started:.0f}s] {tally.report().splitlines()[0]}",
                  flush=True)
    print(f"\nseed {args.seed}, programs {args.start}..{index - 1}, "
          f"{time.monotonic() - started:.0f} s")
    print(tally.report())
    print("tile loops: " + (", ".join(f"{k} {v}" for k, v in sorted(loops.items())) or "none"))
    print("warp-specialized " + specialized.report())
    for name, counts in (("split merges", merges), ("gemm chains", chains)):
        print(f"{name}: " + (", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"))
    failed = [counts.get(s) for counts in (loops, merges, chains)
              for s in ("mismatch", "internal")]
    return 1 if tally.failures or specialized.failures or any(failed) else 0


def _run_specialized(args, switches: Switches, index: int, tally: Tally, shrunk: dict) -> None:
    """Run warp-specialized program `index` of the seed, count it, report a failure. Under
    the default random order, every other one runs under a stall order instead (a role
    held after each named-barrier arrive while the others run ahead)."""
    program = make_specialized_program(args.seed, index, switches)
    if args.role_order == "random" and index % 2:
        args = argparse.Namespace(**vars(args))  # its reproducing command names the order
        args.role_order = ("stall", "stall-reversed")[index // 2 % 2]
    verdict = fuzz_program(program, args.seed, index, _features(switches), _targets(args),
                           args.role_order)
    tally.add(verdict)
    if verdict.failed:
        _report_failure(args, switches, index, program, verdict, shrunk, "--specialized")


def _run_tile_loop(seed: int, index: int, counts: dict, show: bool = False) -> int:
    """Run tile-loop program `index` of `seed`, count its status, print a failure."""
    from tegula.fuzz.tile_loops import check_tile_loop, make_tile_loop
    loop = make_tile_loop(seed, index)
    status, reason, detail = check_tile_loop(loop, seed * 100003 + index)
    counts[status] = counts.get(status, 0) + 1
    if show or status in ("mismatch", "internal"):
        print(f"\n=== tile loop {index} (seed {seed}): {status}: {reason}\n{detail}\n"
              f"reproduce: python -m tegula.fuzz --seed {seed} --tile-loop {index}", flush=True)
    return 1 if status in ("mismatch", "internal") else 0


def _run_extra(kind: str, seed: int, index: int, counts: dict, show: bool = False) -> int:
    """Run program `index` of `seed` of a template generator (`kind`: "split_merge",
    `split_merge`; "gemm_chain", `gemm_chains`), count its status, print a failure."""
    if kind == "split_merge":
        from tegula.fuzz.split_merge import check_split_merge as check
        from tegula.fuzz.split_merge import make_split_merge as make
    else:
        from tegula.fuzz.gemm_chains import check_gemm_chain as check
        from tegula.fuzz.gemm_chains import make_gemm_chain as make
    status, reason, detail = check(make(seed, index), seed * 100003 + index)
    counts[status] = counts.get(status, 0) + 1
    if show or status in ("mismatch", "internal"):
        option = "--" + kind.replace("_", "-")
        print(f"\n=== {kind.replace('_', ' ')} {index} (seed {seed}): {status}: {reason}\n"
              f"{detail}\nreproduce: python -m tegula.fuzz --seed {seed} {option} {index}",
              flush=True)
    return 1 if status in ("mismatch", "internal") else 0


if __name__ == "__main__":
    sys.exit(main())
