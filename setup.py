"""The compiled twins of the hot paths, built by the package's own build (pyproject.toml holds
everything else about the package).

Each ``speedups/mqgw_speedups/<name>.pyx`` (Cython) mirrors the pure module
``gateway/amqp/<name>.py`` and becomes the extension ``mqgw_speedups.<name>``;
``storage/twins.py`` picks it when it imports. Without a C compiler or the Python headers
the build still succeeds, pure Python only: it says so in one warning line and leaves the
reason in ``speedups/mqgw_speedups/not_built.txt``, where ``mqgw --version`` reads it. An
editable install (``pip install -e .``) builds in place, beside the ``.pyx`` files; the
generated ``.c`` files stay in the build's temporary directory.
"""

from __future__ import annotations

import re
import sysconfig
import warnings
from pathlib import Path

from setuptools import Extension, find_namespace_packages, setup
from setuptools.command.build_ext import build_ext
from setuptools.errors import CCompilerError, ExecError, PlatformError

PACKAGE = "mqgw_speedups"
SOURCES = Path("speedups", PACKAGE)  # the twins' own folder; installed as the package mqgw_speedups
# Every package of the project, folders without __init__.py too (as pyproject's packages.find
# found them); setup.py lists them because mqgw_speedups lives under speedups/.
PACKAGES = [
    *find_namespace_packages(
        include=[
            *("storage*", "gateway*", "meta*", "controller*", "bench*", "localcluster*"),
            *("mqgw_cli*", "replay*"),
        ]
    ),
    PACKAGE,
]
NOT_BUILT = "not_built.txt"  # storage/twins.py reads it (NOT_BUILT_NOTE)
TWINS = sorted(path.stem for path in (Path(__file__).parent / SOURCES).glob("*.pyx"))
# C libraries a twin links: the record encoder and decoder checksum with zlib's crc32, the
# function Python's own zlib module calls (its headers come with Python's, zlib1g-dev on Debian).
LIBRARIES = {"record_encode": ["z"], "record_decode": ["z"]}
# Cython text the twins include (slot access), shipped with the sources they are built from.
INCLUDES = sorted(str(path) for path in SOURCES.glob("*.pxi"))
DIRECTIVES = {"language_level": "3", "boundscheck": False, "wraparound": False}


def why_not_built(error: Exception, compiler: str) -> str:
    """The build's failure as the reason ``mqgw --version`` gives after "not built: "."""
    headers = Path(sysconfig.get_paths()["include"], "Python.h")
    if not headers.is_file():
        return f"no Python headers ({headers} missing) when installed"
    text = str(error)
    if isinstance(error, PlatformError) or "No such file or directory" in text:
        return f"no C compiler ({compiler} not found) when installed"
    status = re.search(r"exit (?:status|code) -?\d+", text)
    return f"the C compiler ({compiler}) failed when installed: {status[0] if status else text}"


class OptionalBuildExt(build_ext):
    """build_ext that turns a failed compile into a warning and a pure-Python install."""

    def run(self) -> None:
        inplace = self.inplace  # setuptools' run clears it while building (and after a failure)
        # The package's directories: the one the wheel is made from and, for an in-place
        # (editable) build, the sources' one, which the install imports from.
        places = [Path(self.build_lib, PACKAGE), *([SOURCES] if inplace else [])]
        try:
            from Cython.Build import cythonize  # noqa: PLC0415 - a build requirement only
        except ImportError as error:
            self._pure_only(places, f"Cython missing when installed ({error})")
            return
        # The generated C goes to the build's temporary directory, not beside the .pyx files.
        generated = cythonize(
            self.extensions, compiler_directives=DIRECTIVES, build_dir=self.build_temp, quiet=True
        )
        for ext, c_ext in zip(self.extensions, generated, strict=True):
            ext.sources = c_ext.sources
        try:
            super().run()
        except (CCompilerError, ExecError, PlatformError, OSError) as error:
            self.inplace = inplace
            compiler = getattr(self.compiler, "compiler_so", None) or ["cc"]
            self._pure_only(places, why_not_built(error, compiler[0]))
            return
        for place in places:
            (place / NOT_BUILT).unlink(missing_ok=True)

    def _pure_only(self, places: list[Path], reason: str) -> None:
        # Nothing half-built stays behind: an extension built before the failure, or one an
        # earlier in-place build left beside the sources, would contradict the note.
        for place in places:
            for ext in self.extensions:
                (place / Path(self.get_ext_filename(ext.name)).name).unlink(missing_ok=True)
            place.mkdir(parents=True, exist_ok=True)
            (place / NOT_BUILT).write_text(reason + "\n", encoding="utf-8")
        # A warning, not a print: pip shows a build backend's warnings even with -q.
        warnings.warn(
            f"mqgw: compiled hot paths NOT built: {reason}; installing pure Python only "
            "(works, slower; `mqgw --version` tells which)",
            stacklevel=1,
        )


setup(
    packages=PACKAGES,
    package_dir={PACKAGE: str(SOURCES)},
    ext_modules=[
        Extension(
            f"{PACKAGE}.{name}",
            [f"{SOURCES}/{name}.pyx"],
            libraries=LIBRARIES.get(name, []),
            depends=INCLUDES,
        )
        for name in TWINS
    ],
    cmdclass={"build_ext": OptionalBuildExt},
)
