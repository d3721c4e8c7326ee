"""Helpers for the asynchronous emulator tests: running the Hopper samples
(`tegula.codegen.samples`) with a deadline, and editing their thread IR to inject bugs."""
from __future__ import annotations

import copy
import threading

import numpy as np

from tegula.codegen.samples import tma_round_trip, warp_specialized_gemm
from tegula.emulate import run_thread_kernel
from tegula.lower.async_ir import Roles
from tegula.lower.thread_ir import For, If, ThreadKernel

#: No emulation in these tests takes more than a few seconds on an idle core; a hang fails
#: instead of stalling CI (pytest-timeout is not a dependency). Generous, because one did
#: pass 60 s on a machine loaded ~5x over its cores (a false "hang").
DEADLINE_S = 180


def run_with_deadline(fn, seconds: float = DEADLINE_S):
    """fn() in a daemon thread; its result, its exception, or a failure after `seconds`."""
    out: dict = {}

    def target():
        try:
            out["value"] = fn()
        except BaseException as e:  # re-raised in the test's thread
            out["error"] = e
    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    if t.is_alive():
        raise AssertionError(f"the emulation did not finish within {seconds} s (a hang)")
    if "error" in out:
        raise out["error"]
    return out.get("value")


def role_body(kernel: ThreadKernel, name: str) -> list:
    """The statement list of role `name` (to edit in place)."""
    for s in kernel.body:
        if isinstance(s, Roles):
            for r in s.roles:
                if r.name == name:
                    return r.body
    raise KeyError(name)


def remove(stmts: list, pred) -> int:
    """Delete every statement where `pred` holds, in loops and branches too; how many."""
    n = 0
    for s in list(stmts):
        if pred(s):
            stmts.remove(s)
            n += 1
        elif isinstance(s, For):
            n += remove(s.body, pred)
        elif isinstance(s, If):
            n += remove(s.then, pred) + remove(s.otherwise, pred)
    return n


def loop_body(stmts: list, var: str = "kt") -> list:
    """The body of the loop over `var` in `stmts` (the samples' k-tile loop)."""
    return next(s for s in stmts if isinstance(s, For) and s.var.name == var).body


def gemm_kernel(block_n: int = 64, stages: int = 2) -> ThreadKernel:
    return copy.deepcopy(warp_specialized_gemm(block_n, stages))


def round_trip_kernel(**kw) -> ThreadKernel:
    return copy.deepcopy(tma_round_trip(**kw))


def gemm_inputs(m: int, n: int, k: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.full((m, n), np.nan, dtype=np.float32)
    return a, b, c


def run_gemm(kernel: ThreadKernel, a, b, c, block_n: int = 64, role_order: str = "listed"):
    """Run the warp-specialized GEMM sample; the sample lists its consumer role first, so
    `role_order="reversed"` lets the producer run first."""
    m, n = c.shape
    grid = (-(-n // block_n), -(-m // 64))
    return run_with_deadline(lambda: run_thread_kernel(kernel, grid, {"a": a, "b": b, "c": c},
                                                       role_order=role_order))


def gemm_reference(a, b):
    return a.astype(np.float64) @ b.astype(np.float64).T
