"""The cost facts of catalogue entries (issue 9 §1): every entry names the pipe it
occupies, its throughput follows from its issue cycles and the target's sub-partitions,
and the cost model charges each use to the pipe its entry names."""
from __future__ import annotations

import pytest

from tegula.arch.catalogue import ALL_INSTRUCTIONS, get_instruction
from tegula.arch.instructions import MmaInstr
from tegula.arch.targets import get_target
from tegula.arch.wgmma import WgmmaInstr
from tegula.build import build
from tegula.dtypes import f16
from tegula.kernels.gemm import gemm_kernel
from tegula.kernels.softmax import softmax_kernel
from tegula.synth.cost import instruction_uses

PIPES = {"tensor", "shared", "global", "tma", "alu", "sync", "sfu"}


def test_every_entry_names_a_known_pipe():
    assert {i.pipe for i in ALL_INSTRUCTIONS} <= PIPES
    expected = {"mma": "tensor", "wgmma": "tensor", "ldmatrix": "shared",
                "stmatrix": "shared", "ld.shared": "shared", "st.shared": "shared",
                "ld.global": "global", "st.global": "global", "cp.async": "global",
                "tma.load": "tma", "tma.store": "tma", "shfl": "alu"}
    for instr in ALL_INSTRUCTIONS:
        if instr.kind in expected:
            assert instr.pipe == expected[instr.kind], instr.name


@pytest.mark.parametrize("target", ["sm_80", "sm_89", "sm_90a"])
def test_tensor_throughput_is_the_targets_rate(target):
    """An MMA entry's instructions per clock per SM times its FMAs is the SM's tensor rate
    (mma.sync: four sub-partitions each at a quarter of it; wgmma: the whole SM)."""
    t = get_target(target)
    checked = 0
    for instr in ALL_INSTRUCTIONS:
        if isinstance(instr, MmaInstr) and instr.available_on(t):
            m, n, k = instr.shape_mnk
            assert instr.throughput(t) * m * n * k == t.tensor_rate(instr.operand_class)
            checked += 1
        elif isinstance(instr, WgmmaInstr) and instr.available_on(t):
            fmas = instr.m * instr.n * instr.k
            assert instr.throughput(t) * fmas == pytest.approx(t.wgmma_rate(instr.operand_class))
            checked += 1
    assert checked


def test_pipelined_entries_issue_one_per_clock_per_subpartition():
    t = get_target("sm_80")
    assert t.subpartitions == 4 and t.shared_bytes_per_clk == 128
    assert get_instruction("ld.global.v4.b32").throughput(t) == 4.0
    assert get_instruction("ldmatrix.x4").throughput(t) == 1.0  # four issue cycles


@pytest.mark.parametrize("target", ["sm_80", "sm_90a"])
def test_cost_uses_take_their_pipe_from_the_entry(target):
    builds = [build(gemm_kernel(f16), {"BM": 128, "BN": 128, "BK": 32}, None, target),
              build(softmax_kernel(f16), {"BM": 2, "BN": 1024}, None, target)]
    named = 0
    for b in builds:
        for counted in instruction_uses(b.traced, b.target):
            use = counted.use
            try:
                entry = get_instruction(use.instr)
            except Exception:
                # arithmetic: the ALUs, or the special-function unit (exp2, rsqrt, ...)
                assert use.instr in ("alu", "mov") and use.pipe in ("alu", "sfu"), use
                continue
            assert use.pipe == entry.pipe, use
            named += 1
    assert named >= 4
