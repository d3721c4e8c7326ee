"""The fuzzer runs warp roles in an interleaving drawn per program (`role_order="random:<data
seed>"`, `emulate/roles.py`), so a lowering that releases a stage too early — invisible
to the two fixed orders, which run a role until it blocks — is found by a fuzz run. GEMM
programs in clusters of two blocks interleave the blocks too."""
from __future__ import annotations

import copy
import importlib
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from tegula.fuzz import fuzz_program
from tegula.fuzz.program import Invalid, check
from tegula.fuzz.runner import data_seed, role_order_for
from tegula.lower.async_ir import MBarrierArrive, Roles, WgmmaWait
from tegula.fuzz.source import kernel_source
from tegula.lower.thread_ir import For, If

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_fuzz_transposed import transposed_gemm  # noqa: E402

# The package (`tegula.emulate` as an attribute is `tg.emulate`, the function).
EMULATOR = importlib.import_module("tegula.emulate")


def _release_before_the_wait(stmts: list) -> int:
    """Swap every `WgmmaWait; <release>` pair (the consumer's release of the stage the
    retired wgmma group read, `_is_release`) in `stmts` and nested bodies: a release too
    early."""
    swapped = 0
    for s in stmts:
        if isinstance(s, For):
            swapped += _release_before_the_wait(s.body)
        elif isinstance(s, If):
            swapped += _release_before_the_wait(s.then) + \
                _release_before_the_wait(s.otherwise or [])
    for i in range(len(stmts) - 1):
        if isinstance(stmts[i], WgmmaWait) and _is_release(stmts[i + 1]):
            stmts[i], stmts[i + 1] = stmts[i + 1], stmts[i]
            swapped += 1
    return swapped


def _is_release(s) -> bool:
    """An arrive on an empty barrier, or a branch of nothing else (the arrive of one
    elected lane per warp: `If(elect, [MBarrierArrive])`)."""
    if isinstance(s, If):
        return bool(s.then) and not s.otherwise and all(
            isinstance(t, MBarrierArrive) for t in s.then)
    return isinstance(s, MBarrierArrive)


@pytest.fixture
def early_release_lowering(monkeypatch):
    """Every emulated warp-specialized kernel gets the injected early release."""
    real = EMULATOR.run_thread_kernel
    injected = []

    def run(kernel, *args, **kwargs):
        kernel = copy.deepcopy(kernel)
        for s in kernel.body:
            if isinstance(s, Roles):
                injected.append(sum(_release_before_the_wait(r.body) for r in s.roles))
        return real(kernel, *args, **kwargs)
    monkeypatch.setattr(EMULATOR, "run_thread_kernel", run)
    return injected


def test_the_fuzzer_finds_an_early_release_the_fixed_orders_miss(early_release_lowering):
    program = replace(transposed_gemm("", "", stages=3, extent=88),  # 6 K tiles (of 16),
                      warp_specialize=True)                       # 3 stages, warp roles
    for order in ("listed", "reversed"):
        verdict = fuzz_program(program, 1, 0, role_order=order)
        assert verdict.status == "pass", (order, verdict.detail)
        assert "warp roles" in verdict.targets["sm_90a"][2]
    assert early_release_lowering and all(early_release_lowering)
    found = [index for index in range(6)
             if fuzz_program(program, 1, index).status == "internal"]
    assert found, "no random interleaving of six programs exposed the early release"
    detail = fuzz_program(program, 1, found[0]).detail
    assert "while a wgmma or TMA store still reads it" in detail and "target sm_90a" in detail


def test_the_interleaving_is_drawn_from_the_programs_data_seed():
    assert role_order_for("random", data_seed(3, 4)) == f"random:{data_seed(3, 4)}"
    assert role_order_for("listed", 5) == "listed"
    with pytest.raises(ValueError, match="role order must be one of"):
        role_order_for("sideways", 5)


def test_a_clustered_program_multicasts_and_falls_back_to_sm_90_for_the_ampere_path():
    """`tg.cluster(2)`: sm_80 and sm_89 refuse clusters, sm_90 (the Ampere path on the
    H100) takes the second turn; the two blocks of each cluster run interleaved at random."""
    program = replace(transposed_gemm("", "smem", m=120, n=40, extent=88), cluster=2,
                      warp_specialize=True)
    assert "    tg.cluster(2)\n" in kernel_source(program)
    verdict = fuzz_program(program, 1, 0)
    assert verdict.status == "pass", verdict.detail
    assert {"TMA", "warp roles", "wgmma"} <= verdict.targets["sm_90a"][2]
    assert verdict.targets["sm_80"][0] == verdict.targets["sm_89"][0] == "rejected"
    assert "mma.sync" in verdict.targets["sm_90"][2]
    with pytest.raises(Invalid, match="dividing the grid's rows"):
        check(replace(program, M=60))                       # one row of blocks
