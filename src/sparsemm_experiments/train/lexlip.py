"""LexLIP training: lexicon-bottlenecked pre-training, then momentum lexicon contrastive.

Two phases (Luo et al., "LexLIP", ICCV 2023, Sec. 3.2-3.3), one plain function,
:func:`train_lexlip`, resumable at step granularity:

1. **Lexicon-bottlenecked pre-training** (after LexMAE). Per (item, caption) pair:
   masked-language modelling on the text encoder (``enc_mask_rate`` 30% of the caption's
   word pieces replaced by [MASK]); the text lexicon bottleneck
   ``b_t = softmax(max_t l_t) @ E`` feeds a weak decoder that reconstructs the caption
   from a copy masked at ``dec_mask_rate`` (50%); the image's bottleneck ``b_i`` feeds the
   same decoder for the same caption (independently masked), so the image's lexicon
   distribution must name the caption's words; plus in-batch InfoNCE on the dense [CLS]
   paths (the released code's phase-1 task also trains a contrastive term), so the Dense
   variant and phase 2 start from aligned towers.
2. **Momentum lexicon-contrastive pre-training**. Momentum copies (MoCo, He et al. 2020) of
   the trained parts of both towers (m = ``momentum``) fill feature queues (``queue_size``)
   of lexicon vectors and dense vectors; the student's image lexicon is contrasted with the
   momentum text lexicons of the batch and the queue (and the other way round) by
   cosine / tau; the same for the dense paths; plus lambda x FLOPs regulariser (Paria et
   al. 2020) on both students' lexicon weights. Queue entries of the same item as the
   query (its other captions) are not used as negatives.

Optimisation (paper settings, scaled to CPU): AdamW, lr 5e-5 for the pretrained MiniLM
layers, ``new_lr`` for freshly initialised layers (heads, image tower, decoder; the paper's
lr is tuned for ~10^5 steps, these runs make a few hundred), weight decay 0.01 (not on
biases/norms), linear warm-up over 10% of each phase then linear decay, gradient clipping at
1.0. Each phase has its own optimizer and schedule. Every random draw (item order, caption
choice, masks, dropout) is seeded by (seed, phase, step), so resuming from a checkpoint
replays exactly what an uninterrupted run would have done.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from sparsemm.data.collection import Collection
from sparsemm.errors import SparsemmError
from sparsemm.io import check_output_dir, find_dir, load_npy, read_json, save_npy, write_json
from sparsemm.train.checkpoint import (
    CKPT_DIR,
    checkpoint_due,
    has_checkpoint,
    load_matching_checkpoint,
    save_checkpoint,
)
from sparsemm.train.loop import stop_if_diverged
from sparsemm.train.losses import info_nce
from sparsemm_experiments.models.lexlip import (
    LexLIPConfig,
    LexLIPModel,
    corpus_lexicon,
    flops_loss,
    load_tokenizer,
)

log = logging.getLogger(__name__)


def read_checkpoint_state(out_dir: str | Path) -> dict[str, Any]:
    """The loop state of ``out_dir``'s checkpoint without loading any weights."""
    return dict(read_json(find_dir(Path(out_dir) / CKPT_DIR) / "state.json")["state"])


def remove_checkpoint(out_dir: str | Path) -> None:
    """Delete ``out_dir``'s checkpoint (once the finished model is saved)."""
    ck = find_dir(Path(out_dir) / CKPT_DIR)
    if ck.is_dir():
        shutil.rmtree(ck, ignore_errors=True)


PHASES = (1, 2)
PHASE_KEYS = ("phase", "step")


@dataclass(frozen=True)
class LexLIPTrainConfig:
    pretrain_steps: int = 200  # phase 1 optimizer steps (lexicon-bottlenecked pre-training)
    contrastive_steps: int = 400  # phase 2 optimizer steps (momentum lexicon contrastive)
    batch_size: int = 32  # distinct items per step (in-batch negatives + queue)
    lr: float = 5e-5  # paper lr, used for the pretrained MiniLM layers
    new_lr: float = 1e-3  # freshly initialised layers: few hundred steps, not ~10^5
    warmup: float = 0.1  # share of each phase spent in linear warm-up
    weight_decay: float = 0.01  # AdamW, not applied to biases and norms
    clip: float = 1.0  # gradient-norm clipping
    seed: int = 0  # item order, caption choice, masks, dropout
    checkpoint_every: int = 100  # steps between checkpoints (and at each phase end)
    log_every: int = 25  # steps averaged into one history record
    leave_one_out: bool = True  # caption patches: hide the paired caption from its item
    captions_per_item: int | None = 2  # captions per item whose frozen states are cached

    def __post_init__(self) -> None:
        if self.pretrain_steps < 0 or self.contrastive_steps < 0:
            raise SparsemmError("pretrain_steps and contrastive_steps must be >= 0")
        if self.pretrain_steps + self.contrastive_steps == 0:
            raise SparsemmError("nothing to train: both phases have 0 steps")
        if self.batch_size < 2:
            raise SparsemmError("batch_size must be at least 2 (contrastive negatives)")
        if self.lr <= 0 or self.new_lr <= 0 or self.weight_decay < 0 or self.clip <= 0:
            raise SparsemmError("lr, new_lr and clip must be positive, weight_decay >= 0")
        if not 0.0 <= self.warmup < 1.0:
            raise SparsemmError("warmup must be in [0, 1)")
        if self.checkpoint_every < 1 or self.log_every < 1:
            raise SparsemmError("checkpoint_every and log_every must be at least 1")
        if self.captions_per_item is not None and self.captions_per_item < 1:
            raise SparsemmError("captions_per_item must be at least 1 (or None for all)")


