"""Bytes a socket's kernel buffer still holds to send (Linux ``SIOCOUTQ``, the same request as ``TIOCOUTQ``).

A transport hands bytes to the kernel only once a share of the socket's buffer is free (a TCP buffer may grow to
several MB), so what the transport holds may not move for a second while its peer reads steadily; the two
together do (trials FN, FW).
"""

from __future__ import annotations

import contextlib
import fcntl
import socket
import struct
import termios


def unsent_in_socket(sock: socket.socket | None) -> int:
    """Bytes ``sock`` holds that its peer has not taken yet; 0 for none, a closed socket, or where the system cannot
    tell. Raises nothing."""
    if sock is None:
        return 0
    with contextlib.suppress(OSError, ValueError, TypeError):
        size: int = struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, b"\0\0\0\0"))[0]
        return size
    return 0
