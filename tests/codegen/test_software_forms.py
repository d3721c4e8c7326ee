"""The emitter's software forms of catalogue entries (`codegen.ptx.SOFTWARE_FORMS`: what
targets before an entry's min_cc run — f8 conversions before sm_89, 16-bit arithmetic and
the bf16 atomic add before sm_90) compute what the entry does (`convert` / `execute`,
which the emulator calls).

Every helper with a software branch is listed and guarded by its entry's min_cc; the f8
conversion forms and the bf16 compare-and-swap add are plain C, so their code — the very
text the kernels include — is compiled for the CPU with the host C++ compiler and run
against the entries: every f16 value and its f32 neighbours (every tie and near-tie of
both f8 types), random f32 bit patterns, every f8 code. (On the GPU, with the guards
forced false, tests/gpu/test_entry_semantics_gpu.py checks every form.)"""
from __future__ import annotations

import re
import shutil
import subprocess

import numpy as np
import pytest

from tegula.arch.catalogue import get_instruction
from tegula.arch.convert import rounding_to
from tegula.arch.memory import RED_ADD
from tegula.codegen import ptx
from tegula.dtypes import bf16, f8e4m3, f8e5m2
from tegula.emulate import from_bits, round_to, to_bits


def test_every_software_branch_is_a_listed_form_of_its_entry():
    branched = {name for name, (source, _) in ptx._HELPERS.items() if "#else" in source}
    assert branched == set(ptx.SOFTWARE_FORMS)
    for helper, entry_name in ptx.SOFTWARE_FORMS.items():
        entry = get_instruction(entry_name)
        source = ptx._HELPERS[helper][0]
        guard = re.search(r"__CUDA_ARCH__ >= (\d+)", source)
        assert guard and int(guard.group(1)) == 10 * entry.min_cc, helper
        assert f'{entry.ptx} ' in source, (helper, entry.ptx)  # the entry above the guard


_PRELUDE = """\
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>
#define __device__
#define __forceinline__ inline
static inline unsigned __float_as_uint(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
static inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, 4); return f; }
"""


def run_host(code: str, stdin: bytes, tmp_path) -> bytes:
    cxx = shutil.which("g++") or shutil.which("clang++")
    if cxx is None:
        pytest.skip("no host C++ compiler")
    src, exe = tmp_path / "forms.cpp", tmp_path / "forms"
    src.write_text(code)
    # -ffp-contract=off and no fast-math: the C's float arithmetic as the GPU's IEEE one
    subprocess.run([cxx, "-O1", "-ffp-contract=off", "-o", str(exe), str(src)], check=True,
                   capture_output=True)
    return subprocess.run([str(exe)], input=stdin, check=True, capture_output=True).stdout


def f8_inputs(rng) -> np.ndarray:
    """Every f16 value as f32 and its two f32 neighbours, random f32 bit patterns, edges."""
    halves = np.arange(65536, dtype=np.uint16).view(np.float16).astype(np.float32)
    halves = halves[np.isfinite(halves)]
    near = [halves, np.nextafter(halves, np.float32(np.inf)),
            np.nextafter(halves, np.float32(-np.inf))]
    noise = rng.integers(0, 2**32, 200_000, dtype=np.uint64).astype(np.uint32).view(np.float32)
    noise = np.where(np.isnan(noise), np.float32(np.nan), noise)  # quiet NaNs only
    edges = np.float32([0.0, -0.0, np.inf, -np.inf, np.nan, 448.0, 464.0, 57344.0, 61440.0,
                        3.4e38, -3.4e38, 1e-45])
    return np.concatenate(near + [noise, edges]).astype(np.float32)


