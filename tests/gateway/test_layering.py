"""The gateway's layering, checked on the source: every import, including those under
TYPE_CHECKING and inside functions, goes down (or sideways), never up.

The layers, lowest first (docs/architecture.md): the sans-IO protocol, routing and the leaves
(configuration, resources) < queues < features, observe and the ports < controls and the
cluster link < vhost < sessions < node < admin < server. A lower layer that needs something
of a higher one asks through a Protocol (gateway/ports.py, gateway/sessions/host.py,
gateway/queues/consumer.py). The storage and metadata packages never import the gateway, nor
the controller.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Module prefix -> layer; the longest matching prefix wins.
LAYERS: dict[str, int] = {
    "gateway.amqp": 0,
    "gateway.routing": 0,
    "gateway.config": 0,
    "gateway.resources": 0,
    "gateway.observe.histogram": 0,  # a leaf the scheduler records into
    "gateway.observe.otel_extra": 0,  # a leaf the settings check
    "gateway.queues": 1,
    "gateway.features": 2,
    "gateway.observe": 2,
    "gateway.ports": 2,
    "gateway.controls": 3,
    "gateway.cluster": 3,
    "gateway.vhost": 4,
    "gateway.sessions": 5,
    "gateway.node": 6,
    "gateway.admin": 7,
    "gateway.server": 8,
    "gateway.net": 8,
}
# Imports still going up, each with the move that ends it. Keep this empty.
PENDING: dict[str, str] = {}
# package -> what it must never import
FORBIDDEN: dict[str, tuple[str, ...]] = {
    # The group records and their contract are meta.groups: brokers follow the controller's
    # records without importing the controller.
    "storage": ("gateway", "controller", "mqgw_cli"),
    "meta": ("gateway", "storage", "controller", "mqgw_cli"),
    # The gateway reaches Redis only through meta's ports (the metadata store, the group
    # link), never with a client of its own.
    "gateway": ("redis",),
}


def layer_of(module: str) -> int | None:
    best: tuple[int, int] | None = None
    for prefix, layer in LAYERS.items():
        matches = module == prefix or module.startswith(prefix + ".")
        if matches and (best is None or len(prefix) > best[0]):
            best = (len(prefix), layer)
    return None if best is None else best[1]


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every module name ``path`` imports (``from x import y`` gives x and x.y)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
    return names


def _upward(source: str, imports: set[str]) -> list[str]:
    here = layer_of(source)
    found = []
    for name in sorted(imports):
        there = layer_of(name)
        if here is not None and there is not None and there > here:
            found.append(f"{source} (layer {here}) imports {name} (layer {there})")
    return found


def test_every_gateway_module_has_a_layer() -> None:
    unplaced = [
        _module_name(path)
        for path in ROOT.glob("gateway/**/*.py")
        if _module_name(path) != "gateway" and layer_of(_module_name(path)) is None
    ]
    assert not unplaced


def test_no_gateway_import_goes_up() -> None:
    found = []
    for path in sorted(ROOT.glob("gateway/**/*.py")):
        module = _module_name(path)
        if module not in PENDING:
            found += _upward(module, _imports(path))
    assert not found


def test_pending_exceptions_still_need_to_be_there() -> None:
    """An exception whose module no longer imports upward must leave PENDING."""
    for module in PENDING:
        path = ROOT / (module.replace(".", "/") + ".py")
        assert _upward(module, _imports(path)), f"{module} is clean: take it off PENDING"


@pytest.mark.parametrize("package", list(FORBIDDEN))
def test_a_package_imports_nothing_it_must_not(package: str) -> None:
    found = []
    for path in sorted(ROOT.glob(package + "/**/*.py")):
        for name in sorted(_imports(path)):
            if any(name == f or name.startswith(f + ".") for f in FORBIDDEN[package]):
                found.append(f"{_module_name(path)} imports {name}")
    assert not found


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gateway.sessions.session import Session\n"
        "def f():\n    from gateway import node\n"
    )
    imports = _imports(source)
    assert {"gateway.sessions.session", "gateway.node"} <= imports
    assert len(_upward("gateway.features.stream", imports)) == 3  # node, session, Session
    assert _upward("gateway.admin.app", imports) == []
