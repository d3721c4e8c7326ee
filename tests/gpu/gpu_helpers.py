"""Shared by the GPU tests: moving exactly-typed data between numpy and torch by bit
patterns, poisoning outputs, launching thread-IR and raw kernels.

Arrays on the host are in the emulator's storage types (`tegula.emulate.storage_dtype`:
bf16 and f8 held in float32, already rounded to the type), so the same array feeds the
emulator and, through its bit patterns, the GPU; results come back as bit patterns, which
compare exactly.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np

from tegula.dtypes import DType
from tegula.emulate.values import bits_dtype, from_bits, to_bits

#: tegula dtype name -> torch dtype name (packed 4-bit types travel as bytes).
TORCH_NAMES = {"f32": "float32", "f16": "float16", "bf16": "bfloat16",
               "f8e4m3": "float8_e4m3fn", "f8e5m2": "float8_e5m2", "i32": "int32",
               "i8": "int8", "u8": "uint8", "i4": "uint8", "u4": "uint8"}
_SIGNED = {1: np.int8, 2: np.int16, 4: np.int32}


def torch_dtype(dtype: DType):
    import torch
    return getattr(torch, TORCH_NAMES[dtype.name])


def to_device(values: np.ndarray, dtype: DType):
    """A CUDA tensor of `dtype` holding exactly `values` (storage values; packed 4-bit
    arrays are their bytes)."""
    import torch
    bits = values if dtype.is_packed else to_bits(np.asarray(values), dtype)
    bits = np.ascontiguousarray(bits)
    signed = bits.view(_SIGNED[bits.dtype.itemsize])
    t = torch.from_numpy(signed.copy())
    t = t.view(torch_dtype(dtype))
    return t.cuda()


def bits_of(t, dtype: DType) -> np.ndarray:
    """The bit patterns of a CUDA tensor of `dtype` (unsigned numpy array)."""
    import torch
    width = max(1, dtype.bits // 8)
    signed = {1: torch.int8, 2: torch.int16, 4: torch.int32}[width]
    host = t.detach().contiguous().view(signed).cpu().numpy()
    return host.view(bits_dtype(dtype) if not dtype.is_packed else np.uint8)


def values_of(t, dtype: DType) -> np.ndarray:
    """A CUDA tensor's elements as storage values."""
    return from_bits(bits_of(t, dtype), dtype)


def poison(t):
    """Fill a tensor so an unwritten element cannot pass: NaN for floats, 0xA5 bytes else."""
    import torch
    if t.dtype.is_floating_point and t.element_size() > 1:
        return t.fill_(float("nan"))
    # f8 (NaN as 0x7f/0xff is a value the kernels never produce from finite data) and ints
    raw = t.view(torch.uint8) if t.element_size() == 1 else t.view(torch.int32)
    raw.fill_(0x7F if t.dtype.is_floating_point else (0xA5 if t.element_size() == 1
                                                        else 0x5A5A5A5A))
    return t


def storage_bits(values: np.ndarray, dtype: DType) -> np.ndarray:
    """Bit patterns of host storage values (packed arrays are already bytes)."""
    return values if dtype.is_packed else to_bits(np.asarray(values), dtype)


#: How many ulps (of the magnitude the caller names) one contracted multiply-add may move
#: an f32 result away from the emulator's: the emulator rounds the product (1/2 ulp), the
#: fused and unfused sums then round apart (1 ulp), and one more rounding of the two
#: diverged values (1 ulp) — 2.5, so 3. Callers with longer chains after the fused
#: operation add one per further add/sub.
FMA_ULPS = 3


def _isnan_bits(bits: np.ndarray, dtype: DType) -> np.ndarray:
    """Which storage bit patterns of a float type are NaN (exponent all ones, mantissa not
    zero; e4m3 has only S.1111.111)."""
    bits = bits.astype(np.uint64)
    m, e = dtype.mantissa_bits, dtype.exponent_bits
    exponent = (bits >> m) & ((1 << e) - 1)
    mantissa = bits & ((1 << m) - 1)
    if dtype.name == "f8e4m3":
        return (exponent == (1 << e) - 1) & (mantissa == (1 << m) - 1)
    return (exponent == (1 << e) - 1) & (mantissa != 0)


