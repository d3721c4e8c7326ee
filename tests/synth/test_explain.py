"""`tegula explain` and the cost model: the report states the decisions (layouts with
reasons, instructions with bytes per instruction and conflicts, resources), the model's
numbers follow from the counts, and the CLI builds a kernel from a file path."""
from __future__ import annotations

import os
import xml.etree.ElementTree as ET

import pytest

import tegula as tg
from tegula.build import build
from tegula.cli import load_kernel, main, parse_define, parse_shape, UsageError
from tegula.dtypes import f16
from tegula.ir.ops import Gemm, walk_ops
from tegula.kernels.gemm import gemm_kernel
from tegula.synth.cost import estimate, instruction_uses

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "examples", "gemm.py")
gemm = gemm_kernel(f16)
SQUARE = {"a": (4096, 4096), "b": (4096, 4096), "c": (4096, 4096)}


@pytest.fixture(scope="module")
def gemm128():
    # The mma.sync path (sm_90a plans wgmma: tests/synth/test_hopper_decision.py).
    return build(gemm, {"BM": 128, "BN": 128, "BK": 32}, None, "sm_80")


def test_report_states_layouts_instructions_and_resources(gemm128):
    text = gemm128.explain()
    assert "kernel gemm (BM=128, BN=128, BK=32, STAGES=3, CLUSTER_M=1, CLUSTER_N=1)" in text
    assert "Sw<2,3,3> o 0 o (128,32):(32,1)" in text                 # the synthesized swizzle
    assert "because: accumulator of mma.m16n8k16.f32.f16.f16.f32 on a 2x2 warp grid" in text
    assert "because: same as r0 (cast)" in text
    rows = [line.split() for line in text.splitlines()]
    cp_async = [r for r in rows if r[:2] == ["G2S", "cp.async.cg.shared.global.16"]]
    assert len(cp_async) == 2 and all(r[2:8] == ["8", "16", "512", "16", "64/64", "0"]
                                      for r in cp_async)
    ldmatrix = [r for r in rows if "ldmatrix.x4" in r]
    assert len(ldmatrix) == 2 and all(r[-6:] == ["8", "16", "512", "32", "128/128", "0"]
                                      for r in ldmatrix)
    assert "shared memory: 49152 B = 49152 B of kernel buffers + 0 B of scratch" in text
    assert "registers per thread: ~" in text and "estimated from liveness" in text
    assert "== predicted time" in text


def test_tg_explain_builds_and_explains():
    text = tg.explain(gemm, target="sm_80", BM=64, BN=64)
    assert "kernel gemm (BM=64, BN=64, BK=32, STAGES=3, CLUSTER_M=1, CLUSTER_N=1)" in text
    assert "2x4x2 MMAs per warp per gemm" in text


def test_uses_count_every_instruction_once(gemm128):
    uses = instruction_uses(gemm128.traced, gemm128.target)
    mma = [u for u in uses if u.use.pipe == "tensor"]
    assert len(mma) == 1 and mma[0].use.warp_instructions == 4 * 4 * 8 * 2
    assert len(mma[0].loops) == 1                                  # inside the k loop
    moved = sum(u.use.global_bytes for u in uses if u.loops)
    assert moved == 2 * 128 * 32 * 2                               # A and B tiles per k-step


