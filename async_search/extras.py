"""The optional extras: a framework imported where it is first needed, and, where it is
not installed, an error that names the extra to install.

The core imports with NumPy alone; a name that needs one of setup.cfg's extras
(``torch``, ``jax``, ``tf``, ``ray``, ``http``, ``grpc``, ``plot``, ``main``) imports it
on first use.

Example:
    >>> missing = ModuleNotFoundError("No module named 'torch'", name="torch")
    >>> print(extra_error(missing, "TorchModel"))  # doctest: +NORMALIZE_WHITESPACE
    TorchModel needs torch, which is not installed: pip install 'async_search[torch]'
    (in a clone of the repository: pip install -e '.[torch]')
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: The extra that installs each optional top-level module.
EXTRA_OF = {"torch": "torch", "jax": "jax", "jaxlib": "jax", "tensorflow": "tf",
            "keras": "tf", "ray": "ray", "aiohttp": "http", "prometheus_client": "http",
            "grpc": "grpc", "tritonclient": "grpc", "matplotlib": "plot",
            "seaborn": "plot", "pandas": "plot", "tqdm": "plot", "absl": "main",
            "uvloop": "main"}


def is_missing_extra(error: ModuleNotFoundError) -> bool:
    """Whether the module not found is one of the extras' frameworks itself (not a
    module of its own: torch._C missing is an installed framework that is broken)."""
    return error.name in EXTRA_OF


def extra_error(error: ModuleNotFoundError, what: str) -> ModuleNotFoundError:
    """The error to raise for ``error``: naming the extra to install where the module
    not found is an extra's; ``error`` itself otherwise (a module that an installed
    framework lacks, or a caller's typo, is reported as it is)."""
    if not is_missing_extra(error):
        return error
    missing, extra = error.name, EXTRA_OF[error.name]
    return ModuleNotFoundError(
        f"{what} needs {missing}, which is not installed: pip install "
        f"'async_search[{extra}]' (in a clone of the repository: pip install -e "
        f"'.[{extra}]')", name=error.name)


def import_extra(module: str, what: str) -> ModuleType:
    """``module`` (an extra's, as in ``EXTRA_OF``), imported; where it is not installed,
    a ``ModuleNotFoundError`` that names the extra and ``what`` needs it.

    Example:
        >>> import_extra("numpy", "the core").__name__  # any module imports
        'numpy'
    """
    top = module.partition(".")[0]
    try:
        importlib.import_module(top)
    except ModuleNotFoundError as e:
        if e.name != top:
            raise  # the framework is there and lacks something of its own
        raise extra_error(e, what) from e
    return importlib.import_module(module)
