"""The sentence negation benchmark: captions joined with the negation of an absent object.

Builder. For each evaluation image, a caption of it (one with no negation of its own and
not naming the object) is joined with the negation of a frequent object the image does not
carry, chosen with probability proportional to how often it co-occurs with the image's own
labels (a plausible distractor: "a kitchen" with "no chair", not "no giraffe"). The joining
is one of :data:`FAMILIES`, phrasing families written for this benchmark: prefix, suffix,
inline, postfix ("the X is absent"), implicit cues ("devoid of", "nobody"), different
presence fillers, plurals, two negated objects. Families are split into those used for
tuning (``tune``) and those held out for testing (``heldout``); numbers on held-out
families measure how the parser and the scorer do on phrasings nobody tuned on. No
third-party negation query set is used.

Each query's truth: the caption's image (the one relevant item), the negated objects (a
label each, for violation) and the parse a reader would give (include = the caption,
exclude = the objects as written).

Metrics (per query): recall@1/5/10 of the caption's image (R@k), violation@5 (share of the
top 5 whose labels carry a negated object: "neg-violation@5") and parse exact match (the
parser's include and exclude, normalised, equal the truth's). Rows: dense on the raw
sentence, dense on the caption without its negation (the reference: negation should cost
nothing), the parsed query through every strategy, and the served default, all ranked by
:func:`sparsemm.query.strategies.ranking.rank_query`, the function the CLI, the web API and
``Searcher.search`` call.
"""

from __future__ import annotations

import dataclasses
import logging
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, write_json
from sparsemm.models.detectors import ConceptDetectors
from sparsemm.query.parse import Query, parse_query
from sparsemm.query.request import DEFAULT_STRATEGY
from sparsemm.query.strategies import (
    STRATEGIES,
    ExclusionContext,
    QueryCoder,
    ReferenceSet,
    TextEncoder,
    get_spec,
)
from sparsemm.query.strategies.ranking import rank_query
from sparsemm.query.text_parser import strip_filler_words
from sparsemm.text import term_tokens

# register the baselines (slq, paper, cbe, ...) whether or not an install recorded the
# sparsemm.strategies entry points
from sparsemm_experiments.baselines import cbe as _cbe  # noqa: F401
from sparsemm_experiments.baselines import strategies as _baselines  # noqa: F401
from sparsemm_experiments.eval.exclusion import (
    build_exclusion_queries,
    query_matrices,
    write_report,
)
from sparsemm_experiments.eval.metrics import evaluate_rankings
from sparsemm_experiments.eval.tables import md_table

logger = logging.getLogger(__name__)

METRICS = ("recall@1", "recall@5", "recall@10", "violation@5")
DENSE_RAW = "dense raw sentence"
DENSE_CAPTION = "dense caption without negation"
SERVED = "served default"
N_OBJECTS = 40  # negated objects come from the most frequent labels of the split
# A caption already holding a negation (or a quote of one) is not used.
_NEG_WORDS = frozenset(
    "no not without nobody none nothing empty absent missing lacking lacks devoid free "
    "deserted unoccupied nowhere never neither nor".split()
)

_IRREGULAR = {
    "person": "people",
    "mouse": "mice",
    "knife": "knives",
    "sheep": "sheep",
    "skis": "skis",
    "scissors": "scissors",
    "broccoli": "broccoli",
    "skateboard": "skateboards",
}


def plural(label: str) -> str:
    """English plural of a (possibly two-word) object name: the head noun inflected."""
    *head, last = label.split(" ")
    if label in _IRREGULAR:
        return _IRREGULAR[label]
    if last in _IRREGULAR:
        out = _IRREGULAR[last]
    elif last.endswith(("s", "sh", "ch", "x", "z")):
        out = last + "es"
    elif last.endswith("y") and last[-2:-1] not in "aeiou":
        out = last[:-1] + "ies"
    elif last.endswith("fe"):
        out = last[:-2] + "ves"
    else:
        out = last + "s"
    return " ".join([*head, out])


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


