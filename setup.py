"""Build the Cython hot paths (store/_codec.pyx, gateway/_jsonops.pyx); everything else is
pure Python."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(
                "store._codec",
                ["store/_codec.pyx"],
                include_dirs=["store"],
                depends=["store/mblake2b.h"],
            ),
            Extension("gateway._jsonops", ["gateway/_jsonops.pyx"]),
        ],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    )
)
