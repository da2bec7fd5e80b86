"""Answers already computed, kept by the server: an equal request is answered from memory.

An estimate or a fit is a pure function of the validated request and of the folders the
server was started with (read once per process: catalog and hardware loaders are cached), so
the JSON bytes of a 200 answer are kept, keyed by the operation and the request's fields, and
an equal request (the same job asked again: a scheduler's poll, the page redrawn) is answered on
the event loop without a worker: no computation, so neither `max_concurrent` nor `timeout_s`
is involved. Errors are never kept (they are answered anew). The memory is bounded: the least
recently used answers go first once keys and bodies pass `max_bytes`.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

MAX_ANSWER_BYTES = 32 * 2**20
"""Bytes of keys and bodies kept (an estimate's answer is about 4 KiB: some 8,000 answers)."""


def answer_key(operation: str, fields: Mapping[str, Any]) -> str:
    """One text per distinct request: the operation and its validated fields, sorted."""
    return json.dumps([operation, fields], sort_keys=True, separators=(",", ":"))


class Answers:
    """A least-recently-used store of answers' bytes, at most `max_bytes` of keys and bodies."""

    def __init__(self, *, max_bytes: int = MAX_ANSWER_BYTES) -> None:
        self.max_bytes = max_bytes
        self.num_bytes = 0
        self._kept: OrderedDict[str, bytes] = OrderedDict()

    def __len__(self) -> int:
        return len(self._kept)

    async def get(self, key: str, compute: Callable[[], Awaitable[bytes]]) -> bytes:
        """The kept answer for `key`, else `compute()`'s, kept when it returns (an exception
        passes through, nothing kept)."""
        kept = self._kept.get(key)
        if kept is not None:
            self._kept.move_to_end(key)
            return kept
        body = await compute()
        self._put(key, body)
        return body

    def _put(self, key: str, body: bytes) -> None:
        size = len(key) + len(body)
        if size > self.max_bytes or key in self._kept:  # too large to keep; or kept meanwhile
            return
        self._kept[key] = body
        self.num_bytes += size
        while self.num_bytes > self.max_bytes:
            old_key, old_body = self._kept.popitem(last=False)
            self.num_bytes -= len(old_key) + len(old_body)
