"""The attention entry points' replays (`attention_decode`: one launch through fresh
workspaces, or a split and a combine launch with `fused=False`; `attention_forward`: one launch, two outputs) as the driver sees
them: on the CPU, compiler stubbed, a ctypes callback in place of cuLaunchKernel
(tests/kernels/test_api_replay.py's `driver` fixture). Each call runs on fresh tensors:
every launch must carry this call's own pointers and outputs it allocated afresh (the
workspaces the split writes are the ones the combine reads), every other parameter byte
as the first (full-path) call sent; later calls skip the full path (no checks, no
configuration); a call whose pointers are ambiguous (k_cache is v_cache) is not
replayed."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

import tegula.kernels as tk  # noqa: E402
from tegula.kernels import api  # noqa: E402


def _replay_harness():
    path = Path(__file__).resolve().parent / "test_api_replay.py"
    spec = importlib.util.spec_from_file_location("tegula_test_api_replay_attention", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_REPLAY = _replay_harness()
driver = _REPLAY.driver  # the fixture: compile stubbed, the driver recorded
_x = _REPLAY._x


@pytest.fixture(autouse=True)
def maps(monkeypatch):
    """TMA tensor maps (the sm_90a attention takes some) without a driver: each map's
    first 8 bytes are its tensor's pointer, the rest its other fields' hash."""
    from tegula.runtime.tensor_map import TENSOR_MAPS

    def encode(ptr, dtype, shape, strides, dims, box, swizzle, name="tensor"):
        rest = hash((dtype.name, shape, strides, dims, box, swizzle)) & (2**64 - 1)
        return ptr.to_bytes(8, "little") + rest.to_bytes(8, "little") * 15
    monkeypatch.setattr(TENSOR_MAPS, "encode", encode)
    TENSOR_MAPS.clear()
    yield
    TENSOR_MAPS.clear()


def _pointers(launch) -> list[int]:
    """The data pointers a launch sent, in parameter order; each tensor map's pointer
    must be its tensor's."""
    ck, *_, sent = launch
    by_tensor = {spec.source: int.from_bytes(b, "little")
                 for b, spec in zip(sent, ck.params) if spec.kind == "pointer"}
    for b, spec in zip(sent, ck.params):
        if spec.kind == "tensormap":
            assert int.from_bytes(b[:8], "little") == by_tensor[spec.source], spec.name
    return list(by_tensor.values())


def _others(launch):
    """Everything else a launch sent (a tensor map without its pointer)."""
    ck, device, grid, block, shared, stream, extra, sent = launch
    return (ck, device, grid, block, shared, stream, extra,
            [b[8:] if spec.kind == "tensormap" else b for b, spec in zip(sent, ck.params)
             if spec.kind != "pointer"])


def _decode_operands(seed, paged):
    q = _x((2, 4, 1, 64), dtype=torch.float16, seed=seed)
    if paged:
        k = _x((5, 2, 16, 64), dtype=torch.float16, seed=seed + 1)
        v = _x((5, 2, 16, 64), dtype=torch.float16, seed=seed + 2)
        table = torch.tensor([[3, 0], [1, 4]], dtype=torch.int32)
        return q, k, v, torch.tensor([30, 17], dtype=torch.int32), table
    k = _x((2, 2, 40, 64), dtype=torch.float16, seed=seed + 1)
    v = _x((2, 2, 40, 64), dtype=torch.float16, seed=seed + 2)
    return q, k, v, torch.tensor([40, 17], dtype=torch.int32), None


@pytest.fixture
def full_paths(monkeypatch):
    """How many calls ran attention_decode's / attention_forward's full path (their
    configuration step)."""
    import importlib  # the modules (tegula.kernels re-exports functions of their names)
    attention = importlib.import_module("tegula.kernels.attention")
    attention_decode = importlib.import_module("tegula.kernels.attention_decode")
    counts = {"decode": 0, "forward": 0}
    real_launches, real_tuned = attention_decode.decode_launches, attention._run_tuned

    def decode_launches(*args, **kwargs):
        counts["decode"] += 1
        return real_launches(*args, **kwargs)

    def run_tuned(*args, **kwargs):
        counts["forward"] += 1
        return real_tuned(*args, **kwargs)

    monkeypatch.setattr(attention_decode, "decode_launches", decode_launches)
    monkeypatch.setattr(attention, "_run_tuned", run_tuned)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (9, 0))
    # The kernels' own replays (kernel[grid]) outlive a test and hold the driver of the
    # test that prepared them: start each test without them.
    from tegula.dtypes import bf16, f16
    kernels = [attention_decode.attention_decode_split_kernel(f16, paged)
               for paged in (False, True)]
    kernels += [attention_decode.attention_decode_combine_kernel(f16),
                attention.attention_kernel(bf16)]
    for kernel in kernels:
        monkeypatch.setitem(kernel.__dict__, "_fast_launch", {})
    return counts