@dataclass(frozen=True)
class Family:
    """One way of joining a caption with a negation.

    ``template`` placeholders: ``{cap}`` the caption (no final period), ``{Cap}``/``{cap_l}``
    it with the first letter upper/lower-cased, ``{b}``/``{bs}``/``{a_b}`` the object, its
    plural and it with an article, ``{b2}``... the second object, ``{head}``/``{tail}`` the
    caption cut before its first verb (inline families). ``excluded`` says what the truth
    excludes: the written forms ("b", "bs", "b2", "bs2") or "person". ``person``: the family
    only negates people (nobody, empty of people).
    """

    name: str
    group: str  # "tune" | "heldout"
    template: str
    excluded: tuple[str, ...]
    person: bool = False

    @property
    def n_objects(self) -> int:
        return 2 if any(e.endswith("2") for e in self.excluded) else 1


_T, _H = "tune", "heldout"
FAMILIES: tuple[Family, ...] = (
    # --- tuning families
    Family("suffix_there_is_no_sight", _T, "{cap}, but there is no {b} in sight.", ("b",)),
    Family("sentence_no_in_image", _T, "{cap}. There is no {b} in the image.", ("b",)),
    Family("prefix_there_is_no", _T, "There is no {b} in the image. {Cap}.", ("b",)),
    Family("prefix_no_present_where", _T, "No {b} is present in the image, where {cap_l}.", ("b",)),
    Family("suffix_with_no", _T, "{cap} with no {b}", ("b",)),
    Family("suffix_without_any_plural", _T, "{cap}, without any {bs}.", ("bs",)),
    Family("label_but_not", _T, "{cap} but not {a_b}", ("b",)),
    Family("search_minus", _T, "{cap} -{b_q}", ("b",)),
    Family("postfix_absent", _T, "{cap}. The {b} is absent.", ("b",)),
    Family("postfix_nowhere_plural", _T, "{cap}; {bs} are nowhere to be seen.", ("bs",)),
    Family("inverted_absent_is_any", _T, "{cap}. Noticeably absent is any {b}.", ("b",)),
    Family("devoid_of_plural", _T, "{cap}, devoid of {bs}.", ("bs",)),
    Family("lacking", _T, "{cap}, lacking {a_b}.", ("b",)),
    Family("no_sign_of", _T, "{cap}. No sign of {a_b}.", ("b",)),
    Family("and_not_visible", _T, "{cap}, and {a_b} is not visible.", ("b",)),
    Family("plural_no_sentence", _T, "{cap}. No {bs}.", ("bs",)),
    Family("person_nobody_around", _T, "{cap}, with nobody around.", ("person",), True),
    Family("double_with_no_and_no", _T, "{cap}, with no {b} and no {b2}.", ("b", "b2")),
    Family("prefix_without_colon", _T, "Without any {bs}: {cap_l}.", ("bs",)),
    Family("inline_with_no_scene", _T, "{head}, with no {b} in the scene, {tail}.", ("b",)),
    # --- held-out families (never used for tuning)
    Family("not_a_single_picture", _H, "{cap}, not a single {b} in the picture.", ("b",)),
    Family("free_of_plural", _H, "{cap}. The scene is free of {bs}.", ("bs",)),
    Family("person_empty_of_people", _H, "{cap}, empty of people.", ("people",), True),
    Family("postfix_missing", _H, "{cap}, but the {b} is missing.", ("b",)),
    Family("postfix_not_present", _H, "{Cap}. {A_b} is not present.", ("b",)),
    Family("prefix_no_plural", _H, "No {bs}. {Cap}.", ("bs",)),
    Family("doesnt_contain_any", _H, "{cap}. The photo doesn't contain any {bs}.", ("bs",)),
    Family("isnt_any_to_be_seen", _H, "{cap}, and there isn't any {b} to be seen.", ("b",)),
    Family("out_of_sight_plural", _H, "{cap}, with {bs} out of sight.", ("bs",)),
    Family("double_without_or", _H, "{cap}, without {a_b} or {a_b2}.", ("b", "b2")),
    Family("inline_without_anywhere", _H, "{head}, without {a_b} anywhere, {tail}.", ("b",)),
    Family("prefix_image_lacks", _H, "The image lacks {bs}: {cap_l}.", ("bs",)),
    Family("person_no_one_picture", _H, "{cap}. No one is in the picture.", ("person",), True),
    Family("postfix_not_in_sight", _H, "{cap}; {a_b} is not in sight.", ("b",)),
)
# The verb an inline family cuts the caption before ("A man | is making pizzas").
_INLINE_CUT = re.compile(r"\s(is|are|sits|sit|stands|stand|holds|holding|sitting|standing)\s")


