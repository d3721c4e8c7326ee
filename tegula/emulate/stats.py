"""What an emulated run did: instruction counts, bytes, shared-memory wavefronts.

Counts are *warp-level*: one executed statement counts once per warp with at least one
active thread (what the SM issues). Bytes are those actually moved by threads whose
predicate held. Wavefronts / ideal follow the bank model in `tegula.emulate.memory`.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class OpStats:
    """Totals for one statement kind (or one statement)."""

    count: int = 0
    bytes: int = 0
    wavefronts: int = 0
    ideal_wavefronts: int = 0

    @property
    def bank_conflicts(self) -> int:
        """Extra shared-memory wavefronts beyond the ideal."""
        return self.wavefronts - self.ideal_wavefronts

    def add(self, count: int, nbytes: int = 0, wavefronts: int = 0, ideal: int = 0) -> None:
        self.count += count
        self.bytes += nbytes
        self.wavefronts += wavefronts
        self.ideal_wavefronts += ideal


@dataclass
class EmulationReport:
    """The result of `run_thread_kernel`: per statement kind and per statement totals.

    `by_kind` maps a kind ("GlobalLoad", "SharedStore", "CpAsync", "LdMatrix", "Mma",
    "Shuffle", "Barrier", "Assign", and the asynchronous ones: "TmaLoad"/"TmaStore" with
    their box bytes, zero-filled parts included, "Wgmma" with the shared bytes its
    descriptors read, "MBarrierWait", …) to its `OpStats`; `by_stmt` maps a statement's
    position in a depth-first walk of the kernel body to (description, `OpStats`).
    """

    kernel: str
    grid: tuple[int, ...]
    threads: int
    blocks: int = 0
    seconds: float = 0.0
    shared_bytes: int = 0
    by_kind: dict[str, OpStats] = field(default_factory=dict)
    by_stmt: dict[int, tuple[str, OpStats]] = field(default_factory=dict)
    #: Per tensor whose writes were tracked: which element offsets some block stored to.
    written: dict = field(default_factory=dict)

    def kind(self, name: str) -> OpStats:
        """Totals of one statement kind (zeros when it never ran)."""
        return self.by_kind.get(name, OpStats())

    @property
    def bank_conflicts(self) -> int:
        return sum(s.bank_conflicts for s in self.by_kind.values())

    @property
    def instructions(self) -> int:
        return sum(s.count for s in self.by_kind.values())

    def __str__(self) -> str:
        lines = [f"emulated {self.kernel}: grid {self.grid}, {self.threads} threads/block, "
                 f"{self.blocks} blocks, {self.shared_bytes} B shared, {self.seconds:.3f} s",
                 f"{'kind':<16}{'warp instrs':>12}{'bytes':>14}{'wavefronts':>12}"
                 f"{'ideal':>10}{'conflicts':>11}"]
        for name in sorted(self.by_kind):
            s = self.by_kind[name]
            lines.append(f"{name:<16}{s.count:>12}{s.bytes:>14}{s.wavefronts:>12}"
                         f"{s.ideal_wavefronts:>10}{s.bank_conflicts:>11}")
        conflicted = [(d, s) for d, s in self.by_stmt.values() if s.bank_conflicts > 0]
        if conflicted:
            lines.append("statements with bank conflicts:")
            for d, s in sorted(conflicted, key=lambda x: -x[1].bank_conflicts)[:10]:
                per = s.wavefronts / max(1, s.ideal_wavefronts)
                lines.append(f"  {per:.2f}x wavefronts  {d}")
        return "\n".join(lines)
