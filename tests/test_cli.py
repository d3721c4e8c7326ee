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


# --------------------------------------------------------------------------- issue 14

def test_layout_tv_says_when_the_layout_leaves_most_of_the_tile_empty(capsys):
    code, out, _ = run(capsys, "layout", "((2,4),(2,2)):((8,1),(4,16))", "--tv", "--tile", "16x8")
    assert code == 0 and "covers 32 of the 128 cells of the 16x8 tile" in out
    code, out, _ = run(capsys, "layout", MMA_M16N8K16_C, "--tv", "--tile", "16x8")
    assert code == 0 and "covers" not in out  # the README's example: a whole TV layout


@pytest.mark.parametrize("flag", [["--swizzle", "3,3,3"], ["--elem-bytes", "2"]])
def test_layout_tv_refuses_shared_memory_options(capsys, flag):
    code, out, err = run(capsys, "layout", MMA_M16N8K16_C, "--tv", *flag)
    assert code == 2 and out == ""
    assert err.startswith(f"tegula: error: {flag[0]} describes a shared-memory layout")


def test_bench_layout_writes_to_a_user_results_directory(capsys, tmp_path, monkeypatch):
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    monkeypatch.chdir(checkout)
    monkeypatch.setenv("TEGULA_RESULTS_DIR", str(tmp_path / "results"))
    assert main(["bench", "layout", "--min-time", "0.001", "--repeat", "1"]) == 0
    assert list(checkout.iterdir()) == []  # nothing written into the current directory
    (path,) = (tmp_path / "results").glob("layout-*.json")
    assert f"wrote {path}" in capsys.readouterr().out
    monkeypatch.delenv("TEGULA_RESULTS_DIR")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    from tegula.bench import user_results_dir
    assert user_results_dir() == tmp_path / "xdg" / "tegula" / "results"


def test_explain_svg_only_draws_what_was_asked(capsys, tmp_path):
    gemm = os.path.join(os.path.dirname(__file__), "..", "examples", "gemm.py")
    code, out, _ = run(capsys, "explain", f"{gemm}:gemm", "-D", "BM=64", "-D", "BN=64",
                       "--svg", str(tmp_path), "--svg-only", "s0")
    assert code == 0 and sorted(os.listdir(tmp_path)) == ["gemm.svg"]
    page = ET.parse(tmp_path / "gemm.svg").getroot()
    (drawing,) = page.findall("{http://www.w3.org/2000/svg}svg")
    assert "".join(drawing.itertext()).strip().startswith("%s0 (f16)")
    code, _, err = run(capsys, "explain", f"{gemm}:gemm", "--svg", str(tmp_path),
                       "--svg-only", "s0,nope")
    assert code == 2 and "gemm has no register tile or shared buffer named nope" in err
    assert "(it has r0, r1, s0, s1)" in err


FACTORY = '''
import tegula as tg
from tegula import f16, f32


def scale_kernel(dtype):
    @tg.kernel(threads=64)
    def scale(x: tg.Tensor[dtype], y: tg.Tensor[dtype], BN: tg.constexpr = 64):
        t = tg.load(x.tile((1, BN), (tg.block_id(0), 0)))
        tg.copy(t * 2.0, y.tile((1, BN), (tg.block_id(0), 0)))
    return scale


scale_f16 = scale_kernel(f16)
scale_f32 = scale_kernel(f32)
'''


def test_compile_names_factory_variants_after_the_files_names(capsys, tmp_path):
    from tegula.runtime.compiler import available_compilers

    if not available_compilers():
        pytest.skip("no CUDA compiler (NVRTC or nvcc) installed")
    source = tmp_path / "factory.py"
    source.write_text(FACTORY)
    for variant in ("scale_f16", "scale_f32"):
        assert main(["compile", f"{source}:{variant}", "--out", str(tmp_path / "out"),
                     "--target", "sm_80"]) == 0
    written = sorted(os.listdir(tmp_path / "out"))
    assert written == sorted(f"{v}{s}" for v in ("scale_f16", "scale_f32")
                             for s in (".cu", ".cubin", ".explain.txt"))
    assert "f16" in (tmp_path / "out" / "scale_f16.explain.txt").read_text()
    assert "f32" in (tmp_path / "out" / "scale_f32.explain.txt").read_text()


def test_compile_messages_name_compile(capsys, tmp_path):
    source = tmp_path / "only_factory.py"
    source.write_text(FACTORY.split("scale_f16 =")[0])
    code, _, err = run(capsys, "compile", str(source), "--out", str(tmp_path))
    assert code == 2 and "compile imports the file" in err and "explain" not in err
    assert "gemm_f16 = gemm_kernel(f16)" in err


# --------------------------------------------------------------------------- tegula doctor

