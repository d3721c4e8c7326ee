"""The FlashAttention forward on the GPU against a float32 torch reference with an explicit
bottom-right causal mask: every autotuner candidate launched directly with NaN-poisoned
outputs, the torch entry points (`tegula.kernels.attention_forward`, `attention`,
`attention_varlen`) on many shapes (odd lengths, Sq != Sk, fully masked rows, GQA/MQA,
D = 64/128/256, f16/bf16), and one launch under compute-sanitizer.

Run as a script (`python tests/gpu/test_attention_forward_gpu.py smoke`) it makes the one
checked launch the sanitizer test runs.
"""
from __future__ import annotations

import math
import os
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent

if __name__ != "__main__":
    pytestmark = pytest.mark.gpu
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():  # collected in CI (no GPU): every test skips
        pytestmark = [pytest.mark.gpu, pytest.mark.skip(reason="needs a CUDA GPU")]
else:
    import torch

from tegula.dtypes import bf16, f16  # noqa: E402
from tegula.kernels.attention import (attention_candidates, attention_kernel,  # noqa: E402
                                      forward_grid, keys_last, qk_scale)

DTYPES = {"f16": torch.float16, "bf16": torch.bfloat16}
TEGULA_DTYPES = {torch.float16: f16, torch.bfloat16: bf16}


def reference(q, k, v, causal: bool, scale: float | None = None):
    """o and natural-log lse in float32 on the GPU: kv heads repeated for GQA, the mask
    explicit (query i sees key j iff j <= i + Sk - Sq); rows that see no key: o = 0,
    lse = -inf."""
    sq, sk, d = q.shape[-2], k.shape[-2], q.shape[-1]
    scale = 1 / math.sqrt(d) if scale is None else scale
    group = q.shape[1] // k.shape[1]
    kf = k.float().repeat_interleave(group, dim=1)
    vf = v.float().repeat_interleave(group, dim=1)
    s = q.float() @ kf.transpose(-1, -2) * scale
    rows = torch.arange(sq, device=q.device)[:, None]
    mask = torch.arange(sk, device=q.device)[None, :] <= rows + (sk - sq) if causal else \
        torch.ones(sq, sk, dtype=torch.bool, device=q.device)
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows with lse -inf: all zero
    return p @ vf, lse


def tolerance(dtype) -> float:
    """p and o are rounded to the element type: a few of its ulps, relative to |v| ~ 1."""
    return 4e-3 if dtype == torch.float16 else 3e-2


def check(o, lse, want_o, want_lse, dtype, what: str = ""):
    """Every element: no NaN left (outputs start poisoned), o within the type's rounding,
    lse within 1e-4, -inf exactly where the reference has it."""
    assert not torch.isnan(o).any(), f"{what}: o has NaN (unwritten or wrong)"
    assert not torch.isnan(lse).any(), f"{what}: lse has NaN (unwritten or wrong)"
    tol = tolerance(dtype)
    torch.testing.assert_close(o.float(), want_o, rtol=tol, atol=tol, msg=lambda m: f"{what}: {m}")
    assert torch.equal(torch.isneginf(lse), torch.isneginf(want_lse)), what
    finite = torch.isfinite(want_lse)
    # f32 sums of up to 16k terms in two different orders: 1e-4 (a wrong scale or mask
    # is off by far more)
    torch.testing.assert_close(lse[finite], want_lse[finite], rtol=1e-4, atol=1e-4)


def random_qkv(seed: int, b, h, h_kv, sq, sk, d, dtype):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    make = lambda *s: torch.randn(*s, device="cuda", generator=gen).to(dtype)  # noqa: E731
    return make(b, h, sq, d), make(b, h_kv, sk, d), make(b, h_kv, sk, d)


def seed_of(request) -> int:
    return zlib.crc32(request.node.nodeid.encode())


# -- every candidate the autotuner may pick, launched directly into poisoned outputs ----------
def _candidates():
    wgmma = torch.cuda.is_available() and torch.cuda.get_device_capability() >= (9, 0)
    return [(d, causal, c) for d in (64, 128, 256) for causal in (False, True)
            for c in attention_candidates(d, wgmma, causal)]


