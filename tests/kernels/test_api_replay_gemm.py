"""The matrix entry points' replays (`matmul`, its split-K and copied-b plans, `gemv`,
`matmul_fp8`) as the driver sees them: on the CPU, compiler stubbed, a ctypes callback in
place of cuLaunchKernel (tests/kernels/test_api_replay.py's `driver` fixture). Each call
runs on fresh tensors; every launch must carry this call's own input pointers and the
output it returns (a fresh, contiguous tensor of the result's shape and dtype), with
every other parameter byte as the first (full-path) call sent. A single launch replays in
one C call (`fastcall.entry_launch`, no Python `PreparedLaunch.__call__`) from the third
call on; a two-launch plan replays through Python with a fresh workspace each call."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tegula.kernels as tk  # noqa: E402
from tegula.kernels import api  # noqa: E402
from tegula.runtime import launcher  # noqa: E402
from tegula.runtime.autotune import Config  # noqa: E402


def _replay_harness():
    path = Path(__file__).resolve().parent / "test_api_replay.py"
    spec = importlib.util.spec_from_file_location("tegula_test_api_replay_gemm", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_REPLAY = _replay_harness()
driver = _REPLAY.driver  # the fixture: compile stubbed, the driver recorded
_x = _REPLAY._x


@pytest.fixture(autouse=True)
def maps(monkeypatch):
    """TMA tensor maps (the sm_90a GEMMs take some) without a driver: each map's first 8
    bytes are its tensor's pointer, the rest its other fields' hash."""
    from tegula.runtime.tensor_map import TENSOR_MAPS

    def encode(ptr, dtype, shape, strides, dims, box, swizzle, name="tensor"):
        rest = hash((dtype.name, shape, strides, dims, box, swizzle)) & (2**64 - 1)
        return ptr.to_bytes(8, "little") + rest.to_bytes(8, "little") * 15
    monkeypatch.setattr(TENSOR_MAPS, "encode", encode)
    TENSOR_MAPS.clear()
    yield
    TENSOR_MAPS.clear()


def _pointers(launch):
    """The data pointers a launch sent, in parameter order; each tensor map's pointer
    must be its tensor's."""
    ck, *_, sent = launch
    by_tensor = {spec.source: int.from_bytes(b, "little")
                 for b, spec in zip(sent, ck.params) if spec.kind == "pointer"}
    for b, spec in zip(sent, ck.params):
        if spec.kind == "tensormap":
            assert int.from_bytes(b[:8], "little") == by_tensor[spec.source], spec.name
    return list(by_tensor.values())


def _mapped_pointers(launch) -> dict:
    """{tensor map's name: the data pointer of its tensor} for the maps a launch passed."""
    ck, *_, sent = launch
    by_tensor = {spec.source: int.from_bytes(b, "little")
                 for b, spec in zip(sent, ck.params) if spec.kind == "pointer"}
    return {spec.name: by_tensor[spec.source] for spec in ck.params
            if spec.kind == "tensormap"}


def _others(launch):
    """Everything else a launch sent (a tensor map without its pointer)."""
    ck, device, grid, block, shared, stream, extra, sent = launch
    return (ck, device, grid, block, shared, stream, extra,
            [b[8:] if spec.kind == "tensormap" else b for b, spec in zip(sent, ck.params)
             if spec.kind != "pointer"])


def _h(shape, seed):
    return _x(shape, dtype=torch.float16, seed=seed)


def _fp8(shape, seed):
    return _x(shape, seed=seed).to(torch.float8_e4m3fn)


