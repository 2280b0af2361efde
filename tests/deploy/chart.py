"""Render charts/mqgw the way `helm template` does, without Helm.

The renderer is charts/render (Go's text/template + sprig + Helm's own functions), built
offline from Debian's Go packages into build/chart-render/ (ignored by git); `go build` with
its cache there is a no-op when nothing changed. scripts/setup-dev builds it the same way.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "mqgw"
RENDER_SRC = REPO / "charts" / "render"
BUILD_DIR = REPO / "build" / "chart-render"
RENDERER = BUILD_DIR / "render"

# The Kubernetes version the manifests are validated against (a schema set that
# kubernetes-validate ships); the chart's kubeVersion is >= 1.28.
KUBE_VERSION = "1.30.0"

GO_ENV = {
    "GO111MODULE": "off",  # Debian's Go libraries, no module download
    "GOPATH": "/usr/share/gocode",
    "CGO_ENABLED": "0",
    "GOFLAGS": "",
}


def build_renderer() -> Path:
    """Build (or reuse) the renderer binary; returns its path."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **GO_ENV, "GOCACHE": str(BUILD_DIR / "gocache")}
    done = subprocess.run(
        ["go", "build", "-o", str(RENDERER), "./charts/render"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if done.returncode != 0:
        raise RuntimeError(f"building the chart renderer failed:\n{done.stderr}")
    return RENDERER


def run_renderer(
    *,
    chart: Path = CHART,
    values: Iterable[Path] = (),
    sets: Iterable[str] = (),
    name: str = "mq",
    namespace: str = "messaging",
) -> subprocess.CompletedProcess[str]:
    args = [str(RENDERER), "--name", name, "--namespace", namespace]
    for file in values:
        args += ["-f", str(file)]
    for item in sets:
        args += ["--set", item]
    args.append(str(chart))
    return subprocess.run(args, capture_output=True, text=True, timeout=60)


def render(**options: Any) -> list[dict[str, Any]]:
    """The rendered manifests (empty documents dropped); raises if rendering fails."""
    done = run_renderer(**options)
    if done.returncode != 0:
        raise AssertionError(f"render failed: {done.stderr}")
    return [doc for doc in yaml.safe_load_all(done.stdout) if doc]


def chart_values(*overrides: Mapping[str, Any]) -> dict[str, Any]:
    """values.yaml with overrides merged over it, as the renderer merges them."""
    values: dict[str, Any] = yaml.safe_load((CHART / "values.yaml").read_text())
    for override in overrides:
        _merge(values, override)
    return values


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> None:
    for key, value in override.items():
        if value is None:
            base.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(base.get(key), dict):
            _merge(base[key], value)
        else:
            base[key] = value
