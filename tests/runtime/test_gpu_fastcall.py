"""On a GPU: launches go through the C launcher where it can be built, and the ctypes
path (the fallback) gives the same, fully checked, results.

Run with `pytest -m gpu tests/runtime`."""
from __future__ import annotations

import pytest

from tegula.codegen import samples
from tegula.dtypes import f32
from tegula.runtime import DiskCache, compile_kernel, fastcall, launcher

torch = pytest.importorskip("torch")
pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_c_launcher_and_ctypes_launch_the_same(tmp_path, monkeypatch):
    launcher._LOADED.clear()
    ck = compile_kernel(samples.vector_copy(f32, 4), cache=DiskCache(tmp_path))
    n = 128 * 4 * 9 + 20
    x = torch.randn(n, device="cuda")
    y = torch.full_like(x, float("nan"))
    ck[10](x, y)
    torch.cuda.synchronize()
    assert torch.equal(x, y)
    if launcher._C_LAUNCH[0] is None:
        assert fastcall.unavailable, "no C launcher and no reason given"
        pytest.skip(f"C launcher unavailable here: {fastcall.unavailable}")
    monkeypatch.setattr(launcher, "_C_LAUNCH", [None])  # the ctypes path
    y2 = torch.full_like(x, float("nan"))
    ck[10](x, y2)
    torch.cuda.synchronize()
    assert torch.equal(x, y2)


def test_replays_through_the_c_key_and_pointer_launch_read_fresh_tensors():
    """`kernel[grid](x, y)` replayed through the C replay lookup and `launch_pointers`
    (pointers only, no lock): every launch reads its own fresh input and writes its own
    poisoned output, on the current stream and on a side stream; a launch with a shifted
    (4-byte aligned) view does not replay the aligned one's variant."""
    import tegula as tg
    from tegula.kernels.copy import copy_kernel
    from tegula.runtime import replay

    # A kernel object of its own: `copy_kernel(f32)` is cached per process, and the
    # library's `tk.copy` (tests/kernels/test_api.py) files its launches in that object's
    # replay table, so under `pytest -n 8` a worker that ran those first counted 16
    # prepared launches here, not 2 (the flake of session 5).
    kernel = copy_kernel.__wrapped__(f32)
    grid = (tg.cdiv(130, 64), tg.cdiv(37, 16))
    side = torch.cuda.Stream()
    for call in range(6):
        base = torch.randn(37 * 130 + 1, device="cuda")
        x = base[call % 2:call % 2 + 37 * 130].view(37, 130)  # odd calls: 4-byte aligned
        y = torch.full((37, 130), float("nan"), device="cuda")
        if call >= 4:
            # x and y were written on the current stream: the side stream must wait for
            # them, or the copy can run before y's NaN fill lands (a race in the test
            # itself, which a faster replay exposed in session 9's final GPU run)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                kernel[grid](x, y, BM=16, BN=64)
            side.synchronize()
        else:
            kernel[grid](x, y, BM=16, BN=64)
        torch.cuda.synchronize()
        assert torch.equal(x, y), f"call {call}"
    prepared = list(kernel._fast_launch.values())
    assert len(prepared) == 2  # aligned and 4-byte aligned: two specializations
    if launcher._C_POINTERS[0] is None:
        pytest.skip(f"C extension unavailable here: {fastcall.unavailable}")
    assert replay.C_LOOKUP[0] is not None
    assert all(p.direct is not None for p in prepared)  # launched through launch_pointers


def test_f32_scalars_through_the_c_launch_equal_the_python_packed_launch():
    """A prepared launch of a kernel with an f32 scalar (`elementwise_zoo`: `alpha`
    decides where(x > alpha, ...)) writes the float in C (`launch_pointers`, kind 'f'):
    for each value — the sign of zero, a subnormal, NaN, infinity — the outputs equal
    those of the same launch packed in Python (`CompiledKernel.launch`), into poisoned
    outputs, on fresh inputs."""
    from tegula.runtime import PreparedLaunch

    ck = compile_kernel(samples.elementwise_zoo())
    n = 128 * 2 * 7 + 6
    grid = (-(-n // 256), 1, 1)
    if launcher._C_POINTERS[0] is None:
        pytest.skip(f"C extension unavailable here: {fastcall.unavailable}")

    def tensors(seed):
        g = torch.Generator(device="cuda").manual_seed(seed)
        x = (torch.rand(n, device="cuda", generator=g) * 6 - 3).half()
        return (x, torch.full((n,), float("nan"), device="cuda", dtype=torch.bfloat16),
                torch.full((n,), 0x7F, device="cuda", dtype=torch.uint8)
                .view(torch.float8_e4m3fn))

    x, y, q = tensors(0)
    prepared = PreparedLaunch(ck, *ck.plan.flatten([x, 0.5, y, q]))
    for seed, alpha in enumerate([0.5, -0.0, 1.25, 1e-40, float("nan"), float("inf"),
                                  -float("inf"), -1.75]):
        x, y, q = tensors(seed)
        args = [x, alpha, y, q]
        prepared(grid, args, [t.data_ptr() if hasattr(t, "data_ptr") else None
                              for t in args])
        _, y_ref, q_ref = tensors(seed)
        ck.launch(grid, [x, alpha, y_ref, q_ref])
        torch.cuda.synchronize()
        assert torch.equal(y.view(torch.int16), y_ref.view(torch.int16)), alpha
        assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)), alpha
        # the C launch ran: a spec with scalars (kinds b"f") and no tensor maps
        assert isinstance(prepared.direct, tuple) and prepared.direct[8] == b"f"
