"""The compiled twin of a pure hot module (storage/twins.py), for the tests that compare them."""

from __future__ import annotations

from types import ModuleType
from typing import Any

from storage import twins


def built_twin(pure: ModuleType) -> Any:
    """``pure``'s compiled twin; fails the test when the build did not make it (the build
    warns and carries on, pure Python only, so a broken build shows here)."""
    twin = twins.compiled_twin(pure)
    assert twin is not None, f"{pure.__name__}'s compiled twin is not built: scripts/setup"
    return twin
