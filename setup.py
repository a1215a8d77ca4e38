"""Build hook for the optional native cores (svtagg.mpc._gc, svtagg.vdaf._field).

Everything else about the package is in pyproject.toml.  The extension is
`optional`: where it cannot be compiled (no C compiler, no AES-NI target), the
install still succeeds and svtagg uses its numpy / Python-integer reference paths.
"""

from setuptools import Extension, setup
from setuptools.command.build_py import build_py


class BuildPy(build_py):  # type: ignore[misc]
    """The package `svtagg` is the repository root: keep this file out of it."""

    def find_package_modules(self, package: str, package_dir: str) -> list[tuple[str, str, str]]:
        modules = super().find_package_modules(package, package_dir)
        return [m for m in modules if not (package == "svtagg" and m[1] == "setup")]


if __name__ == "__main__":  # how pip's build backend runs it; importing it does nothing
    setup(
        cmdclass={"build_py": BuildPy},
        ext_modules=[
            Extension(
                "svtagg.mpc._gc",
                sources=["mpc/_gc.c"],
                # Baseline x86-64 with AES-NI; the VAES path is compiled separately
                # under a target attribute and chosen at run time.
                extra_compile_args=["-O3", "-maes", "-msse4.1", "-mpclmul", "-std=c11"],
                optional=True,
            ),
            Extension(
                "svtagg.vdaf._sparse",
                sources=["vdaf/_sparse.c"],
                depends=["mpc/_aesni.h"],
                # The sparse reports' DPF expansion: AES-NI like the engine's core.
                extra_compile_args=["-O3", "-maes", "-msse4.1", "-std=c11"],
                optional=True,
            ),
            Extension(
                "svtagg.vdaf._field",
                sources=["vdaf/_field.c", "vdaf/_keccak.c"],
                depends=["vdaf/_keccak.h", "vdaf/_arith.h"],
                # Portable C with unsigned __int128 (GCC, Clang); the wider SHAKE128
                # paths (AVX2, AVX-512F) are compiled under target attributes and
                # chosen at run time.
                extra_compile_args=["-O3", "-std=c11"],
                optional=True,
            ),
        ],
    )