# ------------------------------------------------------------------------------- data


@dataclass
class LexLIPData:
    """Training pairs: item patch features and one caption per pair.

    ``patches`` (n_items, P, d) float16/32 with ``patch_mask`` (n_items, P) bool;
    ``captions`` (n_pairs,) with ``pair_item`` (n_pairs,) the item row of each; with caption
    patches, ``pair_patch`` (n_pairs,) is the caption's own patch slot in its item (hidden
    from the item while that pair trains, ``leave_one_out``), else None.
    """

    patches: np.ndarray
    patch_mask: np.ndarray
    captions: list[str]
    pair_item: np.ndarray
    pair_patch: np.ndarray | None = None

    def __post_init__(self) -> None:
        if self.patches.ndim != 3 or self.patch_mask.shape != self.patches.shape[:2]:
            raise SparsemmError("patches must be (n, P, d) with a (n, P) patch_mask")
        if len(self.captions) != len(self.pair_item):
            raise SparsemmError("one pair_item per caption is needed")
        if len(self.captions) < 2:
            raise SparsemmError("LexLIP training needs at least 2 (item, caption) pairs")
        if self.pair_item.min() < 0 or self.pair_item.max() >= len(self.patches):
            raise SparsemmError("pair_item points outside the items")
        if self.pair_patch is not None and len(self.pair_patch) != len(self.captions):
            raise SparsemmError("pair_patch must have one entry per caption")
        if not self.patch_mask.any(axis=1).all():
            raise SparsemmError("every item needs at least one patch")

    @property
    def n_items(self) -> int:
        return len(self.patches)

    def fingerprint(self) -> str:
        """sha256 of the inputs, so a resume on other data is refused."""
        h = hashlib.sha256()
        for a in (self.patches, self.patch_mask, self.pair_item, self.pair_patch):
            if a is None:
                h.update(b"none")
                continue
            h.update(str((a.shape, a.dtype)).encode())
            h.update(np.ascontiguousarray(a).tobytes())
        h.update("\n".join(self.captions).encode())
        return h.hexdigest()


