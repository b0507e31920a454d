"""Who may call the server (`infer serve --api-key`, `--allowed-origins`, `--allowed-hosts`), checked before a
request reaches a route (`access_middleware.py`).

- Host names: on a loopback address only requests whose Host header names a loopback host (localhost, 127.0.0.1,
  [::1], any port) or one of `--allowed-hosts` are served, so a web page whose own name an attacker points at
  127.0.0.1 (DNS rebinding) cannot reach the server through a browser; 421 otherwise.
- CORS: browsers may call the server from `--allowed-origins` (none by default); their preflights are answered
  before the key is checked, since a preflight never carries one.
- The API key: every route but /health, /metrics and /version needs `Authorization: Bearer KEY`; 401 otherwise,
  the key compared in constant time.
Every refusal is OpenAI's error shape.
"""

from __future__ import annotations

import hmac
import ipaddress
import re
from dataclasses import dataclass

OPEN_PATHS = frozenset({"/health", "/metrics", "/version"})  # no key needed: probes, scrapers, version checks
ORIGIN = re.compile(r"[a-z][a-z0-9+.-]*://[^/\s]+")  # scheme://host[:port], as a browser's Origin header has it


def host_name(host: str) -> str:
    """A Host header's (or a bind address's) name without its port, lower-cased: "[::1]:8000" -> "::1"."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1 : host.find("]")] if "]" in host else host[1:]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def is_loopback(host: str) -> bool:
    """Whether a name or address is this machine's loopback (localhost, 127.0.0.0/8, ::1)."""
    name = host_name(host)
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


@dataclass(frozen=True)
class AccessPolicy:
    """The access rules of one server: `api_key` (None: open), browser origins allowed by CORS ("*": any), Host
    names allowed besides the loopback ones ("*": any), and the address the server binds (loopback: Host checked)."""

    api_key: str | None = None
    allowed_origins: tuple[str, ...] = ()
    allowed_hosts: tuple[str, ...] = ()
    bind_host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        if self.api_key is not None and not self.api_key.strip():
            raise ValueError("--api-key: must not be empty")
        for origin in self.allowed_origins:
            if origin != "*" and not ORIGIN.fullmatch(origin):
                raise ValueError(f"--allowed-origins: {origin!r} is not an origin: give scheme://host[:port] as a "
                                 "browser sends it (no path, no trailing slash), or *")
        for host in self.allowed_hosts:
            if host != "*" and (not host_name(host) or "/" in host):
                raise ValueError(f"--allowed-hosts: {host!r} is not a host name (give names, e.g. example.com, or *)")
        object.__setattr__(self, "allowed_hosts", tuple(h if h == "*" else host_name(h) for h in self.allowed_hosts))

    @property
    def checks_host(self) -> bool:
        """Host headers are checked on a loopback address, or anywhere `--allowed-hosts` names hosts."""
        return "*" not in self.allowed_hosts and (is_loopback(self.bind_host) or bool(self.allowed_hosts))

    def host_allowed(self, host: str) -> bool:
        return is_loopback(host) or host_name(host) in self.allowed_hosts

    def key_matches(self, authorization: bytes | None) -> bool:
        """Whether an Authorization header carries the key as a bearer token (compared in constant time)."""
        assert self.api_key is not None
        scheme, _, token = (authorization or b"").partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), self.api_key.encode())
