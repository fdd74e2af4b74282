"""Unpickling untrusted files without running code (CIFAR-10 batches, FedScale traces).

``load(data, allowed)`` admits the plain containers every pickle is made of, plus only the
globals in ``allowed`` ((module, name) -> object); any other global is refused, so a pickle
that would call ``os.system`` or build an arbitrary object fails instead of running.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, Mapping


class _Restricted(pickle.Unpickler):
    def __init__(self, file: io.BytesIO, allowed: Mapping[tuple[str, str], Any], **kwargs: Any):
        super().__init__(file, **kwargs)
        self._allowed = allowed

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused pickle global {module}.{name} "
                                         f"(refusing to load anything the format does not use)") from None


def load(data: bytes, allowed: Mapping[tuple[str, str], Any] | None = None, encoding: str = "ASCII") -> Any:
    """Unpickle ``data`` admitting only ``allowed`` globals (none by default)."""
    return _Restricted(io.BytesIO(data), allowed or {}, encoding=encoding).load()