@dataclass(frozen=True)
class NegationQuery:
    """One benchmark sentence and its truth (``item``: row among the evaluation items)."""

    text: str
    caption: str
    item: int
    family: str
    group: str
    objects: tuple[str, ...]  # negated labels
    truth: Query  # the parse a reader gives


def _clean_caption(caption: str) -> str:
    return " ".join(caption.strip().split()).rstrip(" .")


def usable_caption(caption: str) -> bool:
    """A caption with no negation of its own (it would change the truth)."""
    words = set(re.findall(r"[a-z']+", caption.lower()))
    return bool(words) and not (words & _NEG_WORDS) and not any(w.endswith("n't") for w in words)


def _fill(family: Family, caption: str, objects: Sequence[str]) -> tuple[str, Query] | None:
    """The family's sentence for a caption and objects, and its truth; None when the
    family cannot phrase it (inline families need a verb to cut before)."""
    cap = _clean_caption(caption)
    b = objects[0]
    b2 = objects[1] if len(objects) > 1 else ""
    head = tail = ""
    if "{head}" in family.template:
        m = _INLINE_CUT.search(cap)
        if m is None or m.start() < 3:
            return None
        head, tail = cap[: m.start()], cap[m.start() + 1 :]
    values = {
        "cap": cap,
        "Cap": cap[:1].upper() + cap[1:],
        "cap_l": cap[:1].lower() + cap[1:],
        "b": b,
        "bs": plural(b),
        "a_b": f"{_article(b)} {b}",
        "A_b": f"{_article(b).capitalize()} {b}",
        "b_q": f'"{b}"' if " " in b else b,
        "b2": b2,
        "bs2": plural(b2) if b2 else "",
        "a_b2": f"{_article(b2)} {b2}" if b2 else "",
        "head": head,
        "tail": tail,
    }
    text = family.template.format(**values)
    forms = {
        "b": b,
        "bs": plural(b),
        "b2": b2,
        "bs2": plural(b2) if b2 else "",
        "person": "person",
        "people": "people",
    }
    include_words = re.sub(r"[^\w\s'-]", " ", cap.lower()).split()
    include = " ".join(strip_filler_words(include_words))
    truth = Query((include,) if include else (), tuple(forms[e] for e in family.excluded))
    return text, truth


def build_negation_queries(
    captions: Sequence[Sequence[str]],
    labels: Sequence[Sequence[str]],
    families: Sequence[Family] = FAMILIES,
    per_item: int = 2,
    seed: int = 0,
    n_objects: int = N_OBJECTS,
) -> list[NegationQuery]:
    """``per_item`` queries per evaluation item (``captions[i]``, ``labels[i]``), each with a
    different caption and family (seeded). Items without labels or usable captions are
    skipped."""
    if len(captions) != len(labels):
        raise SparsemmError("captions and labels need one entry per item")
    if not families:
        raise SparsemmError("no phrasing family to build queries with")
    rng = np.random.default_rng(seed)
    counts: dict[str, int] = {}
    for labs in labels:
        for lab in set(labs):
            counts[lab] = counts.get(lab, 0) + 1
    objects = sorted(counts, key=lambda x: (-counts[x], x))[:n_objects]
    index = {o: j for j, o in enumerate(objects)}
    co = np.zeros((len(objects), len(objects)))
    for labs in labels:
        js = [index[x] for x in set(labs) if x in index]
        for j in js:
            co[j, js] += 1
    queries: list[NegationQuery] = []
    for i, (caps, labs) in enumerate(zip(captions, labels, strict=True)):
        usable = [c for c in caps if usable_caption(c)]
        if not labs or not usable or not objects:
            continue
        own = {index[x] for x in labs if x in index}
        order = rng.permutation(len(families))
        picked = 0
        for f_idx in order:
            if picked >= per_item:
                break
            family = families[int(f_idx)]
            caption = usable[picked % len(usable)]
            tokens = set(term_tokens(caption))
            cand = [
                j
                for j in range(len(objects))
                if j not in own and not set(term_tokens(objects[j])) & tokens
            ]
            if family.person:
                cand = [j for j in cand if objects[j] == "person"]
            if len(cand) < family.n_objects:
                continue
            weight = np.array([1.0 + sum(co[j, k] for k in own) for j in cand])
            chosen = rng.choice(
                len(cand), size=family.n_objects, replace=False, p=weight / weight.sum()
            )
            objs = tuple(objects[cand[int(c)]] for c in chosen)
            filled = _fill(family, caption, objs)
            if filled is None:
                continue
            text, truth = filled
            queries.append(NegationQuery(text, caption, i, family.name, family.group, objs, truth))
            picked += 1
    return queries


