from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .support import Embedded


@pytest.fixture
def embedded(tmp_path: Path) -> Iterator[Embedded]:
    deployment = Embedded(tmp_path / "data")
    yield deployment
    deployment.close()
