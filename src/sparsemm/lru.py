"""A bounded, thread-safe least-recently-used cache (bottom layer: imports nothing of sparsemm
but its error type). Every text cache of the query path is one, so a stream of distinct
queries cannot grow memory without bound."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

from sparsemm.errors import SparsemmError


class LRUCache(OrderedDict[Any, Any]):
    """A dict that keeps only its ``maxsize`` most recently used entries (a read or a write
    is a use); the oldest is dropped when a new key would exceed the limit.

    Thread-safe: every access holds the cache's own lock (a read reorders the entries, so
    even reads mutate), which lets the web server run searches on several threads at once
    over one strategy context without serialising whole searches.
    """

    def __init__(self, maxsize: int) -> None:
        super().__init__()
        if maxsize < 1:
            raise SparsemmError(f"cache size must be at least 1, got {maxsize}")
        self.maxsize = maxsize
        self._lock = threading.RLock()

    def __getitem__(self, key: Any) -> Any:
        with self._lock:
            value = super().__getitem__(key)
            self.move_to_end(key)
            return value

    def __setitem__(self, key: Any, value: Any) -> None:
        with self._lock:
            super().__setitem__(key, value)
            self.move_to_end(key)
            while len(self) > self.maxsize:
                self.popitem(last=False)

    def __contains__(self, key: object) -> bool:
        with self._lock:
            return super().__contains__(key)

    def get(self, key: Any, default: Any = None) -> Any:
        with self._lock:
            return self[key] if super().__contains__(key) else default

    def setdefault(self, key: Any, default: Any = None) -> Any:
        with self._lock:
            if super().__contains__(key):
                return self[key]
            self[key] = default
            return default

    def clear(self) -> None:
        with self._lock:
            super().clear()
