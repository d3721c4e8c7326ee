"""`elect.sync` in lowering (issue 9 §2): where one thread of a warp issues TMA boxes or
arrives for its warp, the condition is `all_of([<warp-uniform part>, Elect()])`, printed
through the catalogue's entry (`tg_elect_one`), emulated as the warp's lane 0 with every
lane of the warp required to take part (the full member mask), and refused before sm_90."""
from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest

from tegula.arch.tma import get_async
from tegula.build import build
from tegula.codegen import CodegenError, emit_cuda
from tegula.dtypes import f16, f32, i32
from tegula.emulate import EmulationError, run_thread_kernel
from tegula.kernels.common import poisoned, random_input
from tegula.lower.async_ir import Elect
from tegula.lower.thread_ir import (TID, Const, GlobalLoad, GlobalStore, If, Reg, RegArray,
                                    TensorParam, ThreadKernel, all_of)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from gemm_fixtures import readme_gemm  # noqa: E402


def store_where(cond, threads: int = 64, outer=None) -> ThreadKernel:
    """out[tid] = x[tid] where `cond` (inside `If(outer)` if given)."""
    r = RegArray("r", i32, 1)
    store = [If(cond, [GlobalStore("out", TID, Reg(r, Const(0)), 1)])]
    body = [GlobalLoad(Reg(r, Const(0)), "x", TID, 1)]
    body += [If(outer, store)] if outer is not None else store
    return ThreadKernel("elect_store", threads, [TensorParam("x", i32, 1),
                                                 TensorParam("out", i32, 1, True)], [r], [], body)


def run(kernel: ThreadKernel, threads: int = 64) -> np.ndarray:
    x = np.arange(100, 100 + threads, dtype=np.int32)
    out = np.full(threads, -1, dtype=np.int32)
    run_thread_kernel(kernel, 1, dict(x=x, out=out))
    return out


def test_one_lane_of_each_warp_that_reaches_the_election():
    out = run(store_where(Elect(), threads=96), threads=96)
    assert list(np.flatnonzero(out != -1)) == [0, 32, 64]
    out = run(store_where(all_of([TID.ge(32), TID.lt(64), Elect()]), threads=96), threads=96)
    assert list(np.flatnonzero(out != -1)) == [32] and out[32] == 132


@pytest.mark.parametrize("case", ["inactive lanes", "condition differs in the warp"])
def test_an_election_without_the_whole_warp_is_reported(case):
    if case == "inactive lanes":
        kernel = store_where(Elect(), outer=TID.lt(40))  # warp 1 has lanes 32..39 only
    else:
        kernel = store_where(all_of([TID.lt(40), Elect()]))
    with pytest.raises(EmulationError, match=r"elect.sync in warp 1 with lanes 8, 9, 10"
                                             r".*needs all 32 lanes"):
        run(kernel)


def test_elect_only_as_a_conjunct():
    kernel = store_where(all_of([TID.lt(64), Elect()]).logical_and(Const(1)) + Elect())
    with pytest.raises(EmulationError, match="an Elect may only be a conjunct"):
        run(kernel)


def test_printed_through_the_entry_and_refused_before_sm_90():
    kernel = store_where(all_of([TID.lt(32), Elect()]))
    source = emit_cuda(kernel, "sm_90")
    assert "if (tid < 32 && tg_elect_one()) {" in source
    assert get_async("elect.sync").format_asm(d="elected") in source
    with pytest.raises(CodegenError, match=r"Elect \(elect.sync\) cannot be compiled for "
                                           r"sm_80"):
        emit_cuda(kernel, "sm_80")


# ------------------------------------------------------------ where lowering elects

GEMM = readme_gemm(out_dtype=f32, BM=128, BN=128)


@pytest.mark.parametrize("options", [{"warp_specialize": True}, {"warp_specialize": False},
                                     {"consumers": "cooperative"}],
                         ids=["pingpong", "one-role", "cooperative"])
def test_tma_issue_and_stage_releases_elect_one_lane(options):
    """Warp-specialized: the producer lane and the consumers' releasing lanes are elected;
    the barrier inits keep thread 0. One role: thread 0 still issues (electing there
    was measured worse, `lower/pipeline.py` `MBarrierRing`)."""
    source = build(GEMM, dict(options), target="sm_90a").cuda_source()
    assert "tid % 32 == 0" not in source
    if options.get("warp_specialize", True):
        # No thread is singled out by number except the barrier inits' thread 0.
        assert re.findall(r"tid == \d+", source) == ["tid == 0"]
        assert re.search(r"if \(tid >= 256 && tid < 288 && tg_elect_one\(\)\) \{", source) or \
            re.search(r"if \(tid >= 128 && tid < 160 && tg_elect_one\(\)\) \{", source), source
        assert "= tg_elect_one();" in source  # the releases' election, hoisted
    else:
        assert "tg_elect_one" not in source and "if (tid == 0 && " in source


@pytest.mark.parametrize("options", [{}, {"warp_specialize": False}],
                         ids=["warp-specialized", "one-role"])
def test_elected_gemm_is_right_at_ragged_shapes(options):
    import tegula as tg
    rng = np.random.default_rng(4)
    M, N, K = 200, 136, 200
    a, b = random_input(rng, (M, K), f16), random_input(rng, (N, K), f16)
    c = poisoned((M, N), f32)
    tg.emulate(GEMM, (2, 2), a, b, c, target="sm_90a", role_order="random:3", **options)
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    np.testing.assert_allclose(c, ref, rtol=2e-3, atol=2e-3)
