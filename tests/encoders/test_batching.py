"""BatchingTextEncoder: concurrent calls share forward passes and get their own rows."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from sparsemm.encoders.batching import BatchingTextEncoder


class SlowEncoder:
    """Embeds a text as a fixed function of its characters; each call takes ``delay`` s and
    is recorded, so a test sees how calls were grouped."""

    name = "slow"
    dim = 8

    def __init__(self, delay: float = 0.05, fail_on: str | None = None) -> None:
        self.delay, self.fail_on = delay, fail_on
        self.calls: list[list[str]] = []

    def encode_text(
        self,
        texts: Sequence[str],
        batch_size: int = 64,
        normalize: bool = True,
        progress: bool = False,
    ) -> np.ndarray:
        texts = list(texts)
        self.calls.append(texts)
        time.sleep(self.delay)
        if self.fail_on is not None and self.fail_on in texts:
            raise ValueError(f"cannot encode {self.fail_on!r}")
        out = np.zeros((len(texts), self.dim), np.float32)
        for i, t in enumerate(texts):
            for j, ch in enumerate(t.encode()):
                out[i, j % self.dim] += ch
        if normalize:
            out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
        return out


def _in_threads(enc: BatchingTextEncoder, jobs: list[list[str]]) -> list[np.ndarray]:
    out: list[np.ndarray | None] = [None] * len(jobs)
    start = threading.Barrier(len(jobs))

    def run(i: int) -> None:
        start.wait()
        out[i] = enc.encode_text(jobs[i])

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(o is not None for o in out)
    return [o for o in out if o is not None]


def test_concurrent_calls_share_passes_and_get_their_own_rows() -> None:
    base = SlowEncoder()
    enc = BatchingTextEncoder(base, max_batch=64)
    jobs = [[f"dog {i}", f"cat {i}"] for i in range(12)]
    got = _in_threads(enc, jobs)
    ref = SlowEncoder(delay=0)
    for texts, rows in zip(jobs, got, strict=True):
        np.testing.assert_allclose(rows, ref.encode_text(texts), rtol=1e-6)
    # the first call runs alone; the rest arrive while it encodes and go in one pass
    assert len(base.calls) < len(jobs)
    assert enc.batches == len(base.calls) and enc.texts == 24
    enc.close()


def test_batches_hold_at_most_max_batch_texts_and_dedupe() -> None:
    base = SlowEncoder()
    enc = BatchingTextEncoder(base, max_batch=5)
    jobs = [["same", f"t{i}"] for i in range(10)]
    got = _in_threads(enc, jobs)
    assert all(len(c) <= 5 for c in base.calls)
    assert sum(c.count("same") for c in base.calls) == len(base.calls)  # once per pass
    for texts, rows in zip(jobs, got, strict=True):
        np.testing.assert_allclose(rows, SlowEncoder(delay=0).encode_text(texts), rtol=1e-6)
    enc.close()


def test_other_calls_go_straight_through() -> None:
    base = SlowEncoder(delay=0)
    enc = BatchingTextEncoder(base, max_batch=2)
    raw = enc.encode_text(["a b c"], normalize=False)
    assert np.linalg.norm(raw) > 1.5  # not normalised: the base's own call
    many = enc.encode_text(["x", "y", "z"])  # more than max_batch
    assert many.shape == (3, 8)
    assert enc.encode_text([]).shape == (0, 8)
    assert enc.batches == 0 and enc.dim == 8 and enc.name == "slow"


def test_an_encoder_error_reaches_every_caller_of_that_pass_and_the_worker_goes_on() -> None:
    base = SlowEncoder(fail_on="boom")
    enc = BatchingTextEncoder(base, max_batch=64)
    with pytest.raises(ValueError, match="boom"):
        enc.encode_text(["boom"])
    assert enc.encode_text(["fine"]).shape == (1, 8)  # the worker survived
    enc.close()
    with pytest.raises(RuntimeError, match="closed"):
        enc.encode_text(["late"])


def test_a_failing_call_does_not_fail_the_calls_batched_with_it() -> None:
    base = SlowEncoder(delay=0.3, fail_on="boom")
    enc = BatchingTextEncoder(base, max_batch=64)
    # keep the worker busy while the calls queue, so they are taken as one batch
    busy = threading.Thread(target=enc.encode_text, args=(["warm"],))
    busy.start()
    time.sleep(0.1)
    jobs = [["boom"]] + [[f"ok {i}"] for i in range(6)]
    out: list[object] = [None] * len(jobs)

    def run(i: int) -> None:
        try:
            out[i] = enc.encode_text(jobs[i])
        except ValueError as exc:
            out[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(jobs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    busy.join()
    assert isinstance(out[0], ValueError)
    for texts, rows in zip(jobs[1:], out[1:], strict=True):
        assert isinstance(rows, np.ndarray)
        np.testing.assert_allclose(rows, SlowEncoder(delay=0).encode_text(texts), rtol=1e-6)
    together = {t for j in jobs for t in j}
    assert any(set(c) == together for c in base.calls)  # one shared pass failed, then alone
    enc.close()


def test_rejects_a_batch_size_below_one() -> None:
    with pytest.raises(ValueError):
        BatchingTextEncoder(SlowEncoder(), max_batch=0)
