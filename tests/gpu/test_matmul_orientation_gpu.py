"""matmul's transposed orientation on the GPU (the search's decision for decode buckets,
tests/kernels/test_matmul_orientation.py): the launch computing cᵀ = b·aᵀ into out's
transpose against torch in f64, every element, at shapes that do not divide the 64 x 16
tile; then its replay with new values of a (the pointers mapped by role: a replay passing
them in call order would swap a and b, and a stale output would not match the new a)."""
import pytest

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("m, n, k, activation", [(16, 4096, 4096, None), (5, 1000, 328, "silu"),
                                                 (13, 136, 200, "relu")])
def test_transposed_launch_matches_torch(m, n, k, activation, monkeypatch):
    import torch

    import tegula.kernels as tk
    from tegula.kernels import api as _api
    from tegula.runtime.autotune import Config
    if torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs a Hopper GPU for sm_90a")
    config = (Config.of(dict(kernel="shared", BM=64, BN=16, BK=64, STAGES=16,
                             orientation="Cᵀ", B="view")),)
    monkeypatch.setattr(_api, "_configs", lambda family, *bucket: config)
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    w = torch.randn(n, k, device="cuda", generator=g).half()
    for call in range(2):  # the first call launches, the second (new a) replays
        a = torch.randn(m, k, device="cuda", generator=g).half()
        ref = a.double() @ w.double().T
        ref = {None: ref, "relu": ref.clamp(min=0), "silu": ref * torch.sigmoid(ref)}[activation]
        got = tk.matmul(a, w.T, None, activation)
        torch.cuda.synchronize()
        assert not torch.isnan(got).any()
        assert ((got.double() - ref).abs() <= 2e-3 * ref.abs() + 2e-3 * k ** 0.5).all()
