"""jfa-prof: profiling and diagnostics around Jagged Flash Attention kernels written in TLX."""
from pathlib import Path as _Path

__version__ = "0.1.0"

# Run from a source tree (repo root on PYTHONPATH, no install): let `jfa_prof.kernels` and
# `jfa_prof.analyses` resolve to the repo's top-level kernels/ and analyses/ folders, the same
# mapping pyproject.toml gives an installed wheel.
_root = _Path(__file__).resolve().parent.parent
if (_root / "kernels" / "__init__.py").is_file() and (_root / "analyses" / "__init__.py").is_file() \
        and (_root / "pyproject.toml").is_file():
    __path__.append(str(_root))  # noqa: F821 - __path__ is the package's module search path
