"""Each reach into a library's internals, behind one door: a small module per library that names the version it was
written for (:func:`check_version` warns once on another one) and that a test checks against the installed library,
so that an upgrade fails a test instead of a run."""

from __future__ import annotations

import warnings
from importlib.metadata import version

_warned: set[str] = set()


def check_version(package: str, written_for: str) -> bool:
    """True when ``package``'s installed version starts with ``written_for`` (e.g. "0.19."); else warn once."""
    installed = version(package)
    if installed.startswith(written_for):
        return True
    if package not in _warned:
        _warned.add(package)
        warnings.warn(f"mars2 reaches into {package} internals written for {written_for}x; {installed} is installed "
                      f"(the project pins it in pyproject.toml). If something breaks, see mars2/shims/.", stacklevel=2)
    return False
