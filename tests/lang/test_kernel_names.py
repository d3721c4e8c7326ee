"""A kernel's CUDA function carries the kernel's name (`extern "C"`): a name CUDA already
declares with C linkage (`exp`, `sqrt`, …) or a C++ keyword does not compile, so it is
refused at the definition, where NVRTC failed only when the kernel first met a GPU."""
import pytest

import tegula as tg
from tegula import f32
from tegula.errors import TraceError


@pytest.mark.parametrize("name", ["exp", "sqrt", "tanh", "printf", "max", "float"])
def test_a_kernel_named_like_a_cuda_function_is_refused_at_its_definition(name):
    source = (f"def {name}(x: tg.Tensor[f32], y: tg.Tensor[f32]):\n"
              f"    tg.copy(tg.load(x.tile((32,), (0,))), y.tile((32,), (0,)))\n")
    scope = dict(tg=tg, f32=f32)
    exec(compile(source, "user_kernels.py", "exec"), scope)  # noqa: S102 (test source)
    with pytest.raises(TraceError, match=f"kernel {name}: CUDA already has") as err:
        tg.kernel(threads=32)(scope[name])
    assert "user_kernels.py:1" in str(err.value) and f"{name}_kernel" in str(err.value)


def test_a_name_that_only_contains_a_cuda_function_is_fine():
    for name in ("exp_kernel", "softmax", "logits"):
        source = (f"def {name}(x: tg.Tensor[f32], y: tg.Tensor[f32]):\n"
                  f"    tg.copy(tg.load(x.tile((32,), (0,))), y.tile((32,), (0,)))\n")
        scope = dict(tg=tg, f32=f32)
        exec(compile(source, "user_kernels.py", "exec"), scope)  # noqa: S102
        assert tg.kernel(threads=32)(scope[name]).name == name