def caption_patches(
    collection: Collection, rows: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Caption-proxy item patches: the frozen text embeddings of each item's captions.

    For items ``rows`` (default all): patches (n, P, d) float32 (P = most captions of an
    item), mask (n, P) bool, and slot (n, P) int64 = the collection text row of each patch
    (-1 for padding). Items without captions raise SparsemmError.
    """
    items = np.arange(len(collection.items)) if rows is None else np.asarray(rows, np.int64)
    emb = collection.text_embeddings()
    text_item = collection.text_item_index()
    by_item: dict[int, list[int]] = {}
    for r, it in enumerate(text_item.tolist()):
        by_item.setdefault(it, []).append(r)
    lists = [by_item.get(int(i), []) for i in items]
    if any(not x for x in lists):
        raise SparsemmError(
            "some items have no captions, so no caption patches can be made; LexLIP on the "
            "caption-proxy needs captioned items (or use image features)"
        )
    p = max(len(x) for x in lists)
    patches = np.zeros((len(items), p, emb.shape[1]), dtype=np.float32)
    mask = np.zeros((len(items), p), dtype=bool)
    slot = np.full((len(items), p), -1, dtype=np.int64)
    for i, rs in enumerate(lists):
        patches[i, : len(rs)] = emb[rs]
        mask[i, : len(rs)] = True
        slot[i, : len(rs)] = rs
    return patches, mask, slot


def collection_key(collection: Collection, extra: str) -> str:
    """A short key of a collection's files and size plus ``extra``, naming its caches."""
    h = hashlib.sha256()
    h.update(repr(sorted(collection.manifest.get("checksums", {}).items())).encode())
    h.update(str(len(collection.items)).encode())
    h.update(extra.encode())
    return h.hexdigest()[:16]


def spatial_patches(
    collection: Collection,
    cache_dir: str | Path | None = None,
    encoder: Any = None,
    batch_size: int = 32,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """EfficientNet-Lite0 7x7 spatial features of every item's image: (n, 49, 1280) float16.

    Cached as ``cache_dir/spatial-<key>.npy`` (key: the collection's checksums), because
    one pass over a few thousand images costs minutes on a CPU. Returns (patches, mask).
    """
    paths = [it.get("image") for it in collection.items]
    if any(not p for p in paths):
        raise SparsemmError(
            "image features need an image for every item; this collection has items without "
            "one (use caption patches for the caption-proxy)"
        )
    cache = None
    if cache_dir is not None:
        cache = Path(cache_dir) / f"spatial-{collection_key(collection, 'effnet-lite0')}.npy"
        if cache.is_file():
            arr = load_npy(cache)
            if arr.shape[0] == len(paths):
                return arr, np.ones(arr.shape[:2], dtype=bool)
    if encoder is None:
        from sparsemm.encoders.efficientnet import EfficientNetEncoder

        encoder = EfficientNetEncoder()
    feats = encoder.encode_spatial(paths, batch_size=batch_size, progress=progress)
    arr = np.asarray(feats, dtype=np.float16)
    if cache is not None:
        save_npy(cache, arr)
    return arr, np.ones(arr.shape[:2], dtype=bool)


def item_patches(
    collection: Collection,
    kind: str,
    cache_dir: str | Path | None = None,
    progress: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """Patch features of every collection item for ``kind`` ("captions" | "efficientnet")."""
    if kind == "captions":
        patches, mask, _ = caption_patches(collection)
        return patches, mask
    if kind == "efficientnet":
        return spatial_patches(collection, cache_dir, progress=progress)
    raise SparsemmError(f"no item patch builder for image_input {kind!r}")


def lexlip_data(
    collection: Collection,
    item_mask: np.ndarray,
    kind: str,
    cache_dir: str | Path | None = None,
    progress: bool = False,
    patches: tuple[np.ndarray, np.ndarray] | None = None,
) -> LexLIPData:
    """Training pairs of the items in ``item_mask``: every caption with its item's patches.

    ``patches`` (all items' (patches, mask)) skips recomputing them.
    """
    items = np.flatnonzero(item_mask)
    if not len(items):
        raise SparsemmError("no items selected for LexLIP training")
    rows, pair_item = collection.caption_rows(item_mask)
    captions = [str(collection.texts[r]["text"]) for r in rows]
    pair_patch = None
    if kind == "captions":
        p, m, slot = caption_patches(collection, items)
        pos = {int(t): j for i in range(len(items)) for j, t in enumerate(slot[i]) if t >= 0}
        pair_patch = np.array([pos[int(r)] for r in rows], dtype=np.int64)
    else:
        allp, allm = (
            patches if patches is not None else item_patches(collection, kind, cache_dir, progress)
        )
        p, m = allp[items], allm[items]
    return LexLIPData(p, m, captions, np.asarray(pair_item, np.int64), pair_patch)


def build_config(
    data: LexLIPData,
    base: LexLIPConfig | None = None,
    min_count: int | None = 2,
) -> tuple[LexLIPConfig, np.ndarray]:
    """A config fitted to ``data`` (patch width, positions) and the lexicon ids.

    ``min_count`` None keeps the whole vocabulary; otherwise the lexicon is the word pieces
    seen at least ``min_count`` times in the training captions.
    """
    base = base or LexLIPConfig()
    tok = load_tokenizer(base)
    if min_count is None:
        from sparsemm_experiments.models.lexlip import default_lexicon

        vocab = default_lexicon(tok)
    else:
        vocab = corpus_lexicon(data.captions, tok, min_count)
    positions = data.patches.shape[1] if base.image_input == "efficientnet" else 0
    cfg = dataclasses.replace(
        base,
        image_dim=int(data.patches.shape[2]),
        image_positions=positions if base.image_positions == 0 else base.image_positions,
        lexicon_size=len(vocab),
    )
    return cfg, vocab


# ---------------------------------------------------------------------- momentum state


class MomentumEncoders(nn.Module):
    """Momentum copies of the trained towers and the four feature queues (MoCo).

    Queues hold unit-length keys: image/text lexicon (Q, V'), image/text dense (Q, D), the
    item of each entry (-1 = empty) and the write pointer.
    """

    img_lex: torch.Tensor
    txt_lex: torch.Tensor
    img_dense: torch.Tensor
    txt_dense: torch.Tensor
    item: torch.Tensor
    ptr: torch.Tensor

    def __init__(self, model: LexLIPModel) -> None:
        super().__init__()
        c = model.config
        self.text_top = copy.deepcopy(model.text_top)
        self.image = copy.deepcopy(model.image)
        for p in self.parameters():
            p.requires_grad_(False)
        q, v, d = c.queue_size, c.lexicon_size, c.dense_dim
        self.register_buffer("img_lex", torch.zeros(q, v))
        self.register_buffer("txt_lex", torch.zeros(q, v))
        self.register_buffer("img_dense", torch.zeros(q, d))
        self.register_buffer("txt_dense", torch.zeros(q, d))
        self.register_buffer("item", torch.full((q,), -1, dtype=torch.long))
        self.register_buffer("ptr", torch.zeros((), dtype=torch.long))

    def reset(self, model: LexLIPModel) -> None:
        """Copy the student's weights and empty the queues (start of phase 2)."""
        self.text_top.load_state_dict(model.text_top.state_dict())
        self.image.load_state_dict(model.image.state_dict())
        for name in ("img_lex", "txt_lex", "img_dense", "txt_dense"):
            getattr(self, name).zero_()
        self.item.fill_(-1)
        self.ptr.zero_()

    @torch.no_grad()
    def update(self, model: LexLIPModel, m: float) -> None:
        """theta_k <- m theta_k + (1 - m) theta_q for both towers."""
        for mine, theirs in ((self.text_top, model.text_top), (self.image, model.image)):
            for pk, pq in zip(mine.parameters(), theirs.parameters(), strict=True):
                pk.mul_(m).add_(pq.detach(), alpha=1.0 - m)

    @torch.no_grad()
    def enqueue(self, keys: dict[str, torch.Tensor], items: torch.Tensor) -> None:
        """Write a batch of keys FIFO (wrapping around)."""
        q = self.item.shape[0]
        n = min(len(items), q)
        idx = (int(self.ptr) + torch.arange(n)) % q
        for name in ("img_lex", "txt_lex", "img_dense", "txt_dense"):
            getattr(self, name)[idx] = keys[name][-n:].detach()
        self.item[idx] = items[-n:]
        self.ptr.fill_(int((int(self.ptr) + n) % q))


def queue_contrastive(
    query: torch.Tensor,
    keys: torch.Tensor,
    queue: torch.Tensor,
    query_items: torch.Tensor,
    queue_items: torch.Tensor,
    tau: float,
) -> torch.Tensor:
    """InfoNCE of unit queries (B, d) against [batch keys (B, d); queue (Q, d)] / tau.

    Row i's positive is keys[i]; queue entries that are empty (item -1) or belong to
    query i's own item are left out of its negatives.
    """
    logits_b = query @ keys.T
    logits_q = query @ queue.T
    bad = (queue_items[None, :] < 0) | (queue_items[None, :] == query_items[:, None])
    logits_q = logits_q.masked_fill(bad, float("-inf"))
    logits = torch.cat([logits_b, logits_q], dim=1) / tau
    return F.cross_entropy(logits, torch.arange(len(query)))


# ------------------------------------------------------------------------ checkpoints


class _TrainState(nn.Module):
    """What a checkpoint stores: the model's trainable state and the momentum encoders."""

    def __init__(self, model: LexLIPModel, momentum: MomentumEncoders) -> None:
        super().__init__()
        self.model = model
        self.momentum = momentum

    def state_dict(self, *args: Any, **kwargs: Any) -> dict[str, Any]:  # type: ignore[override]
        out = {f"model.{k}": v for k, v in self.model.trainable_state().items()}
        out.update({f"momentum.{k}": v for k, v in self.momentum.state_dict().items()})
        return out

    def load_state_dict(  # type: ignore[override]
        self, state: dict[str, Any], strict: bool = True, assign: bool = False
    ) -> Any:
        model = {k[6:]: v for k, v in state.items() if k.startswith("model.")}
        mom = {k[9:]: v for k, v in state.items() if k.startswith("momentum.")}
        self.model.load_trainable_state(model)
        return self.momentum.load_state_dict(mom, strict=strict)


# ------------------------------------------------------------------------------ steps


def _param_groups(model: LexLIPModel, train: LexLIPTrainConfig) -> list[dict[str, Any]]:
    """Pretrained text layers at ``lr``, fresh layers at ``new_lr``; no decay on 1-D."""
    pretrained = {id(p) for p in model.text_top.layers.parameters()}
    if model.config.text_init != "minilm":
        pretrained = set()
    groups: dict[tuple[bool, bool], list[nn.Parameter]] = {}
    for p in model.parameters():
        if not p.requires_grad:
            continue
        key = (id(p) in pretrained, p.ndim >= 2)
        groups.setdefault(key, []).append(p)
    out = []
    for (is_pre, decay), params in sorted(groups.items()):
        lr = train.lr if is_pre else train.new_lr
        out.append(
            {
                "params": params,
                "lr": lr,
                "base_lr": lr,
                "weight_decay": train.weight_decay if decay else 0.0,
            }
        )
    return out


def lr_factor(step: int, total: int, warmup: float) -> float:
    """Linear warm-up over ``warmup`` x total steps, then linear decay to 0 (0-based step)."""
    w = max(1, round(warmup * total)) if warmup > 0 else 0
    if step < w:
        return (step + 1) / w
    return max(0.0, (total - step) / max(1, total - w))


def _item_schedule(n_items: int, steps: int, batch: int, seed: int, phase: int) -> np.ndarray:
    """(steps, B) item rows: consecutive seeded permutations, B distinct items per step."""
    b = min(batch, n_items)
    rng = np.random.default_rng([seed, phase, 7])
    out = np.empty((steps, b), dtype=np.int64)
    perm: list[int] = []
    for s in range(steps):
        if len(perm) < b:
            perm = perm + rng.permutation(n_items).tolist()
        row = perm[:b]
        if len(set(row)) < b:  # a permutation boundary repeated an item: take a fresh one
            perm = rng.permutation(n_items).tolist()
            row = perm[:b]
        out[s] = row
        perm = perm[b:]
    return out


def select_captions(data: LexLIPData, per_item: int | None, seed: int) -> np.ndarray:
    """Sorted pair rows used for training: up to ``per_item`` seeded captions per item."""
    if per_item is None:
        return np.arange(len(data.captions))
    rng = np.random.default_rng([seed, 11])
    order = np.argsort(data.pair_item, kind="stable")
    starts = np.searchsorted(data.pair_item[order], np.arange(data.n_items + 1))
    keep: list[int] = []
    for i in range(data.n_items):
        rows = order[starts[i] : starts[i + 1]]
        if len(rows) > per_item:
            rows = rng.choice(rows, per_item, replace=False)
        keep.extend(int(r) for r in rows)
    return np.array(sorted(keep), dtype=np.int64)


def cache_text_states(
    model: LexLIPModel,
    ids: torch.Tensor,
    mask: torch.Tensor,
    batch_size: int = 64,
    progress: bool = False,
) -> torch.Tensor:
    """Frozen lower-layer states of every row of ``ids`` as float16 (N, L, h).

    The lower layers never change, so one pass replaces one forward per training step.
    Rows are processed in length order (little padding).
    """
    n, width = ids.shape
    out = torch.zeros(n, width, model.config.hidden, dtype=torch.float16)
    lengths = mask.sum(dim=1)
    order = torch.argsort(lengths, stable=True)
    bar = tqdm(range(0, n, batch_size), desc="LexLIP text cache", disable=not progress, leave=False)
    for s in bar:
        rows = order[s : s + batch_size]
        w = int(lengths[rows].max())
        st = model.text_states(ids[rows, :w], mask[rows, :w])
        out[rows, :w] = st.to(torch.float16)
    return out


class _Batcher:
    """Turns (phase, step) into a deterministic batch: items, captions, tokens, patches,
    and the cached frozen text states of the chosen captions."""

    def __init__(
        self,
        model: LexLIPModel,
        data: LexLIPData,
        train: LexLIPTrainConfig,
        steps: int,
        phase: int,
        cache: _TextCache,
    ) -> None:
        self.model, self.data, self.train, self.phase = model, data, train, phase
        self.schedule = _item_schedule(data.n_items, steps, train.batch_size, train.seed, phase)
        self.cache = cache
        pair_item = data.pair_item[cache.rows]
        order = np.argsort(pair_item, kind="stable")
        starts = np.searchsorted(pair_item[order], np.arange(data.n_items + 1))
        # Positions within the cache of each item's captions.
        self.pairs_of = [order[starts[i] : starts[i + 1]] for i in range(data.n_items)]

    def __call__(self, step: int) -> dict[str, torch.Tensor]:
        rng = np.random.default_rng([self.train.seed, self.phase, step])
        items = self.schedule[step]
        picks = []
        for it in items:
            cands = self.pairs_of[it]
            if not len(cands):
                raise SparsemmError(f"item {it} has no caption to train on")
            picks.append(int(cands[rng.integers(len(cands))]))
        cpos = torch.from_numpy(np.asarray(picks))
        pidx = self.cache.rows[np.asarray(picks)]
        mask = self.cache.mask[cpos]
        width = int(mask.sum(dim=1).max())
        ids, mask = self.cache.ids[cpos, :width], mask[:, :width]
        states = self.cache.states[cpos, :width].float()
        patches = torch.from_numpy(np.asarray(self.data.patches[items], dtype=np.float32))
        pmask = torch.from_numpy(self.data.patch_mask[items].copy())
        if self.train.leave_one_out and self.data.pair_patch is not None:
            slots = self.data.pair_patch[pidx]
            keep_one = pmask.sum(dim=1) > 1  # never hide an item's only caption
            rows = torch.arange(len(items))[keep_one]
            pmask[rows, torch.from_numpy(slots)[keep_one]] = False
        return {
            "items": torch.from_numpy(items),
            "ids": ids,
            "mask": mask,
            "states": states,
            "patches": patches,
            "patch_mask": pmask,
            "seed": torch.tensor(int(rng.integers(2**31 - 1))),
        }


@dataclass
class _TextCache:
    """Tokenised training captions (rows of the pair list) and their frozen states."""

    rows: np.ndarray  # (N,) pair rows
    ids: torch.Tensor  # (N, L)
    mask: torch.Tensor  # (N, L)
    states: torch.Tensor  # (N, L, h) float16


def build_text_cache(
    model: LexLIPModel, data: LexLIPData, train: LexLIPTrainConfig, progress: bool = False
) -> _TextCache:
    """Tokenise the selected training captions and cache their frozen states."""
    rows = select_captions(data, train.captions_per_item, train.seed)
    ids, mask = model.tokenize([data.captions[r] for r in rows])
    states = cache_text_states(model, ids, mask, progress=progress)
    log.info("cached frozen text states of %d captions (%s)", len(rows), tuple(states.shape))
    return _TextCache(rows, ids, mask, states)


def mask_tokens(
    ids: torch.Tensor,
    eligible: torch.Tensor,
    rate: float,
    mask_id: int,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Replace round(rate x eligible) positions per row (at least 1) by [MASK].

    Returns (masked ids, (n, L) bool of masked positions). Exactly that many positions are
    chosen uniformly among the row's eligible ones.
    """
    scores = torch.rand(ids.shape, generator=gen).masked_fill(~eligible, 2.0)
    n_elig = eligible.sum(dim=1)
    n_mask = torch.clamp(torch.round(n_elig.float() * rate).long(), min=1)
    n_mask = torch.minimum(n_mask, n_elig)
    ranks = scores.argsort(dim=1).argsort(dim=1)
    chosen = (ranks < n_mask[:, None]) & eligible
    return ids.masked_fill(chosen, mask_id), chosen


def _mlm(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of (k, V') logits against lexicon columns (k,); -100 targets skipped."""
    keep = targets >= 0
    if not keep.any():
        return logits.sum() * 0.0
    return F.cross_entropy(logits[keep], targets[keep])


def _lexmlm(
    model: LexLIPModel,
    pooled: torch.Tensor,
    ids: torch.Tensor,
    mask: torch.Tensor,
    eligible: torch.Tensor,
    targets: torch.Tensor,
    gen: torch.Generator,
) -> torch.Tensor:
    """Bottleneck of ``pooled`` logits -> weak decoder -> CE on a 50%-masked caption."""
    c = model.config
    b = model.bottleneck(pooled)
    dec_ids, chosen = mask_tokens(ids, eligible, c.dec_mask_rate, model.mask_token_id, gen)
    chosen = chosen & (targets >= 0)
    return _mlm(model.decode_logits(b, dec_ids, mask, chosen), targets[chosen])


def pretrain_losses(model: LexLIPModel, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Phase-1 objective on one batch (see the module docstring). Returns named terms."""
    c = model.config
    gen = torch.Generator().manual_seed(int(batch["seed"]))
    ids, mask = batch["ids"], batch["mask"]
    eligible = model.lexicon_mask(ids, mask)
    targets = model.lexicon_targets(ids)
    # Encoder-side MLM on cached frozen states: the chosen positions' states are replaced
    # by the learned mask state at the input of the trained layers.
    _, enc_chosen = mask_tokens(ids, eligible, c.enc_mask_rate, model.mask_token_id, gen)
    text = model.text_forward(ids, mask, states=batch["states"], masked=enc_chosen)
    sel = enc_chosen[eligible]  # packed order of text["flat_logits"]
    packed_targets = targets[eligible]
    mlm = _mlm(text["flat_logits"][sel], packed_targets[sel])
    # Visible pieces predict themselves: the lexical prior of a pretrained MLM head.
    identity = _mlm(text["flat_logits"][~sel], packed_targets[~sel])
    lex_text = _lexmlm(model, text["pooled"], ids, mask, eligible, targets, gen)

    image = model.image_forward(batch["patches"], batch["patch_mask"])
    lex_img = _lexmlm(model, image["pooled"], ids, mask, eligible, targets, gen)

    dense = info_nce(image["dense"], text["dense"], c.tau)
    loss = mlm + c.identity_weight * identity + lex_text + lex_img + c.dense_weight * dense
    return {
        "loss": loss,
        "mlm": mlm,
        "identity": identity,
        "lexmlm_text": lex_text,
        "lexmlm_image": lex_img,
        "dense_nce": dense,
    }


def contrastive_losses(
    model: LexLIPModel, momentum: MomentumEncoders, batch: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Phase-2 objective on one batch; returns (named terms, momentum keys to enqueue)."""
    c = model.config
    ids, mask, items, states = batch["ids"], batch["mask"], batch["items"], batch["states"]
    text = model.text_forward(ids, mask, states=states)
    image = model.image_forward(batch["patches"], batch["patch_mask"])
    with torch.no_grad():
        tk = model.text_forward(ids, mask, top=momentum.text_top, states=states)
        ik = model.image_forward(batch["patches"], batch["patch_mask"], tower=momentum.image)
    keys = {
        "img_lex": F.normalize(ik["lexicon"], dim=1),
        "txt_lex": F.normalize(tk["lexicon"], dim=1),
        "img_dense": F.normalize(ik["dense"], dim=1),
        "txt_dense": F.normalize(tk["dense"], dim=1),
    }
    q_img, q_txt = F.normalize(image["lexicon"], dim=1), F.normalize(text["lexicon"], dim=1)
    lex = 0.5 * (
        queue_contrastive(q_img, keys["txt_lex"], momentum.txt_lex, items, momentum.item, c.tau)
        + queue_contrastive(q_txt, keys["img_lex"], momentum.img_lex, items, momentum.item, c.tau)
    )
    d_img, d_txt = F.normalize(image["dense"], dim=1), F.normalize(text["dense"], dim=1)
    dense = 0.5 * (
        queue_contrastive(d_img, keys["txt_dense"], momentum.txt_dense, items, momentum.item, c.tau)
        + queue_contrastive(
            d_txt, keys["img_dense"], momentum.img_dense, items, momentum.item, c.tau
        )
    )
    flops = flops_loss(image["lexicon"]) + flops_loss(text["lexicon"])
    loss = lex + c.dense_weight * dense + c.flops_weight * flops
    active = (image["lexicon"] > 0).float().sum(1).mean() + (text["lexicon"] > 0).float().sum(
        1
    ).mean()
    nnz = 0.5 * active
    return {"loss": loss, "lex_nce": lex, "dense_nce": dense, "flops": flops, "nnz": nnz}, keys


# ------------------------------------------------------------------------------- loop


def train_lexlip(
    data: LexLIPData,
    config: LexLIPConfig,
    vocab_ids: np.ndarray | None,
    out_dir: str | Path,
    train: LexLIPTrainConfig | None = None,
    resume: bool = False,
    progress: bool = True,
    on_step: Callable[[int, int, dict[str, float]], None] | None = None,
) -> tuple[LexLIPModel, list[dict[str, float]]]:
    """Train LexLIP (phase 1 then phase 2) and save it into ``out_dir``.

    Writes ``config.json``, ``model.safetensors``, ``history.json`` and a checkpoint every
    ``checkpoint_every`` steps (``out_dir/checkpoint``); ``resume=True`` continues from it
    (same settings and data required). ``on_step(phase, step, record)`` runs after each
    step (after its checkpoint, if one was written); history records average
    ``log_every`` steps. Leaves the model in eval mode.
    """
    train = train or LexLIPTrainConfig()
    out = check_output_dir(out_dir)  # a wrong -o fails before training
    if data.patches.shape[2] != config.image_dim:
        raise SparsemmError(
            f"the items' patches have width {data.patches.shape[2]} but the config expects "
            f"{config.image_dim}; build the config with "
            "sparsemm_experiments.train.lexlip.build_config"
        )
    model = LexLIPModel(config, vocab_ids)
    momentum = MomentumEncoders(model)
    state_mod = _TrainState(model, momentum)
    expected = {  # stored in each checkpoint and history.json; a resume must match all of it
        "config": dataclasses.asdict(config),
        "train": dataclasses.asdict(train),
        "data": data.fingerprint(),
        "vocab": hashlib.sha256(model.vocab_ids.numpy().tobytes()).hexdigest(),
    }

    phase, history = 1, []
    resume_state: dict[str, Any] | None = None
    if resume and has_checkpoint(out):
        # The optimizer is rebuilt per phase; peek at the phase first.
        resume_state = read_checkpoint_state(out)
        phase = int(resume_state["phase"])
    elif resume:
        log.info("no checkpoint in %s; starting from scratch", out)

    cache: _TextCache | None = None
    steps_of = {1: train.pretrain_steps, 2: train.contrastive_steps}
    final_phase = max(p for p in PHASES if steps_of[p] > 0)
    while phase in PHASES:
        total = steps_of[phase]
        if total == 0:
            phase += 1
            continue
        opt = torch.optim.AdamW(_param_groups(model, train), foreach=True)
        step = 0
        if resume_state is not None:
            st = load_matching_checkpoint(out, state_mod, opt, expected)
            step, history = int(st["step"]), list(st["history"])
            resume_state = None
            log.info("resuming LexLIP phase %d at step %d/%d", phase, step, total)
        if phase == 2 and step == 0:
            momentum.reset(model)
        if cache is None:
            cache = build_text_cache(model, data, train, progress)
        batcher = _Batcher(model, data, train, total, phase, cache)
        sums: dict[str, float] = {}
        n_acc = 0
        model.train()
        momentum.eval()
        bar = tqdm(
            range(step, total),
            desc=f"LexLIP phase {phase}",
            disable=not progress,
            leave=False,
        )
        for s in bar:
            batch = batcher(s)
            torch.manual_seed(int(batch["seed"]))  # dropout
            factor = lr_factor(s, total, train.warmup)
            for g in opt.param_groups:
                g["lr"] = g["base_lr"] * factor
            if phase == 1:
                losses = pretrain_losses(model, batch)
                keys = None
            else:
                losses, keys = contrastive_losses(model, momentum, batch)
            stop_if_diverged(
                losses["loss"],
                "LexLIP",
                f"phase {phase}, step {s + 1}",
                f"--lr {train.lr}, --new-lr {train.new_lr}",
                out,
                "" if has_checkpoint(out) else None,
            )
            opt.zero_grad(set_to_none=True)
            losses["loss"].backward()
            torch.nn.utils.clip_grad_norm_(
                [p for p in model.parameters() if p.requires_grad], train.clip
            )
            opt.step()
            if phase == 2 and keys is not None:
                momentum.update(model, config.momentum)
                momentum.enqueue(keys, batch["items"])
            for k, v in losses.items():
                sums[k] = sums.get(k, 0.0) + float(v.detach())
            n_acc += 1
            bar.set_postfix(loss=f"{float(losses['loss'].detach()):.3f}")
            done = s + 1
            record: dict[str, float] = {}
            if done % train.log_every == 0 or done == total:
                record = {"phase": phase, "step": done, **{k: v / n_acc for k, v in sums.items()}}
                history.append(record)
                sums, n_acc = {}, 0
                log.info(
                    "LexLIP phase %d step %d/%d: %s",
                    phase,
                    done,
                    total,
                    ", ".join(f"{k}={v:.4f}" for k, v in record.items() if k not in PHASE_KEYS),
                )
            last = done == total
            due = checkpoint_due(done, train.checkpoint_every, total)
            if due and not (last and phase == final_phase):
                st = {
                    "phase": phase + 1 if last else phase,
                    "step": 0 if last else done,
                    "history": history,
                    **expected,
                }
                # At a phase end the next phase starts with a fresh optimizer.
                ck_opt = (
                    torch.optim.AdamW(_param_groups(model, train), foreach=True) if last else opt
                )
                save_checkpoint(out, state_mod, ck_opt, st)
            if on_step is not None:
                on_step(phase, done, record)
        phase += 1
    model.eval()
    model.save_pretrained(out)
    write_json(out / "history.json", {**expected, "history": history})
    remove_checkpoint(out)  # the finished model is saved; its checkpoint is no longer needed
    return model, history


def trained_matches(
    out_dir: str | Path, data: LexLIPData, config: LexLIPConfig, train: LexLIPTrainConfig
) -> bool:
    """True when ``out_dir`` holds a finished model trained with these settings on ``data``."""
    out = Path(out_dir)
    if not (out / "history.json").is_file() or not (out / "model.safetensors").is_file():
        return False
    try:
        saved = read_json(out / "history.json")
    except SparsemmError:
        return False
    return (
        saved.get("config") == dataclasses.asdict(config)
        and saved.get("train") == dataclasses.asdict(train)
        and saved.get("data") == data.fingerprint()
    )


def phase_of(history: Sequence[dict[str, float]], phase: int) -> list[dict[str, float]]:
    """The history records of one phase."""
    return [r for r in history if int(r["phase"]) == phase]
