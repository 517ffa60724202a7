"""Writing output files: checked before the work that fills them, and replaced whole.

Every file a command writes (pages, trace JSON, result files, traces) goes through
:func:`write_atomic`: the bytes go to a temporary file beside the target, are flushed to disk,
and the temporary file is renamed over the target. A reader never sees half a file, and a write
that fails (disk full, file size limit) leaves the earlier file as it was and no partial one.

:func:`check_writable` is the same question asked up front, so a command that runs for minutes
refuses an impossible ``--out`` before it starts rather than after. Both raise BadInputError
(one line, exit code 2) naming the path and the reason, never a bare OSError.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Callable, IO

from jfa_prof.errors import BadInputError

__all__ = ["check_writable", "write_atomic"]


def _reason(err: OSError) -> str:
    return err.strerror or str(err) or type(err).__name__


def _cannot(path: Path, what: str, err: OSError | str) -> BadInputError:
    reason = err if isinstance(err, str) else _reason(err)
    return BadInputError(f"cannot write {what} {path}: {reason}")


def _new_file_mode(path: Path) -> int:
    # mkstemp makes its file private (0600); the result should have the mode any other new file
    # gets here, or keep the one of the file it replaces.
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def check_writable(path: str | os.PathLike, what: str = "output") -> Path:
    """``path`` as a Path once it is known that a file can be made there; BadInputError otherwise.

    Creates missing parent directories (as the write would), and makes and removes a temporary
    file beside the target: permissions, read-only mounts and pseudo file systems all answer
    only to an actual attempt.
    """
    path = Path(path)
    if path.is_dir():
        raise _cannot(path, what, "it is a directory")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as e:
        raise _cannot(path, what, e) from None
    os.close(fd)
    os.unlink(tmp)
    return path


def write_atomic(path: str | os.PathLike, data: str | bytes | Callable[[IO[bytes]], None], *,
                 what: str = "output", encoding: str = "utf-8") -> Path:
    """Write ``data`` (text, bytes, or a function that writes to a binary file object) to ``path``
    all at once: beside it first, synced, then renamed over it."""
    path = check_writable(path, what)
    mode = _new_file_mode(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            if callable(data):
                data(f)
            else:
                f.write(data.encode(encoding) if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise _cannot(path, what, e) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
