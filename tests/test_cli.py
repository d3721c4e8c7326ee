"""The `tegula` command line (tegula.cli)."""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tegula.cli import (
    MMA_M16N8K16_C, COMMANDS, main, parse_layout, parse_tile, ptx_m16n8k16_c,
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_layout_prints_notation_stats_and_grid(capsys):
    code, out, _ = run(capsys, "layout", "((2,4),(2,2)):((8,1),(4,16))")
    assert code == 0
    assert "layout: ((2,4),(2,2)):((8,1),(4,16))" in out
    assert "size 32, cosize 32, rank 2, depth 2" in out
    assert "0 |  0  4 16 20" in out


def test_layout_tv_with_tile_labels_cells(capsys):
    code, out, _ = run(capsys, "layout", MMA_M16N8K16_C, "--tv", "--tile", "16x8")
    assert code == 0
    rows = [line for line in out.splitlines() if line.startswith(" 8 |")]
    assert rows and rows[0].split("|", 1)[1].split()[:2] == ["T0V2", "T0V3"]


def test_layout_tv_infers_a_tile(capsys):
    code, out, _ = run(capsys, "layout", "(4,2):(2,1)", "--tv")
    assert code == 0 and "-> 2x4 tile" in out


def test_layout_writes_svg(capsys, tmp_path):
    path = tmp_path / "pics" / "l.svg"
    code, out, _ = run(capsys, "layout", "(4,8):(8,1)", "--svg", str(path))
    assert code == 0 and f"wrote {path}" in out
    ET.parse(path)


def test_layout_swizzle_draws_banks(capsys, tmp_path):
    path = tmp_path / "sw.svg"
    code, out, _ = run(capsys, "layout", "(8,64):(64,1)", "--swizzle", "3,3,3",
                       "--elem-bytes", "2", "--svg", str(path))
    assert code == 0 and "Sw<3,3,3> o 0 o (8,64):(64,1)" in out
    assert "banks of Sw<3,3,3>" in out
    text = path.read_text()
    ET.fromstring(text)
    assert "bank colours" in text


@pytest.mark.parametrize("argv", [
    ["layout", "((2,4),(2,2):((8,1),(4,16))"],
    ["layout", "banana"],
    ["layout", "(4,8):(8,1)", "--tile", "4xq"],
    ["layout", "(4,8):(8,1)", "--tv", "--tile", "4x4"],
    ["layout", "(4,8):(8,1)", "--swizzle", "3,3"],
    ["layout", "(4,8):(8,1)", "--swizzle", "9,9,1"],
    ["layout", "(4,8):(8,1)", "--elem-bytes", "0"],
    ["layout", "(4,8):(8,1)", "--swizzle", "1,0,1", "--bank-bytes", "0"],
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2
    assert err.startswith("tegula: error: ") and err.count("\n") == 1
    assert "Traceback" not in err


def test_unwritable_svg_path_is_one_line(capsys, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    code, _, err = run(capsys, "layout", "4:1", "--svg", str(blocker / "x.svg"))
    assert code == 2 and err.startswith("tegula: error: ") and err.count("\n") == 1


def test_parse_helpers():
    assert parse_tile("16x8") == (16, 8) and parse_tile("16,8") == (16, 8)
    assert parse_tile("128") == (128,)
    assert str(parse_layout("(4,8):(8,1)")) == "(4,8):(8,1)"


def test_mma_c_constant_matches_ptx_table():
    c = parse_layout(MMA_M16N8K16_C)
    for lane in range(32):
        for i in range(4):
            row, col = ptx_m16n8k16_c(lane, i)
            assert c(lane + 32 * i) == row + 16 * col


def test_every_command_has_help():
    assert {"layout", "demo"} <= {c.name for c in COMMANDS}
    assert all(c.help for c in COMMANDS)


def test_demo_prints_parts_and_writes_valid_svgs(capsys, tmp_path):
    code, out, _ = run(capsys, "demo", "--out", str(tmp_path))
    assert code == 0
    assert "matches the PTX ISA fragment table: yes" in out
    assert "skipped" not in out
    svgs = sorted(p for p in os.listdir(tmp_path) if p.endswith(".svg"))
    assert len(svgs) >= 4
    for name in svgs:
        ET.parse(tmp_path / name)


def test_entry_point_runs_as_a_module():
    done = subprocess.run([sys.executable, "-m", "tegula.cli", "layout", "4:1"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "size 4, cosize 4" in done.stdout


def test_mma_constants_agree_with_the_arch_catalogue():
    # Two independent transcriptions of the PTX ISA fragment tables must agree.
    mma = pytest.importorskip("tegula.arch.mma")
    from tegula.cli import MMA_M16N8K16_A, MMA_M16N8K16_B

    assert parse_layout(MMA_M16N8K16_A) == mma.A_16x16_B16
    assert parse_layout(MMA_M16N8K16_B) == mma.B_8x16_B16
    assert parse_layout(MMA_M16N8K16_C) == mma.C_16x8


def test_compile_writes_source_cubin_and_explanation_without_a_gpu(capsys, tmp_path):
    from tegula.runtime.compiler import available_compilers

    if not available_compilers():
        pytest.skip("no CUDA compiler (NVRTC or nvcc) installed")
    gemm = os.path.join(os.path.dirname(__file__), "..", "examples", "gemm.py")
    assert main(["compile", f"{gemm}:gemm", "--out", str(tmp_path), "-D", "BM=64",
                 "--target", "sm_80"]) == 0
    source = (tmp_path / "gemm.cu").read_text()
    assert 'extern "C" __global__' in source and "mma.sync.aligned.m16n8k16" in source
    cubin = (tmp_path / "gemm.cubin").read_bytes()
    assert cubin[:4] == b"\x7fELF"  # a cubin is an ELF image, never PTX text
    assert "BM=64" in (tmp_path / "gemm.explain.txt").read_text()


def test_compile_of_a_missing_kernel_is_one_line(capsys, tmp_path):
    gemm = os.path.join(os.path.dirname(__file__), "..", "examples", "gemm.py")
    assert main(["compile", f"{gemm}:nope", "--out", str(tmp_path)]) == 2
    assert "no kernel 'nope'" in capsys.readouterr().err