def assert_matches_emulator(emulated: np.ndarray, gpu, dtype: DType, fma_scale=None,
                            ulps: float = FMA_ULPS, what: str = "output") -> None:
    """The one comparison of a GPU result with the emulator's for the same inputs.

    Bit-exact, except where the caller passes `fma_scale`: the CUDA may contract an f32
    `a * b + c` into one FMA (NVRTC's default `--fmad=true`, as in nvcc and Triton; see
    docs/compiler.md), which rounds once where the emulator rounds the product and the sum
    separately. Then finite f32 elements may differ by `ulps` ulps of `fma_scale` (per
    element or one number: a bound on the magnitudes of the products and partial sums —
    not of the result, which cancellation can make arbitrarily small); NaN and ±inf must
    still be where the emulator has them. Only f32 contracts: 16- and 8-bit floats are
    rounded through `cvt` after every operation, so they stay bit-exact, like integers.
    """
    want, got = storage_bits(emulated, dtype), bits_of(gpu, dtype)
    if fma_scale is None or dtype.name != "f32":
        bad = want != got
        if dtype.is_float:  # NaN payloads are unspecified (the GPU's is 0x7fffffff, numpy's
            # 0x7fc00000): any NaN matches any NaN, nothing else does.
            bad &= ~(_isnan_bits(want, dtype) & _isnan_bits(got, dtype))
        assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} elements differ "
                               f"from the emulator, first at {np.argwhere(bad)[0].tolist()}: "
                               f"GPU bits {got[bad][0]:#x}, emulator {want[bad][0]:#x}")
        return
    e = want.view(np.float32).astype(np.float64)
    g = got.view(np.float32).astype(np.float64)
    finite = np.isfinite(e) & np.isfinite(g)
    scale = np.broadcast_to(np.abs(np.asarray(fma_scale, dtype=np.float32)), e.shape)
    allowed = ulps * np.spacing(scale).astype(np.float64)
    bad = np.where(finite, np.abs(g - e) > allowed, want != got)
    bad &= ~(np.isnan(e) & np.isnan(g))  # any NaN payload
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.size} f32 elements differ from "
                           f"the emulator by more than {ulps} ulps of their FMA scale, first at "
                           f"{np.argwhere(bad)[0].tolist()}: GPU {g[bad][0]!r}, emulator "
                           f"{e[bad][0]!r}, allowed {allowed[bad][0]!r}")


def launch(kernel, grid, *tensors) -> None:
    """Compile a ThreadKernel (disk-cached) and launch it, then synchronize and check."""
    import torch

    from tegula.runtime import compile_kernel
    compile_kernel(kernel)[grid](*tensors)
    torch.cuda.synchronize()


def launch_raw(raw, grid, *tensors) -> None:
    """Compile a `hwcheck.RawKernel` for the current GPU and launch it."""
    import torch

    from tegula.runtime import compile_cuda, default_target
    from tegula.runtime.launcher import CompiledKernel
    target = default_target()
    cubin = compile_cuda(raw.source, raw.name, target)
    CompiledKernel(raw.signature, cubin, raw.source, target).launch(grid, tensors)
    torch.cuda.synchronize()


def device_cc() -> int:
    """Compute capability of the current GPU as an int (90 for sm_90)."""
    import torch
    major, minor = torch.cuda.get_device_capability()
    return 10 * major + minor


def launch_fuzz_program(program, inputs: dict, target: str | None = None) -> dict:
    """Compile a fuzzer program from its printed source, launch it on CUDA tensors (inputs
    as the emulator saw them, outputs poisoned) for `target` (None: the device's), and
    return every output's storage values by name."""
    import torch

    from tegula.dtypes import dtype_from_name
    from tegula.fuzz import numerics as nx
    from tegula.fuzz.runner import tensor_order
    from tegula.fuzz.source import forget_kernel, kernel_source, make_kernel

    kernel, filename = make_kernel(kernel_source(program))
    try:
        args, outputs = [], {}
        for t in tensor_order(program):
            dtype = dtype_from_name(t.dtype)
            if t.kind == "out":
                tensor = poison(torch.empty(program.extents(t), dtype=torch_dtype(dtype),
                                            device="cuda"))
                outputs[t.name] = tensor
            else:
                tensor = to_device(nx.storage(inputs[t.name], t.dtype), dtype)
            args.append(tensor)
        from tegula.fuzz.runner import build_options
        from tegula.runtime.launcher import default_target
        # the build options the emulator ran it with (warp_specialize=, consumers=)
        options = build_options(program, target or default_target())
        kernel[program.launch_grid](*args, target=target, **options)
        torch.cuda.synchronize()
        return {name: values_of(t, dtype_from_name(program.tensor(name).dtype))
                for name, t in outputs.items()}
    finally:
        forget_kernel(filename)


def assert_fuzz_program_right_on_gpu(program, inputs: dict, emulated: dict, where: str,
                                     target: str | None = None) -> None:
    """Launch a fuzzer program the emulator ran (its outputs `emulated`) on the GPU for
    `target` (None: the device's), outputs poisoned: the GPU's outputs must pass the
    reference in its loose model, and an integer-only program's must equal the
    emulator's bit for bit. An AssertionError starting with `where` otherwise."""
    import numpy as np

    from tegula.fuzz import numerics as nx
    from tegula.fuzz.program import check
    from tegula.fuzz.runner import check_outputs

    gpu = launch_fuzz_program(program, inputs, target)
    if all(not nx.is_float(t.dtype) for t in check(program).values()):
        for name in emulated:
            assert np.array_equal(gpu[name], emulated[name]), where
    verdict = check_outputs(program, inputs, gpu, loose=True)
    assert verdict.status == "pass", where + verdict.detail


