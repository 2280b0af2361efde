"""The gateway's layering, checked on the source: every import, including those under
TYPE_CHECKING and inside functions, goes down (or sideways), never up.

amqp (the sans-IO protocol) and routing know nothing of the rest; queues (the delivery core)
know consumers only through gateway/queues/consumer.py; no layer below the composition root
(node.py, server.py) imports the admin plane or the server; the storage and metadata packages
never import the gateway.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# package -> the gateway modules it may import (prefixes); anything else under gateway. is up.
ALLOWED: dict[str, tuple[str, ...]] = {
    "gateway.amqp": ("gateway.amqp",),
    "gateway.routing": ("gateway.amqp", "gateway.routing"),
    "gateway.queues": (
        "gateway.amqp",
        "gateway.routing",
        "gateway.queues",
        "gateway.observe.histogram",
    ),
}
# package -> gateway modules it must not import (the layers above it).
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "gateway.features": ("gateway.node", "gateway.server", "gateway.admin", "gateway.cluster"),
    "gateway.sessions": ("gateway.server", "gateway.admin", "gateway.cluster"),
    "gateway.observe": ("gateway.server", "gateway.admin"),
    "gateway.vhost": ("gateway.node", "gateway.server", "gateway.admin", "gateway.sessions"),
    "storage": ("gateway", "mqgw_cli"),  # the controller's contract it shares (replication)
    "meta": ("gateway", "storage", "controller", "mqgw_cli"),
}


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


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _violations(package: str) -> list[str]:
    found = []
    for path in sorted(ROOT.glob(package.replace(".", "/") + "/**/*.py")) or [
        ROOT / (package.replace(".", "/") + ".py")
    ]:
        module = _module_name(path)
        for name in sorted(_imports(path)):
            if package in ALLOWED:
                allowed = ALLOWED[package]
                up = _under(name, "gateway") and not any(_under(name, a) for a in allowed)
                # "from gateway.queues import x" names the package itself: fine when allowed.
                up = up and name != "gateway"
            else:
                up = any(_under(name, f) for f in FORBIDDEN[package])
            if up:
                found.append(f"{module} imports {name}")
    return found


@pytest.mark.parametrize("package", [*ALLOWED, *FORBIDDEN])
def test_no_layer_imports_upwards(package: str) -> None:
    assert not _violations(package)


def test_the_checker_sees_an_upward_import(tmp_path: Path) -> None:
    source = tmp_path / "m.py"
    source.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from gateway.sessions.session import Session\n"
        "def f():\n    from gateway import node\n"
    )
    assert {"gateway.sessions.session", "gateway.node"} <= _imports(source)
