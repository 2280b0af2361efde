"""Compiled twins of the hot paths, and which one is in use.

A hot function lives in a small pure-Python module beside the code that calls it
(``gateway/amqp/publish_cut.py``, ``gateway/amqp/deliver_frame.py``,
``storage/record_encode.py``): that module is the source of truth and the reference. This
chooser sits in storage, the lowest layer, so that every layer's hot path can use it. Its
compiled twin, ``speedups/mqgw_speedups/<name>.pyx``, does the same in C (Cython) and is built
by the package's own build (setup.py) into the extension ``mqgw_speedups.<name>``:
``pip install .``, a wheel, and the editable install of ``scripts/setup`` (in place, beside
the ``.pyx``) all have it. Where the build found no C
compiler or no Python headers it warned, installed pure Python only and left the reason in
``speedups/mqgw_speedups/not_built.txt``. Both twins can be imported in one process, so the
tests run the codec suites against both and compare them on random input
(tests/gateway/amqp/test_twins.py, tests/storage/test_record_twins.py).

``pick(pure_function)`` gives the same-named function of the compiled twin when it is built,
else ``pure_function``. ``MQGW_PURE_PYTHON=1`` in the environment forces the pure modules
(read when the caller is imported). A caller binds the pick to a module global at import, so
the choice costs nothing per call and a test can swap it with monkeypatch. ``status()`` says
whether the compiled hot paths are in use and, if not, why: ``mqgw --version`` prints it and
``mqgw serve`` logs it at start (``status_line``).
"""

from __future__ import annotations

import importlib
import importlib.resources
import os
import sys
from collections.abc import Callable
from types import ModuleType
from typing import Any, TypeVar

F = TypeVar("F", bound=Callable[..., Any])

COMPILED_PACKAGE = "mqgw_speedups"
PURE_ENV = "MQGW_PURE_PYTHON"
# Each compiled twin (speedups/mqgw_speedups/<name>.pyx) -> its pure module.
HOT_MODULES = {
    "consumer_credit": "gateway.sessions.consumer_credit",
    "deliver_frame": "gateway.amqp.deliver_frame",
    "deliver_run": "gateway.sessions.deliver_run",
    "index_dispatch": "storage.log.index_dispatch",
    "publish_cut": "gateway.amqp.publish_cut",
    "plain_turn": "gateway.queues.plain_turn",
    "publish_lane": "gateway.sessions.publish_lane",
    "record_decode": "storage.record_decode",
    "record_encode": "storage.record_encode",
    "settle_acks": "gateway.sessions.settle_acks",
    "write_through": "gateway.vhost.write_through",
}
# Written into mqgw_speedups by a build that could not compile (setup.py): the reason.
NOT_BUILT_NOTE = "not_built.txt"

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


def status() -> tuple[bool, str]:
    """(True, "") when every hot module runs compiled; else (False, the reason): disabled by
    the environment, not built (the build's own reason) or the twin's ImportError."""
    if pure_forced():
        return False, f"disabled by {PURE_ENV}={os.environ[PURE_ENV].strip()}"
    for name in HOT_MODULES:
        try:
            importlib.import_module(f"{COMPILED_PACKAGE}.{name}")
        except ImportError as error:
            note = _not_built_note()
            return False, f"not built: {note}" if note else f"{COMPILED_PACKAGE}.{name}: {error}"
    return True, ""


def status_line() -> str:
    """``compiled hot paths: yes`` or ``compiled hot paths: no (reason)``."""
    compiled, reason = status()
    return f"compiled hot paths: {'yes' if compiled else f'no ({reason})'}"


def _not_built_note() -> str:
    try:
        note = importlib.resources.files(COMPILED_PACKAGE).joinpath(NOT_BUILT_NOTE)
        return note.read_text(encoding="utf-8").strip() if note.is_file() else ""
    except (ImportError, OSError):
        return ""