# ----------------------------------------------------------------------------- parsing


def _content(text: str) -> list[str]:
    words = re.sub(r"[^\w\s'-]", " ", text.lower()).split()
    return [w for w in words if w not in ("a", "an", "the")]


def parse_matches(parsed: Query, truth: Query) -> bool:
    """Exact match of a parse against the truth, after normalising both sides: include as
    one text without punctuation or articles; excluded terms as sets of singular forms."""

    def exc(q: Query) -> set[tuple[str, ...]]:
        return {tuple(term_tokens(t)) or (t,) for t in q.exclude}

    return _content(" and ".join(parsed.include)) == _content(" and ".join(truth.include)) and exc(
        parsed
    ) == exc(truth)


def parse_all(queries: Sequence[NegationQuery]) -> tuple[list[Query | None], np.ndarray]:
    """The parser's reading of every query (None where it refused) and exact-match flags."""
    parsed: list[Query | None] = []
    ok = np.zeros(len(queries), dtype=bool)
    for i, q in enumerate(queries):
        try:
            p = parse_query(q.text)
        except SparsemmError as exc:
            logger.debug("parse refused %r: %s", q.text, exc)
            parsed.append(None)
            continue
        parsed.append(p)
        ok[i] = parse_matches(p, q.truth)
    return parsed, ok


# --------------------------------------------------------------------------- evaluation


def _rankings(rank: Callable[[int], np.ndarray], n: int, k: int) -> np.ndarray:
    out = np.full((n, k), -1, dtype=np.int64)
    for i in range(n):
        rows = rank(i)[:k]
        out[i, : len(rows)] = rows
    return out


def query_truth(
    queries: Sequence[NegationQuery], labels: Sequence[Sequence[str]]
) -> tuple[np.ndarray, np.ndarray]:
    """Boolean (q, n_items) matrices: the caption's image, items carrying a negated object."""
    n = len(labels)
    rel = np.zeros((len(queries), n), dtype=bool)
    neg = np.zeros((len(queries), n), dtype=bool)
    sets = [set(x) for x in labels]
    for i, q in enumerate(queries):
        rel[i, q.item] = True
        neg[i] = [bool(s & set(q.objects)) for s in sets]
    return rel, neg


def evaluate_method(
    ctx: ExclusionContext,
    queries: Sequence[NegationQuery],
    parsed: Sequence[Query | None],
    matrices: tuple[np.ndarray, np.ndarray],
    strategy: str,
    params: Mapping[str, Any] | None = None,
    k: int = 10,
) -> dict[str, np.ndarray]:
    """Per-query metrics of the parsed queries ranked by ``strategy`` through
    :func:`rank_query` (a refused parse ranks nothing)."""
    strat = get_spec(strategy).build(ctx, **dict(params or {}))
    terms = {t for p in parsed if p is not None for t in (*p.include, *p.exclude)}
    terms |= {p.include_text for p in parsed if p is not None and len(p.include) > 1}
    strat.prepare(terms)

    def rank(i: int) -> np.ndarray:
        p = parsed[i]
        return np.zeros(0, np.int64) if p is None else rank_query(ctx, p, strat, k=k)[0]

    rankings = _rankings(rank, len(queries), k)
    rel, neg = matrices
    return evaluate_rankings(rankings, rel, list(METRICS), excluded=neg)


def evaluate_dense_texts(
    ctx: ExclusionContext,
    texts: Sequence[str],
    matrices: tuple[np.ndarray, np.ndarray],
    k: int = 10,
) -> dict[str, np.ndarray]:
    """Per-query metrics of ranking by the dense cosine of each text as written."""
    assert ctx.items_dense is not None
    emb = ctx.embed(list(texts))
    scores = emb @ ctx.items_dense.T  # (q, n)
    part = np.argsort(-scores, axis=1, kind="stable")[:, :k]
    rel, neg = matrices
    return evaluate_rankings(part.astype(np.int64), rel, list(METRICS), excluded=neg)


# ------------------------------------------------------------------------ joint tuning

