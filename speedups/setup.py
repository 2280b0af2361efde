"""One extension per twin: mqgw_speedups/<name>.pyx mirrors a pure module of the same name."""

from pathlib import Path

from Cython.Build import cythonize
from setuptools import Extension, setup

TWINS = sorted(path.stem for path in Path(__file__).parent.glob("mqgw_speedups/*.pyx"))

setup(
    ext_modules=cythonize(
        [Extension(f"mqgw_speedups.{name}", [f"mqgw_speedups/{name}.pyx"]) for name in TWINS],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    )
)
