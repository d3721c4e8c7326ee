"""The orientation of a GEMM as a decision matmul uses (issue 11): for decode shapes on
sm_90a the search (`tg.recommend(orientation=...)`, scored by the cost model) may rank
cᵀ = b·aᵀ first — the weight's rows as the wgmma's 64-row M, the few tokens as its N —
and matmul then times that configuration too, writing out's transpose. Checked here: the
decision follows the model, the transposed launch is right element by element (emulated,
ragged shapes, an activation, NaN/inf inputs), and its replay passes each tensor's
pointer to the kernel argument of its role (the kernel takes b, a, c, not the call's a, b,
c: a replay in call order would swap a and b silently)."""
from __future__ import annotations

import importlib
import os
import sys

import numpy as np
import pytest

from tegula.dtypes import f16
from tegula.kernels import api as _api
from tegula.kernels.api_matmul import (_matmul_replay, gemm_candidates,
                                       searched_transposed)

torch = pytest.importorskip("torch")
sys.path.insert(0, os.path.dirname(__file__))
from test_matmul_epilogue import check_epilogue, operands  # noqa: E402


@pytest.fixture
def fresh_search():
    searched_transposed.cache_clear()
    yield
    searched_transposed.cache_clear()


def test_the_search_takes_the_transposed_orientation_for_16_tokens(fresh_search):
    # 16 rows against wgmma's 64-row M waste 3/4 of each instruction; transposed, the
    # 4096 weight rows fill M and the tokens are a 16-wide N.
    found = searched_transposed(16, 4096, 4096)
    assert [c["orientation"] for c in found] == ["Cᵀ"] and found[0]["BN"] == 16
    assert dict(found[0], kernel="shared") in gemm_candidates(16, 4096, 4096, hopper=True)


def test_no_transposed_candidate_where_the_model_ties_or_with_a_bias(fresh_search):
    # 64 rows fill wgmma's M in either orientation: a predicted tie ranks C first.
    assert searched_transposed(64, 4096, 4096) == []
    # A bias runs along the columns of c, the rows of cᵀ: the kernel adds it along rows.
    assert not [c for c in gemm_candidates(16, 4096, 4096, hopper=True, fused=True)
                if c.get("orientation") == "Cᵀ"]
    # Off Hopper the shared kernel takes mma.sync, whose 16-row M fits 16 tokens.
    assert not [c for c in gemm_candidates(16, 4096, 4096, hopper=False)
                if c.get("orientation") == "Cᵀ"]


def test_the_decision_follows_the_cost_model(fresh_search, monkeypatch):
    # Were the model to score the transposed builds twice as slow, C would be kept: the
    # entry point takes the search's ranking, not a rule of its own.
    recommend = importlib.import_module("tegula.recommend")  # tg.recommend is the function

    def slower_transposed(*args, **kwargs):
        candidate = score(*args, **kwargs)
        if candidate.config.get("orientation") == "Cᵀ" and candidate.seconds:
            candidate.seconds *= 2
        return candidate
    score = recommend.score
    monkeypatch.setattr(recommend, "score", slower_transposed)
    assert searched_transposed(16, 4096, 4096) == []


#: The transposed configuration with tiles small enough to emulate quickly.
SMALL_T = dict(kernel="shared", BM=64, BN=16, BK=16, STAGES=2, orientation="Cᵀ")


@pytest.fixture
def transposed_only(on_cpu, monkeypatch):
    from tegula.runtime.autotune import Config
    import tegula.kernels.api_matmul as api_matmul

    config = (Config.of(dict(SMALL_T, B="view")),)
    monkeypatch.setattr(_api, "_configs", lambda family, *bucket: config)
    plans = []
    monkeypatch.setattr(api_matmul, "_matmul_replay",
                        lambda plan, b_layout, m, n: plans.append(plan))
    monkeypatch.setattr(_api, "_remember", lambda signature, replay: None)
    return plans


@pytest.mark.parametrize("m, n, k, activation", [(13, 70, 40, None), (5, 96, 72, "relu"),
                                                 (16, 130, 24, "silu")])
def test_transposed_matmul_is_right_everywhere(transposed_only, m, n, k, activation):
    # Every element against f64 (check_epilogue), with a NaN row of a (row 3) and an
    # infinite weight column: m, n not multiples of the 64 x 16 tile, k not of BK.
    import tegula.kernels as tk

    rng = np.random.default_rng(m * n + k)
    a, w, _ = operands(rng, m, n, k, f16, nonfinite=True)
    w[n - 2, :] = np.inf
    c = tk.matmul(torch.from_numpy(a).half(), torch.from_numpy(w).half().T, None,
                  activation)
    assert np.isnan(c[3].float().numpy()).all()
    check_epilogue(c.float().numpy(), a, w, None, activation, f16)
    (_, grid, args, roles), = transposed_only[-1]
    assert roles == ("b", "a", "c") and grid == (-(-n // 64), -(-m // 16), 1)
    assert tuple(args[2].shape) == (n, m)               # out's transpose, a view


class _Pointer:
    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


def test_a_transposed_plan_replays_by_role_not_in_call_order(monkeypatch):
    # The launch takes (b, a, c); an EntryReplay would pass the call's (a, b, c) pointers
    # in that order — a and b swapped, a wrong product and no error. The replay maps
    # each pointer to its role.
    launched = []
    monkeypatch.setattr(_api, "EntryReplay", lambda *args: pytest.fail("call-order replay"))
    monkeypatch.setattr(_api, "_replayer", lambda ck, grid, args: launched.append)
    monkeypatch.setattr(_api, "fast_empty", lambda like, shape, *dtype: lambda a: _Pointer(30))
    plan = [("ck", (4, 1, 1), ("bt", "a", "ct"), ("b", "a", "c"))]
    replay = _matmul_replay(plan, "view", 16, 256)
    replay((_Pointer(10), _Pointer(20)), [10, 20])
    assert launched == [(20, 10, 30)]


def test_a_call_order_plan_still_takes_the_entry_replay(monkeypatch):
    made = []
    monkeypatch.setattr(_api, "EntryReplay", lambda *args: made.append(args) or "entry")
    monkeypatch.setattr(_api, "fast_empty", lambda like, shape, *dtype: None)
    plan = [("ck", (4, 1, 1), ("a", "bt", "c"), ("a", "b", "c"))]
    assert _matmul_replay(plan, "view", 16, 256) == "entry" and len(made) == 1


def test_transposed_candidate_builds_for_sm90a(fresh_search):
    # The configuration the search proposes synthesizes for out's transposed view.
    from tegula.build import build
    from tegula.kernels.gemm import gemm_kernel
    from tegula.synth.facts import TensorFacts

    config, = searched_transposed(16, 4096, 4096)
    facts = {"a": TensorFacts.of((4096, 4096), (4096, 1), 0, 2),
             "b": TensorFacts.of((16, 4096), (4096, 1), 0, 2),
             "c": TensorFacts.of((4096, 16), (1, 4096), 0, 2)}
    values = {k: v for k, v in config.items() if k != "orientation"}
    build(gemm_kernel(f16), values, facts, "sm_90a")