def judge_fuzz_program_on_gpu(program, data: int, target: str, where: str = "",
                              **emulate_options) -> frozenset | None:
    """The one check of a fuzzer program on the GPU: emulate it for `target` on the inputs
    of data seed `data` (strict against the reference; `emulate_options` such as
    `role_order=`), then launch and judge it (`assert_fuzz_program_right_on_gpu`). None
    where the target refuses it (a clean refusal is asserted), else the paths the
    emulated build took. `where` (e.g. the reproducing command) starts every message."""
    from tegula.fuzz.runner import check_outputs, emulate_for, program_inputs
    from tegula.fuzz.source import kernel_source

    inputs = program_inputs(program, data)
    emulated, verdict, paths = emulate_for(program, inputs, target, **emulate_options)
    where = f"{where} ({target})\n{kernel_source(program)}"
    if verdict is not None:
        assert verdict.status == "rejected", where + verdict.detail
        return None
    assert check_outputs(program, inputs, emulated).status == "pass", where
    assert_fuzz_program_right_on_gpu(program, inputs, emulated, where, target)
    return paths


def run_child_cases(script: str, root, time_limit_s: float) -> tuple[dict, bool, str]:
    """Run `script --child` in a fresh process under a time limit; the child prints one JSON
    line `[case id, outcome]` per case as it goes. A hang (a pipeline protocol mistake)
    then fails the cases it did not reach instead of stalling the run. Returns (outcome by
    case id, whether it hung, the end of its stderr)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
    try:
        proc = subprocess.run([sys.executable, script, "--child"], capture_output=True,
                              text=True, env=env, timeout=time_limit_s, check=False)
        out, err, hung = proc.stdout, proc.stderr, False
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err, hung = "", True
    results = dict(json.loads(line) for line in out.splitlines() if line.startswith("["))
    return results, hung, err[-3000:]


def print_case_outcomes(cases, run_one, case_id) -> None:
    """The child's side of `run_child_cases`: run each case and print `[case id, outcome]`
    as one JSON line as it goes; an exception is that case's outcome, and the next cases
    still run."""
    for case in cases:
        try:
            outcome = run_one(case)
        except Exception as e:
            outcome = f"{type(e).__name__}: {e}"
        print(json.dumps([case_id(case), outcome]), flush=True)


def sm90_child_outcomes(script: str, root, time_limit_s: float) -> tuple[dict, bool, str]:
    """`run_child_cases` for a Hopper-only test file (skipped without an sm_90 GPU)."""
    import pytest
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        pytest.skip("needs an sm_90 GPU")
    return run_child_cases(script, root, time_limit_s)


def check_child_case(outcomes: tuple, name: str, names: list, time_limit_s: float) -> None:
    """Fail unless case `name` ran in the child (`run_child_cases`) and came out "ok"."""
    import pytest
    results, hung, err = outcomes
    if name not in results:
        done = len(results)
        first_missing = names[done] if done < len(names) else "?"
        pytest.fail(f"the child hung (over {time_limit_s} s) at case {first_missing}" if hung
                    else f"the child stopped before this case: {err}")
    assert results[name] == "ok", results[name]


def check_f16_gemm(torch, m: int, n: int, k: int, launch, device: str = "cuda") -> str:
    """'ok' or what went wrong: `launch(a, b, c)` must compute c = a @ b.T for random f16
    a (m, k) and b (n, k) into a NaN-poisoned c (m, n), every element written and within
    f16 rounding plus an f32 accumulation bound of a float64 reference."""
    gen = torch.Generator(device=device).manual_seed(m * 7919 + n * 31 + k)
    a = torch.randn(m, k, device=device, generator=gen).half()
    b = torch.randn(n, k, device=device, generator=gen).half()
    c = torch.full((m, n), float("nan"), device=device, dtype=torch.float16)
    launch(a, b, c)
    if device == "cuda":
        torch.cuda.synchronize()
    ref = a.double() @ b.double().T
    bound = 2.0 ** -10 * ref.abs() + k * 2.0 ** -23 * (a.double().abs() @ b.double().abs().T)
    if torch.isnan(c).any():
        return f"{int(torch.isnan(c).sum())} unwritten (poisoned) elements"
    err = (c.double() - ref).abs()
    if not bool((err <= bound + 2.0 ** -24).all()):
        return f"max error {err.max().item():.3g}"
    return "ok"
