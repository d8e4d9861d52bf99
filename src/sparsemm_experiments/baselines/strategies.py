"""The exclusion baselines of the SR paper's comparison, as strategies over an
:class:`~sparsemm.query.strategies.ExclusionContext` ("Answering Multimodal Exclusion Queries
with Lightweight Sparse Disentangled Representations", Prachi, Bhatia, Bedathur, ICTIR 2025).

Dense, on the items' embeddings:

* ``dense_a`` - cos(emb(A), x): the include term alone (reference point).
* ``slq`` - single-line query: cos(emb("a photo of a A without a B"), x).
* ``avg_emb`` / ``avg_emb_0.5`` - embedding arithmetic cos(emb(A) - w emb(B), x), w = 1, 0.5.

Sparse, generic over any non-negative sparse codes (SR, VDR, SpLiCE, ...):

* ``code_a`` - cos(code(A), x) on the sparse codes: A alone.
* ``paper`` - the SR paper's two-step exclusion retrieval (Sec. 4.3): retrieve the top-K
  items for A by code similarity; the *active* dimensions of an item are the smallest set of
  its dimensions holding a share t of its L1 mass; D_A = union of the active dimensions of
  A's top-K items, D_B likewise for B, D = D_A minus D_B; A's top-K items are re-ranked by
  their mass on D (ties: A's similarity). Re-ranking A's retrieved pool (``pool="topk"``) is
  our reading of "two-step"; ``pool="all"`` ranks every item by its mass on D instead.
* ``code_arith`` - cos(code(A) - w code(B), x): arithmetic on the sparse codes (VDR's
  default).
* ``penalty`` - the soft version of the library's ``filter``: cos(code(A), x) - lam *
  sum_{j in B-dims} b_j x_j with b_j B's (unit-normalised) per-dimension weight, so items are
  demoted by how strongly they carry B rather than dropped.

Registered when imported; the ``sparsemm.strategies`` entry points import this module with
:mod:`sparsemm.query.strategies`, so ``sparsemm search --strategy NAME``, the page and the
benchmarks find them by name.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, ClassVar

import numpy as np

from sparsemm.errors import SparsemmError
from sparsemm.linalg import normalize_rows
from sparsemm.query.strategies.base import Strategy
from sparsemm.query.strategies.registry import register_strategy
from sparsemm.query.strategies.sparse import TermDims

SLQ_TEMPLATE = "a photo of a {a} without a {b}"

# -- dense -----------------------------------------------------------------------------------


class DenseA(Strategy):
    """cos(emb(A), x): the include term alone, B ignored."""

    requires = ("dense", "text_encoder")

    def scores(self, a: str, b: str) -> np.ndarray:
        assert self.ctx.items_dense is not None
        return np.asarray(self.ctx.items_dense @ self.ctx.term_embedding(a), dtype=np.float64)


class SingleLineQuery(Strategy):
    """SLQ: cos(emb("a photo of a A without a B"), x) - negation left to the encoder."""

    requires = ("dense", "text_encoder")
    params: ClassVar[dict[str, Any]] = {"template": SLQ_TEMPLATE}

    def prepare(self, terms: Iterable[str]) -> None:  # SLQ texts are per pair
        pass

    def rank_many(self, pairs: Sequence[tuple[str, str]], k: int) -> np.ndarray:
        self.ctx.embed([self.p["template"].format(a=a, b=b) for a, b in pairs])
        return super().rank_many(pairs, k)

    def scores(self, a: str, b: str) -> np.ndarray:
        assert self.ctx.items_dense is not None
        q = self.ctx.embed([self.p["template"].format(a=a, b=b)])[0]
        return np.asarray(self.ctx.items_dense @ q, dtype=np.float64)


class AvgEmb(Strategy):
    """Embedding arithmetic: cos(emb(A) - w emb(B), x)."""

    requires = ("dense", "text_encoder")
    params: ClassVar[dict[str, Any]] = {"w": 1.0}

    def scores(self, a: str, b: str) -> np.ndarray:
        assert self.ctx.items_dense is not None
        q = self.ctx.term_embedding(a) - self.p["w"] * self.ctx.term_embedding(b)
        return np.asarray(self.ctx.items_dense @ q, dtype=np.float64)


# -- sparse ----------------------------------------------------------------------------------


class CodeA(Strategy):
    """cos(code(A), x) over the sparse codes: A alone."""

    requires = ("codes", "text_encoder", "query_coder")
    kind = "sparse"

    def scores(self, a: str, b: str) -> np.ndarray:
        return self.ctx.code_scores(self.ctx.term_code(a))


class CodeArith(Strategy):
    """cos(code(A)/|code(A)| - w code(B)/|code(B)|, x) over the sparse codes."""

    requires = ("codes", "text_encoder", "query_coder")
    kind = "sparse"
    params: ClassVar[dict[str, Any]] = {"w": 0.5}

    def scores(self, a: str, b: str) -> np.ndarray:
        qa, qb = normalize_rows(self.ctx.term_code(a)), normalize_rows(self.ctx.term_code(b))
        return np.asarray(self.ctx.codes_unit @ (qa - self.p["w"] * qb), dtype=np.float64)


class PaperTwoStep(TermDims):
    """SR paper Sec. 4.3: D = D_A minus D_B; rank by mass on D (see module docstring)."""

    params: ClassVar[dict[str, Any]] = {"top_k": 50, "share": 0.5, "pool": "topk"}

    def scores(self, a: str, b: str) -> np.ndarray:
        k, share = self.p["top_k"], self.p["share"]
        da, db = self.item_dims(a, k, share), self.item_dims(b, k, share)
        mass = self.ctx.mass_on(np.setdiff1d(da, db))
        sim = self.ctx.code_scores(self.ctx.term_code(a))
        # Lexicographic (mass on D, then A's similarity): sim is a cosine in [-1, 1].
        score = mass * 4.0 + (sim + 1.0) / 2.0
        if self.p["pool"] == "topk":
            out = np.full(self.ctx.n_items, -np.inf)
            pool = self.top_items(a, k)
            out[pool] = score[pool]
            return out
        if self.p["pool"] != "all":
            raise SparsemmError(f"pool must be 'topk' or 'all', got {self.p['pool']!r}")
        return score


class SoftPenalty(TermDims):
    """cos(code(A), x) - lam * sum_j b_j x_j over B's dims (weights from ``b_weights``)."""

    params: ClassVar[dict[str, Any]] = {
        "dims": "specific",
        "share": 0.5,
        "top_k": 50,
        "ratio": 2.0,
        "lam": 1.0,
    }

    def scores(self, a: str, b: str) -> np.ndarray:
        s = self.ctx.code_scores(self.ctx.term_code(a))
        w = self.b_weights(a, b)
        w = w / max(float(np.linalg.norm(w)), 1e-12)
        pen = np.asarray(self.ctx.codes_unit @ w, dtype=np.float64).ravel()
        return s - self.p["lam"] * pen


