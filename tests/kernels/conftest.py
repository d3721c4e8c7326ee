"""Fixtures of the kernel-library tests.

`on_cpu`: the torch entry points run on CPU tensors in the emulator, so CI (no GPU) checks
their plumbing — argument order, views, run-time scalars, autograd — end to end: every
`tegula.build.launch` becomes `tg.emulate` on numpy copies written back in place, the CUDA
device check is skipped, a tuned entry point runs its first (default) configuration, and
the attention forward is the emulated one.
"""
from __future__ import annotations

import numpy as np
import pytest


def emulated_launch(kernel, grid, *args, **constexprs):
    """`tegula.build.launch` for CPU torch tensors: the kernel in the emulator on numpy
    copies (bf16 as float32 holding its values), every tensor written back in place."""
    import torch

    from tegula.build import emulate

    def host(a):
        if not isinstance(a, torch.Tensor):
            return a
        if a.dtype == torch.bfloat16:
            return a.detach().float().numpy()
        return a.detach().numpy().copy()

    arrays = [host(a) for a in args]
    with np.errstate(invalid="ignore", over="ignore", divide="ignore"):
        emulate(kernel, grid, *arrays, **constexprs)
    for t, a in zip(args, arrays):
        if isinstance(t, torch.Tensor):
            t.copy_(torch.from_numpy(a))


@pytest.fixture
def on_cpu(monkeypatch):
    """torch, with launches emulated (see the module docstring)."""
    torch = pytest.importorskip("torch")
    import importlib

    import tegula.build
    import tegula.kernels.api
    # the module (`tegula.kernels.attention` the attribute is the function of that name)
    attention = importlib.import_module("tegula.kernels.attention")
    monkeypatch.setattr(tegula.build, "launch", emulated_launch)
    monkeypatch.setattr(tegula.kernels.api, "_check_cuda", lambda fn, tensors: None)
    # No timing on the CPU: a tuned entry point runs its first (default) configuration.
    monkeypatch.setattr(tegula.kernels.api, "_tune_and_run",
                        lambda name, device, configs, dims, extra, run: run(configs[0]))

    def forward(q, k, v, causal=False, scale=None):
        o, lse = attention.attention_emulated(q.detach().numpy(), k.detach().numpy(),
                                              v.detach().numpy(), causal, scale,
                                              return_lse=True)
        return torch.from_numpy(o), torch.from_numpy(lse)

    monkeypatch.setattr(attention, "attention_forward", forward)
    return torch
