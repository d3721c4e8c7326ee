"""`python -m tegula.fuzz`: the differential fuzzer from the command line.

    python -m tegula.fuzz --minutes 30 --seed 7          # long mode: run, shrink, report
    python -m tegula.fuzz --programs 200 --seed 1        # a fixed number of programs
    python -m tegula.fuzz --seed 7 --program 1234        # show and rerun one program
    python -m tegula.fuzz --switches=-loop_rebind,-npot_tiles   # leave features out

Each failure (a wrong answer or an internal error) is shrunk to a minimal kernel, printed
as source with the command that reproduces it. The exit status is 1 if any program failed.
"""
from __future__ import annotations

import argparse
import sys
import time

from tegula.fuzz import fuzz_program, make_program
from tegula.fuzz.generate import Switches
from tegula.fuzz.reference import Features
from tegula.fuzz.runner import Tally, run_program
from tegula.fuzz.shrink import shrink
from tegula.fuzz.source import kernel_source

SHRINKS_PER_REASON = 2


def _parse(argv) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="python -m tegula.fuzz", description=__doc__.split("\n")[0])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--minutes", type=float, default=None, help="run for this long")
    ap.add_argument("--programs", type=int, default=None, help="run this many programs")
    ap.add_argument("--program", type=int, default=None, help="show and run one program")
    ap.add_argument("--start", type=int, default=0, help="index of the first program")
    ap.add_argument("--switches", default="", help="e.g. -loop_rebind,-pipelines,max_tile=256")
    ap.add_argument("--no-shrink", action="store_true")
    ap.add_argument("--shrink-seconds", type=float, default=60.0)
    return ap.parse_args(argv)


def _features(switches: Switches) -> Features:
    return Features(nan_reductions=switches.nan_reductions)


def _show_one(args, switches: Switches) -> int:
    program = make_program(args.seed, args.program, switches)
    print(kernel_source(program))
    verdict = fuzz_program(program, args.seed, args.program, _features(switches))
    print(f"verdict: {verdict.status} {verdict.reason}\n{verdict.detail}")
    return 1 if verdict.failed else 0


def _report_failure(args, switches, index: int, program, verdict, shrunk: dict) -> None:
    print(f"\n=== program {index} (seed {args.seed}): {verdict.status}: {verdict.reason}")
    print(verdict.detail.rstrip())
    key = (verdict.status, verdict.reason)
    if args.no_shrink or shrunk.get(key, 0) >= SHRINKS_PER_REASON:
        print(f"reproduce: python -m tegula.fuzz --seed {args.seed} --program {index}"
              + (f" --switches={args.switches}" if args.switches else ""))
        return
    shrunk[key] = shrunk.get(key, 0) + 1
    features = _features(switches)
    small, small_verdict, runs = shrink(
        program, lambda p: fuzz_program(p, args.seed, index, features), verdict,
        budget_s=args.shrink_seconds)
    print(f"--- minimal kernel ({runs} shrink runs):")
    print(kernel_source(small).rstrip())
    print(small_verdict.detail.rstrip()[-2000:])
    print(f"reproduce the original: python -m tegula.fuzz --seed {args.seed} --program {index}"
          + (f" --switches={args.switches}" if args.switches else ""))


def main(argv=None) -> int:
    args = _parse(argv)
    switches = Switches.parse(args.switches)
    if args.program is not None:
        return _show_one(args, switches)
    if args.minutes is None and args.programs is None:
        args.programs = 100
    deadline = time.monotonic() + 60 * args.minutes if args.minutes is not None else None
    tally, shrunk = Tally(), {}
    features = _features(switches)
    index = args.start
    started = time.monotonic()
    while True:
        if args.programs is not None and index - args.start >= args.programs:
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        program = make_program(args.seed, index, switches)
        verdict = fuzz_program(program, args.seed, index, features)
        tally.add(verdict)
        if verdict.failed:
            _report_failure(args, switches, index, program, verdict, shrunk)
        index += 1
        if tally.programs % 500 == 0:
            print(f"[{time.monotonic() - started:.0f}s] {tally.report().splitlines()[0]}",
                  flush=True)
    print(f"\nseed {args.seed}, programs {args.start}..{index - 1}, "
          f"{time.monotonic() - started:.0f} s")
    print(tally.report())
    return 1 if tally.failures else 0


if __name__ == "__main__":
    sys.exit(main())
