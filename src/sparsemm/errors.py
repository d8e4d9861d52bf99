"""The one exception type for errors a user can cause (bad file, wrong dimension, ...)."""

from __future__ import annotations


class SparsemmError(Exception):
    """A user-facing error: the message says what went wrong and what to do.

    The CLI prints it on one line without a traceback and exits with status 2.
    """


def require_extra(module: str, extra: str) -> None:
    """Raise a SparsemmError naming the pip extra that provides ``module``."""
    raise SparsemmError(
        f"this feature needs the '{module}' package: pip install 'sparsemm[{extra}]'"
    )
