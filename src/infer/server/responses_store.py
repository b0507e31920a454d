"""Stored responses (`store`, the default): what GET /v1/responses/{id} returns and previous_response_id continues.

Kept in this API server process's memory, the `--responses-store-size` most recently used; with several API server
processes a response is found only by the process that made it.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from infer.server.responses_protocol import Item


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]  # the response object as it was sent
    history: tuple[Item, ...]  # the conversation it ends: earlier items, its input, its output (no instructions)


class ResponseStore:
    """A bounded LRU map of response id -> StoredResponse; size 0 stores nothing."""

    def __init__(self, size: int) -> None:
        self.size = size
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response_id: str, stored: StoredResponse) -> None:
        if self.size <= 0:
            return
        self._entries[response_id] = stored
        self._entries.move_to_end(response_id)
        while len(self._entries) > self.size:
            self._entries.popitem(last=False)

    def get(self, response_id: str) -> StoredResponse | None:
        stored = self._entries.get(response_id)
        if stored is not None:
            self._entries.move_to_end(response_id)
        return stored
