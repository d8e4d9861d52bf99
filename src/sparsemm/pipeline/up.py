"""A folder of photos to an indexed collection, the pipeline behind ``sparsemm up``.

Steps (each reuses the project's own machinery): read the folder (and an optional captions
file) -> embed new or changed images with EfficientNet-Lite0 (captions with MiniLM) into
``OUT/collection`` -> a model: the ImageNet concept model in ``OUT/model`` (built once, no
training, no captions needed), or, with captions on at least :data:`MIN_TRAIN_PHOTOS`
photos, SR trained on them in ``OUT/sr`` (SPINE in ``OUT/spine``), or ``--model`` -> index.
A re-run embeds only new or changed photos and adds them to the index; photos gone from the
folder are removed from the collection. :func:`up` returns an :class:`UpReport`; what it
does as it goes is said through ``say`` (the CLI prints it).
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sparsemm.data.collection import UP_DIR_NAME, UP_LOCK
from sparsemm.errors import SparsemmError
from sparsemm.io import exclusive_lock

log = logging.getLogger(__name__)


def _said(line: str) -> None:
    log.info("%s", line)


COLLECTION = "collection"
MODEL = "model"
SR_MODEL = "sr"  # an SR model trained on the folder's captions
SPINE = "spine"  # its SPINE word vectors
TRAINING = ".training"  # where both are trained before they replace OUT/sr and OUT/spine
# With captions on at least this many photos, `up` trains SR on them instead of using the
# ImageNet concept model. benchmarks/up_captions.py (collages, 200 uncaptioned photos beside
# the captioned ones): SR's AP@10 0.28 / 0.43 / 0.56 / 0.65 / 0.99 at 5 / 10 / 20 / 30 / 200
# captioned photos against 0.23-0.29 for the concept model; below 20 the model knows only the
# words of a handful of captions, where the concept model knows 1000 classes.
MIN_TRAIN_PHOTOS = 20
# SR and SPINE sizes for a folder: the demo's (sparsemm_experiments.collage_run), with enough
# epochs that a small folder still gets this many (image, caption) pair visits.
UP_LATENT_DIM = 1000
UP_TOP_K = 64
UP_SPINE_WORDS = 5000
UP_SPINE_EPOCHS = 100
UP_PAIR_VISITS = 40_000


ENCODERS = ("efficientnet", "clip", "siglip")
VOCABULARY_SIZE = 10_000  # concepts read from a --vocabulary file (its most frequent)
# The collection's image encoder (sparsemm.encoders.efficientnet with the packaged weights)
EFFICIENTNET_INFO = {"name": "efficientnet", "dim": 1280, "model": "efficientnet-lite0"}


def minilm_info() -> dict[str, Any]:
    """The manifest entry of the offline text encoder, without loading it (10 s)."""
    from sparsemm.encoders.minilm import DEFAULT_DIM

    return {"name": "minilm", "dim": DEFAULT_DIM, "model": "all-MiniLM-L6-v2"}


def _lazy(name: str) -> Any:
    built: list[Any] = []

    def get() -> Any:
        if not built:
            from sparsemm.encoders.base import get_encoder

            built.append(get_encoder(name))
        return built[0]

    return get


def ensure_model(
    out: Path, model: Path | None, progress: bool, say: Callable[[str], None] = _said
) -> Path:
    """The model folder to index with: ``model`` if given, else ``OUT/model`` (the ImageNet
    concept model, copied there from the user cache, built on first use)."""
    from sparsemm.models.base import CONFIG_FILE
    from sparsemm.query.code_models import load_code_model

    if model is not None:
        # a clear error now, not after encoding: the model must read these encoders
        manifest = {"encoder": EFFICIENTNET_INFO, "text_encoder": minilm_info()}
        load_code_model(model, collection=(manifest, out / COLLECTION))
        return model
    target = out / MODEL
    if target.is_dir() and any(target.iterdir()) and not (target / CONFIG_FILE).is_file():
        raise SparsemmError(f"{target} exists and is not a sparsemm model; choose another -o")
    from sparsemm.models.imagenet_concepts import (
        CONCEPTS_VERSION,
        cached_imagenet_concepts,
        default_cache_dir,
    )

    if (target / CONFIG_FILE).is_file():
        try:
            current = load_code_model(target)
            if getattr(current, "version", CONCEPTS_VERSION) >= CONCEPTS_VERSION:
                from sparsemm.models.imagenet_concepts import with_photo_defaults

                m = current.model  # type: ignore[attr-defined]
                if with_photo_defaults(m) is m:
                    return target
            say(f"updating the concept model in {target} to version {CONCEPTS_VERSION}")
        except SparsemmError as exc:
            log.warning("the model in %s is unusable (%s); writing it again", target, exc)

    if not (default_cache_dir() / CONFIG_FILE).is_file():
        say(
            "building the ImageNet concept model: embedding 2,860 class names and glosses "
            f"(once; kept in {default_cache_dir()})"
        )
    cached_imagenet_concepts(progress=progress).save_pretrained(target)
    return target


def clip_model(
    out: Path,
    col: Any,
    encoder: Any,
    vocabulary: Path | None,
    progress: bool,
    say: Callable[[str], None] = _said,
) -> Path:
    """``OUT/model``: the CLIP/SigLIP concept model (SpLiCE over the ImageNet and COCO
    concepts, and ``vocabulary``'s), built once from the collection's image embeddings;
    built again when the encoder or the vocabulary changed."""
    from sparsemm.models.base import CONFIG_FILE
    from sparsemm.models.clip_concepts import COCO_OBJECTS, ClipConceptModel

    concepts = list(dict.fromkeys([*imagenet_names(), *COCO_OBJECTS]))
    if vocabulary is not None:
        from sparsemm.baselines.splice import load_concepts

        concepts = list(dict.fromkeys([*concepts, *load_concepts(vocabulary, VOCABULARY_SIZE)]))
    target = out / MODEL
    if (target / CONFIG_FILE).is_file():
        try:
            old = ClipConceptModel.from_pretrained(target)
            same = (
                old.config.encoder == encoder.name
                and old.config.encoder_model == str(getattr(encoder, "model_id", ""))
                and list(old.config.concepts) == concepts
            )
            if same:
                return target
        except SparsemmError as exc:
            log.warning("the model in %s is unusable (%s); building it again", target, exc)
    say(f"building the {encoder.name} concept model: embedding {len(concepts):,} concepts")
    model = ClipConceptModel.build(concepts, encoder, col.image_embeddings(), progress=progress)
    model.save_pretrained(target)
    return target


def imagenet_names() -> list[str]:
    """The 1000 ImageNet-1k class names (first WordNet synonym each)."""
    from sparsemm.encoders.efficientnet import imagenet_class_names

    return list(imagenet_class_names())


def will_train(out: Path, n_captioned: int, force: bool) -> bool:
    """Whether ``up`` serves an SR model trained on the captions: when forced, when one was
    trained here before (it is reused), or with captions on at least
    :data:`MIN_TRAIN_PHOTOS` photos."""
    from sparsemm.models.base import CONFIG_FILE

    return force or (out / SR_MODEL / CONFIG_FILE).is_file() or n_captioned >= MIN_TRAIN_PHOTOS


def detector_mentions(n_photos: int) -> int:
    """Captioned photos a word needs for a word detector of its own in a folder of
    ``n_photos`` captioned photos: a tenth of them, between 2 and the default 10 (a folder
    of 25 mentions "dog" twice, not ten times)."""
    from sparsemm.models.detectors import DetectorConfig

    return max(2, min(DetectorConfig.min_mentions, n_photos // 10))


def caption_model(
    out: Path, col: Any, force: bool, progress: bool, say: Callable[[str], None] = _said
) -> Path | None:
    """``OUT/sr``: the SR model trained on the collection's captions before, else (or with
    ``force``) one trained now, with its SPINE vectors in ``OUT/spine``. Training happens in
    ``OUT/.training``, which replaces ``OUT/sr`` and ``OUT/spine`` only when done, so a
    killed run leaves the previous model.

    The model is served with its word detectors (:func:`detector_mentions`): they give the
    default scorer its match probabilities. None when no word is in enough captions for
    one: an SR model without them would rank by raw code similarity, on another scale
    than "% match", so the caller keeps the ImageNet concept model instead."""
    from sparsemm.io import replace_dir
    from sparsemm.models.base import CONFIG_FILE
    from sparsemm.models.detectors import DetectorConfig, has_detectors
    from sparsemm.train.spine import train_caption_spine
    from sparsemm.train.sr import SRTrainConfig, train_sr_on_collection

    target = out / SR_MODEL
    # a model saved without detectors (served on another scale than "% match") is redone
    if (target / CONFIG_FILE).is_file() and has_detectors(target) and not force:
        say(f"model: SR trained on the captions earlier ({target}; --train trains it again)")
        return target
    rows, owner = col.caption_rows(col.split_mask("all"))
    n_photos = len(set(owner.tolist()))
    if n_photos < 2:
        raise SparsemmError(
            f"training needs captions on at least 2 photos; {col.root} has {n_photos} "
            "(give them with --captions FILE, or drop --train)"
        )
    captions = [str(col.texts[int(r)]["text"]) for r in rows]
    say(f"training an SR model on {n_photos} captioned photos ({len(captions)} captions)")
    work = out / TRAINING
    shutil.rmtree(work, ignore_errors=True)  # a killed run's leftovers (minutes to redo)
    t0 = time.perf_counter()
    vectors = train_caption_spine(
        work / SPINE,
        captions,
        latent_dim=UP_LATENT_DIM,
        top_words=UP_SPINE_WORDS,
        epochs=UP_SPINE_EPOCHS,
        progress=progress,
    )
    epochs = min(200, max(10, -(-UP_PAIR_VISITS // len(captions))))
    model, _, _, _ = train_sr_on_collection(
        col,
        work / SR_MODEL,
        vectors,
        split="all",
        latent_dim=UP_LATENT_DIM,
        top_k=UP_TOP_K,
        train=SRTrainConfig(epochs=epochs),
        progress=progress,
        shared=False,
    )
    from sparsemm.train.detectors import fit_model_detectors

    need = detector_mentions(n_photos)
    try:
        n_det = len(
            fit_model_detectors(
                model,
                work / SR_MODEL,
                col,
                "all",
                DetectorConfig(min_mentions=need),
                progress=progress,
            )
        )
    except SparsemmError:  # no word in `need` captions: no match probabilities
        shutil.rmtree(work, ignore_errors=True)
        say(
            f"no word is in the captions of {need} or more of the {n_photos} photos, so an "
            "SR model would have no word detectors (no match probabilities): the ImageNet "
            "concepts are kept (the captions are shown on the page)"
        )
        return None
    replace_dir(work / SPINE, out / SPINE)
    replace_dir(work / SR_MODEL, target)
    shutil.rmtree(work, ignore_errors=True)
    say(
        f"trained SR ({epochs} epochs, {n_det} word detectors) in "
        f"{time.perf_counter() - t0:.1f} s -> {target}"
    )
    return target


def index_collection(
    col_dir: Path,
    model_dir: Path,
    report: Any,
    spine_dir: Path | None = None,
    progress: bool = False,
    say: Callable[[str], None] = _said,
) -> tuple[Any, str]:
    """Add the new items to the existing index when that is exact, else (re)build it.
    Returns (index, what was done)."""
    from sparsemm.data.collection import open_collection
    from sparsemm.index import InvertedIndex
    from sparsemm.linalg import normalize_rows
    from sparsemm.models.base import config_digest
    from sparsemm.models.detectors import model_weights_sha256
    from sparsemm.query.code_models import load_code_model
    from sparsemm.query.handle import INDEX_DIR
    from sparsemm.query.indexing import build_index

    col = open_collection(col_dir)
    root = col.root / INDEX_DIR
    reason = "new collection"
    index = None
    if (root / "manifest.json").is_file():
        try:
            index = InvertedIndex.open(root)
        except SparsemmError as exc:  # derived from the stored embeddings: built again
            say(f"warning: the index is damaged ({exc}); building it again")
            reason = "the index was damaged"
    if index is not None:
        meta = index.meta or {}
        ids, n_old = col.ids, len(index)
        weights = model_weights_sha256(model_dir)
        same_path = meta.get("model") == str(model_dir.resolve())
        same_config = meta.get("model_config_sha256") in (None, config_digest(model_dir))
        same_model = same_path and same_config and meta.get("model_sha256") in (None, weights)
        # a copied or moved folder's index names the same model where it was before
        moved = not same_path and same_config and meta.get("model_sha256") == weights
        prefix = list(index.ids) == ids[:n_old]
        model = load_code_model(model_dir, int(meta.get("top_k") or 0) or None)
        names = model.dim_names()
        if names is not None and len(names) != index.dim:
            # same weights, other settings: the photo model now reads regions
            same_model = False
        if same_model and prefix and n_old == len(ids):
            return index, "index up to date"
        # Only the concept model codes a subset of items on its own, with fixed labels (class
        # names); an SR index's data-derived labels would go stale, and VDR caches features
        # of the whole collection.
        if same_model and prefix and model.kind == "imagenet_concepts":
            sub = _SubCollection(col, n_old)
            codes = model.encode_items(sub, progress=progress)  # type: ignore[arg-type]
            if model.unit_codes:
                codes = normalize_rows(codes)
            index.add(codes, ids[n_old:])
            return index, f"added {len(ids) - n_old} items to the index"
        reason = (
            "the folder was copied or moved: its index named the model where it was"
            if moved
            else "the model changed"
            if not same_model
            else "photos changed or were removed"
            if not prefix
            else f"a {model.kind} index is rebuilt whole"
        )
    elif reason != "new collection":
        pass  # damaged: said above
    elif report is not None and (
        report.changed or report.removed or report.renamed or report.joined
    ):
        reason = "photos changed or were removed"
    elif report is not None and not report.created:
        reason = "no index yet"
    index = build_index(col_dir, model_dir, spine_dir=spine_dir, progress=progress)
    return index, f"built the index ({reason})"


class _SubCollection:
    """The items of a collection from row ``start`` on, for coding only the new ones."""

    def __init__(self, col: Any, start: int) -> None:
        self._col = col
        self._start = start
        self.root = col.root
        self.manifest = col.manifest
        self.items = col.items[start:]
        self.encoder_name = col.encoder_name

    def image_embeddings(self, mmap: bool = False) -> Any:
        return self._col.image_embeddings(mmap)[self._start :]


@dataclass
class UpReport:
    """What :func:`up` did: where the collection and its model are, what changed."""

    photos: Path
    out: Path
    collection_dir: Path
    model_dir: Path
    items: int  # photos in the collection
    added: int
    changed: int
    unchanged: int
    removed: list[str] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0  # files folded into the photo they copy (listed as its `also`)
    index_action: str = ""  # "index up to date", "built the index (...)", ...
    concepts_per_item: float = 0.0
    seconds: float = 0.0


def check_out_dir(out: Path) -> None:
    """SparsemmError, with the way out, when ``out`` cannot hold the output."""
    if out.exists() and not out.is_dir():
        raise SparsemmError(f"{out} exists and is not a folder; choose another -o")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test.{os.getpid()}"
        probe.touch()
        probe.unlink()
    except OSError as exc:
        raise SparsemmError(
            f"cannot write the output folder {out} ({exc.strerror or exc}); pass -o OUT to "
            "put it somewhere writable"
        ) from exc


def up(
    photos: str | Path,
    *,
    captions: str | Path | None = None,
    out: str | Path | None = None,
    model: str | Path | None = None,
    train: bool = False,
    no_train: bool = False,
    encoder: str = "efficientnet",
    encoder_model: str | None = None,
    vocabulary: str | Path | None = None,
    batch_size: int = 32,
    progress: bool = True,
    say: Callable[[str], None] | None = None,
) -> UpReport:
    """Bring the collection of ``photos`` up to date and index it (module docstring).

    ``out`` defaults to ``PHOTOS/.sparsemm``. ``model``: index with this saved model;
    ``train``: train SR on the captions even below :data:`MIN_TRAIN_PHOTOS`; ``no_train``:
    keep the concept model whatever the captions; ``encoder`` "clip" / "siglip": that
    encoder's concept model (``encoder_model`` its weights, ``vocabulary`` extra concepts).
    ``say`` receives a line for each step (default: the log).
    """
    return _up(
        Path(photos).expanduser(),
        None if captions is None else Path(captions),
        None if out is None else Path(out),
        None if model is None else Path(model),
        train,
        no_train,
        encoder,
        encoder_model,
        None if vocabulary is None else Path(vocabulary),
        batch_size,
        progress,
        say or _said,
    )


def _up(
    photos: Path,
    captions: Path | None,
    out_dir: Path | None,
    model: Path | None,
    force_train: bool,
    no_train: bool,
    encoder_name: str,
    encoder_model: str | None,
    vocabulary: Path | None,
    batch_size: int,
    progress: bool,
    say: Callable[[str], None],
) -> UpReport:
    from sparsemm.data.sync import read_photos, sync_folder
    from sparsemm.encoders.base import get_encoder

    t0 = time.perf_counter()
    if captions is not None and not captions.is_file():
        raise SparsemmError(f"captions file not found: {captions}")
    if encoder_name not in ENCODERS:
        raise SparsemmError(f"unknown encoder {encoder_name!r}; use one of {', '.join(ENCODERS)}")
    items = read_photos(photos, captions)
    out = out_dir if out_dir is not None else photos / UP_DIR_NAME  # hidden, in the folder
    check_out_dir(out)
    with _up_lock(out):
        col_dir = out / COLLECTION
        say(f"{len(items)} photos in {photos} -> {out}")
        clip = encoder_name != "efficientnet"
        _check_options(force_train, no_train, model, encoder_name, vocabulary)
        n_captioned = sum(1 for it in items if it.get("captions"))
        if force_train and n_captioned < 2:  # before minutes of encoding, not after
            raise SparsemmError(
                f"training needs captions on at least 2 photos; {n_captioned} of {len(items)} have "
                "one (give them with --captions FILE, or drop --train)"
            )
        train = (
            not clip
            and model is None
            and not no_train
            and will_train(out, n_captioned, force_train)
        )
        if clip:
            encoder, text_info = _clip_encoder(encoder_name, encoder_model)
            text_encoder: Any = encoder  # one model embeds images, captions and queries
            model_dir = out / MODEL
        else:
            # the concept model is not needed (nor built) when SR is trained
            model_dir = out / SR_MODEL if train else ensure_model(out, model, progress, say)
            encoder = get_encoder("efficientnet")
            text_encoder, text_info = _lazy("minilm"), minilm_info()
        report = sync_folder(
            items,
            col_dir,
            encoder,
            text_encoder,
            text_info,
            source=photos,
            batch_size=batch_size,
            progress=progress,
            before_write=None if clip or train else _reader_ahead(model_dir, progress),
        )
        if report.norms and _reads_norms(model_dir):
            from sparsemm.models.concept_evidence import record_norms

            record_norms(report.collection.root, report.norms)
        _say_synced(report, col_dir, say)
        spine_dir = None
        if clip:
            model_dir = clip_model(out, report.collection, encoder, vocabulary, progress, say)
        elif train:
            trained = caption_model(out, report.collection, force_train, progress, say)
            if trained is None:
                model_dir = ensure_model(out, None, progress, say)
            else:
                model_dir, spine_dir = trained, out / SPINE / "vectors"
        elif n_captioned and model is None:
            say(
                f"model: ImageNet concepts ({n_captioned} captioned photos; an SR model is trained "
                f"on the captions from {MIN_TRAIN_PHOTOS}, or with --train)"
            )
        index, what = index_collection(col_dir, model_dir, report, spine_dir, progress, say)
        per_item = index.nnz / max(len(index), 1)
        say(f"{what}: {len(index)} items, {per_item:.1f} concepts each")
        return UpReport(
            photos=photos,
            out=out,
            collection_dir=col_dir,
            model_dir=model_dir,
            items=len(report.collection.items),
            added=len(report.added),
            changed=len(report.changed),
            unchanged=report.unchanged,
            removed=list(report.removed),
            skipped=list(report.skipped),
            duplicates=report.folded,
            index_action=what,
            concepts_per_item=per_item,
            seconds=time.perf_counter() - t0,
        )


def _up_lock(out: Path) -> Any:
    """The lock one `up` of ``out`` holds for its whole run; a search meanwhile can tell it
    is running (:mod:`sparsemm.query.handle`), and a second `up` stops with one line."""
    return exclusive_lock(
        out / UP_LOCK,
        f"{out} (another sparsemm up)",
        lambda pid: f"another `sparsemm up` is updating {out}{pid}; wait for it to finish",
    )


def _reader_ahead(model_dir: Path, progress: bool) -> Callable[[Path, list[Any]], None]:
    """What reads the concepts of new photos before the collection takes them, for a model
    that reads photos (the photo concept model; others need nothing read): searches keep
    answering from the old index meanwhile, where they would be refused while the new
    collection is ahead of it (about 0.4 s a photo)."""

    def read(root: Path, new: list[Any]) -> None:
        from sparsemm.query.code_models import load_code_model

        if not new:
            return
        ahead = getattr(load_code_model(model_dir), "read_ahead", None)
        if ahead is not None:
            ahead(root, new, progress=progress)

    return read


def _reads_norms(model_dir: Path) -> bool:
    """Whether the model codes photos from their pooled-feature norms, which `up` then
    records as it embeds: the photo concept model of version 1 (later ones read each
    photo's evidence; other models, the embeddings alone)."""
    from sparsemm.io import read_json
    from sparsemm.models.base import CONFIG_FILE

    try:
        config = read_json(model_dir / CONFIG_FILE)
    except (SparsemmError, OSError):
        return False  # none yet (trained later in the run): coded without norms
    return (
        isinstance(config, dict)
        and config.get("model_type") == "imagenet_concepts"
        and config.get("version", 1) == 1
    )


def _clip_encoder(encoder_name: str, encoder_model: str | None) -> tuple[Any, dict[str, Any]]:
    """The CLIP / SigLIP encoder ``--encoder`` names (``encoder_model``: its weights), and its
    manifest entry."""
    from sparsemm.data.encode import encoder_info
    from sparsemm.encoders.base import get_encoder
    from sparsemm.encoders.hf import WeightsUnavailable

    kwargs = {"model": encoder_model} if encoder_model else {}
    try:
        encoder = get_encoder(encoder_name, **kwargs)
    except WeightsUnavailable as exc:  # `up` takes the folder as --encoder-model
        raise SparsemmError(exc.line("--encoder-model")) from None
    return encoder, encoder_info(encoder)


def _check_options(
    force_train: bool,
    no_train: bool,
    model: Path | None,
    encoder_name: str,
    vocabulary: Path | None,
) -> None:
    """SparsemmError for options of :func:`up` that do not go together."""
    if force_train and model is not None:
        raise SparsemmError("--train trains a model on the captions; it does not go with --model")
    if force_train and no_train:
        raise SparsemmError("--train and --no-train contradict each other; give one")
    if encoder_name != "efficientnet" and (force_train or model is not None):
        raise SparsemmError(
            f"--encoder {encoder_name} serves its own concept model; --train and --model go "
            "with the offline encoder (drop --encoder)"
        )
    if vocabulary is not None and encoder_name == "efficientnet":
        raise SparsemmError("--vocabulary adds concepts to a clip / siglip model (--encoder)")


def _say_synced(report: Any, col_dir: Path, say: Callable[[str], None]) -> None:
    """Tell what syncing the folder into the collection did (``report``: its SyncReport)."""
    say(
        f"collection: {len(report.collection.items)} photos ({len(report.added)} new, "
        f"{len(report.changed)} changed, {report.unchanged} unchanged)"
    )
    if report.folded:
        say(
            f"{report.folded} duplicate file(s) (same bytes as another photo, or a link to one) "
            "folded: each photo is shown once, with its other paths"
        )
    if report.renamed:
        shown = ", ".join(f"{o} -> {n}" for o, n in report.renamed[:5])
        say(f"{len(report.renamed)} photo(s) kept under another of their paths: {shown}")
    if report.joined:
        shown = ", ".join(report.joined[:5]) + (" ..." if len(report.joined) > 5 else "")
        say(f"{len(report.joined)} photo(s) now a copy of another photo, shown with it: {shown}")
    if report.removed:
        shown = ", ".join(report.removed[:5]) + (" ..." if len(report.removed) > 5 else "")
        say(f"removed {len(report.removed)} photo(s) no longer in the folder: {shown}")
    if report.skipped:
        first = report.skipped[0]
        say(
            f"warning: skipped {len(report.skipped)} unreadable image(s), e.g. {first['id']}: "
            f"{first['error']} (listed in {col_dir}/skipped.jsonl)"
        )


def example_query(collection_dir: Path) -> str:
    """A query the collection answers, to suggest after `sparsemm up`
    (:meth:`~sparsemm.query.term_checks.TermChecks.example_query`); "a dog" when the
    collection cannot be opened (`search` says why)."""
    from sparsemm.query.searcher import Searcher
    from sparsemm.query.term_checks import FALLBACK_EXAMPLE

    try:
        searcher = Searcher(collection_dir)
    except SparsemmError:
        return FALLBACK_EXAMPLE
    try:
        return searcher.example_query()
    finally:
        searcher.close()
