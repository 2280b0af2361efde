"""The pinned RocketMQ release, resolved from Maven Central into a cache directory.

``ensure()`` returns ``<cache>/rocketmq-<version>/lib`` (every jar of the name server, broker,
controller and mqadmin), fetching it first if needed: `mvn dependency:copy-dependencies` on
``pom.xml`` beside this file into a temporary directory, then one rename into place, under an
``fcntl`` lock so two processes (two test sessions, setup-dev and a test) never both fetch or
see half a directory. The cache is ``$MQGW_CACHE_DIR`` or ``~/.cache/mqgw``.

    python -m localcluster.rocketmq.dist     # fetch if needed, print the lib directory
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

POM = Path(__file__).with_name("pom.xml")
CACHE_ENV = "MQGW_CACHE_DIR"
COMPLETE = ".complete"  # written last into the staging directory, before the rename
_MVN_TIMEOUT_S = 900.0
_NS = {"m": "http://maven.apache.org/POM/4.0.0"}
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class DistError(Exception):
    """The release cannot be had: one line saying why and what to do."""


def version() -> str:
    """The pinned release: the pom's ``rocketmq.version`` property (its only home)."""
    found = ET.parse(POM).getroot().find("m:properties/m:rocketmq.version", _NS)
    if found is None or not found.text:
        raise DistError(f"{POM} has no <rocketmq.version> property")
    return found.text.strip()


def cache_root() -> Path:
    configured = os.environ.get(CACHE_ENV)
    return Path(configured) if configured else Path.home() / ".cache" / "mqgw"


def lib_dir() -> Path:
    return cache_root() / f"rocketmq-{version()}" / "lib"


def cached() -> Path | None:
    """The lib directory if a complete fetch is there, else None (never fetches)."""
    lib = lib_dir()
    return lib if (lib / COMPLETE).is_file() else None


def java() -> str:
    found = shutil.which("java")
    if found is None:
        raise DistError(
            "java is not on the PATH: install a JDK 11+ (apt-get install default-jdk-headless)"
        )
    return found


def ensure() -> Path:
    """The lib directory of the pinned release, fetched now if it is not in the cache."""
    done = cached()
    if done is not None:
        return done
    java()  # mvn needs it too, and nothing runs without it
    mvn = shutil.which("mvn")
    if mvn is None:
        raise DistError("mvn is not on the PATH: install Maven (apt-get install maven)")
    lib = lib_dir()
    home = lib.parent
    home.mkdir(parents=True, exist_ok=True)
    with (home / ".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (lib / COMPLETE).is_file():  # another process fetched it while we waited
            return lib
        staging = Path(tempfile.mkdtemp(prefix="fetch-", dir=home))
        try:
            _fetch(mvn, staging)
            if lib.exists():  # a directory without the marker: not ours to trust
                shutil.rmtree(lib)
            (staging / "lib").rename(lib)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    return lib


def _fetch(mvn: str, staging: Path) -> None:
    """Resolve every jar into ``staging/lib`` and mark it complete."""
    pom = staging / "pom.xml"
    shutil.copyfile(POM, pom)  # mvn may write beside its pom: not into the checkout
    out = staging / "lib"
    cmd = [mvn, "-q", "-B", "-Dstyle.color=never", "-f", str(pom), "dependency:copy-dependencies"]
    cmd.append(f"-DoutputDirectory={out}")
    try:
        result = subprocess.run(
            cmd, capture_output=True, text=True, timeout=_MVN_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        raise DistError(
            f"fetching RocketMQ {version()} with mvn took over {_MVN_TIMEOUT_S:g} s"
        ) from None
    jars = list(out.glob("*.jar")) if out.is_dir() else []
    if result.returncode != 0 or not jars:
        raise DistError(
            f"fetching RocketMQ {version()} from Maven Central failed (mvn exit "
            f"{result.returncode}): {_why(result.stdout + result.stderr)}"
        )
    (out / COMPLETE).write_text(f"rocketmq {version()}: {len(jars)} jars\n")


def _why(output: str) -> str:
    """mvn's first error line, which names the cause (no network, an unknown artifact)."""
    plain = _ANSI.sub("", output)  # Debian's mvn colours even in batch mode
    lines = [line.strip() for line in plain.splitlines()]
    errors = [line.removeprefix("[ERROR]").strip() for line in lines if line.startswith("[ERROR]")]
    picked = [line for line in errors if line] or [line for line in lines if line] or ["no output"]
    return picked[0][:400]


def main() -> int:
    try:
        print(ensure())
    except DistError as error:
        print(f"rocketmq: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
