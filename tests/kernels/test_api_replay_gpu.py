"""On a GPU: the entry points' replays (one C call where built) read each call's own
inputs and write each call's own output — a fresh one, or the `out=` tensor — on the
current stream, side streams included. Outputs start poisoned (NaN); every element is
compared. Run with `pytest -m gpu tests/kernels/test_api_replay_gpu.py`."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import tegula.kernels as tk  # noqa: E402

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _references(x, w):
    xd = x.double()
    norm = xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-5) * w.double()
    return {"rms_norm": norm, "softmax": torch.softmax(xd, -1), "copy": xd}


@pytest.mark.parametrize("with_out", [False, True])
def test_replayed_entry_points_write_their_own_outputs(with_out):
    side = torch.cuda.Stream()
    for call in range(6):  # full path, Python replay, then C replays; the last two on `side`
        g = torch.Generator(device="cuda").manual_seed(call)
        x = torch.randn(37, 300, device="cuda", dtype=torch.float16, generator=g) * 3
        w = torch.rand(300, device="cuda", dtype=torch.float16, generator=g) + 0.5
        outs = {name: torch.full_like(x, float("nan")) if with_out else None
                for name in ("rms_norm", "softmax", "copy")}
        stream = side if call >= 4 else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            got = {"rms_norm": tk.rms_norm(x, w, 1e-5, out=outs["rms_norm"]),
                   "softmax": tk.softmax(x, out=outs["softmax"]),
                   "copy": tk.copy(x, out=outs["copy"])}
        stream.synchronize()
        for name, ref in _references(x, w).items():
            y = got[name]
            assert (y is outs[name]) if with_out else y.is_contiguous(), (name, call)
            assert not torch.isnan(y).any(), (name, call)
            if name == "copy":
                assert torch.equal(y, x), (name, call)
            else:
                err = ((y.double() - ref).abs() / (ref.abs() + 1e-3)).max().item()
                assert err < 4e-3, (name, call, err)


def _matrix_cases():
    """(name, inputs, the call, the float64 reference) of the matrix entry points."""
    g = torch.Generator(device="cuda").manual_seed(7)
    h = dict(device="cuda", dtype=torch.float16)
    a, w = torch.randn(257, 72, generator=g, **h), torch.randn(129, 72, generator=g, **h) / 8
    x, wg = torch.randn(4, 512, generator=g, **h), torch.randn(256, 512, generator=g, **h) / 8
    a8 = (torch.randn(64, 256, device="cuda", generator=g) / 4).to(torch.float8_e4m3fn)
    w8 = (torch.randn(128, 256, device="cuda", generator=g) / 4).to(torch.float8_e4m3fn)
    sa, sb = torch.tensor([0.5], device="cuda"), torch.tensor([0.25], device="cuda")
    return [("matmul", a, lambda: tk.matmul(a, w.T), lambda: a.double() @ w.double().T),
            ("gemv", x, lambda: tk.gemv(x, wg), lambda: x.double() @ wg.double().T),
            ("matmul_fp8", a8, lambda: tk.matmul_fp8(a8, w8.T, sa, sb),
             lambda: (a8.double() @ w8.double().T) * 0.125)]


@pytest.mark.parametrize("case", [0, 1, 2], ids=["matmul", "gemv", "matmul_fp8"])
def test_matrix_replays_read_each_call_s_data_through_the_same_pointers(case):
    """matmul, gemv and matmul_fp8 replayed on inputs rewritten in place between calls:
    the same pointers, so from the third call on a launch with TMA tensor maps takes
    them from its prepared launch's encodings in the C call; every call's fresh output
    is checked against a float64 reference of that call's data (a launch that read stale
    data, or none, gives the previous call's result)."""
    name, operand, call, reference = _matrix_cases()[case]
    for step in range(6):
        fresh = torch.randn(operand.shape, device="cuda") / (4 if name == "matmul_fp8" else 1)
        operand.copy_(fresh.to(operand.dtype))
        c = call()
        torch.cuda.synchronize()
        ref = reference()
        tol = 1e-2 if name == "matmul_fp8" else 2e-3
        bad = int((~((c.double() - ref).abs() <= tol * (ref.abs() + 1))).sum())
        assert bad == 0, (name, step, bad)