# name -> (inputs made from a seed, in pointer order; the call on them; the result's shape
# and dtype)
ENTRIES = {
    "matmul": (lambda s: [_h((40, 64), s), _h((48, 64), s + 50)],
               lambda a, w: tk.matmul(a, w.T), (40, 48), torch.float16),
    "matmul, bias, gelu": (lambda s: [_h((40, 64), s), _h((48, 64), s + 50), _h((48,), s + 90)],
                           lambda a, w, b: tk.matmul(a, w.T, b, "gelu"), (40, 48),
                           torch.float16),
    "gemv": (lambda s: [_h((4, 64), s), _h((48, 64), s + 50)], tk.gemv, (4, 48),
             torch.float16),
    "gemv, one row": (lambda s: [_h((64,), s), _h((48, 64), s + 50)], tk.gemv, (48,),
                      torch.float16),
    "matmul_fp8": (lambda s: [_fp8((40, 64), s), _fp8((48, 64), s + 50),
                              _x((1,), seed=s + 90).abs() + 0.5,
                              _x((1,), seed=s + 91).abs() + 0.5],
                   lambda a, w, sa, sb: tk.matmul_fp8(a, w.T, sa, sb), (40, 48),
                   torch.bfloat16),
}


@pytest.mark.parametrize("entry", list(ENTRIES))
def test_matrix_entry_replays_in_one_c_call_on_the_call_s_own_pointers(driver, entry):
    """Fresh inputs each call, then the last call's inputs again: a launch with TMA
    tensor maps goes through Python for pointers it has no map for yet (it encodes them),
    and through the C call for pointers seen before."""
    recording, python_calls = driver
    make, call_on, shape, dtype = ENTRIES[entry]
    kept = _KeptMaps(launcher.MAPS_KEPT_PER_TENSOR)
    for call in range(5):
        del python_calls[:]
        inputs = make(10 * call) if call < 4 else inputs
        result = call_on(*inputs)
        launch = recording.launches[-1]
        assert _pointers(launch) == [t.data_ptr() for t in inputs] + [result.data_ptr()], call
        assert tuple(result.shape) == shape and result.dtype == dtype, call
        assert result.is_contiguous(), call
        if call == 0:
            first = _others(launch)
            continue  # the full path
        assert _others(launch) == first, call
        # The Python replay (deciding the C launch), then C unless a map is new to it
        assert bool(python_calls) == (call == 1 or kept.new(launch)), call
        kept.keep(launch)


class _KeptMaps:
    """The documented rule (PreparedLaunch's docstring, "Tensor maps") as a model: per
    tensor map, the pointers a Python launch encoded, dropped all at once when a new one
    comes to a map holding `limit`. A launch goes through C exactly when every map's
    pointer is kept by that map."""

    def __init__(self, limit: int):
        self.limit, self.maps, self.dropped = limit, {}, 0

    def new(self, launch) -> bool:
        return any(ptr not in self.maps.get(name, ()) for name, ptr in
                   _mapped_pointers(launch).items())

    def keep(self, launch) -> None:
        """What the launch (a Python one where `new`) leaves kept."""
        for name, ptr in _mapped_pointers(launch).items():
            kept = self.maps.setdefault(name, set())
            if ptr not in kept:
                if len(kept) >= self.limit:
                    kept.clear()
                    self.dropped += 1
                kept.add(ptr)


def test_tensor_maps_are_kept_per_map_until_the_limit_then_dropped(driver, monkeypatch):
    """The eviction rule with the limit at 2, against the model: operands that come back
    while kept launch through C; a third distinct pointer drops a map's kept ones, which
    launch through Python again (re-encoded); a map whose own pointer is kept keeps its
    others when another map's is new."""
    from tegula.runtime import launcher
    monkeypatch.setattr(launcher, "MAPS_KEPT_PER_TENSOR", 2)
    recording, python_calls = driver
    make, call_on, *_ = ENTRIES["matmul_fp8"]
    x, y, z = make(0), make(10), make(20)
    calls = [x, x, x, y, x, y, [x[0], z[1]] + x[2:], [y[0], z[1]] + x[2:], z, x, y]
    kept, paths = _KeptMaps(2), []
    for call, inputs in enumerate(calls):
        del python_calls[:]
        call_on(*inputs)
        launch = recording.launches[-1]
        if call == 0:
            if not _mapped_pointers(launch):
                pytest.skip("this GEMM configuration takes no tensor maps")
            continue  # the full path
        paths.append(bool(python_calls))
        assert paths[-1] == (call == 1 or kept.new(launch)), call
        kept.keep(launch)
    assert kept.dropped and paths.count(False) >= 4, paths  # both paths, and an eviction


