"""What `pip install` of a wheel gives: the compiled hot paths, or a clear pure-Python fallback.

A wheel is built from a copy of the repository's files (git's tracked and untracked, not
ignored: no in-place extension, build directory or virtualenv of the working tree) with
`python -m build --wheel`, as a user would, and installed into a fresh virtualenv, whose
`mqgw --version` must tell which hot paths it runs. Without a C compiler (CC=/bin/false) the
build still succeeds, warns in one line and installs pure Python only. The virtualenv gets
mqgw's dependencies once for the module (from pyproject.toml; pip's cache makes it ~10 s), then
each wheel with --no-deps. Both builds need PyPI (setuptools and Cython, the build
requirements).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

from storage import twins
from tests.harness.processes import REPO

PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
VERSION_LINE = f"mqgw {PROJECT['version']}"


def _environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("MQGW_PURE_PYTHON", "PYTHONPATH")}
    return {**env, **extra}


def _run(cmd: list[str | Path], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(part) for part in cmd], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _source_copy(into: Path) -> Path:
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    for name in filter(None, listed.decode().split("\0")):
        source = REPO / name
        if source.is_file():  # a file deleted in the working tree is still listed
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def build_wheel(tmp_path: Path, **env: str) -> tuple[Path, str]:
    """The wheel `python -m build --wheel` makes of the repository, and the build's output."""
    source = _source_copy(tmp_path / "src")
    built = _run(
        [sys.executable, "-m", "build", "--wheel", "--outdir", tmp_path / "dist", source],
        _environment(**env),
        tmp_path,
    )
    output = built.stdout + built.stderr
    assert built.returncode == 0, output
    (wheel,) = (tmp_path / "dist").glob("mqgw-*.whl")
    return wheel, output


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh virtualenv with mqgw's dependencies and no mqgw."""
    root = tmp_path_factory.mktemp("venv")
    subprocess.run([sys.executable, "-m", "venv", root], check=True, timeout=120)
    pip = [root / "bin" / "python", "-m", "pip", "install", "-q"]
    installed = _run([*pip, *PROJECT["dependencies"]], _environment(), root)
    assert installed.returncode == 0, installed.stderr
    return root


def install_and_ask_version(venv: Path, wheel: Path) -> list[str]:
    """`mqgw --version` of ``wheel`` installed into ``venv`` (replacing the last one)."""
    pip = [venv / "bin" / "python", "-m", "pip", "install", "-q"]
    installed = _run([*pip, "--no-deps", "--force-reinstall", wheel], _environment(), venv)
    assert installed.returncode == 0, installed.stderr
    asked = _run([venv / "bin" / "mqgw", "--version"], _environment(), venv)
    assert asked.returncode == 0, asked.stderr
    return asked.stdout.splitlines()


def _speedups(wheel: Path) -> list[str]:
    with zipfile.ZipFile(wheel) as archive:
        return sorted(n for n in archive.namelist() if n.startswith("mqgw_speedups/"))


def test_a_wheel_holds_the_compiled_hot_paths_and_uses_them(tmp_path: Path, venv: Path) -> None:
    wheel, output = build_wheel(tmp_path)
    files = _speedups(wheel)
    for twin in twins.HOT_MODULES:
        assert any(re.fullmatch(rf"mqgw_speedups/{twin}\..*\.so", name) for name in files), files
    assert "mqgw_speedups/not_built.txt" not in files
    assert "NOT built" not in output

    lines = install_and_ask_version(venv, wheel)
    assert lines == [VERSION_LINE, "compiled hot paths: yes"]


def test_without_a_c_compiler_the_wheel_is_pure_python_and_says_why(
    tmp_path: Path, venv: Path
) -> None:
    wheel, output = build_wheel(tmp_path, CC="/bin/false")
    files = _speedups(wheel)
    assert not [name for name in files if name.endswith(".so")], files
    assert "mqgw_speedups/not_built.txt" in files
    reason = "the C compiler (/bin/false) failed when installed: exit status 1"
    warnings = [line for line in output.splitlines() if "compiled hot paths NOT built" in line]
    assert len(warnings) == 1, output
    assert reason in warnings[0]
    assert "installing pure Python only" in warnings[0]

    lines = install_and_ask_version(venv, wheel)
    assert lines == [VERSION_LINE, f"compiled hot paths: no (not built: {reason})"]
