"""hypothesis, or where it is missing (it is a test dependency: ``pip install -e .[dev]``) stand-ins
under which each property test is skipped with the reason, and the rest of its file still runs."""

from __future__ import annotations

from typing import Any

import pytest

try:
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st
except ImportError:
    _REASON = "needs hypothesis (the [dev] extra: pip install -e .[dev])"

    class _Anything:
        """Builds strategies at import time whatever is asked of it (st.integers(0, 3).map(f) | ...)."""

        def __getattr__(self, name: str) -> _Anything:
            return self

        def __call__(self, *args: Any, **kwargs: Any) -> _Anything:
            return self

        def __or__(self, other: Any) -> _Anything:
            return self

    st = HealthCheck = _Anything()

    def given(*args: Any, **kwargs: Any):
        return pytest.mark.skip(reason=_REASON)

    def settings(*args: Any, **kwargs: Any):
        return lambda fn: fn

__all__ = ["HealthCheck", "given", "settings", "st"]
