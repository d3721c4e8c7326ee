"""The common idioms of `idiom_kernels.py` in the emulator, on sm_90a and sm_80, every
output element checked against numpy."""
import os
import sys

import numpy as np
import pytest

import tegula as tg

sys.path.insert(0, os.path.dirname(__file__))
from idiom_kernels import CASES  # noqa: E402


@pytest.mark.parametrize("target", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_idiom_in_the_emulator(name, target):
    case = CASES[name](np.random.default_rng(sorted(CASES).index(name)))
    tg.emulate(case.kernel, case.grid, *case.args, target=target, **case.constexprs)
    case.check(case.args)
