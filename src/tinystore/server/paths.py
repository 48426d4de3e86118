"""Where a store's server can be reached: ``DIR/server/`` (mode 0700) and its Unix socket.

When ``DIR/server/sock`` is too long for a socket address (``sun_path`` holds 108 bytes on Linux), the
socket goes to ``$XDG_RUNTIME_DIR/tinystore/`` or ``/tmp/tinystore-<uid>/`` (mode 0700), named by a hash of
the directory, and ``DIR/server/address`` says where.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

MAX_SOCKET_PATH = 100


def make_directory(path: Path, what: str) -> None:
    """Make the store's directory ``path`` (and its parents) when missing. ``what`` starts the error message.

    Raises ``InvalidError`` when ``path`` or a parent is not a directory or the OS cannot make it (a read-only
    or virtual file system), and ``PermissionError`` as it is (the caller says it its own way)."""
    from ..errors import InvalidError

    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InvalidError(f"{what}: {path} is not a directory") from None
    except PermissionError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            from .dirlock import storage_error

            raise storage_error(f"{what}: cannot make the store's directory {path}", exc) from None
        raise InvalidError(f"{what}: cannot make the store's directory {path}: {exc.strerror or exc}") from None


def server_dir(directory: Path) -> Path:
    """``DIR/server``, created with mode 0700 (only its user can enter)."""
    d = directory / "server"
    try:
        d.mkdir(parents=True, exist_ok=True)
        os.chmod(d, 0o700)
    except PermissionError:
        raise  # the caller names the store and this process's user
    except OSError as exc:
        from .dirlock import storage_error

        raise storage_error(f"store {directory}: cannot make {d}", exc) from None
    return d


def socket_path(directory: Path) -> Path:
    """The Unix socket of ``directory``'s server (deterministic, so clients can find it without a file)."""
    directory = directory.resolve()
    p = directory / "server" / "sock"
    if len(os.fsencode(p)) <= MAX_SOCKET_PATH:
        return p
    digest = hashlib.sha256(os.fsencode(directory)).hexdigest()[:24]
    runtime = os.environ.get("XDG_RUNTIME_DIR")
    base = (
        Path(runtime) / "tinystore"
        if runtime and os.path.isdir(runtime)
        else Path(tempfile.gettempdir()) / f"tinystore-{os.getuid()}"
    )
    return base / f"{digest}.sock"


def prepare_socket_dir(path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.chmod(path.parent, 0o700)


def address_file(directory: Path) -> Path:
    return directory / "server" / "address"


def write_address(directory: Path, info: dict[str, Any]) -> None:
    """Write ``DIR/server/address`` atomically (JSON: pid, socket, tcp, version, protocol, started)."""
    path = address_file(directory)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(info, indent=2))
    os.replace(tmp, path)


def read_address(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(address_file(directory).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None
