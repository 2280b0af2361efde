"""Compiled twins of the hot paths, and which one is in use.

A hot function lives in a small pure-Python module beside the code that calls it
(``gateway/amqp/publish_cut.py``, ``gateway/amqp/deliver_frame.py``): that module is the
source of truth and the reference. Its compiled twin, ``speedups/mqgw_speedups/<name>.pyx``,
does the same in C (Cython) and is built by ``scripts/setup`` (``scripts/build-speedups``)
into the virtualenv as ``mqgw_speedups.<name>``. Both can be imported in one process, so the
tests run the codec suites against both and compare them on random input
(tests/amqp/test_twins.py).

``pick(pure_function)`` gives the same-named function of the compiled twin when it is built,
else ``pure_function``. ``MQGW_PURE_PYTHON=1`` in the environment forces the pure modules
(read when the caller is imported). A caller binds the pick to a module global at import, so
the choice costs nothing per call and a test can swap it with monkeypatch.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

COMPILED_PACKAGE = "mqgw_speedups"
PURE_ENV = "MQGW_PURE_PYTHON"

_chosen: dict[str, ModuleType] = {}  # pure module's short name -> the module pick() used


def pure_forced() -> bool:
    return os.environ.get(PURE_ENV, "").strip().lower() not in ("", "0", "false", "no")


def compiled_twin(pure: ModuleType) -> ModuleType | None:
    """The built twin of ``pure`` (whatever the environment says), or None if not built."""
    name = pure.__name__.rpartition(".")[2]
    try:
        return importlib.import_module(f"{COMPILED_PACKAGE}.{name}")
    except ImportError:
        return None


def twin(pure: ModuleType) -> ModuleType:
    """The module to call: ``pure``'s compiled twin if built and not disabled, else ``pure``."""
    compiled = None if pure_forced() else compiled_twin(pure)
    return pure if compiled is None else compiled


def pick(pure_function: F) -> F:
    """``pure_function``'s counterpart in the module ``twin`` chooses (typed as the pure one:
    the twins share their signatures)."""
    pure = sys.modules[pure_function.__module__]
    module = _chosen[pure.__name__.rpartition(".")[2]] = twin(pure)
    chosen: F = getattr(module, pure_function.__name__)
    return chosen


def in_use() -> dict[str, str]:
    """Each hot module picked from so far -> "compiled" or "pure"."""
    return {
        name: "compiled" if module.__name__.startswith(COMPILED_PACKAGE + ".") else "pure"
        for name, module in sorted(_chosen.items())
    }
