from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

import tinystore

from .helpers import open_store


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "contract(id): a contract of CONTRACTS.md")


@pytest.fixture(params=["embedded", "private", "sidecar"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tinystore.Store]:
    """A store in each way of reaching it that contracts run over (embedded, private, sidecar)."""
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


@pytest.fixture(params=["private", "sidecar", "tcp"])
async def remote_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tinystore.Store]:
    """A store reached over a connection (private, sidecar, TCP): for contracts about connections."""
    async with open_store(request.param, tmp_path / "store") as s:
        yield s


@pytest.fixture(params=["embedded", "private", "sidecar", "tcp"])
async def any_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[tinystore.Store]:
    """A store in every way of reaching it."""
    async with open_store(request.param, tmp_path / "store") as s:
        yield s
