"""Build the Cython hot paths (store/_codec.pyx, gateway/_jsonops.pyx,
gateway/_usagecount.pyx, reads/_fastget.pyx, net/_fastconn.pyx);
everything else is pure Python. The store codec links libdeflate (CRC-32), zlib (CRC-32
combination), libsodium (BLAKE2b) and OpenSSL's libcrypto (SHA-256), the read fast path
libdeflate: Debian packages libdeflate-dev, zlib1g-dev, libsodium-dev and libssl-dev (`make
build` installs them when missing and run as root).

`core/compiled.py` registers the same modules with their pure twins; tests/test_compiled.py
checks that this list, that registry and the tree's ``_*.pyx`` files are one set."""

from setuptools import Extension, setup

#: Every compiled module (dotted name, built from the ``.pyx`` of that path) and the C
#: libraries it links.
EXTENSIONS: dict[str, list[str]] = {
    "store._codec": ["sodium", "crypto", "z", "deflate"],
    "gateway._jsonops": [],
    "gateway._usagecount": [],
    "reads._fastget": ["deflate"],
    "net._fastconn": [],
}


def extensions() -> list[Extension]:
    # -g0: no debug information. The machine code is the same (Python's own CFLAGS keep
    # their -O3), and compiling the codec takes a third less without it: compiling is most
    # of a fresh checkout's wait before `make run` answers.
    return [
        Extension(
            name, [name.replace(".", "/") + ".pyx"], libraries=libs, extra_compile_args=["-g0"]
        )
        for name, libs in EXTENSIONS.items()
    ]


# Run as a script by `setup.py build_ext` and by pip's build backend; imported, it only
# lists `EXTENSIONS` (Cython is needed to build, not to read the list).
if __name__ == "__main__":
    import os

    from Cython.Build import cythonize

    # Every core at work: the modules are independent, and compiling them is most of a
    # fresh checkout's wait before `make run` answers.
    jobs = os.cpu_count() or 1
    setup(
        ext_modules=cythonize(
            extensions(),
            nthreads=jobs,
            quiet=True,
            compiler_directives={"language_level": "3", "boundscheck": False, "wraparound": False},
        ),
        options={"build_ext": {"parallel": jobs}},
    )