def _force(monkeypatch, **config):
    monkeypatch.setattr(api, "_configs", lambda family, *bucket: (Config.of(config),))


@pytest.mark.parametrize("plan", ["split K", "copied b"])
def test_two_step_matmul_replays_use_fresh_workspaces(driver, monkeypatch, plan):
    """A split-K plan (the GEMM into an f32 workspace, then the reduction into c) and a
    row-major b copied to K-major first: each replay's launches read this call's a (and
    b, or its fresh copy), pass one fresh workspace from the first launch to the second
    and write the c it returns; every other byte as the full path sent."""
    recording, python_calls = driver
    if plan == "split K":
        _force(monkeypatch, kernel="shared", B="view", BM=64, BN=128, BK=64, STAGES=4, SPLIT=3)
    else:
        _force(monkeypatch, kernel="shared", B="copy", BM=64, BN=128, BK=64, STAGES=4)
    for call in range(4):
        a = _x((40, 96), dtype=torch.float16, seed=call)
        w = _x((48, 96), dtype=torch.float16, seed=50 + call)
        b = w.T if plan == "split K" else w.T.contiguous()  # (K, N) row-major: copied
        before = len(recording.launches)
        c = tk.matmul(a, b)
        launches = recording.launches[before:]
        assert tuple(c.shape) == (40, 48) and c.dtype == torch.float16 and c.is_contiguous()
        if plan == "split K":
            assert len(launches) == 2, call
            (pa, pb, partial), (partial2, pc) = map(_pointers, launches)
            assert (pa, pb, pc) == (a.data_ptr(), b.data_ptr(), c.data_ptr()), call
            assert partial == partial2 and partial not in (pa, pb, pc), call
        else:
            (launch,) = launches
            pa, pb, pc = _pointers(launch)
            assert (pa, pc) == (a.data_ptr(), c.data_ptr()), call
            assert pb not in (b.data_ptr(), a.data_ptr(), c.data_ptr()), call  # b's copy
        others = [_others(launch) for launch in launches]
        if call == 0:
            first = others
        assert others == first, call
    assert len(api._REPLAYS) == 1


def test_a_replay_dropped_from_the_table_during_its_allocation_stays_alive(driver):
    """The C replay (`entry_launch`) holds its table entry while it calls Python (the
    allocation, the stream, the launch): another thread may drop the entry meanwhile (the
    table starts over past its size limit). Here the allocation itself drops it, on a call
    with new pointers (a map to encode: the C call hands the entry back to Python, which
    replays it). The entry must outlive the C call, not be freed inside it."""
    recording, python_calls = driver
    make, call_on, *_ = ENTRIES["matmul_fp8"]
    inputs = make(0)
    for _ in range(3):
        call_on(*inputs)  # full path, Python replay, C
    (key, entry), = api._REPLAYS.items()
    events = []

    class Watched(api.EntryReplay):
        def __del__(self):
            events.append("freed")

    watched = Watched.__new__(Watched)
    for name in api.EntryReplay.__slots__:
        setattr(watched, name, getattr(entry, name))
    real_allocate = entry.allocate

    def dropping_allocate(t):
        api._REPLAYS.clear()  # the only reference to the entry, but the C call's own
        events.append("allocated")
        return real_allocate(t)

    watched.allocate = dropping_allocate
    api._REPLAYS[key] = watched
    del watched, entry
    fresh = make(10)  # new pointers: their maps to encode, so the entry goes back to Python
    result = call_on(*fresh)
    assert _pointers(recording.launches[-1]) == [t.data_ptr() for t in fresh] + \
        [result.data_ptr()]
    assert events[:2] == ["allocated", "allocated"] and events.count("freed") == 1, events