@pytest.mark.parametrize("paged", [False, True])
@pytest.mark.parametrize("return_lse", [False, True])
def test_decode_replays_one_launch_through_fresh_workspaces(driver, full_paths, paged,
                                                             return_lse):
    """The fused form: one launch per call, fresh workspaces and outputs, and the same
    arrival counters every call (one buffer per device and stream, left zero by each)."""
    recording, _ = driver
    kept = []  # every call's results stay alive: fresh outputs cannot reuse their memory
    for call in range(4):
        q, k, v, lens, table = _decode_operands(10 * call, paged)
        result = tk.attention_decode(q, k, v, lens, table, return_lse=return_lse)
        o, lse = result if return_lse else (result, None)
        kept.append(result)
        split = recording.launches[-1]
        inputs = [q, k, v, lens] + ([table] if paged else [])
        sent = _pointers(split)
        assert sent[:len(inputs)] == [t.data_ptr() for t in inputs], call
        o_part, lse_part, o_sent, lse_sent, counters = sent[len(inputs):]
        assert o_sent == o.data_ptr(), call
        if return_lse:
            assert lse_sent == lse.data_ptr() and lse.shape == (2, 4, 1), call
            assert lse.dtype == torch.float32 and lse.is_contiguous()
        assert o.shape == q.shape and o.dtype == q.dtype and o.is_contiguous()
        assert len({o_part, lse_part, o_sent, lse_sent, counters,
                    *(t.data_ptr() for t in inputs)}) == len(inputs) + 5, call
        if call == 0:
            first, first_counters = _others(split), counters
        assert _others(split) == first and counters == first_counters, call
        assert full_paths["decode"] == 1, call  # later calls replay
    tk.attention_decode(q, k, v, lens, table, causal=True, return_lse=return_lse)
    assert full_paths["decode"] == 2  # another option: another key, the full path


def test_decode_two_launch_form_replays_through_fresh_workspaces(driver, full_paths):
    recording, _ = driver
    kept = []
    for call in range(3):
        q, k, v, lens, table = _decode_operands(10 * call, False)
        o = tk.attention_decode(q, k, v, lens, fused=False)
        kept.append(o)
        split, combine = recording.launches[-2:]
        sent_split, sent_combine = _pointers(split), _pointers(combine)
        assert sent_split[:4] == [t.data_ptr() for t in (q, k, v, lens)], call
        assert sent_combine[:2] == sent_split[4:6], call  # the split's workspaces
        assert sent_combine[2] == o.data_ptr(), call
        if call == 0:
            first = (_others(split), _others(combine))
        assert (_others(split), _others(combine)) == first, call
        assert full_paths["decode"] == 1, call


def test_decode_with_k_cache_as_v_cache_is_not_replayed(driver, full_paths):
    """The same tensor as k and v: a launch's pointer would not say which argument it
    came from, so no replay is kept (a later call with distinct k and v must not read v
    from k's memory)."""
    q, k, _, lens, _ = _decode_operands(0, False)
    for _ in range(2):
        tk.attention_decode(q, k, k, lens)
    assert full_paths["decode"] == 2 and not api._REPLAYS
    q, k, v, lens, _ = _decode_operands(5, False)
    for call in range(3):
        tk.attention_decode(q, k, v, lens)
    assert full_paths["decode"] == 3  # distinct k and v: replayed from the second call


def test_attention_forward_replays_into_fresh_outputs(driver, full_paths, monkeypatch):
    """One launch, o and lse allocated per call (a configuration whose v is not
    transposed: the transposed copy is made per call, so those keep the full path)."""
    monkeypatch.setattr(api, "_tune_and_run",
                        lambda name, device, configs, dims, extra, run:
                        run(next(c for c in configs if not c.kwargs["V_KMAJOR"])))
    recording, _ = driver
    kept = []
    for call in range(4):
        q = _x((1, 2, 24, 64), dtype=torch.bfloat16, seed=call)
        k = _x((1, 1, 40, 64), dtype=torch.bfloat16, seed=call + 50)
        v = _x((1, 1, 40, 64), dtype=torch.bfloat16, seed=call + 90)
        o, lse = tk.attention_forward(q, k, v, True, 0.125)
        kept.append((o, lse))
        launch = recording.launches[-1]
        assert _pointers(launch) == [t.data_ptr() for t in (q, k, v, o, lse)], call
        assert (o.shape, o.dtype, lse.shape, lse.dtype) == \
            (q.shape, q.dtype, (1, 2, 24), torch.float32), call
        assert o.is_contiguous() and lse.is_contiguous()
        if call == 0:
            first = _others(launch)
        assert _others(launch) == first, call
        assert full_paths["forward"] == 1, call
