"""The protocol layer stays sans-IO: no event loop, socket or clock imports."""

from __future__ import annotations

import ast
from pathlib import Path

import gateway.amqp

FORBIDDEN = {"anyio", "asyncio", "trio", "socket", "time", "selectors", "threading"}


def test_no_io_or_clock_imports() -> None:
    package = Path(gateway.amqp.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) >= 8
    for path in modules:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                assert name.split(".")[0] not in FORBIDDEN, f"{path.name} imports {name}"


def test_module_sizes_stay_readable() -> None:
    package = Path(gateway.amqp.__file__).parent
    for path in package.glob("*.py"):
        assert len(path.read_text().splitlines()) < 550, path.name
