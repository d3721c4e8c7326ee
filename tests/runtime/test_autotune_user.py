"""`@tg.autotune` on user kernels (`tegula/runtime/tuned_kernel.py`), on the CPU: the GPU
launch and the timer are replaced (`launch=`, `timer=`), everything else is real —
candidates, limits checked by building each one, the cost-model ranking, the library's
cache (memory and disk) and its key buckets."""
from __future__ import annotations

import numpy as np
import pytest

import tegula as tg
from tegula import f16, f32
from tegula.errors import TegulaError
from tegula.runtime.autotune import AutotuneError


@tg.kernel(threads=128)
def scale(x: tg.Tensor[f16], y: tg.Tensor[f16], BM: tg.constexpr = 32, BN: tg.constexpr = 64):
    m, n = tg.block_id(0), tg.block_id(1)
    t = tg.load(x.tile((BM, BN), (m, n)))
    tg.copy((t.to(f32) * 2.0).to(f16), y.tile((BM, BN), (m, n)))


@tg.kernel(threads=128)
def open_scale(x: tg.Tensor[f16], y: tg.Tensor[f16],
               BM: tg.constexpr(choices=(16, 32, 64, 128)), BN: tg.constexpr = 64):
    m, n = tg.block_id(0), tg.block_id(1)
    t = tg.load(x.tile((BM, BN), (m, n)))
    tg.copy((t.to(f32) * 2.0).to(f16), y.tile((BM, BN), (m, n)))


class Fake:
    """A launcher that records each launch's constexprs, and a timer that returns a
    made-up time per config (seconds = table[BM] or 1.0) for the config launched last."""

    def __init__(self, table=None, fail=()):
        self.table, self.fail = dict(table or {}), set(fail)
        self.launches: list[dict] = []
        self.timed: list[dict] = []

    def launch(self, kernel, grid, args, kwargs):
        self.launches.append(dict(kwargs))
        if kwargs.get("BM") in self.fail:
            raise RuntimeError(f"launch failed for BM={kwargs['BM']}")
        return "ran"

    def timer(self, fn):
        fn()
        self.timed.append(self.launches[-1])
        return self.table.get(self.launches[-1].get("BM"), 1.0)


def arrays(m=500, n=300):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((m, n)).astype(np.float16)
    return x, np.empty_like(x)


def tuned(fake, tmp_path, **options):
    return tg.autotune(timer=fake.timer, launch=fake.launch, cache_dir=str(tmp_path),
                       progress=options.pop("progress", False), **options)


