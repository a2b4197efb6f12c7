"""Shared fixtures: the repository's example programs."""

from __future__ import annotations

import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


@pytest.fixture
def quest_source() -> str:
    return (EXAMPLES / "quest.vflow").read_text()
