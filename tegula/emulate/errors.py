"""The emulator's error type."""
from __future__ import annotations

from tegula.errors import TegulaError


class EmulationError(TegulaError):
    """The thread IR did something the hardware would not allow or that would be wrong on
    the GPU: an out-of-bounds or misaligned access, a shared-memory race, a missing
    cp.async wait, a barrier under divergent control flow, a malformed instruction.

    These are compiler bugs caught on the CPU; the message names the statement, the
    tensor or buffer, the block and the loop iteration.
    """
