"""A `tg.cluster` that multicasts nothing is said, not silently dropped (synth/multicast.py).

Session 8: multicast was honoured only in warp-specialized TMA pipelines; a kernel with
`warp_specialize=False`, cp.async copies, the sm_90 target or no pipeline at all launched
in clusters with nothing shared, and nothing told its author. Each such build now warns
(`tg.ClusterWarning`, at the `tg.cluster` line) and explain says why.
"""
from __future__ import annotations

import importlib.util
import inspect
import warnings
from pathlib import Path

import numpy as np
import pytest

import tegula as tg
from tegula import f32
from tegula.build import build

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(BM=64, BN=64, BK=32, GROUP=2, consumers="cooperative", STAGES=3, CLUSTER=2)


def _persistent_gemm():
    spec = importlib.util.spec_from_file_location("persistent_gemm_multicast_warning",
                                                  ROOT / "examples" / "persistent_gemm.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.persistent_gemm


def test_a_multicasting_cluster_does_not_warn():
    with warnings.catch_warnings():
        warnings.simplefilter("error", tg.ClusterWarning)
        result = build(_persistent_gemm(), SMALL, target="sm_90a").synthesis
    assert result.cluster_unused == ""


@pytest.mark.parametrize("options,target,reason", [
    ({"warp_specialize": False}, "sm_90a",
     r"the pipeline at line \d+ is not warp-specialized \(warp_specialize=False\)"),
    ({"load_path": "cp.async"}, "sm_90a", r"no copy runs on TMA: the build option "
                                          r"load_path='cp.async'"),
    ({}, "sm_90", r"the target sm_90 has no TMA pipelines into wgmma operands"),
])
def test_a_cluster_that_multicasts_nothing_warns_at_its_line(options, target, reason):
    kernel = _persistent_gemm()  # a fresh kernel: builds are cached, each warns once
    with pytest.warns(tg.ClusterWarning, match=r"kernel persistent_gemm: tg.cluster\(2, 1\) "
                      r"multicasts nothing for " + target + ": " + reason) as caught:
        result = build(kernel, dict(SMALL, **options), target=target).synthesis
    assert result.cluster_unused
    warning = [w for w in caught if w.category is tg.ClusterWarning][0]
    line = Path(warning.filename).read_text().splitlines()[warning.lineno - 1]
    assert "tg.cluster(" in line, (warning.filename, warning.lineno)
    text = tg.explain(kernel, target=target, **dict(SMALL, **options))
    assert "clusters of 2x1 blocks multicast nothing (ClusterWarning)" in text


def _clustered_scale():
    @tg.kernel(threads=64)
    def clustered_scale(x: tg.Tensor[f32], y: tg.Tensor[f32]):
        tg.cluster(2)
        m = tg.block_id(0)
        tg.copy(tg.load(x.tile((16, 32), (m, 0))) * 3.0, y.tile((16, 32), (m, 0)))
    return clustered_scale


def test_a_cluster_without_any_pipeline_warns_and_still_computes():
    kernel = _clustered_scale()
    x = np.random.default_rng(4).standard_normal((50, 32)).astype(np.float32)
    y = np.full_like(x, np.nan)
    with pytest.warns(tg.ClusterWarning, match=r"no tg.pipeline copies global tiles into "
                                               r"wgmma operand buffers") as caught:
        tg.emulate(kernel, (4,), x, y)
    assert np.array_equal(y, x * np.float32(3.0))
    warning = [w for w in caught if w.category is tg.ClusterWarning][0]
    assert warning.filename == __file__
    assert "tg.cluster(2)" in inspect.getsource(_clustered_scale).splitlines()[
        warning.lineno - inspect.getsourcelines(_clustered_scale)[1]]
