"""`tegula.runtime.torch_alloc`: the optional C++ (libtorch) output allocators of replayed
entry points. Built here against the installed torch (CPU tensors take the same path as
CUDA ones: `at::empty` on the argument's device); slow the first time on a machine (a
C++ compile against torch's headers), then loaded from the disk cache."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from tegula.kernels import api  # noqa: E402
from tegula.runtime import torch_alloc  # noqa: E402


@pytest.fixture(scope="module")
def built():
    torch_alloc.start()
    if not torch_alloc.wait(600):
        pytest.skip(f"no C++ allocator here: {torch_alloc.unavailable}")
    return torch_alloc.module()


@pytest.mark.slow
def test_allocators_give_fresh_contiguous_tensors_of_their_shape_and_dtype(built):
    x = torch.randn(6, 10, dtype=torch.float16)[:, ::2]  # non-contiguous argument
    same = torch_alloc.allocator(None)
    other = torch_alloc.allocator((3, 7), torch.empty(0, dtype=torch.float32))
    for allocate, shape, dtype in ((same, (6, 5), torch.float16),
                                   (other, (3, 7), torch.float32)):
        first, second = allocate(x), allocate(x)
        for y in (first, second):
            assert (tuple(y.shape), y.dtype, y.device) == (shape, dtype, x.device)
            assert y.is_contiguous() and not y.requires_grad
        assert first.data_ptr() != second.data_ptr() != x.data_ptr()  # new storage each
    with torch.inference_mode():  # follows torch's modes as torch.empty_like does
        assert same(x).is_inference() == torch.empty_like(x).is_inference() is True
    with pytest.raises(TypeError, match="tegula allocator: expected a torch.Tensor, got int"):
        same(3)


@pytest.mark.slow
def test_remembered_replays_switch_to_the_cxx_allocator(built, monkeypatch):
    """`upgrade_allocations` (run when the extension becomes ready) swaps each remembered
    replay's Python allocator for the C++ one of the same output."""
    x = torch.randn(4, 8, dtype=torch.float16)
    by_python = {"same": torch.empty_like,
                 "shape": lambda t: t.new_empty((2, 16)),
                 "dtype": lambda t: t.new_empty((4, 8), dtype=torch.float32)}
    by_python["shape"].tegula_output = ((2, 16), None)
    by_python["dtype"].tegula_output = ((4, 8), torch.empty(0, dtype=torch.float32))
    by_python["unknown"] = lambda t: t.new_empty((1,))  # not fast_empty's: left alone
    replays = {}
    for name, allocate in by_python.items():
        replay = api.EntryReplay.__new__(api.EntryReplay)
        replay.allocate = allocate
        replays[name] = replay
    monkeypatch.setattr(api, "_REPLAYS", dict(replays))
    assert api.upgrade_allocations() == 3
    assert replays["unknown"].allocate is by_python["unknown"]
    for name in ("same", "shape", "dtype"):
        assert type(replays[name].allocate) is not type(by_python["shape"])  # a C function
        got, want = replays[name].allocate(x), by_python[name](x)
        assert (got.shape, got.dtype, got.is_contiguous()) == (want.shape, want.dtype, True)


def test_turned_off_by_the_environment():
    code = ("from tegula.runtime import torch_alloc as t; t.start(); "
            "print(t.wait(5), t.unavailable)")
    env = dict(os.environ, TEGULA_TORCH_ALLOCATOR="0")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert out.strip() == "False turned off by TEGULA_TORCH_ALLOCATOR=0"


@pytest.mark.gpu
def test_cuda_replays_allocate_through_it(built):
    """On CUDA: the allocators give tensors on the argument's device, and a replayed
    entry point allocates through the C++ allocator with every element right."""
    import tegula.kernels as tk
    x = torch.randn(33, 70, device="cuda", dtype=torch.float16) * 4
    y = torch_alloc.allocator((5,), torch.empty(0, dtype=torch.int32))(x)
    assert (y.device, y.dtype, y.shape) == (x.device, torch.int32, (5,))
    results = [tk.softmax(x) for _ in range(4)]  # full path, then replays
    replay = api._REPLAYS[api._signature("softmax", (x,), int, -1, True)]
    assert api._output_of(replay.allocate) is None  # not a Python allocator
    torch.cuda.synchronize()
    want = torch.softmax(x.double(), -1)
    for got in results:
        assert torch.allclose(got.double(), want, rtol=2e-3, atol=1e-5)
    assert len({r.data_ptr() for r in results}) == 4
