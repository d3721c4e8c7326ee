"""`tegula.kernels.gemv` and `matmul_w4a16` replay a prepared launch only where their full
path would make the same one: the harness of tests/kernels/test_api_replay.py (compiler
and driver stubbed, CPU tensors read as cuda:0) compares every call made with earlier
calls' replays cached against the same call through the full path."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tegula.kernels as tk  # noqa: E402

_spec = importlib.util.spec_from_file_location(
    "tegula_test_api_replay", Path(__file__).resolve().parent / "test_api_replay.py")
_harness = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_harness)
sent = _harness.sent          # the fixture, used by name below
check_sequence, _x = _harness.check_sequence, _harness._x


def test_gemv_replays_only_its_own_specialization(sent):
    w = _x((40, 96), dtype=torch.float16, seed=1)
    variants = [lambda: _x((1, 96), dtype=torch.float16),
                lambda: _x((1, 96), torch.float16, seed=4),
                lambda: _x((96,), dtype=torch.float16), lambda: _x((3, 96), dtype=torch.float16),
                lambda: _x((1, 96), dtype=torch.float16, offset=1),
                lambda: _x((2, 192), dtype=torch.float16)[:, :96]]
    calls = [(lambda make=make: tk.gemv(make(), w)) for make in variants]
    calls.append(lambda: tk.gemv(_x((1, 96), dtype=torch.bfloat16),
                                 _x((40, 96), dtype=torch.bfloat16)))
    calls.append(lambda: tk.gemv(_x((1, 96), dtype=torch.float16),
                                 _x((40, 192), dtype=torch.float16)[:, :96]))
    replayed = check_sequence(sent, calls + calls)
    assert replayed[1], "new data in the first call's layout replays"
    assert not any(replayed[2:len(calls)]), "a variant replayed another's launch"


def test_matmul_w4a16_replays_only_its_own_specialization(sent):
    a = _x((2, 128), dtype=torch.float16)
    packed = torch.randint(0, 256, (24, 64), dtype=torch.uint8)
    scales = _x((24, 2), dtype=torch.float16, seed=2).abs() + 0.01
    zeros = torch.randint(0, 16, (24, 2)).to(torch.float16)
    scales4 = _x((24, 4), dtype=torch.float16, seed=2).abs() + 0.01
    calls = [lambda: tk.matmul_w4a16(a, packed, scales, zeros, 64),
             lambda: tk.matmul_w4a16(_x((2, 128), torch.float16, seed=5), packed, scales,
                                     zeros, 64),
             lambda: tk.matmul_w4a16(a, packed, scales, None, 64),
             lambda: tk.matmul_w4a16(a, packed, scales4, zeros.repeat(1, 2), 32),
             # 12 rows: the 16-row GEMM (the harness runs the first candidate; from 17
             # rows it takes TMA, whose tensor maps the stubbed driver cannot encode)
             lambda: tk.matmul_w4a16(_x((12, 128), dtype=torch.float16), packed, scales,
                                     zeros, 64),
             lambda: tk.matmul_w4a16(a, packed, scales, zeros, 128)]  # shape error
    replayed = check_sequence(sent, calls + calls)
    assert replayed[1], "new activations in the first call's layout replay"
    assert not any(replayed[2:len(calls)]), "a variant replayed another's launch"


@pytest.mark.parametrize("rows", [1, 2, 3, 16])
def test_gemv_hands_more_than_two_rows_to_the_tensor_core_matmul(sent, rows):
    """Up to 2 rows (GEMV_KERNEL_ROWS) launch the GEMV kernel; more launch matmul's GEMM
    (the GEMV kernel's FMAs per weight grow with the rows: 0.27x torch at 16 on an H100)."""
    w = _x((40, 96), dtype=torch.float16, seed=1)
    tk.gemv(_x((rows, 96), dtype=torch.float16), w)
    names = [launch[0].name for launch in sent]
    assert names, "nothing launched"
    on_gemv = all(name == "gemv" for name in names)
    assert on_gemv == (rows <= 2), names


def test_matmul_w4a16_split_k_replays_both_launches(sent, monkeypatch):
    """A split-K configuration is two launches (the partial products into an f32
    workspace, then their sum into c): its replay sends both, each with the full path's
    bytes (a WSMEM config: cp.async, no tensor maps for the stubbed driver)."""
    from tegula.kernels import quant
    split = dict(BT=16, BK=64, STAGES=3, WSMEM=1, SPLIT=2, warp_specialize=False)
    monkeypatch.setattr(quant, "w4a16_candidates", lambda m, group_size: [split])
    packed = torch.randint(0, 256, (70, 64), dtype=torch.uint8)
    scales = _x((70, 2), dtype=torch.float16, seed=2).abs() + 0.01
    zeros = torch.randint(0, 16, (70, 2)).to(torch.float16)
    calls = [lambda: tk.matmul_w4a16(_x((12, 128), dtype=torch.float16), packed, scales,
                                     zeros, 64),
             lambda: tk.matmul_w4a16(_x((12, 128), torch.float16, seed=5), packed, scales,
                                     zeros, 64)]
    before = len(sent)
    replayed = check_sequence(sent, calls)
    assert replayed == [False, True]
    assert len(sent) - before == 2 * 2 * len(calls), "two launches per call and path"


def test_gemv_on_the_matmul_replays_its_own_shapes_only(sent):
    """More than 2 rows replay straight into matmul (no second pass through gemv's checks),
    and only for calls with the first call's signature."""
    w = _x((40, 96), dtype=torch.float16, seed=1)
    variants = [lambda: _x((3, 96), dtype=torch.float16),
                lambda: _x((3, 96), torch.float16, seed=4),
                lambda: _x((4, 96), dtype=torch.float16),
                lambda: _x((3, 192), dtype=torch.float16)[:, :96]]
    calls = [(lambda make=make: tk.gemv(make(), w)) for make in variants]
    replayed = check_sequence(sent, calls + calls)
    assert replayed[1], "new data in the first call's layout replays"
    assert not any(replayed[2:len(calls)]), "a variant replayed another's launch"


@pytest.mark.parametrize("config", [
    dict(FRAGMENT=1, BT=16, KS=2, STAGES=3, SPLIT=2, FUSED=1, load_path="cp.async",
         warp_specialize=False),
    dict(GEMV=1, KS=2, KW=2), dict(GEMV=1, KS=2, KW=2, SPLIT=2)],
    ids=["fused-split", "gemv", "gemv-split"])
def test_matmul_w4a16_prepacked_replays_fused_split_and_gemv(sent, monkeypatch, config):
    """On fragment-ordered weights: the fused split is one launch (a fresh workspace and
    the stream's counters each call), the GEMV kernel one launch on a's (M, K/16, 2, 8)
    view (two with its split): each replayed with the full path's bytes."""
    from tegula.kernels import quant
    monkeypatch.setattr(quant, "fragment_candidates", lambda *args, **kw: [config])
    monkeypatch.setattr(quant, "_sm_count", lambda torch, device: 132)
    stored = tk.pack_fragments(torch.randint(0, 256, (70, 128), dtype=torch.uint8))
    scales = _x((70, 2), dtype=torch.float16, seed=2).abs() + 0.01
    zeros = torch.randint(0, 16, (70, 2)).to(torch.float16)
    calls = [lambda: tk.matmul_w4a16(_x((1, 256), dtype=torch.float16), stored, scales,
                                     zeros, 128),
             lambda: tk.matmul_w4a16(_x((1, 256), torch.float16, seed=5), stored, scales,
                                     zeros, 128)]
    before = len(sent)
    replayed = check_sequence(sent, calls)
    assert replayed == [False, True]
    launches = 2 if config.get("SPLIT", 1) > 1 and not config.get("FUSED") else 1
    assert len(sent) - before == 2 * launches * len(calls)
