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


def _reader_cases(device: str) -> list:
    """Tensors of every kind a replay key reads: contiguous, sliced (a pointer off the
    16-byte class), transposed, 0-d, empty, a Parameter, integer, half."""
    base = torch.randn(64, 64, device=device)
    return [base, base[:, 1:], base.T, base[3], torch.tensor(2.5, device=device),
            torch.empty(0, 4, dtype=torch.float16, device=device),
            torch.nn.Parameter(torch.randn(3, 5, device=device)),
            torch.randn(9, dtype=torch.float16, device=device)[1:],
            torch.arange(6, dtype=torch.int32, device=device).view(2, 3)[:, ::2]]


@pytest.mark.slow
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_tensor_reader_reads_the_key_python_reads(built, device):
    """The C++ reads of a replay key (`fastcall.use_tensor_reader`) give a key equal to,
    and hashing as, the one read through torch's Python API, and the same pointers, for
    every kind of tensor; a dict filed under either finds the other."""
    from tegula.runtime import fastcall, replay
    module = fastcall.c_extension()
    if module is None:
        pytest.skip(f"no C extension here: {fastcall.unavailable}")
    assert fastcall.use_tensor_reader()
    head = ("head", int, 7)
    for t in _reader_cases(device):
        args = (t, 3, t.T if t.dim() == 2 else t)
        _, key, pointers = replay._lookup({}, head, args, ())
        _, fast_key, fast_pointers = module.replay_lookup({}, head, args)
        assert (fast_key, fast_pointers) == (key, pointers) and hash(fast_key) == hash(key)
        assert module.replay_lookup({key: "found"}, head, args)[0] == "found"


@pytest.mark.slow
def test_tensor_reader_leaves_subclasses_and_modes_to_python(built):
    """A tensor subclass or a __torch_function__ mode may answer `shape` (or any read)
    its own way: the C++ reader declines both, so the key holds what Python reads."""
    from torch.overrides import TorchFunctionMode

    from tegula.runtime import fastcall, replay
    module = fastcall.c_extension()
    if module is None:
        pytest.skip(f"no C extension here: {fastcall.unavailable}")
    assert fastcall.use_tensor_reader()

    class Taller(torch.Tensor):  # reports one more row than it has
        @property
        def shape(self):
            return torch.Size((self.size(0) + 1,) + tuple(self.size())[1:])

    class TallerMode(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            result = func(*args, **(kwargs or {}))
            return torch.Size((result[0] + 1,) + tuple(result)[1:]) \
                if func == torch.Tensor.shape.__get__ else result

    x = torch.randn(4, 6)
    sub = x.as_subclass(Taller)
    assert module.replay_lookup({}, ("h",), (sub,))[1][2] == (5, 6)
    with TallerMode():
        python_key = replay._lookup({}, ("h",), (x,), ())[1]
        assert python_key[2] == (5, 6)
        assert module.replay_lookup({}, ("h",), (x,))[1] == python_key
    assert module.replay_lookup({}, ("h",), (x,))[1][2] == (4, 6)
