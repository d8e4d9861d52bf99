"""Searcher, `sparsemm index` and `sparsemm search` on a toy corpus with known answers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from fakes import KeywordEncoder, identity_sr, keyword_collection
from sparsemm.cli.main import main
from sparsemm.encoders.base import register_encoder
from sparsemm.errors import SparsemmError
from sparsemm.models.sr import SRModel
from sparsemm.query.indexing import build_index
from sparsemm.query.searcher import Searcher

WORDS = ("dog", "cat", "pizza", "car", "tree", "ball")


class ToyEncoder(KeywordEncoder):
    name = "toykw"
    keywords = WORDS


register_encoder("toykw")(ToyEncoder)

# item -> objects in it (captions mention them); the right answers are read off this table.
ITEMS = {
    "d1": ["dog"],
    "d2": ["dog", "ball"],
    "d3": ["dog", "tree"],
    "dc1": ["dog", "cat"],
    "dc2": ["dog", "cat", "tree"],
    "c1": ["cat"],
    "c2": ["cat", "tree"],
    "p1": ["pizza"],
    "p2": ["pizza", "car"],
    "t1": ["tree"],
    "r1": ["car"],
    "b1": ["ball", "tree"],
}


def _collection(tmp_path: Path) -> Path:
    return keyword_collection(tmp_path / "col", ToyEncoder(), ITEMS)


def _identity_sr(tmp_path: Path) -> Path:
    """An SR whose code is the keyword vector itself: dim j = keyword j (hand-made answer)."""
    return identity_sr(tmp_path / "sr", len(WORDS))


@pytest.fixture()
def searcher(tmp_path: Path) -> Searcher:
    col = _collection(tmp_path)
    build_index(col, _identity_sr(tmp_path))
    return Searcher(col)


def test_dog_but_not_cat_filter_and_index_agree(searcher: Searcher) -> None:
    hits = searcher.search("dog but not cat", k=5, strategy="filter", dims="query")
    assert {h.id for h in hits} == {"d1", "d2", "d3"}  # every dog item without a cat
    assert hits[0].id == "d1"  # the purest dog code ranks first
    via_index = searcher.search_index("dog but not cat", k=5)
    assert [h.id for h in via_index] == [h.id for h in hits]
    assert np.allclose([h.score for h in via_index], [h.score for h in hits], atol=1e-5)


def test_several_exclusions_all_apply(searcher: Searcher) -> None:
    hits = searcher.search("dog, no cat, no tree", k=5, strategy="filter", dims="query")
    assert [h.id for h in hits] == ["d1", "d2"]
    hits = searcher.search("dog", exclude=("cat", "ball"), k=5, strategy="filter", dims="query")
    assert {h.id for h in hits} == {"d1", "d3"}


def test_explanations_name_matched_and_checked_concepts(searcher: Searcher) -> None:
    hit = searcher.search("dog but not cat", k=1, strategy="filter", dims="query")[0]
    assert hit.matched[0].dim == WORDS.index("dog")
    assert "dog" in hit.matched[0].words
    (check,) = hit.excluded
    assert check.term == "cat" and WORDS.index("cat") in check.dims and check.item_mass == 0.0


def test_no_exclusion_and_paging(searcher: Searcher) -> None:
    first = searcher.search("tree", k=2)
    second = searcher.search("tree", k=2, offset=2)
    assert len(first) == 2 and not {h.id for h in first} & {h.id for h in second}
    assert all("tree" in ITEMS[h.id] for h in first + second)


def test_bad_input(searcher: Searcher, tmp_path: Path) -> None:
    with pytest.raises(SparsemmError, match="unknown strategy"):
        searcher.search("dog", strategy="nope")
    with pytest.raises(SparsemmError):
        searcher.search("   ")
    with pytest.raises(SparsemmError, match="no index"):
        Searcher(_collection(tmp_path / "other"))


def test_cli_index_and_search(tmp_path: Path, capsys) -> None:
    col = _collection(tmp_path)
    sr = _identity_sr(tmp_path)
    assert main(["index", str(col), "--model", str(sr)]) == 0
    assert "indexed 12 items" in capsys.readouterr().out
    assert main(["search", str(col), "pizza -car", "-k", "3", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "[hybrid]" in out and "matched dim" in out and "checked 'car'" in out
    # The default scorer demotes the item with a car below the clean pizza item.
    assert out.index(" p1 ") < out.index(" p2 ")
    assert main(["search", str(col), "pizza -car", "-k", "3", "--strategy", "filter"]) == 0
    out = capsys.readouterr().out
    assert "p1" in out and "p2" not in out
    assert main(["search", str(col), "pizza -car", "--engine", "index", "--json"]) == 0
    assert '"id": "p1"' in capsys.readouterr().out
    # Only an exclusion: items are ranked by absence, the car items last.
    assert main(["search", str(col), "no car", "-k", "12", "--json"]) == 0
    ids = [h["id"] for h in json.loads(capsys.readouterr().out)["hits"]]
    with_car = [i for i in ids if "car" in ITEMS[i]]
    assert set(ids[-len(with_car) :]) == set(with_car) == {"p2", "r1"}
    assert main(["search", str(col), "   "]) == 2
    assert capsys.readouterr().err.startswith("error:")


def test_terms_the_model_does_not_know_are_named(searcher: Searcher) -> None:
    with pytest.raises(SparsemmError, match=r"'qwerty' matches no concept .* cannot search for"):
        searcher.search("qwerty")
    with pytest.raises(SparsemmError, match=r"'qwerty' matches no concept .* cannot exclude"):
        searcher.search("dog but not qwerty", strategy="penalty")
    with pytest.raises(SparsemmError, match="'blorp' matches no concept"):
        searcher.search("dog, blorp")
    with pytest.raises(SparsemmError, match="'zzz' matches no concept"):
        searcher.search("dog", exclude=("zzz",), strategy="dense_a")  # dense: the embedding
    with pytest.raises(SparsemmError, match="'qwerty' matches no concept"):
        searcher.search_index("dog but not qwerty")
    assert searcher.search("dog but not cat", strategy="dense_a")[0].id == "d1"


def _naive_explain(searcher: Searcher, row: int, q) -> tuple[list, list]:
    """The reference: the item's dense row, B's dims recomputed from the filter strategy."""
    from sparsemm.query.strategies import get_strategy

    item = searcher.codes[row].toarray().ravel()
    a = " and ".join(q.include)
    contrib = searcher.context.term_code(a) * item
    order = [int(j) for j in np.argsort(-contrib, kind="stable")[:5] if contrib[j] > 0]
    matched = [(j, float(contrib[j])) for j in order]
    filt = get_strategy("filter", searcher.context, dims="query")
    checks = []
    for b in q.exclude:
        dims = [int(j) for j in np.flatnonzero(filt.b_weights(a, b) > 0)]
        checks.append((b, dims, float(item[dims].sum()) if dims else 0.0))
    return matched, checks


@pytest.mark.parametrize(
    "text", ["dog but not cat", "tree, no dog, no ball", "pizza -car", "cat and tree"]
)
def test_explanations_equal_the_per_row_reference(searcher: Searcher, text: str) -> None:
    from sparsemm.query.parse import parse_query

    q = parse_query(text)
    hits = searcher.search(q, k=12, strategy="penalty")
    assert hits
    for h in hits:
        matched, checks = _naive_explain(searcher, h.row, q)
        assert [(c.dim, c.weight) for c in h.matched] == matched  # the same float32 products
        assert [(e.term, e.dims) for e in h.excluded] == [(t, d) for t, d, _ in checks]
        assert [e.item_mass for e in h.excluded] == pytest.approx([m for *_, m in checks])
        m2, e2 = searcher.explain(h.row, q)
        assert (m2, e2) == (h.matched, h.excluded)


def test_a_parked_collection_still_finds_its_index(searcher: Searcher, tmp_path: Path) -> None:
    """After a crash between the two renames of a collection swap only ``.col.old`` is
    left; open_collection falls back to it and so must the searcher's index."""
    from sparsemm.io import old_dir

    col = searcher.collection.root
    want = [h.id for h in searcher.search("dog but not cat")]
    col.rename(old_dir(col))
    parked = Searcher(col)
    assert parked.collection.root == old_dir(col)
    assert [h.id for h in parked.search("dog but not cat")] == want
    build_index(col, tmp_path / "sr")  # re-indexing writes beside the parked items too
    assert not col.exists() and (old_dir(col) / "index" / "manifest.json").is_file()


