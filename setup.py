"""Build hook for the optional native core (svtagg.mpc._gc).

Everything else about the package is in pyproject.toml.  The extension is
`optional`: where it cannot be compiled (no C compiler, no AES-NI target), the
install still succeeds and svtagg uses its numpy backend.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "svtagg.mpc._gc",
            sources=["mpc/_gc.c"],
            # Baseline x86-64 with AES-NI; the VAES path is compiled separately
            # under a target attribute and chosen at run time.
            extra_compile_args=["-O3", "-maes", "-msse4.1", "-mpclmul", "-std=c11"],
            optional=True,
        )
    ]
)
