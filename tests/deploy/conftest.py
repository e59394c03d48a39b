"""Fixtures of the deployment tests (helpers live in chart_support.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from chart_support import CHART_DIR, helm


@pytest.fixture(scope="session")
def chart() -> Iterator[Any]:
    """The chart loaded once by Helm v4's Go SDK."""
    with helm.Chart.load(str(CHART_DIR)) as loaded:
        yield loaded
