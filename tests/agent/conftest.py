"""Shared pieces of the agent tests: the fork server is started once per session (its
start, importing torch and torch._dynamo, is paid once; every candidate after that is a
fork)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="session", autouse=True)
def fork_server():
    """Started by the first agent test, so its preload overlaps the tests that need no
    candidate process (the static check, the task set)."""
    from tegula.agent.forkserver import ForkServer

    return ForkServer.shared()
