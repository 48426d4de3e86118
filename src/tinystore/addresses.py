"""TCP addresses of a store, ``tcp://HOST:PORT`` and ``tls://HOST:PORT``, read the one way for ``connect`` and for
``tinystore serve --listen`` (an IPv6 host in brackets, as RFC 3986 writes it: ``tcp://[::1]:7600``)."""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import urlparse

from .errors import InvalidError

_BRACKETED = re.compile(r"\[[^\]]*\](:[0-9]*)?")


def parse_address(address: object, what: str, lowest_port: int = 1) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of ``address``, the scheme in lower case (as URLs have it). ``what`` starts the
    message (``"connect: address"``); ``lowest_port``: 0 where the system may choose the port (a listener).

    Raises ``InvalidError`` naming what is wrong: not a str, no scheme or an unknown one, a user or password (never
    shown: it may be a password), a path, query or fragment, an IPv6 host out of brackets (the address it meant
    suggested), anything after a bracketed host but its port, no host, no port, a port out of range."""
    shown = address if not isinstance(address, str) or len(address) <= 100 else address[:97] + "..."

    def bad(problem: str) -> InvalidError:
        return InvalidError(f"{what} {shown!r}: use tcp://HOST:PORT or tls://HOST:PORT ({problem})")

    if not isinstance(address, str):
        raise bad(f"expected a str, got {type(address).__name__}")
    if len(address) > ADDRESS_MAX:
        raise bad(f"{len(address)} characters: an address is at most {ADDRESS_MAX}")
    if any(c.isspace() or not c.isprintable() for c in address):
        # (urlparse drops tabs and newlines anywhere, and a host with a space or a NUL cannot resolve: trial DD)
        raise bad("it holds whitespace or a control character")
    try:
        u = urlparse(address)
    except ValueError as exc:  # e.g. an unclosed [ of an IPv6 address
        raise bad(str(exc)) from None
    if not u.scheme:
        raise bad("no scheme")
    if not u.netloc:
        raise bad(
            "no host and port after the scheme" if address.rstrip("/").endswith(":") else "no // after the scheme"
        )
    if "@" in u.netloc:  # never shown: it may hold a password
        shown = address.replace(u.netloc.rpartition("@")[0], "…", 1)
        raise bad("a user or password in the address is not used: tokens go apart, connect(token=...), serve --tokens")
    if u.scheme not in ("tcp", "tls"):
        raise bad(f"unknown scheme {u.scheme + '://'!r}")
    for part, value in (("a path", u.path + (";" + u.params if u.params else "")), ("a query", u.query)):
        if value and value != "/":
            raise bad(f"{part} ({value!r}) has no meaning here")
    if u.fragment or address.endswith("#"):
        raise bad(f"a fragment ({'#' + u.fragment!r}) has no meaning here")
    netloc = u.netloc
    if netloc.startswith("["):
        if _BRACKETED.fullmatch(netloc) is None:
            raise bad(f"{netloc!r}: after the bracketed host comes only ':PORT'")
    elif netloc.count(":") > 1:
        raise bad(_out_of_brackets(u.scheme, netloc))
    if not u.hostname:
        raise bad("no host")
    host = u.hostname
    if netloc.startswith("["):
        host = host.replace("%25", "%", 1)  # a zone id as RFC 6874 writes it in a URI: fe80::1%25eth0
    else:
        problem = _bad_host_name(host)
        if problem:
            raise bad(f"the host {_short(host)!r} {problem}")
    try:
        port = u.port
    except ValueError:
        port = -1
    if port is None:
        raise bad("no port")
    if not lowest_port <= port <= 65535:
        raise bad(f"port {netloc.rpartition(':')[2]!r} is not a number from {lowest_port} to 65535")
    return u.scheme, host, port


ADDRESS_MAX = 300
"""The longest address: a host name is at most 253 characters (RFC 1035), and a scheme and a port a few more."""


def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


def _bad_host_name(host: str) -> str:
    """Why ``host`` (not bracketed) cannot be looked up, or ``""``: over 253 characters, an empty label (``a..b``),
    a label over 63 characters (RFC 1035), or not encodable as IDNA (the resolver would raise ``UnicodeError``)."""
    try:
        ipaddress.ip_address(host)
        return ""
    except ValueError:
        pass
    if len(host) > 253:
        return f"is {len(host)} characters: a host name is at most 253"
    labels = host.removesuffix(".").split(".")
    if any(not label for label in labels):
        return "has an empty label (two dots in a row, or a dot first)"
    if any(len(label) > 63 for label in labels):
        return "has a label over 63 characters"
    try:
        host.encode("idna")
    except UnicodeError:
        return "is not a host name (it does not encode as IDNA)"
    return ""


def _out_of_brackets(scheme: str, netloc: str) -> str:
    """Why ``netloc``, with more than one ``:`` and no brackets, is refused: an IPv6 address (with its port, or
    none) told to go in brackets; anything else, not a HOST:PORT."""
    # (its last part a port first: "::1:7600" is an IPv6 address too, but [::1]:7600 is what was meant)
    for host, port in (tuple(netloc.rsplit(":", 1)), (netloc, "PORT")):
        try:
            ipaddress.IPv6Address(host.partition("%")[0])
        except ValueError:
            continue
        if port == "PORT" or port.isdigit():
            return f"an IPv6 address goes in brackets: {scheme}://[{host}]:{port}"
    return f"{netloc!r} is not HOST:PORT (more than one ':')"