# The served scorer's grid: tuned on the train split of both benchmarks, chosen by the sum
# of label-pair AP@10 and sentence R@5 (tuning families only) under three bars: label
# violation@10 no higher than dense arithmetic's (avg_emb_0.5), sentence R@5 no lower than
# dense on the caption without its negation, and sentence neg-violation@5 at most half that
# of dense on the raw sentence (the targets, on the tuning split).
HYBRID_GRID: dict[str, Sequence[Any]] = {
    "alpha": [5.0, 10.0],
    "alpha_phrase": [10.0, 20.0],
    "beta": [1.0, 2.0],
    "gamma": [3.0, 6.0],
    "delta": [2.0, 4.0],
}


def tune_hybrid(
    ctx: ExclusionContext,
    sentence_queries: Sequence[NegationQuery],
    labels: Sequence[Sequence[str]],
    grid: Mapping[str, Sequence[Any]] = HYBRID_GRID,
    max_grid: int | None = None,
    k: int = 10,
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, float]]:
    """Joint grid search of the served scorer on tuning items (see :data:`HYBRID_GRID`).

    Returns (chosen params, every grid row, the bars)."""
    import itertools

    from sparsemm_experiments.eval.bench import evaluate_strategy

    pairs = build_exclusion_queries(labels)
    p_mat = query_matrices(pairs, ctx.n_items)
    parsed, _ = parse_all(sentence_queries)
    s_mat = query_truth(sentence_queries, labels)
    # Bars from the dense references on the same tuning items.
    dense = evaluate_strategy(ctx, "avg_emb_0.5", {}, pairs, p_mat, k, ["violation@10"])
    bar_viol = float(dense["violation@10"].mean())
    raw = evaluate_dense_texts(ctx, [q.text for q in sentence_queries], s_mat, k)
    ref = evaluate_dense_texts(ctx, [q.caption for q in sentence_queries], s_mat, k)
    bar_neg = 0.5 * float(raw["violation@5"].mean())
    bar_r5 = float(ref["recall@5"].mean())
    bars = {
        "label_violation@10": bar_viol,
        "sentence_recall@5": bar_r5,
        "sentence_violation@5": bar_neg,
    }

    keys = list(grid)
    points = [dict(zip(keys, v, strict=True)) for v in itertools.product(*grid.values())]
    points = points[: max_grid or None]
    rows: list[dict[str, Any]] = []
    for point in points:
        lab = evaluate_strategy(ctx, "hybrid", point, pairs, p_mat, k, ["ap@10", "violation@10"])
        sen = evaluate_method(ctx, sentence_queries, parsed, s_mat, "hybrid", point, k)
        ap, viol = float(lab["ap@10"].mean()), float(lab["violation@10"].mean())
        r5, neg = float(sen["recall@5"].mean()), float(sen["violation@5"].mean())
        row: dict[str, Any] = {
            "params": point,
            "label_ap@10": ap,
            "label_violation@10": viol,
            "sentence_recall@5": r5,
            "sentence_violation@5": neg,
            "sum": ap + r5,
            "within_bars": viol <= bar_viol + 1e-12
            and neg <= bar_neg + 1e-12
            and r5 >= bar_r5 - 1e-12,
        }
        rows.append(row)
        logger.debug("hybrid %s -> %s", point, row)
    ok = [i for i, r in enumerate(rows) if r["within_bars"]] or list(range(len(rows)))
    best = max(ok, key=lambda i: (rows[i]["sum"], -i))
    rows[best]["chosen"] = True
    return dict(points[best]), rows, bars


# ------------------------------------------------------------------------------ runner


@dataclass(frozen=True)
class NegationConfig:
    split: str = "test"
    tune_split: str | None = "train"  # reference set (detectors) and joint tuning items
    label_targets: bool = True  # reference items' labels count as mentions (see BenchConfig)
    tune_fraction: float = 0.25  # share of the tune split scored when tuning
    methods: tuple[str, ...] = ()  # strategies to run on the parsed queries (() = all)
    per_item: int = 2  # queries per evaluation image
    limit_items: int | None = None  # quick runs
    tune: bool = False  # run the joint grid of the served scorer (HYBRID_GRID)
    max_grid: int | None = None
    seed: int = 0
    k: int = 10