@pytest.mark.parametrize("d,causal,config", _candidates() if torch.cuda.is_available() else [],
                         ids=lambda x: str(x))
def test_every_candidate_into_poisoned_outputs(d, config, causal, request):
    b, h, h_kv, sq, sk = 2, 4, 2, 203, 150   # divides no tile; Sq > Sk: masked rows if causal
    dtype = torch.float16 if d != 128 else torch.bfloat16
    q, k, v = random_qkv(seed_of(request), b, h, h_kv, sq, sk, d, dtype)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, sq), float("nan"), device="cuda")
    values = dict(config)
    threads = values.pop("threads", None)
    operand = keys_last(v, (0, 1, 3, 2)) if values["V_KMAJOR"] else v  # as the entry does
    kernel = attention_kernel(TEGULA_DTYPES[dtype])
    extra = {"threads": threads} if threads else {}
    kernel[forward_grid(values, sq, h, b, q.device)](q, k, operand, o, lse, D=d,
                                                     QK_SCALE=qk_scale(None, d),
                                                     CAUSAL=causal, **values, **extra)
    torch.cuda.synchronize()
    check(o, lse, *reference(q, k, v, causal), dtype, f"D={d} {config} causal={causal}")


@pytest.mark.parametrize("d,bn", [(64, 128), (128, 128), (256, 64)])
@pytest.mark.parametrize("overlap", [False, True])
@pytest.mark.parametrize("causal", [False, True])
def test_turn_taking_warpgroups_into_poisoned_outputs(d, bn, overlap, causal, request):
    """consumers="pingpong" on the 128-row forward (the two consumer warpgroups take turns
    at the tensor cores, `lower/warp_roles.py`): every element, odd lengths, GQA 2:1,
    rows that see no key when causal (Sq > Sk), the plain and the overlapped loop."""
    b, h, h_kv, sq, sk = 2, 4, 2, 203, 150
    q, k, v = random_qkv(seed_of(request), b, h, h_kv, sq, sk, d, torch.float16)
    o = torch.full_like(q, float("nan"))
    lse = torch.full((b, h, sq), float("nan"), device="cuda")
    attention_kernel(TEGULA_DTYPES[torch.float16])[(-(-sq // 128), h, b)](
        q, k, v, o, lse, D=d, QK_SCALE=qk_scale(None, d), CAUSAL=causal, BM=128, BN=bn,
        OVERLAP=overlap, threads=256, consumers="pingpong")
    torch.cuda.synchronize()
    check(o, lse, *reference(q, k, v, causal), torch.float16,
          f"D={d} pingpong OVERLAP={overlap} causal={causal}")


@pytest.mark.parametrize("d,bm,bn", [(64, 128, 128), (128, 128, 128), (256, 128, 64),
                                     (128, 64, 64)])
@pytest.mark.parametrize("causal", [False, True])
def test_overlapped_loop_into_poisoned_outputs(d, bm, bn, causal, request):
    """OVERLAP (FlashAttention-3's order: s_{j+1} and p_j @ v_j in flight during block
    j+1's softmax, p carried in f32, the softmax copied into both sides of the mask's
    branch) on one or two consumer warpgroups: every element, odd lengths with many key
    blocks, GQA 2:1, rows that see no key when causal (Sq > Sk)."""
    # Sq < Sk: many key blocks, a diagonal when causal; Sq > Sk: rows 0..573 see no key
    for sq, sk in ((203, 777), (777, 203)):
        b, h, h_kv = 2, 4, 2
        q, k, v = random_qkv(seed_of(request) + sq, b, h, h_kv, sq, sk, d, torch.float16)
        o = torch.full_like(q, float("nan"))
        lse = torch.full((b, h, sq), float("nan"), device="cuda")
        attention_kernel(TEGULA_DTYPES[torch.float16])[(-(-sq // bm), h, b)](
            q, k, v, o, lse, D=d, QK_SCALE=qk_scale(None, d), CAUSAL=causal, BM=bm, BN=bn,
            OVERLAP=True, threads=2 * bm)
        torch.cuda.synchronize()
        check(o, lse, *reference(q, k, v, causal), torch.float16,
              f"D={d} BM={bm} BN={bn} OVERLAP causal={causal} Sq={sq} Sk={sk}")


# -- three consumer warpgroups, stated register budgets, persistent blocks, session 14's
# candidates: in a child with a time limit (a hang fails the test) ---------------------------
# (D, constexprs): FlashAttention-3's D=64 tile (192 query rows on three consumer warpgroups,
# with synthesis's budgets and with 160 registers a consumer thread), and the consumer
# budget of 240 (producer 24) on the loops it lets fit: the overlapped loop on the
# cooperative consumer at D=128 (which spills at 232), turns and 176-key blocks.
BUDGET_CONFIGS = [
    (64, dict(BM=192, BN=128, threads=384)),
    (64, dict(BM=192, BN=128, threads=384, REGS=160)),
    (128, dict(BM=128, BN=128, threads=256, OVERLAP=True, REGS=240)),
    (128, dict(BM=128, BN=128, threads=256, OVERLAP=True, REGS=240, consumers="pingpong")),
    (128, dict(BM=128, BN=176, threads=256, REGS=240, consumers="pingpong")),
    (256, dict(BM=128, BN=64, threads=256, OVERLAP=True, REGS=240)),
    # persistent: 5 blocks walking every tile, the TMA ring running on across them
    (64, dict(BM=128, BN=128, threads=256, PERSISTENT=True)),
    (64, dict(BM=192, BN=128, threads=384, PERSISTENT=True)),
    (128, dict(BM=128, BN=128, threads=256, PERSISTENT=True)),
    # session 14's candidates: D = 256's 128 x 80 tile (FlashAttention-3's) with and without
    # turns, 64-key turns; two 128-row blocks an SM in one role (short sequences)
    (256, dict(BM=128, BN=80, threads=256, REGS=240, consumers="pingpong")),
    (256, dict(BM=128, BN=64, threads=256, consumers="pingpong")),
    (256, dict(BM=128, BN=80, threads=256, REGS=240)),
    (64, dict(BM=128, BN=128, threads=256, warp_specialize=False, blocks_per_sm=2)),
    (128, dict(BM=128, BN=64, threads=256, warp_specialize=False, blocks_per_sm=2)),
    # the overlapped loop with block 0's keys through the ring (FIRST_IN_RING)
    (256, dict(BM=128, BN=80, threads=256, OVERLAP=True, FIRST_IN_RING=True, REGS=240)),
    (64, dict(BM=128, BN=64, threads=256, OVERLAP=True, FIRST_IN_RING=True)),
]


def run_budget_configs(part: int = 0, parts: int = 1) -> None:
    """Every BUDGET_CONFIGS entry (those i with i % parts == part), causal and not, at
    Sq < Sk (many key blocks, a diagonal) and Sq > Sk (rows that see no key), GQA 2:1,
    into NaN-poisoned outputs; one line each."""
    for d, config in BUDGET_CONFIGS[part::parts]:
        for causal in (False, True):
            for sq, sk in ((203, 777), (777, 203)):
                b, h, h_kv = 2, 4, 2
                q, k, v = random_qkv(d + sq + causal, b, h, h_kv, sq, sk, d, torch.float16)
                o = torch.full_like(q, float("nan"))
                lse = torch.full((b, h, sq), float("nan"), device="cuda")
                grid = (5,) if config.get("PERSISTENT") else (-(-sq // config["BM"]), h, b)
                attention_kernel(f16)[grid](
                    q, k, v, o, lse, D=d, QK_SCALE=qk_scale(None, d), CAUSAL=causal,
                    **config)
                torch.cuda.synchronize()
                what = f"D={d} {config} causal={causal} Sq={sq} Sk={sk}"
                check(o, lse, *reference(q, k, v, causal), torch.float16, what)
                print("ok", what, flush=True)


def test_three_warpgroups_and_stated_budgets_into_poisoned_outputs():
    """BUDGET_CONFIGS in a child process with a time limit, so that a hang (a barrier
    protocol that deadlocks) fails this test instead of stalling the suite."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(HERE.parents[1]),
                                                       os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run([sys.executable, __file__, "budgets"], capture_output=True,
                              text=True, env=env, timeout=240, check=False)
    except subprocess.TimeoutExpired as e:
        done = (e.stdout or b"").decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        pytest.fail(f"no result within 240 s (a hang?); finished before it:\n{done}")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert proc.stdout.count("ok ") == 4 * len(BUDGET_CONFIGS), proc.stdout


# -- the torch entry points -----------------------------------------------------------------
# (B, H, H_kv, Sq, Sk, D, causal, dtype)
SHAPES = [
    (2, 4, 4, 128, 128, 64, False, "f16"),
    (2, 4, 4, 128, 128, 64, True, "f16"),
    (1, 8, 2, 1000, 1000, 128, True, "f16"),
    (1, 8, 8, 1000, 1000, 128, False, "bf16"),
    (2, 4, 1, 77, 300, 64, True, "bf16"),     # Sq < Sk, MQA
    (1, 2, 2, 300, 77, 128, True, "f16"),     # Sq > Sk: rows 0..222 see no key
    (1, 4, 4, 1, 513, 128, True, "f16"),      # decoding: one query sees every key
    (1, 2, 1, 513, 1, 64, False, "f16"),      # one key
    (1, 1, 1, 1, 1, 64, True, "bf16"),
    (1, 2, 2, 200, 333, 256, True, "f16"),
    (2, 2, 1, 333, 200, 256, False, "bf16"),
    (1, 16, 2, 2048, 2048, 128, True, "bf16"),
    (1, 8, 1, 4096, 4096, 64, True, "f16"),
]


@pytest.fixture
def untuned(monkeypatch):
    """The entry point's default configuration, without timing the others: every candidate
    is checked above at one shape, and compiling all of them per shape bucket would cost
    minutes. The two largest shapes below still run the autotuner."""
    monkeypatch.setenv("TEGULA_AUTOTUNE", "0")


@pytest.mark.parametrize("b,h,h_kv,sq,sk,d,causal,dtype", SHAPES)
def test_attention_forward_matches_the_reference(b, h, h_kv, sq, sk, d, causal, dtype, request,
                                                 monkeypatch):
    from tegula.kernels import attention_forward
    if sq < 2048:
        monkeypatch.setenv("TEGULA_AUTOTUNE", "0")  # as the `untuned` fixture
    dt = DTYPES[dtype]
    q, k, v = random_qkv(seed_of(request), b, h, h_kv, sq, sk, d, dt)
    o, lse = attention_forward(q, k, v, causal)
    check(o, lse, *reference(q, k, v, causal), dt, f"{(b, h, h_kv, sq, sk, d, causal, dtype)}")


def test_attention_agrees_with_sdpa_given_the_bottom_right_mask(request, untuned):
    """torch SDPA with the explicit bottom-right mask as attn_mask, and with is_causal when
    Sq == Sk (where top-left and bottom-right agree); an explicit scale."""
    from tegula.kernels import attention
    F = torch.nn.functional
    q, k, v = random_qkv(seed_of(request), 2, 8, 8, 100, 260, 128, torch.float16)
    mask = torch.arange(260, device="cuda")[None, :] <= torch.arange(100, device="cuda")[:, None] + 160
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.07)
    torch.testing.assert_close(attention(q, k, v, causal=True, scale=0.07), want,
                               rtol=4e-3, atol=4e-3)
    q2, k2, v2 = random_qkv(seed_of(request) + 1, 1, 4, 4, 333, 333, 64, torch.bfloat16)
    torch.testing.assert_close(attention(q2, k2, v2, causal=True),
                               F.scaled_dot_product_attention(q2, k2, v2, is_causal=True),
                               rtol=3e-2, atol=3e-2)


def test_strided_views_are_read_in_place(request, untuned):
    """A (B, S, H, D) tensor's (B, H, S, D) view (what a model's projection gives): the
    kernels specialize on its strides rather than copying."""
    from tegula.kernels import attention_forward
    q, k, v = random_qkv(seed_of(request), 2, 6, 3, 90, 140, 64, torch.float16)
    qs, ks, vs = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
    assert not qs.is_contiguous()
    o, lse = attention_forward(qs, ks, vs, True)
    check(o, lse, *reference(q, k, v, True), torch.float16)
    # K and V broadcast over the kv heads (stride 0, as an `expand` for MQA gives): copied
    # by the entry point, since TMA needs positive strides.
    ke, ve = k[:, :1].expand(2, 3, 140, 64), v[:, :1].expand(2, 3, 140, 64)
    o, lse = attention_forward(q, ke, ve, False)
    check(o, lse, *reference(q, ke, ve, False), torch.float16, "expanded k, v")


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("d,dtype", [(64, "bf16"), (128, "f16"), (256, "f16")])
def test_attention_varlen_matches_each_sequence_alone(d, dtype, causal, request, untuned):
    """Five packed sequences (empty, single-query and longer than a block among them), GQA
    4:1, and padding rows past the last offset holding NaN keys and infinite values that
    no sequence may read."""
    from tegula.kernels import attention_varlen
    dt = DTYPES[dtype]
    lengths_q, lengths_k = [1, 0, 257, 100, 64], [40, 7, 300, 100, 1]
    cu_q = torch.tensor([0] + lengths_q, device="cuda").cumsum(0).to(torch.int32)
    cu_k = torch.tensor([0] + lengths_k, device="cuda").cumsum(0).to(torch.int32)
    gen = torch.Generator(device="cuda").manual_seed(seed_of(request))
    total_q, total_k = int(cu_q[-1]) + 5, int(cu_k[-1]) + 9
    q = torch.randn(total_q, 8, d, device="cuda", generator=gen).to(dt)
    k = torch.randn(total_k, 2, d, device="cuda", generator=gen).to(dt)
    v = torch.randn(total_k, 2, d, device="cuda", generator=gen).to(dt)
    k[int(cu_k[-1]):], v[int(cu_k[-1]):] = float("nan"), float("inf")
    o, lse = attention_varlen(q, k, v, cu_q, cu_k, max(lengths_q), max(lengths_k), causal,
                              return_lse=True)
    torch.cuda.synchronize()
    for e in range(len(lengths_q)):
        rows = slice(int(cu_q[e]), int(cu_q[e + 1]))
        keys = slice(int(cu_k[e]), int(cu_k[e + 1]))
        want_o, want_lse = reference(q[rows].transpose(0, 1)[None], k[keys].transpose(0, 1)[None],
                                     v[keys].transpose(0, 1)[None], causal)
        check(o[rows].transpose(0, 1)[None], lse[:, rows][None], want_o, want_lse, dt,
              f"sequence {e}")


def test_bad_devices_are_named():
    from tegula.kernels import attention
    q = torch.randn(1, 2, 8, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="k is on cpu"):
        attention(q, q.cpu(), q)


# -- compute-sanitizer on one launch -----------------------------------------------------------
def smoke() -> None:
    """One small checked launch through the torch entry point: causal, GQA, ragged."""
    from tegula.kernels import attention_forward
    q, k, v = random_qkv(1, 1, 4, 2, 70, 130, 64, torch.float16)
    o, lse = attention_forward(q, k, v, True)
    torch.cuda.synchronize()
    check(o, lse, *reference(q, k, v, True), torch.float16, "smoke")


@pytest.mark.parametrize("tool", ["memcheck", "racecheck", "synccheck"])
def test_sanitizer_reports_zero_errors_on_one_launch(tool):
    sys.path.insert(0, str(HERE))
    from test_sanitize import TOOL_OPTIONS, _sanitizer, assert_clean
    env = dict(os.environ, TEGULA_AUTOTUNE="0")  # one configuration: the untuned default
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parents[1]), env.get("PYTHONPATH", "")])
    proc = subprocess.run([_sanitizer(), *TOOL_OPTIONS[tool], sys.executable, __file__, "smoke"],
                          capture_output=True, text=True, env=env, timeout=500, check=False)
    out = proc.stdout + proc.stderr
    if "Device not supported" in out:
        pytest.skip("compute-sanitizer does not support this device/runtime")
    assert proc.returncode == 0, out[-3000:]
    assert_clean(tool, out)


if __name__ == "__main__":
    if sys.argv[1:] == ["smoke"]:
        smoke()
        print("ok")
    elif sys.argv[1:2] == ["budgets"]:  # budgets [PART PARTS]: a share, for parallel runs
        run_budget_configs(*map(int, sys.argv[2:4]))