def test_f8_software_forms_are_the_entries(tmp_path):
    helpers = ["tg_fp8_sw", "tg_f32_to_e4m3", "tg_f32_to_e5m2", "tg_e4m3_to_f32",
               "tg_e5m2_to_f32"]
    code = _PRELUDE + "\n".join(ptx._HELPERS[h][0] for h in helpers) + """
int main() {
  std::vector<float> x;
  float v;
  while (std::fread(&v, 4, 1, stdin) == 1) x.push_back(v);
  for (float f : x) { unsigned char c[2] = {tg_f32_to_e4m3(f), tg_f32_to_e5m2(f)};
                      std::fwrite(c, 1, 2, stdout); }
  for (int c = 0; c < 256; ++c) { float d[2] = {tg_e4m3_to_f32((unsigned char)c),
                                               tg_e5m2_to_f32((unsigned char)c)};
                                  std::fwrite(d, 4, 2, stdout); }
}
"""
    x = f8_inputs(np.random.default_rng(0))
    out = run_host(code, x.tobytes(), tmp_path)
    codes = np.frombuffer(out[: 2 * x.size], np.uint8).reshape(-1, 2)
    decoded = np.frombuffer(out[2 * x.size:], np.float32).reshape(256, 2)
    every_code = np.arange(256, dtype=np.uint8)
    for col, dt in enumerate((f8e4m3, f8e5m2)):
        want = to_bits(rounding_to(dt).convert(x), dt)
        bad = np.flatnonzero(codes[:, col] != want)
        assert bad.size == 0, f"{dt}: {bad.size} differ, e.g. {x[bad[:4]]} -> " \
                              f"{codes[bad[:4], col]} want {want[bad[:4]]}"
        widen = get_instruction(f"cvt.rn.f16x2.{'e4m3' if dt == f8e4m3 else 'e5m2'}x2")
        values = widen.convert(from_bits(every_code, dt)).astype(np.float32)
        np.testing.assert_array_equal(decoded[:, col], values)


def test_bf16_compare_and_swap_add_is_the_entry(tmp_path):
    """The CAS form on a host word array: both halves of every word, sums that round,
    overflow, NaN. (Its f32 -> bf16 rounding is the cvt entry on the GPU; here a C RNE.)"""
    code = _PRELUDE + """
static unsigned atomicCAS(unsigned* p, unsigned expected, unsigned desired) {
  unsigned old = *p; if (old == expected) *p = desired; return old;
}
static unsigned short tg_f32_to_bf16(float f) {
  unsigned u = __float_as_uint(f);
  if (f != f) return (unsigned short)((u >> 16) | 0x40);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
""" + ptx._HELPERS["tg_bf16_to_f32"][0] + ptx._HELPERS["tg_red_add_bf16"][0] + """
int main() {
  std::vector<unsigned short> mem, add;
  unsigned short m, a;
  while (std::fread(&m, 2, 1, stdin) == 1 && std::fread(&a, 2, 1, stdin) == 1) {
    mem.push_back(m); add.push_back(a);
  }
  std::vector<unsigned> words((mem.size() + 1) / 2);
  std::memcpy(words.data(), mem.data(), mem.size() * 2);
  unsigned short* cells = reinterpret_cast<unsigned short*>(words.data());
  for (size_t i = 0; i < mem.size(); ++i) tg_red_add_bf16(cells + i, add[i]);
  std::fwrite(cells, 2, mem.size(), stdout);
}
"""
    rng = np.random.default_rng(1)
    n = 20000
    old = from_bits(rng.integers(0, 2**16, n, dtype=np.uint64).astype(np.uint16), bf16)
    v = from_bits(rng.integers(0, 2**16, n, dtype=np.uint64).astype(np.uint16), bf16)
    with np.errstate(invalid="ignore"):  # inf * 2^-8 ...
        v[:5000] = round_to(old[:5000] * np.float32(2.0 ** -8), bf16)  # ties and near-ties
    pairs = np.stack([to_bits(old, bf16), to_bits(v, bf16)], 1).astype(np.uint16)
    got = np.frombuffer(run_host(code, pairs.tobytes(), tmp_path), np.uint16)
    want = RED_ADD["bf16"].execute(old, v)
    same = (got == to_bits(want, bf16)) | (np.isnan(from_bits(got, bf16)) & np.isnan(want))
    assert same.all(), f"{(~same).sum()} differ, e.g. {old[~same][:3]} + {v[~same][:3]}"
