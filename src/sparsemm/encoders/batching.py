"""Cross-request batching of query-text encoding, for a server answering many searches at once.

A transformer text encoder on a CPU costs about the same for one short text as for several:
at batch size 1 the forward pass is bound by reading the weights, not by the arithmetic.
:class:`BatchingTextEncoder` wraps an encoder so that ``encode_text`` calls made at the same
time by many threads (a web server's request threads) share forward passes: a call puts its
texts in a queue and waits; one worker thread takes everything queued (up to ``max_batch``
texts), encodes it in one call of the wrapped encoder and hands every caller its rows. No
call waits on a timer: a batch is whatever arrived while the previous one was encoding, so a
lone request is encoded at once and a crowd is encoded together.

Rows are the wrapped encoder's own (same model, same normalisation); a text's float32
embedding can differ from the one it gets alone in the last bits, as with any batch size
(the matrix products are blocked by shape), which the benchmarks' batch runs share.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from sparsemm.encoders.base import as_text_encoder

MAX_BATCH = 32  # texts per forward pass: past ~16 short texts the cost per text is flat


@dataclass
class _Pending:
    texts: list[str]
    done: threading.Event = field(default_factory=threading.Event)
    result: np.ndarray | None = None
    error: BaseException | None = None


class BatchingTextEncoder:
    """``base`` (an encoder with ``encode_text``) whose default text calls from concurrent
    threads are encoded together by one worker thread. Everything but ``encode_text`` is
    ``base``'s own; calls with non-default arguments, or more texts than ``max_batch``, go
    to ``base`` directly."""

    def __init__(self, base: Any, max_batch: int = MAX_BATCH) -> None:
        if max_batch < 1:
            raise ValueError("max_batch must be >= 1")
        self.base = base
        self.max_batch = int(max_batch)
        self._queue: deque[_Pending] = deque()
        self._cond = threading.Condition()
        self._worker: threading.Thread | None = None
        self._closed = False
        self.batches = 0  # forward passes run by the worker (for tests and benchmarks)
        self.texts = 0  # texts they held

    def __getattr__(self, name: str) -> Any:  # name, dim, encode_image, word_vocabulary, ...
        return getattr(self.base, name)

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        texts = list(texts)
        base = as_text_encoder(self.base)  # a wrong modality fails here, not in the worker
        if not normalize or progress or not texts or len(texts) > self.max_batch:
            return np.asarray(
                base.encode_text(
                    texts, batch_size=batch_size, normalize=normalize, progress=progress
                )
            )
        job = _Pending(texts)
        with self._cond:
            if self._closed:
                raise RuntimeError("this BatchingTextEncoder is closed")
            self._queue.append(job)
            if self._worker is None:
                self._worker = threading.Thread(
                    target=self._run, name="sparsemm-text-batcher", daemon=True
                )
                self._worker.start()
            self._cond.notify()
        job.done.wait()
        if job.error is not None:
            raise job.error
        assert job.result is not None
        return job.result

    def close(self) -> None:
        """Stop the worker once the queue is empty (calls after this raise)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._worker is not None:
            self._worker.join()

    def _take(self) -> list[_Pending] | None:
        """The next batch: queued calls in arrival order while their texts fit
        ``max_batch`` (the first always), or None once closed and drained."""
        with self._cond:
            while not self._queue:
                if self._closed:
                    return None
                self._cond.wait()
            jobs = [self._queue.popleft()]
            n = len(jobs[0].texts)
            while self._queue and n + len(self._queue[0].texts) <= self.max_batch:
                n += len(self._queue[0].texts)
                jobs.append(self._queue.popleft())
            return jobs

    def _run(self) -> None:
        while (jobs := self._take()) is not None:
            try:
                self._encode(jobs)
            except BaseException as exc:
                if len(jobs) == 1:  # never a hang: the caller gets the error
                    jobs[0].error = exc
                    jobs[0].done.set()
                    continue
                # One call's texts failed the batch: encode each call on its own, so only
                # the call that fails gets the error (never a neighbour's).
                for j in jobs:
                    try:
                        self._encode([j])
                    except BaseException as exc_j:
                        j.error = exc_j
                        j.done.set()

    def _encode(self, jobs: list[_Pending]) -> None:
        unique = list(dict.fromkeys(t for j in jobs for t in j.texts))
        emb = np.asarray(self.base.encode_text(unique), dtype=np.float32)
        at = {t: i for i, t in enumerate(unique)}
        self.batches += 1
        self.texts += len(unique)
        for j in jobs:
            j.result = emb[[at[t] for t in j.texts]]
            j.done.set()
