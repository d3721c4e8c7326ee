"""The common idioms of `tests/idioms/idiom_kernels.py` launched on the GPU: the same
arguments (views as torch views with the same strides into a copy of their base array,
outputs holding the host's poison), every element checked against numpy by the same check
as in the emulator."""
import os
import sys

import numpy as np
import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "idioms"))
sys.path.insert(0, os.path.dirname(__file__))
from gpu_helpers import to_device, values_of  # noqa: E402
from idiom_kernels import CASES  # noqa: E402

pytestmark = pytest.mark.gpu


def _on_device(array: np.ndarray, dtype):
    """(a tensor holding `array` with its element strides, the tensor of the whole base
    array it views — itself when it views none)."""
    import torch
    base = array if array.base is None else array.base
    whole = to_device(base, dtype)
    if base is array:
        return whole, whole
    size = array.itemsize
    offset = (array.__array_interface__["data"][0] - base.__array_interface__["data"][0]) // size
    return torch.as_strided(whole, array.shape, [s // size for s in array.strides], offset), whole


@pytest.mark.parametrize("name", sorted(CASES))
def test_idiom_on_the_gpu(name):
    import torch
    case = CASES[name](np.random.default_rng(sorted(CASES).index(name)))
    params = [p for p in case.kernel.params if p.kind != "constexpr"]
    launch_args, copies = [], []
    for arg, param in zip(case.args, params, strict=True):
        if isinstance(arg, np.ndarray):
            view, whole = _on_device(arg, param.spec.dtype)
            launch_args.append(view)
            copies.append((arg if arg.base is None else arg.base, whole, param.spec.dtype))
        else:
            launch_args.append(arg)
    case.kernel[case.grid](*launch_args, **case.constexprs)
    torch.cuda.synchronize()
    for host, whole, dtype in copies:   # every element of every base, views' gaps included
        host[...] = values_of(whole, dtype)
    case.check(case.args)