def grid(meta):
    return (-(-500 // meta["BM"]), -(-300 // meta["BN"]))


def test_picks_the_fastest_and_launches_it(tmp_path):
    fake = Fake({16: 3e-6, 32: 1e-6, 64: 2e-6})
    k = tuned(fake, tmp_path, configs=[{"BM": 16}, {"BM": 32}, {"BM": 64}])(scale)
    assert k[grid](*arrays()) == "ran"
    assert [t["BM"] for t in fake.timed] == [16, 32, 64]   # each measured once
    assert fake.launches[-1]["BM"] == 32                    # then the winner runs
    assert "BM=32 (measured)" in k.report()


def test_cache_hit_measures_nothing_and_buckets_shapes(tmp_path, monkeypatch):
    import importlib

    recommend_module = importlib.import_module("tegula.recommend")  # tg.recommend: the function
    fake = Fake({16: 3e-6, 32: 1e-6})
    k = tuned(fake, tmp_path, configs=[{"BM": 16}, {"BM": 32}])(scale)
    k[grid](*arrays(500, 300))
    timed = len(fake.timed)
    score = recommend_module.score

    def no_scoring(*args, **kwargs):
        raise AssertionError("a cached choice must not build or score candidates")

    monkeypatch.setattr(recommend_module, "score", no_scoring)
    k[grid](*arrays(500, 300))
    k[grid](*arrays(400, 260))        # same power-of-two bucket (512, 512)
    assert len(fake.timed) == timed and fake.launches[-1]["BM"] == 32
    # A new process (a fresh TunedKernel on the same cache directory) reads the winner.
    again = Fake({16: 1e-9, 32: 1.0})
    k2 = tuned(again, tmp_path, configs=[{"BM": 16}, {"BM": 32}])(scale)
    k2[grid](*arrays(500, 300))
    assert again.timed == [] and again.launches[-1]["BM"] == 32
    monkeypatch.setattr(recommend_module, "score", score)
    k[grid](*arrays(600, 300))        # bucket (1024, 512): tuned again
    assert len(fake.timed) == 2 * timed


def test_failing_and_oversized_configs_are_skipped_with_reasons(tmp_path):
    fake = Fake({16: 1e-6, 32: 2e-6}, fail={16})
    configs = [{"BM": 16}, {"BM": 32}, {"BM": 512, "BN": 512}]   # 512x512: too many registers
    k = tuned(fake, tmp_path, configs=configs)(scale)
    k[grid](*arrays())
    assert fake.launches[-1]["BM"] == 32
    assert 512 not in [launch["BM"] for launch in fake.launches]   # never launched
    report = k.report()
    assert "BM=16: skipped: RuntimeError: launch failed for BM=16" in report
    assert "BM=512,BN=512: skipped: ~" in report and "registers per thread" in report


def test_every_config_failing_is_an_error_naming_each(tmp_path):
    fake = Fake(fail={16, 32})
    k = tuned(fake, tmp_path, configs=[{"BM": 16}, {"BM": 32}])(scale)
    with pytest.raises(AutotuneError, match=r"BM=16.*launch failed.*BM=32.*launch failed"):
        k[grid](*arrays())


def test_space_is_ranked_by_the_cost_model_and_only_top_k_measured(tmp_path):
    fake = Fake()
    k = tuned(fake, tmp_path, space={"BM": [128, 16, 64, 32], "BN": [64]}, top_k=2)(scale)
    k[grid](*arrays())
    assert len(fake.timed) == 2
    predicted = tg.recommend(scale, shapes={"x": (500, 300), "y": (500, 300)}, BN=64,
                             space={"BM": [16, 32, 64, 128]})
    assert [t["BM"] for t in fake.timed] == [c.config["BM"] for c in predicted.top[:2]]


def test_no_configs_measures_the_recommendation_top_k(tmp_path):
    fake = Fake()
    k = tuned(fake, tmp_path, top_k=2)(open_scale)
    k[grid](*arrays())
    predicted = tg.recommend(open_scale, shapes={"x": (500, 300), "y": (500, 300)}, top_k=2)
    assert [t["BM"] for t in fake.timed] == [c.config["BM"] for c in predicted.top]


def test_choice_is_deterministic(tmp_path):
    picks = []
    for run in range(2):
        fake = Fake({16: 1e-6, 32: 1e-6, 64: 1e-6})   # a three-way tie
        k = tuned(fake, tmp_path / str(run), configs=[{"BM": 64}, {"BM": 16}, {"BM": 32}])(scale)
        k[grid](*arrays())
        picks.append(fake.launches[-1]["BM"])
    assert picks[0] == picks[1]


def test_progress_bar_on_stderr(tmp_path, capsys):
    fake = Fake({16: 2e-6, 32: 1e-6})
    k = tuned(fake, tmp_path, configs=[{"BM": 16}, {"BM": 32}], progress=True)(scale)
    k[grid](*arrays())
    err = capsys.readouterr().err
    assert "measuring BM=16" in err and "2/2 done; best 1.0 us (BM=32)" in err
    assert err.endswith("\n")


def test_key_names_scalars_tensors_and_dims(tmp_path):
    k = tuned(Fake(), tmp_path, configs=[{"BM": 16}], key=["x.shape[1]", "y"])(scale)
    x, y = arrays(500, 300)
    assert k.key_dims((x, y)) == (300, 500, 300)
    with pytest.raises(TegulaError, match="autotune key 'z' names no argument"):
        tuned(Fake(), tmp_path, configs=[{"BM": 16}], key=["z"])(scale).key_dims((x, y))


def test_bad_decorations_are_refused(tmp_path):
    with pytest.raises(TegulaError, match="BX is not a constexpr of the kernel"):
        tuned(Fake(), tmp_path, configs=[{"BX": 1}])(scale)
    with pytest.raises(TegulaError, match="configs= or space=, not both"):
        tg.autotune(configs=[{"BM": 16}], space={"BM": [16]})
    with pytest.raises(TegulaError, match="goes above @tg.kernel"):
        tg.autotune(configs=[{"BM": 16}])(lambda x: x)
    k = tuned(Fake(), tmp_path, configs=[{"BM": 16}])(scale)
    with pytest.raises(TegulaError, match="the call fixes BM, which the autotune configs"):
        k[grid](*arrays(), BM=32)


@pytest.mark.gpu
def test_autotuned_kernel_on_the_gpu(tmp_path):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    k = tg.autotune(space={"BM": [16, 32, 64]}, cache_dir=str(tmp_path))(scale)
    x = torch.randn(500, 300, device="cuda", dtype=torch.float16)
    y = torch.full_like(x, float("nan"))
    k[grid](x, y)
    torch.cuda.synchronize()
    assert torch.equal(y, (x.float() * 2).half())
    record = k.tuner.last
    assert record.source == "measured" and sum(t.seconds is not None for t in record.trials) == 3
