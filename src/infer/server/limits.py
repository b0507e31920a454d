"""What one HTTP client may cost the server: body size, how long its headers and body may take, how many
connections one API server keeps open, how many responses it keeps for /v1/responses, and how long a stopping
server waits for the requests it is serving (`infer serve --max-request-body-mb`, `--header-timeout-s`,
`--body-timeout-s`, `--body-deadline-s`, `--max-connections`, `--keep-alive-timeout-s`, `--responses-store-size`,
`--shutdown-timeout-s`; docs/serving.md)."""

from __future__ import annotations

import resource
from dataclasses import dataclass, field

from infer.server.access import AccessPolicy

MIB = 1 << 20
BODY_BYTES_PER_CONTEXT_TOKEN = 256  # JSON-escaped text is <= ~24 bytes a token; the rest is room for batches, schemas
MIN_BODY_BYTES = 1 * MIB
LARGE_TEXT_CHARS = 16_384  # text longer than this is tokenized on a worker thread, not on the event loop
RESERVED_FDS = 256  # file descriptors an API server keeps for what is not a client connection (ZMQ, files, threads)
MIN_CONNECTIONS = 64
OPEN_FILES_WANTED = 65_536  # the soft open-file limit a server raises itself to (as far as the hard limit allows)


@dataclass(frozen=True)
class ServerLimits:
    """One API server's limits; None for the body cap means "sized from the context length"."""

    max_request_body_mb: float | None = None
    header_timeout_s: float = 10.0  # a connection's request line and headers, from its first byte (or its opening)
    body_timeout_s: float = 30.0  # the longest wait for the next piece of a request body
    body_deadline_s: float = 120.0  # the longest a whole request body may take, however it trickles
    max_connections: int | None = None  # open connections per API server; None: from the file-descriptor limit
    keep_alive_timeout_s: float = 5.0  # an idle keep-alive connection is closed after this (uvicorn's timeout)
    shutdown_timeout_s: float = 30.0  # SIGTERM: in-flight requests get this long, then are aborted
    access: AccessPolicy = field(default_factory=AccessPolicy)  # who may call: API key, CORS origins, Host names
    responses_store_size: int = 1000  # /v1/responses kept for previous_response_id and GET, per API server

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "body_deadline_s", "keep_alive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}: must be > 0")
        if self.shutdown_timeout_s < 0:
            raise ValueError(f"--shutdown-timeout-s={self.shutdown_timeout_s}: must be >= 0")
        if self.max_request_body_mb is not None and not self.max_request_body_mb > 0:
            raise ValueError(f"--max-request-body-mb={self.max_request_body_mb}: must be > 0")
        if self.max_connections is not None and self.max_connections < 1:
            raise ValueError(f"--max-connections={self.max_connections}: must be >= 1")
        if self.responses_store_size < 0:
            raise ValueError(f"--responses-store-size={self.responses_store_size}: must be >= 0")

    def connection_cap(self) -> int:
        """`--max-connections`, or RESERVED_FDS below this process's file-descriptor limit (at least 64)."""
        if self.max_connections is not None:
            return self.max_connections
        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
        return max(MIN_CONNECTIONS, soft - RESERVED_FDS) if soft != resource.RLIM_INFINITY else 1 << 16

    def body_bytes(self, max_seq_len: int) -> int:
        """The largest request body accepted: the flag, or 256 bytes per token of context (at least 1 MiB)."""
        if self.max_request_body_mb is not None:
            return int(self.max_request_body_mb * MIB)
        return max(MIN_BODY_BYTES, max_seq_len * BODY_BYTES_PER_CONTEXT_TOKEN)


def raise_open_file_limit(wanted: int = OPEN_FILES_WANTED) -> int:
    """Raise this process's soft open-file limit towards `wanted` (never above the hard limit, never lowering it);
    the soft limit now. Many shells start at 1,024, which would cap an API server at 768 connections: each stream
    is a socket. Children (the API servers, the cores) inherit it."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):  # a sandbox may refuse; the connection cap then follows the old limit
            return soft
        return target
    return soft
