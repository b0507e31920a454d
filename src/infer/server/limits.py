"""What one HTTP client may cost the server: body size, how long its headers and body may take, and how long a
stopping server waits for the requests it is serving (`infer serve --max-request-body-mb`, `--header-timeout-s`,
`--body-timeout-s`, `--keep-alive-timeout-s`, `--shutdown-timeout-s`; docs/serving.md)."""

from __future__ import annotations

from dataclasses import dataclass

MIB = 1 << 20
BODY_BYTES_PER_CONTEXT_TOKEN = 256  # JSON-escaped text is <= ~24 bytes a token; the rest is room for batches, schemas
MIN_BODY_BYTES = 1 * MIB
LARGE_TEXT_CHARS = 16_384  # text longer than this is tokenized on a worker thread, not on the event loop


@dataclass(frozen=True)
class ServerLimits:
    """One API server's limits; None for the body cap means "sized from the context length"."""

    max_request_body_mb: float | None = None
    header_timeout_s: float = 10.0  # a connection's request line and headers, from its first byte (or its opening)
    body_timeout_s: float = 30.0  # the longest wait for the next piece of a request body
    keep_alive_timeout_s: float = 5.0  # an idle keep-alive connection is closed after this (uvicorn's timeout)
    shutdown_timeout_s: float = 30.0  # SIGTERM: in-flight requests get this long, then are aborted

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s", "keep_alive_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"--{name.replace('_', '-')}={getattr(self, name)}: must be > 0")
        if self.shutdown_timeout_s < 0:
            raise ValueError(f"--shutdown-timeout-s={self.shutdown_timeout_s}: must be >= 0")
        if self.max_request_body_mb is not None and not self.max_request_body_mb > 0:
            raise ValueError(f"--max-request-body-mb={self.max_request_body_mb}: must be > 0")

    def body_bytes(self, max_seq_len: int) -> int:
        """The largest request body accepted: the flag, or 256 bytes per token of context (at least 1 MiB)."""
        if self.max_request_body_mb is not None:
            return int(self.max_request_body_mb * MIB)
        return max(MIN_BODY_BYTES, max_seq_len * BODY_BYTES_PER_CONTEXT_TOKEN)
