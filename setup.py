"""Build hook for the optional compiled build; the project's metadata is in ``pyproject.toml``.

``pip install .`` and ``pip install -e .`` build pure Python, as always. With ``AIQSIM_COMPILE=1`` set,
the modules listed in ``aiqsim/compiled.py`` (``COMPILED_MODULES``) are compiled by Cython from their
unchanged ``.py`` sources into extension modules beside them, and ``aiqsim/_compiled_sources.json``
records each source's SHA-256 so that ``import aiqsim`` can refuse a compiled module whose source was
edited since (see ``aiqsim/compiled.py``). Cython is fetched into the build environment only then.
A compiled build that cannot be made (no Cython, no C compiler) fails loudly: it was asked for.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

ROOT = Path(__file__).resolve().parent


def _compiled_rules():
    """aiqsim/compiled.py, loaded by path: it imports only the standard library (aiqsim's own
    dependencies are not installed in the build environment)."""
    spec = importlib.util.spec_from_file_location("_aiqsim_compiled_rules", ROOT / "aiqsim" / "compiled.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


RULES = _compiled_rules()
COMPILE = os.environ.get(RULES.COMPILE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


class BuildWithManifest(build_ext):
    """build_ext that cythonizes the listed modules first and writes the manifest of their sources after.

    Cython is imported here, at build time, not when setup.py is read: pip reads setup.py once to learn
    the build's requirements (``setup_requires``) before Cython is installed."""

    def finalize_options(self) -> None:
        if self.distribution.ext_modules:
            try:
                from Cython.Build import cythonize
            except ImportError as missing:
                raise SystemExit(
                    f"{RULES.COMPILE_ENV}=1 asks for the compiled build, which needs Cython "
                    "(pip install 'Cython>=3.0')"
                ) from missing
            self.distribution.ext_modules = cythonize(
                self.distribution.ext_modules,
                language_level=3,
                # generated C goes under build/, not beside the sources
                build_dir="build/cython",
                quiet=True,
                compiler_directives={
                    # annotations are documentation here, as in CPython: Cython must not turn them into C
                    # types (an int-annotated value that is a float, or a bool tuple typed as a C tuple,
                    # would change behaviour), so the compiled modules keep the Python modules' semantics
                    "annotation_typing": False,
                    "infer_types": False,
                    # functions keep their Python introspection (signatures, __qualname__, pickling by name)
                    "binding": True,
                },
            )
            if not self.parallel:  # one compiler per core: ~1.5 minutes instead of ~3 on 2 cores
                self.parallel = os.cpu_count() or 1
        super().finalize_options()

    def run(self) -> None:
        super().run()
        if not self.extensions:
            return
        # where this build puts aiqsim's top-level modules: the build folder, or the checkout (--inplace)
        package_dir = Path(self.get_ext_fullpath("aiqsim._manifest_probe")).parent
        manifest = RULES.source_manifest(ROOT / "aiqsim")
        (package_dir / RULES.MANIFEST_NAME).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")


def _extensions() -> list[Extension]:
    """One extension per listed module, built from its unchanged ``.py`` (none without the switch)."""
    if not COMPILE:
        return []
    return [
        Extension(name, [str(RULES.module_source(Path("aiqsim"), name))]) for name in RULES.COMPILED_MODULES
    ]


setup(
    ext_modules=_extensions(),
    cmdclass={"build_ext": BuildWithManifest},
    # only a compiled build needs Cython in its build environment (setuptools installs these there)
    setup_requires=["Cython>=3.0"] if COMPILE else [],
)
