"""Build the Cython hot paths (store/_codec.pyx, gateway/_jsonops.pyx,
gateway/_usagecount.pyx, reads/_fastget.pyx, net/_fastconn.pyx);
everything else is pure Python. The store codec links libdeflate (CRC-32), zlib (CRC-32
combination), libsodium (BLAKE2b) and OpenSSL's libcrypto (SHA-256), the read fast path
libdeflate: Debian packages libdeflate-dev, zlib1g-dev, libsodium-dev and libssl-dev (`make
build` installs them when missing and run as root)."""

from Cython.Build import cythonize
from setuptools import Extension, setup

setup(
    ext_modules=cythonize(
        [
            Extension(
                "store._codec",
                ["store/_codec.pyx"],
                libraries=["sodium", "crypto", "z", "deflate"],
            ),
            Extension("gateway._jsonops", ["gateway/_jsonops.pyx"]),
            Extension("gateway._usagecount", ["gateway/_usagecount.pyx"]),
            Extension("reads._fastget", ["reads/_fastget.pyx"], libraries=["deflate"]),
            Extension("net._fastconn", ["net/_fastconn.pyx"]),
        ],
        compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
    )
)
