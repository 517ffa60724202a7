"""Errors that end a command, each carrying the exit code the CLI returns for it.

Library code raises these instead of printing and exiting, so the same functions stay usable
from notebooks and tests; ``jfa_prof.cli`` turns them into a one-line message and the code.
Exit codes are part of the interface (scripts and CI branch on them): keep them stable.
"""
from __future__ import annotations


class JfaProfError(Exception):
    """Base of the errors a user can act on; anything else is a bug and keeps its traceback."""

    exit_code: int = 1

    def __init__(self, message: str, *, hint: str | None = None, exit_code: int | None = None):
        super().__init__(message)
        self.message = message
        self.hint = hint
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message if self.hint is None else f"{self.message} ({self.hint})"


class BadInputError(JfaProfError):
    """An argument, file or shape the command cannot work with."""

    exit_code = 2


class NoGpuError(JfaProfError):
    """The command needs a CUDA GPU (sm_90) and none is usable."""

    exit_code = 3


class ToolMissingError(JfaProfError):
    """An external tool (ncu, compute-sanitizer, ptxas) is not installed or does not run."""

    exit_code = 4


class TlxUnavailableError(JfaProfError):
    """``triton.language.extra.tlx`` does not import: fbtriton missing or clobbered by upstream."""

    exit_code = 5


def read_json_file(path, what: str, hint: str | None = None):
    """A JSON document from `path`; BadInputError naming `what` was expected when it is missing
    or not JSON, so every result reader fails the same clear way."""
    import json
    from pathlib import Path

    path = Path(path)
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise BadInputError(f"{path} does not exist", hint=hint) from None
    except (OSError, ValueError) as e:
        raise BadInputError(f"{path} is not a JSON file ({what} expected): {e}", hint=hint) from None