def run_negation_bench(
    collection: Collection,
    out_dir: str | Path,
    text_encoder: TextEncoder,
    item_coder: Callable[[np.ndarray], sp.csr_matrix] | None = None,
    query_coder: QueryCoder | None = None,
    config: NegationConfig | None = None,
    run_info: Mapping[str, Any] | None = None,
    dense_items: np.ndarray | None = None,
    detectors: ConceptDetectors | None = None,
) -> dict[str, Any]:
    """Run the sentence negation benchmark and write ``out_dir`` (config.json, metrics.json,
    per_query.npz, report.md, plots, queries.jsonl). ``detectors``: the sparse model's own
    (see :func:`sparsemm_experiments.eval.bench.run_exclusion_bench`). Returns the metrics.json
    content."""
    from sparsemm_experiments.eval.bench import captions_by_item, item_set, split_tune_rows

    cfg = config or NegationConfig()
    t_start = time.perf_counter()
    methods = list(cfg.methods or STRATEGIES)
    for m in methods:
        get_spec(m)
    if item_coder is None or query_coder is None:
        methods = [m for m in methods if get_spec(m).kind != "sparse"]
    if detectors is None:  # the match scorer reads the model's detectors
        methods = [m for m in methods if not getattr(get_spec(m).cls, "needs_concepts", False)]
    captions = captions_by_item(collection)
    dense_all = collection.image_embeddings() if dense_items is None else dense_items

    def rows_of(split: str) -> np.ndarray:
        rows = np.flatnonzero(collection.split_mask(split))
        return rows[: cfg.limit_items] if cfg.limit_items else rows

    ev = item_set(collection, rows_of(cfg.split), item_coder, captions, dense_all)
    queries = build_negation_queries(ev.captions, ev.labels, per_item=cfg.per_item, seed=cfg.seed)
    if not queries:
        raise SparsemmError(
            f"no negation queries on split {cfg.split!r}: its items need labels and captions"
        )
    reference = None
    tuning: dict[str, Any] = {}
    if cfg.tune_split is not None:
        tune_rows = rows_of(cfg.tune_split)
        ref_set = item_set(collection, tune_rows, item_coder, captions, dense_all)
        reference = ReferenceSet(
            ref_set.captions,
            ref_set.dense,
            ref_set.codes,
            ref_set.labels if cfg.label_targets else None,
        )
        if cfg.tune and item_coder is not None:
            ev_rows, ref_rows = split_tune_rows(tune_rows, cfg.tune_fraction, cfg.seed)
            t_ev = item_set(collection, ev_rows, item_coder, captions, dense_all)
            t_ref = item_set(collection, ref_rows, item_coder, captions, dense_all)
            tune_fams = tuple(f for f in FAMILIES if f.group == "tune")
            t_queries = build_negation_queries(
                t_ev.captions, t_ev.labels, tune_fams, per_item=cfg.per_item, seed=cfg.seed + 1
            )
            tctx = ExclusionContext(
                t_ev.dense,
                t_ev.codes,
                text_encoder,
                query_coder,
                ReferenceSet(
                    t_ref.captions,
                    t_ref.dense,
                    t_ref.codes,
                    t_ref.labels if cfg.label_targets else None,
                ),
                cache_size=1 << 16,
                detectors=detectors,
            )
            chosen, grid_rows, bars = tune_hybrid(
                tctx, t_queries, t_ev.labels, max_grid=cfg.max_grid
            )
            tuning = {
                "chosen": chosen,
                "bars": bars,
                "grid": grid_rows,
                "n_sentences": len(t_queries),
            }
            logger.info("joint tuning chose %s (%d grid points)", chosen, len(grid_rows))
    if reference is None:
        methods = [m for m in methods if "reference" not in get_spec(m).cls.requires]

    ctx = ExclusionContext(
        ev.dense,
        ev.codes,
        text_encoder,
        query_coder,
        reference,
        cache_size=1 << 16,
        detectors=detectors,
    )
    parsed, parse_ok = parse_all(queries)
    mats = query_truth(queries, ev.labels)
    per_query: dict[str, dict[str, np.ndarray]] = {}
    seconds: dict[str, float] = {}
    t0 = time.perf_counter()
    per_query[DENSE_RAW] = evaluate_dense_texts(ctx, [q.text for q in queries], mats, cfg.k)
    per_query[DENSE_CAPTION] = evaluate_dense_texts(ctx, [q.caption for q in queries], mats, cfg.k)
    seconds["dense"] = round(time.perf_counter() - t0, 3)
    served = DEFAULT_STRATEGY if DEFAULT_STRATEGY in methods else None
    for name in methods:
        t0 = time.perf_counter()
        per_query[f"parse + {name}"] = evaluate_method(ctx, queries, parsed, mats, name, k=cfg.k)
        seconds[name] = round(time.perf_counter() - t0, 3)
        logger.info(
            "parse + %s: R@5 %.4f, neg-violation@5 %.4f (%.1f s)",
            name,
            per_query[f"parse + {name}"]["recall@5"].mean(),
            per_query[f"parse + {name}"]["violation@5"].mean(),
            seconds[name],
        )
    if served is not None:
        per_query[SERVED] = per_query[f"parse + {served}"]
    groups = np.array([q.group for q in queries])
    subsets = {
        "all": np.ones(len(queries), dtype=bool),
        "tune families": groups == "tune",
        "held-out families": groups == "heldout",
    }
    fam_names = [f.name for f in FAMILIES]
    fams = np.array([q.family for q in queries])
    parse_by_family = {
        f: {
            "group": next(x.group for x in FAMILIES if x.name == f),
            "n": int((fams == f).sum()),
            "exact": float(parse_ok[fams == f].mean()) if (fams == f).any() else None,
        }
        for f in fam_names
    }
    run_config = {
        "name": f"Sentence negation benchmark ({cfg.split} split)",
        "benchmark": "negation",
        "collection": str(collection.root),
        "bench": dataclasses.asdict(cfg),
        "served_default": served,
        "methods": {
            m: {"description": get_spec(m).description, "params": dict(get_spec(m).defaults)}
            for m in methods
        },
        "families": [dataclasses.asdict(f) for f in FAMILIES],
        "n_items": len(ev.rows),
        "n_queries": len(queries),
        **dict(run_info or {}),
    }
    content = write_report(
        out_dir, run_config, per_query, subsets, list(METRICS), [DENSE_RAW, DENSE_CAPTION]
    )
    content["parse"] = {
        "exact_match": {name: float(parse_ok[m].mean()) for name, m in subsets.items() if m.any()},
        "refused": int(sum(p is None for p in parsed)),
        "by_family": parse_by_family,
    }
    content["tuning"] = tuning
    content["seconds"] = {**seconds, "total": round(time.perf_counter() - t_start, 3)}
    out = Path(out_dir)
    write_json(out / "metrics.json", content)
    with atomic_open(out / "queries.jsonl", "w") as fh:
        import json

        for q, p, ok in zip(queries, parsed, parse_ok, strict=True):
            fh.write(
                json.dumps(
                    {
                        "text": q.text,
                        "family": q.family,
                        "group": q.group,
                        "item": collection.items[int(ev.rows[q.item])]["id"],
                        "objects": list(q.objects),
                        "truth": {
                            "include": list(q.truth.include),
                            "exclude": list(q.truth.exclude),
                        },
                        "parse": None
                        if p is None
                        else {"include": list(p.include), "exclude": list(p.exclude)},
                        "parse_exact": bool(ok),
                    }
                )
                + "\n"
            )
    report = (out / "report.md").read_text()
    report += "\n## Parse exact match\n\n"
    exact_rows = [(k, f"{v:.3f}") for k, v in content["parse"]["exact_match"].items()]
    report += "\n".join(md_table(["subset", "exact match"], exact_rows, "lr")) + "\n"
    family_rows = [
        (f, d["group"], d["n"], "–" if d["exact"] is None else f"{d['exact']:.3f}")
        for f, d in parse_by_family.items()
    ]
    header = ["family", "group", "queries", "exact match"]
    report += "\n" + "\n".join(md_table(header, family_rows, "llrr")) + "\n"
    if tuning:
        c = next(r for r in tuning["grid"] if r.get("chosen"))
        bars = tuning["bars"]
        report += (
            f"\n## Joint tuning of the served scorer ({tuning['n_sentences']} tuning "
            f"sentences)\n\nChosen: {tuning['chosen']} -> label AP@10 {c['label_ap@10']:.3f} "
            f"(violation@10 {c['label_violation@10']:.3f}, bar "
            f"{bars['label_violation@10']:.3f}), sentence R@5 {c['sentence_recall@5']:.3f} "
            f"(bar {bars['sentence_recall@5']:.3f}) "
            f"(neg-violation@5 {c['sentence_violation@5']:.3f}, bar "
            f"{bars['sentence_violation@5']:.3f}).\n"
        )
    with atomic_open(out / "report.md", "w") as fh:
        fh.write(report)
    logger.info("negation benchmark done in %.1f s -> %s", time.perf_counter() - t_start, out)
    return content
