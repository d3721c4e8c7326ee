"""`python -m tegula ...`: the same as the `tegula` command."""
import sys

from tegula.cli import main

sys.exit(main())