def test_models_trained_on_other_encoders_are_refused(tmp_path: Path) -> None:
    from sparsemm.data.collection import open_collection
    from sparsemm.models.base import EncoderMismatch, encoder_record
    from sparsemm.query.code_models import load_code_model

    col = _collection(tmp_path)
    sr = _identity_sr(tmp_path)
    model = SRModel.from_pretrained(sr)
    model.training_info = encoder_record(open_collection(col).manifest, col)
    model.save_pretrained(sr)
    build_index(col, sr)  # recorded encoders = the collection's: fine
    assert Searcher(col).search("dog")[0].id == "d1"
    model.training_info = {
        "image_encoder": {"name": "clip", "model": "openai/clip-vit-base-patch32", "dim": 6},
        "text_encoder": {"name": "clip", "model": "openai/clip-vit-base-patch32", "dim": 6},
    }
    model.save_pretrained(sr)
    manifest = open_collection(col).manifest
    for fn in (
        lambda: build_index(col, sr),
        lambda: Searcher(col),
        lambda: load_code_model(sr, collection=(manifest, col)),
    ):
        with pytest.raises(EncoderMismatch, match=r"trained on clip .*the collection has toykw"):
            fn()
    load_code_model(sr)  # without a collection to check against, it loads


def test_cli_json_paths_and_strategy_list(tmp_path: Path, capsys) -> None:
    col = _collection(tmp_path)
    sr = _identity_sr(tmp_path)
    assert main(["index", str(col), "--model", str(sr)]) == 0
    capsys.readouterr()
    assert main(["search", str(col), "a dog, but there is no cat", "-k", "3", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["query"] == {"include": ["dog"], "exclude": ["cat"], "text": "dog -cat"}
    assert out["strategy"] == "hybrid" and len(out["hits"]) == 3
    assert {"id", "rank", "score", "image", "caption", "labels", "evidence"} <= set(out["hits"][0])
    assert main(["search", str(col), "dog -cat", "-k", "3", "--paths"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines == [h["id"] for h in out["hits"]]  # no images here: the ids
    assert main(["search", "--list-strategies"]) == 0
    listing = capsys.readouterr().out
    assert listing.startswith("dense_a") and "hybrid" in listing and "filter" in listing
    assert main(["search", str(col)]) == 2
    assert "give a collection and a query" in capsys.readouterr().err
    # --exclude alone is a query of what to leave out, as "no cats" is
    assert main(["search", str(col), "--exclude", "cat", "-k", "12", "--json"]) == 0
    alone = json.loads(capsys.readouterr().out)
    assert alone["query"]["include"] == [] and alone["query"]["exclude"] == ["cat"]
    assert main(["search", str(col), "no cats", "-k", "12", "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert [h["id"] for h in alone["hits"]] == [h["id"] for h in said["hits"]]


def test_batched_text_encoding_gives_the_same_hits_from_many_threads(searcher: Searcher) -> None:
    """A server's searcher encodes the texts of concurrent searches together: each thread
    still gets the hits a lone search gives."""
    from concurrent.futures import ThreadPoolExecutor

    from sparsemm.encoders.batching import BatchingTextEncoder

    queries = ["dog but not cat", "tree -dog", "pizza", "cat, tree but not dog", "ball -tree"]
    want = {q: [(h.id, h.score) for h in searcher.search(q, k=4)] for q in queries}
    searcher.batch_text_encoding(max_batch=8)
    searcher.batch_text_encoding()  # idempotent: one wrapper
    enc = searcher.encoder
    assert isinstance(enc, BatchingTextEncoder) and not isinstance(enc.base, BatchingTextEncoder)
    with ThreadPoolExecutor(5) as pool:
        got = list(pool.map(lambda q: searcher.search(q, k=4), queries * 4))
    for q, hits in zip(queries * 4, got, strict=True):
        assert [(h.id, h.score) for h in hits] == want[q]
    assert enc.batches >= 1


@pytest.mark.parametrize("strategy", [None, "penalty", "dense_a"])
def test_prepare_encodes_what_search_needs(searcher: Searcher, strategy: str | None) -> None:
    """``prepare`` (the server calls it before taking a search lane) leaves every text
    the search needs in the caches: the search then encodes nothing and ranks the same;
    a term the model does not know gets search's error."""
    want = [(h.id, h.score) for h in searcher.search("dog but not cat", k=4, strategy=strategy)]
    searcher.clear_text_caches()
    calls: list[list[str]] = []
    enc = searcher.encoder
    base_encode = enc.encode_text

    def counting(texts, *args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append(list(texts))
        return base_encode(texts, *args, **kwargs)

    enc.encode_text = counting
    searcher.prepare("dog but not cat", strategy)
    assert calls, "prepare encoded nothing"
    prepared = len(calls)
    got = [(h.id, h.score) for h in searcher.search("dog but not cat", k=4, strategy=strategy)]
    assert len(calls) == prepared  # nothing left to encode
    assert got == want
    with pytest.raises(SparsemmError, match="'qwerty' matches no concept"):
        searcher.prepare("dog but not qwerty", strategy)
    searcher.prepare("dog", "no_such_strategy")  # search() names it; prepare stays quiet
    with pytest.raises(SparsemmError, match="unknown strategy"):
        searcher.search("dog", strategy="no_such_strategy")


def test_an_answer_round_trips_through_json(searcher: Searcher) -> None:
    """The CLI prints, and reads back from a running server, one Answer: to_json ->
    JSON text -> from_json gives the same answer (rows aside, which JSON does not carry),
    and a server's hit with more keys (thumbnails, violations) reads as the same hit."""
    from sparsemm.query.hits import Answer
    from sparsemm.query.request import build_request

    answer = searcher.answer(build_request("dog but not cat", k=5, count=True))
    assert answer.hits and answer.total == len(ITEMS)
    data = json.loads(json.dumps(answer.to_json()))
    back = Answer.from_json(data)
    assert back.to_json() == data
    assert back.query == answer.query and [h.id for h in back.hits] == [h.id for h in answer.hits]
    assert all(h.row == -1 for h in back.hits) and "row" not in data["hits"][0]
    served = dict(data, k=5, offset=0, like=None)
    served["hits"] = [dict(h, image="/img/x", thumb=None, violations=[]) for h in data["hits"]]
    assert Answer.from_json(served).to_json() == data
    # "more like" an item with nothing left out: an empty query, read back from a server
    like = searcher.answer(build_request(like=answer.hits[0].id, k=2))
    data = json.loads(json.dumps(like.to_json()))
    assert data["query"]["include"] == data["query"]["exclude"] == []
    assert Answer.from_json(data).to_json() == data


def test_an_empty_answer_says_why(searcher: Searcher, monkeypatch: pytest.MonkeyPatch) -> None:
    """When the match scorer finds nothing, the answer says why, read over every item: a
    wanted thing no item shows, wanted things only found apart, or every item with them
    also showing what is left out; a search that finds items says none of this."""
    from sparsemm.query.parse import parse_query
    from sparsemm.query.request import build_request
    from sparsemm.query.strategies import get_spec

    ids = list(searcher.collection.ids)
    shows = {"cup": {"d1"}, "table": {"d2", "d3"}, "plate": {"d1"}, "spoon": set()}

    class Scorer:  # P(term | item) where the item shows it (a plate surely), else 0
        def term_probability(self, term: str, excluded: bool = False) -> np.ndarray:
            sure = 1.0 if term == "plate" else 0.9
            return np.array([sure if i in shows[term] else 0.0 for i in ids])

        def probability(self, include: tuple[str, ...], exclude: tuple[str, ...]) -> np.ndarray:
            p = np.ones(len(ids))
            for t in include:
                p = p * self.term_probability(t)
            for t in exclude:
                p = p * (1.0 - self.term_probability(t))
            return p

    monkeypatch.setattr(searcher, "_match_over_items", lambda: Scorer())
    note = searcher.empty_note
    assert note(parse_query("a spoon and a cup")) == (
        "no item shows 'spoon': its match is 0% for every item"
    )
    assert note(parse_query("a cup and a table")) == (
        "no item shows these together ('cup' in 1 item, 'table' in 2 items); "
        "search them one at a time"
    )
    assert note(parse_query("a cup but no plate")) == (
        "every item showing what is wanted also shows what is left out"
    )
    assert note(parse_query("a cup and a plate")) is None
    assert note(parse_query("no cups")) is None
    # the answer of the match scorer carries the note when it has no hits
    monkeypatch.setattr(searcher, "strategy_spec", lambda name=None: get_spec("match"))
    monkeypatch.setattr(searcher, "_read_terms", lambda q, name: ([], []))
    monkeypatch.setattr(searcher, "_ranked", lambda *a, **kw: ([], None))
    answer = searcher.answer(build_request("a cup and a table", k=5))
    assert answer.hits == [] and answer.notes == [note(parse_query("a cup and a table"))]
    monkeypatch.setattr(searcher, "_count", lambda q, threshold: 0)
    strict = searcher.answer(build_request("a cup and a table", k=5, min_score="50%"))
    assert strict.notes == answer.notes  # with --min-score too


def test_a_short_page_of_several_things_says_how_many_items_show_each(
    searcher: Searcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ "big cat in the grass" found in 1 item, where 2 show a big cat and 3 grass: the note
    names each thing's count, so the user sees which word to drop (before, it named only
    the phrase); two wanted terms are counted the same way."""
    from sparsemm.query.parse import parse_query

    ids = list(searcher.collection.ids)
    total = len(ids)
    shows = {"big cat": set(ids[:2]), "grass": set(ids[1:4])}
    phrase = "big cat in the grass"

    class Concept:
        def __init__(self, term: str) -> None:
            self.term = term

    class Reading:
        def __init__(self, terms: list[str]) -> None:
            self.concepts = [Concept(t) for t in terms]

    class Scorer:
        def reading(self, term: str) -> Reading:
            return Reading(["big cat", "grass"] if term == phrase else [term])

        def term_probability(self, term: str, excluded: bool = False) -> np.ndarray:
            if term == phrase:
                return self.term_probability("big cat") * self.term_probability("grass")
            return np.array([0.9 if i in shows[term] else 0.0 for i in ids])

    monkeypatch.setattr(searcher, "_match_over_items", lambda: Scorer())
    assert searcher.empty_note(parse_query(phrase), found=1, k=10) == (
        f"only 1 of the {total} items shows any sign of {phrase!r} (2 show 'big cat', 3 "
        "'grass'; a match needs them all); the others are a 0% match"
    )
    assert searcher.empty_note(parse_query("big cat and grass"), found=1, k=10) == (
        f"only 1 of the {total} items shows any sign of 'big cat' and 'grass' (2 show "
        "'big cat', 3 'grass'; a match needs them all); the others are a 0% match"
    )
    assert searcher.empty_note(parse_query("grass"), found=3, k=10) == (
        f"only 3 of the {total} items show any sign of 'grass'; the others are a 0% match"
    )


def test_a_short_page_says_how_many_items_match_at_all(
    searcher: Searcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A search of the match scorer that finds fewer items than asked for says how many
    show any sign of what is wanted (the rest are a 0% match, left out), where a page of
    3 hits for -k 38 used to come with no word; a page past the matches says so; a full
    page and a --min-score search (which counts its matches) say nothing of it."""
    from sparsemm.query.hits import Hit
    from sparsemm.query.request import build_request
    from sparsemm.query.strategies import get_spec

    total, found = len(searcher.collection.items), 3

    def ranked(q, spec, k, offset, params):  # type: ignore[no-untyped-def]
        rows = range(offset, min(found, offset + k))
        return [Hit(r + 1, r, f"i{r}", 0.5, "", []) for r in rows], None

    monkeypatch.setattr(searcher, "strategy_spec", lambda name=None: get_spec("match"))
    monkeypatch.setattr(searcher, "_read_terms", lambda q, name: ([], []))
    monkeypatch.setattr(searcher, "_count", lambda q, threshold: found)
    monkeypatch.setattr(searcher, "_ranked", ranked)
    note = f"only {found} of the {total} items show any sign of 'dog'; the others are a 0% match"
    assert searcher.answer(build_request("a dog", k=10)).notes == [note]
    assert note in searcher.answer(build_request("a dog", k=2, offset=2)).notes
    for quiet in (build_request("a dog", k=found), build_request("a dog", k=10, min_score=0.01)):
        assert note not in searcher.answer(quiet).notes
    # a page that starts past the matches says so (it printed "no results" and nothing else)
    past = searcher.answer(build_request("a dog", k=2, offset=found)).notes
    assert past == [f"{note}; this page starts past them (offset {found})"]
    found = 1
    assert searcher.answer(build_request("a dog", k=10)).notes == [
        f"only 1 of the {total} items shows any sign of 'dog'; the others are a 0% match"
    ]
    found = total  # a page longer than the collection: nothing to say ("only 9 of the 9")
    assert not any(
        "any sign" in n for n in searcher.answer(build_request("a dog", k=total + 5)).notes
    )


def test_an_excluded_check_leads_with_what_the_item_carries() -> None:
    """The check of an excluded term on a hit lists the term's dimensions the hit carries
    most first, named by their words ("'animals' ... (conch, anemone fish)"), where it
    listed the term's first dimensions by number (goldfish, great white shark, tench: not
    what was in the photo); all the term's dims stay listed, the mass is unchanged."""
    import scipy.sparse as sp

    from sparsemm.query.hits import Explainer

    on = np.zeros(5, dtype=bool)
    on[:4] = True
    labels = [["d0"], ["d1"], ["d2"], ["d3"], ["x"]]
    why = Explainer(np.zeros(5, np.float32), [("dog", [0, 1, 2, 3], on, ["d0"])], labels)
    codes = sp.csr_matrix(np.array([[0, 0, 0.5, 0.9, 0.3], [0, 0, 0, 0, 0.8]]))
    carried = why.explain(codes, 0)[1][0]
    assert carried.dims == [3, 2, 0, 1] and carried.words == ["d3", "d2"]
    assert carried.item_mass == pytest.approx(1.4)
    clean = why.explain(codes, 1)[1][0]
    assert clean.dims == [0, 1, 2, 3] and clean.words == ["d0"] and clean.item_mass == 0.0


def test_the_example_query_is_made_of_what_the_items_show(
    searcher: Searcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`up --no-serve` and the page suggest a query the collection answers (`up` always
    said "a dog"): the commonest everyday thing, less the one most often with it that not
    all of its items show; "a dog" when the model reads none of the words or has no match
    scorer; computed once per searcher."""
    from sparsemm.query import term_checks

    n = len(searcher.collection.items)
    shows = {"people": [], "an animal": [0, 1, 2], "a dog": [0], "a cat": [0, 1, 2]}
    shows["a car"] = [0, 1, 3]  # with two of the three animals
    calls = []

    class Strategy:
        def term_probability(self, word: str) -> np.ndarray:
            calls.append(word)
            if word not in shows:
                raise SparsemmError(f"{word!r} is not something this model can see")
            p = np.zeros(n)
            p[shows[word]] = 0.9
            return p

    matcher: Strategy | None = Strategy()

    def match_strategy(ctx: object = None) -> Strategy:
        if matcher is None:
            raise SparsemmError("the match scorer needs a model with concepts")
        return matcher

    monkeypatch.setattr(searcher, "_match_over_items", match_strategy)

    def example() -> str:
        searcher._example = None
        return searcher.example_query()

    assert example() == "an animal but not a car"  # "a cat": in every animal item
    del shows["a car"]
    assert example() == "an animal but not a dog"
    before = len(calls)
    assert searcher.example_query() == "an animal but not a dog" and len(calls) == before
    shows.clear()
    assert example() == "a dog"
    matcher = None
    assert example() == "a dog"
    monkeypatch.setattr(term_checks, "EXAMPLE_MAX_ITEMS", n - 1)
    assert example() == "a dog"