register_strategy("dense_a", DenseA, "dense: cos(emb(A), x), B ignored (reference)")
register_strategy("slq", SingleLineQuery, 'dense: "a photo of a A without a B" (SLQ)')
register_strategy("avg_emb", AvgEmb, "dense: cos(emb(A) - emb(B), x) (Avg Emb)", w=1.0)
register_strategy("avg_emb_0.5", AvgEmb, "dense: cos(emb(A) - 0.5 emb(B), x)", w=0.5)
register_strategy("code_a", CodeA, "sparse: cos(code(A), x), B ignored (reference)")
register_strategy(
    "paper",
    PaperTwoStep,
    "sparse: SR paper two-step, re-rank A's top-K by mass on D_A minus D_B",
    grid={"top_k": [10, 25, 50, 100], "share": [0.3, 0.5, 0.7, 0.9], "pool": ["topk", "all"]},
)
register_strategy(
    "code_arith",
    CodeArith,
    "sparse: cos(code(A) - w code(B), x)",
    grid={"w": [0.25, 0.5, 0.75, 1.0, 1.5]},
)
register_strategy(
    "penalty",
    SoftPenalty,
    "sparse: cos(code(A), x) - lam * (x on B's dims)",
    grid={
        "dims": ["specific", "query", "bias"],
        "ratio": [1.0, 2.0, 4.0],
        "lam": [0.25, 0.5, 1.0, 2.0],
    },
)
