"""The photo model's presence calibration, fitted on labelled photos and judged on others.

A photo's label (``benchmarks/data/*.json``: every thing visible, hand-labelled, closed under
the file's ``implies``) says whether a concept is in it. For every (photo, concept word)
pair whose word the photo model reads as one concept, the served scorer's inputs are taken
from the collection ``sparsemm up`` built (its codes: whole-image and region class
probabilities, the face unit), and

    P(concept | photo) = noisy-OR( sigmoid(a logit(max(e_whole, lam e_region)) + b), P_face )

(``sparsemm.query.scorers.UnitScorer``; a concept with no evidence at all stays at 0). The
scale ``a``, bias ``b`` and region weight ``lam`` are fitted by log loss. Judged on photos of
sources the fit never saw (leave one source out): the expected calibration error
ECE = sum_bins |bin| / n * |mean predicted P - observed rate| over ten equal-width bins of
predicted P, the reliability table per bin, and the area under the ROC curve.

    python benchmarks/photo_calibration.py OUT_OF_real_photos.py   (reads OUT/up and the data)

Used by ``benchmarks/real_photos.py``, which reports it beside the query figures.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from scipy.optimize import minimize

LAMBDAS = (0.0, 0.25, 0.5, 0.75, 1.0)  # region weights tried
BINS = 10


@dataclasses.dataclass
class Pairs:
    """(photo, concept) pairs: whole-image and region evidence, the face unit's part of P,
    and whether the photo shows the concept."""

    word: np.ndarray  # (m,) str
    photo: np.ndarray  # (m,) str
    source: np.ndarray  # (m,) str
    y: np.ndarray  # (m,) 0/1
    e_whole: np.ndarray  # (m,) summed class probability over the whole photo
    e_region: np.ndarray  # (m,) the same over its tiles (0 without regions)
    face: np.ndarray  # (m,) the face unit's probability, times its weight in the concept
    broader: np.ndarray  # (m,) 0/1: the word is read as a broader thing ("woman": person)


def word_weights(scorer: Any, words: list[str]) -> Iterator[tuple[str, bool, np.ndarray, float]]:
    """(word, read as a broader thing, its unit weights without the face unit, the face
    unit's weight) of each word the model reads as one concept."""
    from sparsemm.concepts.vocabulary import UnknownTerm
    from sparsemm.errors import SparsemmError

    for w in words:
        try:
            reading = scorer.read(w)
        except (UnknownTerm, SparsemmError):
            continue
        if len(reading.concepts) != 1:
            continue
        wt = scorer._unit_weights(reading.concepts[0]).copy()
        face_w = 0.0
        if scorer.face is not None:
            face_w, wt[scorer.face] = float(wt[scorer.face]), 0.0
        yield w, reading.concepts[0].how == "broader", wt, face_w


def labelled(
    keep: list[dict[str, Any]], word: str, implies: dict[str, Any]
) -> Iterator[tuple[int, dict[str, Any], int]]:
    """(row, photo, 1 if it shows ``word`` else 0) over ``keep``, leaving out a photo that
    may show the word (its ``maybe`` labels) without being labelled with it."""
    from real_photos import closure

    for i, p in enumerate(keep):
        labels = closure(p["labels"], implies)
        if word in closure(p.get("maybe", []), implies) and word not in labels:
            continue
        yield i, p, int(word in labels)


def build_pairs(searcher: Any, photos: list[dict[str, Any]], implies: dict[str, Any]) -> Pairs:
    """Pairs over ``photos`` (entries of the data files, with ``id`` and ``source``) of the
    collection ``searcher`` serves, for every label word the model reads as one concept."""
    from real_photos import closure

    scorer = searcher.model.term_scorer()
    ids = [Path(i).stem for i in searcher.collection.ids]
    row_of = {pid: r for r, pid in enumerate(ids)}
    keep = [p for p in photos if p["id"] in row_of]
    rows = np.array([row_of[p["id"]] for p in keep])
    codes = searcher.item_codes(rows) if hasattr(searcher, "item_codes") else None
    if codes is None:
        import scipy.sparse as sp

        codes = sp.vstack([searcher.item_code(int(r)) for r in rows]).tocsr()
    words = sorted({w for p in keep for w in closure(p["labels"], implies)})
    out: dict[str, list[Any]] = {f.name: [] for f in dataclasses.fields(Pairs)}
    for w, broader, wt, face_w in word_weights(scorer, words):
        e_w = np.asarray(codes @ wt, dtype=np.float64).ravel()
        reg = scorer._region_weights(wt)
        e_r = np.asarray(codes @ reg, dtype=np.float64).ravel() if reg is not None else 0 * e_w
        f = (
            face_w * np.asarray(codes[:, scorer.face].toarray(), dtype=np.float64).ravel()
            if face_w
            else 0 * e_w
        )
        for i, p, y in labelled(keep, w, implies):
            out["word"].append(w)
            out["photo"].append(p["id"])
            out["source"].append(p["source"])
            out["y"].append(y)
            out["e_whole"].append(e_w[i])
            out["e_region"].append(e_r[i])
            out["face"].append(f[i])
            out["broader"].append(int(broader))
    return Pairs(**{k: np.asarray(v) for k, v in out.items()})


def _logit(p: np.ndarray) -> np.ndarray:
    p = np.clip(p, 1e-6, 1 - 1e-6)
    return np.log(p) - np.log1p(-p)


def predict(pairs: Pairs, a: float, b: float, lam: float, share: float = 1.0) -> np.ndarray:
    """P(concept | photo) of the served scorer with these settings (``share``: the
    broader-reading share, for words read as a broader thing)."""
    e = np.maximum(pairs.e_whole, lam * pairs.e_region)
    e = np.clip(e, 0.0, 1.0)
    pc = np.where(e > 0, 1.0 / (1.0 + np.exp(-(a * _logit(e) + b))), 0.0)
    p = 1.0 - (1.0 - pc) * (1.0 - np.clip(pairs.face, 0.0, 1.0))
    return np.where(pairs.broader == 1, share * p, p)


def served_presence(pairs: Pairs, config: Any) -> tuple[np.ndarray, np.ndarray]:
    """P(concept | photo) with the served model's own settings (``config``, an
    ImageNetConceptModel's): for a wanted term, and for a term left out of a query."""
    lam = config.region_weight if config.regions else 0.0
    share = float(config.broader_share)
    wanted = predict(pairs, config.presence_scale, config.presence_bias, lam, share)
    left_out = predict(
        pairs,
        config.exclude_presence_scale if config.regions else config.presence_scale,
        config.exclude_presence_bias if config.regions else config.presence_bias,
        config.exclude_region_weight if config.regions else 0.0,
        share,
    )
    return wanted, left_out


def log_loss(y: np.ndarray, p: np.ndarray, pos_weight: float = 1.0) -> float:
    p = np.clip(p, 1e-4, 1 - 1e-4)
    w = np.where(y == 1, pos_weight, 1.0)
    return float(-np.sum(w * (y * np.log(p) + (1 - y) * np.log1p(-p))) / np.sum(w))


def fit(
    pairs: Pairs, lambdas: tuple[float, ...] | None = LAMBDAS, pos_weight: float = 1.0
) -> dict[str, float]:
    """(a, b, lam) of least log loss on ``pairs`` (a > 0), positives weighted
    ``pos_weight`` (above 1: a missed thing costs more than a false alarm, for terms to
    leave out); then the broader-reading share, so that its words' mean P is their rate."""
    best: dict[str, float] | None = None
    direct = pairs.broader == 0
    sub = subset(pairs, direct) if direct.any() else pairs
    for lam in lambdas or LAMBDAS:

        def loss(v: np.ndarray, lam: float = lam) -> float:
            p = predict(sub, float(np.exp(v[0])), float(v[1]), lam)
            return log_loss(sub.y, p, pos_weight)

        res = minimize(loss, np.array([0.0, 0.0]), method="Nelder-Mead")
        cand = {"a": float(np.exp(res.x[0])), "b": float(res.x[1]), "lam": lam, "loss": res.fun}
        if best is None or cand["loss"] < best["loss"]:
            best = cand
    assert best is not None
    share = 1.0
    wide = pairs.broader == 1
    if wide.any():
        p = predict(subset(pairs, wide), best["a"], best["b"], best["lam"])
        share = float(np.clip(pairs.y[wide].sum() / max(p.sum(), 1e-9), 0.01, 1.0))
    best["share"] = share
    return best


def reliability(y: np.ndarray, p: np.ndarray, bins: int = BINS) -> dict[str, Any]:
    """ECE over ``bins`` equal-width bins of predicted P, and the table per bin."""
    edges = np.linspace(0.0, 1.0, bins + 1)
    idx = np.clip(np.digitize(p, edges[1:-1]), 0, bins - 1)
    table, ece = [], 0.0
    for k in range(bins):
        m = idx == k
        if not m.any():
            continue
        pred, obs = float(p[m].mean()), float(y[m].mean())
        ece += m.mean() * abs(pred - obs)
        table.append(
            {
                "bin": f"{edges[k]:.1f}-{edges[k + 1]:.1f}",
                "n": int(m.sum()),
                "predicted": round(pred, 4),
                "observed": round(obs, 4),
            }
        )
    return {"ece": round(float(ece), 4), "n": len(y), "table": table}


def auc(y: np.ndarray, s: np.ndarray) -> float | None:
    from scipy.stats import rankdata

    pos, neg = y == 1, y == 0
    if not pos.any() or not neg.any():
        return None
    r = rankdata(s)
    return round(
        float((r[pos].sum() - pos.sum() * (pos.sum() + 1) / 2) / (pos.sum() * neg.sum())), 4
    )


def subset(pairs: Pairs, mask: np.ndarray) -> Pairs:
    return Pairs(**{f.name: getattr(pairs, f.name)[mask] for f in dataclasses.fields(Pairs)})


def leave_one_source_out(
    pairs: Pairs,
    groups: dict[str, str] | None = None,
    lambdas: tuple[float, ...] | None = None,
    pos_weight: float = 1.0,
) -> dict[str, Any]:
    """Fit on every source but one, predict that one; ``groups`` maps a source to the group
    left out together (packages of one family). Returns per-group figures and the pooled
    held-out predictions' reliability."""
    group = np.array([(groups or {}).get(s, s) for s in pairs.source])
    held = np.zeros(len(pairs.y))
    per: dict[str, Any] = {}
    for g in sorted(set(group)):
        test = group == g
        params = fit(subset(pairs, ~test), lambdas or LAMBDAS, pos_weight)
        held[test] = predict(
            subset(pairs, test), params["a"], params["b"], params["lam"], params["share"]
        )
        per[g] = {
            "pairs": int(test.sum()),
            "positives": int(pairs.y[test].sum()),
            "fit": {k: round(v, 4) for k, v in params.items()},
            "ece": reliability(pairs.y[test], held[test])["ece"],
            "auc": auc(pairs.y[test], held[test]),
        }
    return {
        "per_source": per,
        "pooled": reliability(pairs.y, held),
        "auc": auc(pairs.y, held),
        "predictions": held,
    }


def settings_with(model: Any, **changes: Any) -> Any:
    """A copy of an ImageNetConceptModel with other settings (buffers shared)."""
    from sparsemm.models.concepts import ImageNetConceptModel

    new = ImageNetConceptModel(dataclasses.replace(model.config, **changes))
    new.load_state_dict(model.state_dict())
    new.training_info = model.training_info
    return new.eval()


def plot_reliability(curves: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    """A reliability diagram: mean predicted P against the observed rate per bin, one line
    per curve (``reliability`` outputs), the diagonal for reference."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(4.6, 4.4), dpi=110)
    ax.plot([0, 1], [0, 1], color="0.7", lw=1, ls="--")
    for name, rel in curves.items():
        xs = [b["predicted"] for b in rel["table"]]
        ys = [b["observed"] for b in rel["table"]]
        ax.plot(xs, ys, marker="o", ms=4, label=f"{name} (ECE {rel['ece']:.3f})")
    ax.set_xlabel("predicted P")
    ax.set_ylabel("observed rate")
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
