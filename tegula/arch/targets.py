"""Compilation targets: the numbers of a GPU that layout synthesis and the cost model use.

A `Target` is one SM architecture as tegula compiles for it (`sm_80`, `sm_89`, `sm_90a`;
`sm_90` is Hopper without wgmma/setmaxnreg, i.e. the Ampere path built for an H100),
with the resources of a representative device of that architecture. The numbers come from
NVIDIA's public documents (CUDA C++ Programming Guide, "Compute Capabilities" table;
the A100 / Ada / H100 architecture whitepapers and datasheets):

=========  ========  ===  ===================  ============  ======  ==========
target     device    SMs  smem/block (opt-in)  smem/SM       thr/SM  DRAM GB/s
=========  ========  ===  ===================  ============  ======  ==========
sm_80      A100 SXM  108  163 KiB (166912 B)   164 KiB       2048    2039
sm_89      L40S      142  99 KiB (101376 B)    100 KiB       1536    864
sm_90      H100 SXM  132  227 KiB (232448 B)   228 KiB       2048    3350
sm_90a     H100 SXM  132  227 KiB (232448 B)   228 KiB       2048    3350
h200       H200 SXM  132  227 KiB              228 KiB       2048    4800
=========  ========  ===  ===================  ============  ======  ==========

`tensor_fma_per_clk_sm` is the *dense* multiply-accumulate rate of one SM's tensor cores
for `mma.sync` per operand class, derived from the whitepaper peaks
(peak_flops / (2 * SMs * boost clock)): A100 1024 f16 FMA/clk/SM (312 TFLOPS), int8 twice
that; L40S 512 f16 (362 TFLOPS), fp8/int8 1024; H100 SXM's *wgmma* peak is 2048 f16
FMA/clk/SM (989 TFLOPS) but `mma.sync` measures at roughly half to two thirds of it
(Luo et al., "Benchmarking and Dissecting the Nvidia Hopper GPU Architecture", 2024), so
the table models mma.sync on sm_90a at 1024 (f16) / 2048 (8-bit).

`wgmma_fma_per_clk_sm` is the dense rate of Hopper's warpgroup MMA (sm_90a only): the H100
whitepaper's peaks at the 1.83 GHz tensor boost clock and 132 SMs give 989.4 TFLOPS f16 /
(2 * 132 * 1.83e9) = 2048 f16 FMA/clk/SM, 1979 TFLOPS fp8 -> 4096, 494.7 TFLOPS tf32 ->
1024 (NVIDIA H100 Tensor
Core GPU Architecture whitepaper, Table 2 "per SM" rows: 1024 f16 FMA/clk/SM on A100,
2048 on H100).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from tegula.errors import TegulaError


@dataclass(frozen=True)
class Target:
    """One GPU architecture with the resources of a representative device.

    `cc` is the compute capability as an int (80, 89, 90); `arch_suffix` is "a" for the
    architecture-specific `sm_90a` (wgmma, setmaxnreg). Memory sizes are in bytes.
    """

    name: str
    cc: int
    device: str
    sm_count: int
    smem_per_block_max: int
    smem_per_sm: int
    regs_per_thread_max: int = 255
    regs_per_sm: int = 65536
    max_threads_per_block: int = 1024
    max_threads_per_sm: int = 2048
    max_blocks_per_sm: int = 32
    warp_size: int = 32
    banks: int = 32
    bank_bytes: int = 4
    l2_bytes: int = 0
    dram_gbps: float = 0.0
    clock_ghz: float = 1.0
    arch_suffix: str = ""
    #: Dense mma.sync multiply-accumulates per clock per SM, keyed by operand class
    #: ("f16" for f16/bf16, "8bit" for s8/u8/e4m3/e5m2).
    tensor_fma_per_clk_sm: Mapping[str, int] = field(default_factory=dict)
    #: Dense wgmma multiply-accumulates per clock per SM (sm_90a), same keys; empty where
    #: the architecture has no wgmma.
    wgmma_fma_per_clk_sm: Mapping[str, int] = field(default_factory=dict)
    #: SM sub-partitions, each with its own warp scheduler (one instruction issued per
    #: clock) and tensor core: 4 on sm_70 … sm_90 (A100 whitepaper, "SM architecture";
    #: H100 whitepaper, "H100 SM architecture").
    subpartitions: int = 4
    #: Shared-memory bandwidth per SM: 32 banks x 4 bytes = 128 bytes (one wavefront) per
    #: clock (CUDA C++ Programming Guide, "Shared Memory" of compute capabilities 8.x/9.0).
    shared_bytes_per_clk: int = 128
    #: L2 -> SM bandwidth of the whole GPU in bytes per SM clock (0: not modelled). Every
    #: global byte a block loads passes through it, re-reads that hit L2 included.
    l2_bytes_per_clk: int = 0

    @property
    def sm(self) -> str:
        """The `sm_XX[a]` architecture name the compilers take."""
        return f"sm_{self.cc}{self.arch_suffix}"

    @property
    def gencode(self) -> str:
        """The nvcc `-gencode` flag for this target (explicit form, as docs/design.md asks)."""
        arch = f"{self.cc}{self.arch_suffix}"
        return f"-gencode=arch=compute_{arch},code=sm_{arch}"

    @property
    def warps_per_sm_max(self) -> int:
        return self.max_threads_per_sm // self.warp_size

    def tensor_rate(self, operand_class: str) -> int:
        """Dense FMA per clock per SM for an operand class ("f16" or "8bit"); 0 if none."""
        return int(self.tensor_fma_per_clk_sm.get(operand_class, 0))

    def wgmma_rate(self, operand_class: str) -> int:
        """Dense wgmma FMA per clock per SM for an operand class; 0 without wgmma."""
        return int(self.wgmma_fma_per_clk_sm.get(operand_class, 0))

    def __str__(self) -> str:
        return f"{self.name} ({self.device}, cc {self.cc}{self.arch_suffix}, {self.sm_count} SMs)"


#: H100 SXM L2 -> SM bandwidth, ~8 TB/s at 1.83 GHz: what the fastest L2-bound GEMM tile
#: configurations reached on an H100 80GB HBM3 (benchmarks/cost_model_check.py,
#: 2026-11-24: 7.3-7.8 TB/s of operand loads summed over all blocks).
H100_L2_BYTES_PER_CLK = 4400


def _rates(**kw: int) -> Mapping[str, int]:
    # Read-only so a frozen Target stays immutable all the way down.
    return MappingProxyType({k.replace("bit8", "8bit"): v for k, v in kw.items()})


SM80 = Target(
    name="sm_80", cc=80, device="A100-SXM4-80GB", sm_count=108,
    smem_per_block_max=166912, smem_per_sm=167936,
    l2_bytes=40 * 1024 * 1024, dram_gbps=2039.0, clock_ghz=1.41,
    l2_bytes_per_clk=5120,  # A100 whitepaper: L2 read bandwidth 5120 bytes/clk
    tensor_fma_per_clk_sm=_rates(f16=1024, bit8=2048),
)
SM89 = Target(
    name="sm_89", cc=89, device="L40S", sm_count=142,
    smem_per_block_max=101376, smem_per_sm=102400, max_threads_per_sm=1536,
    max_blocks_per_sm=24, l2_bytes=96 * 1024 * 1024, dram_gbps=864.0, clock_ghz=2.52,
    tensor_fma_per_clk_sm=_rates(f16=512, bit8=1024),
)
SM90A = Target(
    name="sm_90a", cc=90, device="H100-SXM5-80GB", sm_count=132,
    smem_per_block_max=232448, smem_per_sm=233472,
    l2_bytes=50 * 1024 * 1024, dram_gbps=3350.0, clock_ghz=1.83,
    l2_bytes_per_clk=H100_L2_BYTES_PER_CLK, arch_suffix="a",
    tensor_fma_per_clk_sm=_rates(f16=1024, bit8=2048),
    wgmma_fma_per_clk_sm=_rates(f16=2048, bit8=4096, tf32=1024),
)
# Hopper without the architecture-specific features (no wgmma, no setmaxnreg; TMA and
# mbarriers exist at cc 9.0): the Ampere path (mma.sync, cp.async, ldmatrix) compiled for
# an H100. It is how that path runs and is benchmarked on Hopper hardware, where sm_80
# cubins do not load.
SM90 = Target(
    name="sm_90", cc=90, device="H100-SXM5-80GB", sm_count=132,
    smem_per_block_max=232448, smem_per_sm=233472,
    l2_bytes=50 * 1024 * 1024, dram_gbps=3350.0, clock_ghz=1.83,
    l2_bytes_per_clk=H100_L2_BYTES_PER_CLK,
    tensor_fma_per_clk_sm=_rates(f16=1024, bit8=2048),
)
H200 = Target(
    name="h200", cc=90, device="H200-SXM-141GB", sm_count=132,
    smem_per_block_max=232448, smem_per_sm=233472,
    l2_bytes=50 * 1024 * 1024, dram_gbps=4800.0, clock_ghz=1.83,
    l2_bytes_per_clk=H100_L2_BYTES_PER_CLK, arch_suffix="a",
    tensor_fma_per_clk_sm=_rates(f16=1024, bit8=2048),
    wgmma_fma_per_clk_sm=_rates(f16=2048, bit8=4096, tf32=1024),
)

TARGETS: Mapping[str, Target] = MappingProxyType(
    {t.name: t for t in (SM80, SM89, SM90, SM90A, H200)})

# Device names and compute-capability spellings people type.
_ALIASES = {
    "a100": "sm_80", "sm80": "sm_80", "80": "sm_80", "ampere": "sm_80",
    "l40s": "sm_89", "sm89": "sm_89", "89": "sm_89", "ada": "sm_89", "4090": "sm_89",
    "h100": "sm_90a", "sm90": "sm_90", "sm90a": "sm_90a", "90": "sm_90a",
    "90a": "sm_90a", "hopper": "sm_90a", "h800": "sm_90a",
}


def get_target(name: str | Target) -> Target:
    """The target called `name` ("sm_80", "sm_89", "sm_90", "sm_90a", "h200", or a device alias
    such as "a100"/"h100"); a `Target` passes through."""
    if isinstance(name, Target):
        return name
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in TARGETS:
        raise TegulaError(f"unknown target {name!r}; tegula knows {', '.join(TARGETS)} "
                          f"(aliases: {', '.join(sorted(_ALIASES))})")
    return TARGETS[key]


def target_for_cc(major: int, minor: int) -> Target:
    """The closest known target for a device's compute capability (e.g. from the driver):
    the newest target whose cc does not exceed the device's."""
    cc = major * 10 + minor
    usable = [t for t in (SM80, SM89, SM90A) if t.cc <= cc]
    if not usable:
        raise TegulaError(f"compute capability {major}.{minor} is older than sm_80, "
                          "the oldest target tegula compiles for")
    return usable[-1]
