"""`python -m tegula.bench SUITE [suite options]`: run one benchmark suite by name.

The suite's own options follow its name (`python -m tegula.bench layout --help`).
"""
from __future__ import annotations

import importlib
import sys

from tegula.bench import SUITES


def main(argv: list[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(__doc__.strip())
        print("suites: " + ", ".join(sorted(SUITES)))
        return 0 if args else 2
    name, rest = args[0], args[1:]
    if name not in SUITES:
        print(f"unknown benchmark suite {name!r}; known: {', '.join(sorted(SUITES))}",
              file=sys.stderr)
        return 2
    # Import lazily: a suite may need optional dependencies (torch, a GPU) the others do not.
    suite = importlib.import_module(SUITES[name])
    return int(suite.main(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
