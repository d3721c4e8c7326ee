"""Shared pieces of the agent tests: the fork server is started once per session (its
~3-10 s start is paid once; every candidate after that is a fork)."""
from __future__ import annotations

import os

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
CANDIDATES = os.path.join(HERE, "candidates")
REPLAYS = os.path.join(HERE, "replays")


def candidate_path(name: str) -> str:
    return os.path.join(CANDIDATES, name)


@pytest.fixture(scope="session")
def fork_server():
    from tegula.agent.forkserver import ForkServer

    return ForkServer.shared()