def _attention_reference(q, k, v, causal, scale):
    """o (float64) of (B, H, Sq, D) q against (B, Hkv, S, D) k, v, causal bottom-right."""
    q, k, v = (t.double() for t in (q, k, v))
    groups = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(groups, 1), v.repeat_interleave(groups, 1)
    s = q @ k.transpose(-1, -2) * scale
    if causal:
        sq, sk = q.shape[2], k.shape[2]
        hidden = torch.arange(sk, device=q.device)[None, :] > \
            torch.arange(sq, device=q.device)[:, None] + sk - sq
        s = s.masked_fill(hidden, float("-inf"))
    return torch.softmax(s, -1) @ v


def _pages(cache, table):
    """(B, Hkv, S, D) as a pool of 64-token pages: page table[b, j] holds tokens
    64 j ... 64 j + 63 of sequence b (zeros past S)."""
    pool = cache.new_zeros(table.numel(), cache.shape[1], 64, cache.shape[3])
    for b in range(table.shape[0]):
        for j in range(table.shape[1]):
            tokens = cache[b, :, 64 * j:64 * j + 64]
            pool[table[b, j], :, :tokens.shape[1]] = tokens
    return pool


@pytest.mark.parametrize("paged", [False, True])
def test_decode_replays_read_each_call_s_cache_and_lengths(paged):
    """attention_decode's replays (one launch through fresh workspaces and the stream's
    arrival counters; a side stream gets its own) on fresh
    tensors per call, the last two on a side stream, the C++ allocator ready or not:
    every element against float64, with each call's own lengths."""
    from tegula.kernels import api
    side = torch.cuda.Stream()
    before = len(api._REPLAYS)
    for call in range(6):
        g = torch.Generator(device="cuda").manual_seed(100 + call)
        q = torch.randn(3, 8, 2, 128, device="cuda", dtype=torch.float16, generator=g)
        k = torch.randn(3, 2, 300, 128, device="cuda", dtype=torch.float16, generator=g)
        v = torch.randn(3, 2, 300, 128, device="cuda", dtype=torch.float16, generator=g)
        lens = torch.randint(2, 301, (3,), device="cuda", dtype=torch.int32, generator=g)
        cache, table = (k, v), None
        if paged:  # the same cache as 5 pages of 64 tokens per sequence, pool shuffled
            table = torch.randperm(15, device="cuda", generator=g).view(3, 5)
            cache = tuple(_pages(t, table) for t in (k, v))
            table = table.to(torch.int32)
        stream = side if call >= 4 else torch.cuda.current_stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            o, lse = tk.attention_decode(q, *cache, lens, table, return_lse=True)
        stream.synchronize()
        for b in range(3):
            n = int(lens[b])
            want = _attention_reference(q[b:b + 1], k[b:b + 1, :, :n], v[b:b + 1, :, :n],
                                        False, 128 ** -0.5)
            err = (o[b:b + 1].double() - want).abs()
            assert torch.all(err <= 2e-3 * (want.abs() + 1)), (call, b, err.max().item())
        assert torch.isfinite(lse).all()
    assert len(api._REPLAYS) == before + 1  # one key, replayed from the second call


def test_attention_forward_replays_write_their_own_outputs():
    from tegula.kernels import api
    before = len(api._REPLAYS)
    for call in range(5):
        g = torch.Generator(device="cuda").manual_seed(200 + call)
        q = torch.randn(2, 4, 100, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        k = torch.randn(2, 2, 150, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        v = torch.randn(2, 2, 150, 64, device="cuda", dtype=torch.bfloat16, generator=g)
        o, lse = tk.attention_forward(q, k, v, True, 0.1)
        torch.cuda.synchronize()
        want = _attention_reference(q, k, v, True, 0.1)
        err = (o.double() - want).abs()
        assert torch.all(err <= 2 ** -7 * (want.abs() + 1)), (call, err.max().item())
        assert lse.shape == (2, 4, 100) and torch.isfinite(lse).all()
    assert len(api._REPLAYS) <= before + 1