def test_doctor_reports_this_machine(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("TEGULA_CACHE_DIR", str(tmp_path / "cache"))
    code, out, _ = run(capsys, "doctor")
    assert code == 0
    for name in ("python", "numpy", "torch", "cuda-bindings", "NVRTC", "nvcc", "driver",
                 "cache", "C launcher", "emulator"):
        assert any(line[4:].startswith(name) for line in out.splitlines()), name
    assert "emulate  yes" in out
    assert f"{tmp_path / 'cache'} (not created yet" in out
    from tegula.runtime.compiler import available_compilers
    if any(c.kind == "nvrtc" for c in available_compilers()):
        assert "test compile (sm_80): ok" in out and "compile  yes" in out
    try:
        import torch
        gpu = torch.cuda.is_available()
    except ImportError:
        gpu = False
    if not gpu:
        (launch,) = [line for line in out.splitlines() if line.strip().startswith("launch")]
        assert "NO" in launch and "fix:" in launch


def test_doctor_shows_the_cache_directory_and_refuses_an_unsafe_one(capsys, tmp_path,
                                                                    monkeypatch):
    from tegula.doctor import probe_cache

    cache = tmp_path / "cache"
    (cache / "cubin").mkdir(parents=True)
    (cache / "cubin" / "x.cubin").write_bytes(b"0" * 2048)
    cache.chmod(0o700)
    monkeypatch.setenv("TEGULA_CACHE_DIR", str(cache))
    found = probe_cache()
    assert found.ok and "mode 0700, 1 files, 2.0 KB" in found.detail
    assert f"uid {os.getuid()}" in found.detail
    cache.chmod(0o777)
    found = probe_cache()
    assert not found.ok and "writable by group or others" in found.detail
    assert "TEGULA_CACHE_DIR" in found.fix


def test_doctor_says_why_the_c_launcher_is_not_used(monkeypatch, tmp_path):
    from tegula.doctor import probe_c_launcher
    monkeypatch.setenv("TEGULA_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("TEGULA_C_LAUNCHER", "0")
    off = probe_c_launcher()
    assert not off.ok and "TEGULA_C_LAUNCHER=0" in off.detail and off.fix
    monkeypatch.delenv("TEGULA_C_LAUNCHER")
    from tegula.runtime import fastcall
    on = probe_c_launcher()
    assert on.ok == (fastcall.unavailable is None), on.detail


def test_doctor_reports_the_torch_extension(monkeypatch, tmp_path):
    """The optional C++ extension (runtime/torch_alloc.py): turned off, cannot be built,
    in the cache, or to be built by the first CUDA entry-point call."""
    pytest.importorskip("torch")
    from tegula.doctor import probe_torch_extension
    from tegula.runtime import torch_alloc
    monkeypatch.setenv("TEGULA_CACHE_DIR", str(tmp_path / "cache"))  # an empty cache
    fresh = probe_torch_extension()
    why = torch_alloc.cannot_build()
    assert fresh.ok == (why is None)
    assert ("not built yet" in fresh.detail) if why is None else (why in fresh.detail)
    monkeypatch.setenv("TEGULA_TORCH_ALLOCATOR", "0")
    off = probe_torch_extension()
    assert not off.ok and "TEGULA_TORCH_ALLOCATOR=0" in off.detail and off.fix
    monkeypatch.delenv("TEGULA_TORCH_ALLOCATOR")
    monkeypatch.setattr(torch_alloc, "cannot_build", lambda: "no C++ compiler")
    missing = probe_torch_extension()
    assert not missing.ok and "cannot be built: no C++ compiler" in missing.detail
    monkeypatch.setattr(torch_alloc, "cannot_build", lambda: None)
    monkeypatch.setattr(torch_alloc, "_prepare", lambda build: object())
    assert probe_torch_extension().detail.startswith("in the cache")


def test_doctor_verdicts_give_a_fix_for_each_missing_piece():
    from tegula.doctor import Finding, diagnose, report, verdicts

    def missing(name, fix):
        return lambda: Finding(name, False, "not installed", fix)

    def present(name):
        return lambda: Finding(name, True, "1.0")

    def broken():
        raise RuntimeError("boom")

    found = diagnose([present("numpy"), present("emulator"), missing("NVRTC", "pip nvrtc"),
                      missing("nvcc", "install nvcc"), present("cuda-bindings"),
                      missing("driver", "get a GPU"), present("torch"), broken])
    assert found["broken"].detail == "probe failed: RuntimeError: boom"
    (emulate, compile_, launch) = verdicts(found)
    assert emulate[1] and not compile_[1] and not launch[1]
    assert "pip nvrtc" in compile_[2] and "install nvcc" in compile_[2]
    assert "get a GPU" in launch[2] and "a compiler" in launch[2]
    text = report(found)
    assert "compile  NO   fix: NVRTC: pip nvrtc" in text


@pytest.mark.gpu
def test_doctor_on_a_gpu_machine_says_launch_works(capsys):
    code, out, _ = run(capsys, "doctor")
    assert code == 0
    for capability in ("emulate", "compile", "launch"):
        assert f"{capability:<8} yes" in out, out
    assert "compute capability" in out