def test_model_numbers_follow_from_the_counts(gemm128):
    cost = estimate(gemm128, (32, 32), SQUARE)
    steps = 4096 // 32
    assert cost.unresolved_loops == ()
    assert cost.mma_instructions == 256 * steps
    assert cost.global_bytes == 2 * 128 * 32 * 2 * steps + 128 * 128 * 2
    (op,) = [op for op in walk_ops(gemm128.traced.body) if isinstance(op, Gemm)]
    issue, _ = op.choices["plan"].atom.timing(gemm128.target)
    assert cost.tensor_cycles == cost.mma_instructions * issue / 4
    assert cost.flops == 2 * 128 * 128 * 4096
    assert cost.bound == "tensor"                                  # L2 reuse: not DRAM-bound
    target = gemm128.target
    assert cost.waves == -(-1024 // (target.sm_count * cost.blocks_per_sm))
    # Never faster than the target's mma.sync peak.
    peak = 2 * target.tensor_rate("f16") * target.sm_count * target.clock_ghz * 1e9
    assert cost.flops * cost.blocks / cost.seconds <= peak
    assert "TFLOP/s" in str(cost)


def test_model_without_shapes_says_what_it_did_not_know(gemm128):
    cost = estimate(gemm128)
    assert cost.grid_cycles is None and cost.seconds is None
    assert len(cost.unresolved_loops) == 1 and "a.shape[1]" in cost.unresolved_loops[0]
    assert "counted once" in str(cost) and "no L2 reuse" in str(cost)


def test_bigger_problems_take_longer(gemm128):
    small = estimate(gemm128, (8, 8), {k: (1024, 1024) for k in "abc"})
    big = estimate(gemm128, (32, 32), SQUARE)
    assert 0 < small.seconds < big.seconds


# --------------------------------------------------------------------------- the CLI

def test_cli_explain_a_kernel_file(capsys, tmp_path):
    code = main(["explain", f"{EXAMPLE}:gemm", "-D", "BM=64", "-D", "BN=64", "--grid", "64x64",
                 "--shape", "a=4096x4096", "--shape", "b=4096x4096", "--shape", "c=4096x4096",
                 "--svg", str(tmp_path)])
    out = capsys.readouterr().out
    assert code == 0
    assert "kernel gemm (BM=64, BN=64, BK=32, STAGES=3)" in out
    assert "grid (64, 64): 4096 blocks" in out
    # One page per kernel, each distinct layout drawn once: the accumulator r0 and its f16
    # copy r1 share one TV layout, the shared buffers %s0 and %s1 one swizzled layout.
    assert sorted(os.listdir(tmp_path)) == ["gemm.svg"]
    page = ET.parse(tmp_path / "gemm.svg").getroot()
    drawings = page.findall("{http://www.w3.org/2000/svg}svg")
    titles = ["".join(d.itertext()) for d in drawings]
    assert len(drawings) == 2
    assert "%r0" in titles[0] and "%r1" in titles[0] and "%s0, %s1" in titles[1]


def test_cli_explain_errors_are_one_line(capsys, tmp_path):
    assert main(["explain", f"{EXAMPLE}:nope"]) == 2
    assert "has no kernel 'nope'" in capsys.readouterr().err
    assert main(["explain", str(tmp_path / "missing.py")]) == 2
    assert "no file" in capsys.readouterr().err
    assert main(["explain", f"{EXAMPLE}:gemm", "-D", "BQ=3"]) == 2
    assert "'BQ'" in capsys.readouterr().err
    bad = tmp_path / "bad.py"
    bad.write_text("import tegula as tg\nfrom tegula import f32\n\n"
                   "@tg.kernel(threads=128)\n"
                   "def k(a: tg.Tensor[f32]):\n"
                   "    s = tg.shared((256, 256), f32, stages=4)\n"
                   "    tg.copy(a.tile((256, 256), (0, 0)), s[0])\n")
    assert main(["explain", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tegula: error: ") and f"{bad}:6" in err


def test_cli_parsers():
    assert parse_define("BM=64") == ("BM", 64)
    assert parse_define("NAME=fast") == ("NAME", "fast")
    assert parse_shape("a=97x130") == ("a", (97, 130))
    with pytest.raises(UsageError):
        parse_define("64")
    with pytest.raises(UsageError):
        parse_shape("a=0x4")
    name, kernel = load_kernel(f"{EXAMPLE}:gemm")
    assert name == kernel.name == "gemm"


def test_demo_runs_the_gemm_and_passes(capsys, tmp_path):
    assert main(["demo", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "the README's GEMM" in out and "emulated 97x130x72" in out
    assert "DESIGN" not in out  # every reference resolves inside the repository
    assert ": PASS" in out and "FAIL" not in out


def test_conversions_are_reported_with_their_bank_conflicts():
    """A pinned-layout clash resolved by a shared-memory conversion: the report names it,
    and the scratch store of a column-strided layout is counted 32-way conflicted."""
    from tegula import f32
    from tegula.layout.cute import Layout

    @tg.kernel(threads=128)
    def k(a: tg.Tensor[f32], c: tg.Tensor[f32]):
        x = tg.load(a.tile((64, 64), (0, 0)), layout=Layout((128, 32), (1, 128)))
        y = tg.load(a.tile((64, 64), (0, 0)), layout=Layout((128, 32), (32, 1)))
        tg.copy(x + y, c.tile((64, 64), (0, 0)))

    text = build(k).explain()
    assert "-> %r1_cvt (128,32):(1,128)" in text
    rows = [line.split() for line in text.splitlines()]
    store = next(r for r in rows if r[:2] == ["CVT", "st.shared.b32"])
    assert store[-2:] == ["4096/128", "3968"]
