"""LexLIP training: queue and momentum semantics, schedules, smoke training, resume."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from fakes import tiny_lexlip_config
from sparsemm.errors import SparsemmError
from sparsemm_experiments.models.lexlip import (
    LexLIPConfig,
    LexLIPModel,
    corpus_lexicon,
    load_tokenizer,
)
from sparsemm_experiments.train.lexlip import (
    LexLIPData,
    LexLIPTrainConfig,
    MomentumEncoders,
    _Batcher,
    _item_schedule,
    build_text_cache,
    lr_factor,
    phase_of,
    queue_contrastive,
    select_captions,
    train_lexlip,
)

pytestmark = pytest.mark.usefixtures("one_torch_thread")  # tests/conftest.py


WORDS = ["dog", "cat", "car", "tree", "ball", "bike", "boat", "bird"]


def tiny_config(**kw: object) -> LexLIPConfig:
    return tiny_lexlip_config(**{"max_text_len": 10, "image_dim": 8, "queue_size": 12, **kw})


def tiny_data(n_items: int = 16, seed: int = 0) -> LexLIPData:
    """Items = two words; patches = noisy one-hot word codes; three captions per item."""
    rng = np.random.default_rng(seed)
    patches = np.zeros((n_items, 3, 8), dtype=np.float32)
    captions, pair_item, pair_patch = [], [], []
    for i in range(n_items):
        a, b = WORDS[i % 8], WORDS[(i * 3 + 1) % 8]
        patches[i, 0, WORDS.index(a)] = 1.0
        patches[i, 1, WORDS.index(b)] = 1.0
        patches[i, 2] = rng.normal(scale=0.1, size=8)
        for j, text in enumerate([f"a {a} and a {b}", f"the {b} near a {a}", f"{a} {b}"]):
            captions.append(text)
            pair_item.append(i)
            pair_patch.append(j)
    mask = np.ones((n_items, 3), dtype=bool)
    return LexLIPData(patches, mask, captions, np.array(pair_item), np.array(pair_patch))


@pytest.fixture(scope="module")
def setup() -> tuple[LexLIPConfig, np.ndarray, LexLIPData]:
    data = tiny_data()
    vocab = corpus_lexicon(data.captions, load_tokenizer(tiny_config()), min_count=1)
    return tiny_config(lexicon_size=len(vocab)), vocab, data


def test_queue_is_fifo_with_wraparound_and_item_ids(setup) -> None:
    cfg, vocab, _ = setup
    model = LexLIPModel(dataclasses.replace(cfg, queue_size=5), vocab)
    mom = MomentumEncoders(model)
    assert (mom.item == -1).all() and int(mom.ptr) == 0
    v, d = cfg.lexicon_size, cfg.dense_dim

    def keys(start: int, n: int) -> dict[str, torch.Tensor]:
        base = torch.arange(start, start + n, dtype=torch.float32)[:, None]
        return {
            "img_lex": base.expand(n, v).clone(),
            "txt_lex": -base.expand(n, v).clone(),
            "img_dense": base.expand(n, d).clone(),
            "txt_dense": -base.expand(n, d).clone(),
        }

    mom.enqueue(keys(0, 3), torch.tensor([10, 11, 12]))
    assert mom.item.tolist() == [10, 11, 12, -1, -1] and int(mom.ptr) == 3
    mom.enqueue(keys(3, 3), torch.tensor([13, 14, 15]))
    # The oldest entry (item 10) is overwritten first.
    assert mom.item.tolist() == [15, 11, 12, 13, 14] and int(mom.ptr) == 1
    assert mom.img_lex[:, 0].tolist() == [5.0, 1.0, 2.0, 3.0, 4.0]
    assert mom.txt_dense[:, 0].tolist() == [-5.0, -1.0, -2.0, -3.0, -4.0]
    mom.reset(model)
    assert (mom.item == -1).all() and int(mom.ptr) == 0 and float(mom.img_lex.abs().sum()) == 0


def test_momentum_update_is_exponential_moving_average(setup) -> None:
    cfg, vocab, _ = setup
    model = LexLIPModel(cfg, vocab)
    mom = MomentumEncoders(model)
    assert not any(p.requires_grad for p in mom.parameters())
    before = [p.detach().clone() for p in mom.image.parameters()]
    with torch.no_grad():
        for p in model.image.parameters():
            p.add_(1.0)
    mom.update(model, 0.99)
    for old, new, student in zip(
        before, mom.image.parameters(), model.image.parameters(), strict=True
    ):
        assert torch.allclose(new, 0.99 * old + 0.01 * student, atol=1e-6)
    mom.update(model, 0.0)
    for new, student in zip(mom.text_top.parameters(), model.text_top.parameters(), strict=True):
        assert torch.equal(new, student)


def test_queue_contrastive_masks_empty_and_same_item_entries() -> None:
    gen = torch.Generator().manual_seed(0)
    q = torch.nn.functional.normalize(torch.randn(3, 4, generator=gen), dim=1)
    k = torch.nn.functional.normalize(torch.randn(3, 4, generator=gen), dim=1)
    queue = torch.nn.functional.normalize(torch.randn(4, 4, generator=gen), dim=1)
    items = torch.tensor([7, 8, 9])
    queue_items = torch.tensor([7, -1, 5, 9])
    got = queue_contrastive(q, k, queue, items, queue_items, 0.05)
    losses = []
    for i in range(3):
        keys = [k[j] for j in range(3)]
        keys += [queue[j] for j in range(4) if queue_items[j] >= 0 and queue_items[j] != items[i]]
        logits = torch.stack([q[i] @ x for x in keys]) / 0.05
        losses.append(-torch.log_softmax(logits, dim=0)[i])
    assert float(got) == pytest.approx(float(torch.stack(losses).mean()), rel=1e-5)


def test_lr_schedule_and_item_schedule() -> None:
    # 10 steps, 10% warm-up: step 0 is the warm-up peak, then linear decay to 0.1 at the end.
    f = [lr_factor(s, 10, 0.1) for s in range(10)]
    assert f[0] == 1.0 and f[1] == pytest.approx(1.0) and f[-1] == pytest.approx(1 / 9)
    f = [lr_factor(s, 20, 0.1) for s in range(20)]
    assert f[0] == 0.5 and f[1] == 1.0 and all(a >= b for a, b in itertools.pairwise(f[1:]))
    sched = _item_schedule(10, 7, 4, seed=0, phase=1)
    assert sched.shape == (7, 4)
    assert all(len(set(row)) == 4 for row in sched)  # distinct items per batch
    assert set(sched[:2].ravel()) | set(sched[2, :2]) == set(range(10))  # an epoch covers all
    assert np.array_equal(sched, _item_schedule(10, 7, 4, seed=0, phase=1))


def test_batches_hide_the_paired_caption_and_use_cached_states(setup) -> None:
    cfg, vocab, data = setup
    model = LexLIPModel(cfg, vocab)
    tc = LexLIPTrainConfig(pretrain_steps=3, contrastive_steps=0, batch_size=4)
    cache = build_text_cache(model, data, tc)
    assert len(cache.rows) == data.n_items * 2  # captions_per_item=2
    assert np.array_equal(select_captions(data, None, 0), np.arange(len(data.captions)))
    batch = _Batcher(model, data, tc, 3, 1, cache)(0)
    assert batch["patch_mask"].sum(dim=1).tolist() == [2, 2, 2, 2]
    ids, mask = batch["ids"], batch["mask"]
    again = model.text_states(ids, mask)
    assert torch.allclose(batch["states"][mask.bool()], again[mask.bool()], atol=1e-2)
    # Which slot is hidden: the caption's own slot.
    items = batch["items"].tolist()
    texts = model.tokenizer.batch_decode(ids, skip_special_tokens=True)
    for row, (it, text) in enumerate(zip(items, texts, strict=True)):
        pair = next(
            p for p in np.flatnonzero(data.pair_item == it) if data.captions[p].lower() == text
        )
        assert not batch["patch_mask"][row, data.pair_patch[pair]]


def test_training_smoke_loss_falls_and_codes_sparsify(tmp_path, setup) -> None:
    cfg, vocab, data = setup
    tc = LexLIPTrainConfig(
        pretrain_steps=16, contrastive_steps=8, batch_size=8, log_every=8, new_lr=3e-3
    )
    model, hist = train_lexlip(data, cfg, vocab, tmp_path, tc, progress=False)
    p1, p2 = phase_of(hist, 1), phase_of(hist, 2)
    assert len(p1) == 2 and len(p2) == 1
    assert p1[-1]["loss"] < p1[0]["loss"]
    assert p1[-1]["lexmlm_image"] < p1[0]["lexmlm_image"]
    assert p2[-1]["nnz"] < cfg.lexicon_size
    for name in ("config.json", "model.safetensors", "history.json"):
        assert (tmp_path / name).is_file()
    assert not (tmp_path / "checkpoint").exists()  # removed once the model is saved
    lex, _ = model.encode_items(data.patches, data.patch_mask)
    assert lex.getnnz(axis=1).mean() < cfg.lexicon_size
    loaded = LexLIPModel.from_pretrained(tmp_path)
    assert (
        abs(loaded.encode_items(data.patches)[0] - model.encode_items(data.patches)[0]).max() == 0
    )


def test_flops_regulariser_shrinks_the_flops_of_the_codes(tmp_path, setup) -> None:
    cfg, vocab, data = setup
    tc = LexLIPTrainConfig(pretrain_steps=0, contrastive_steps=10, batch_size=8, log_every=10)
    flops = {}
    for lam in (0.0, 20.0):
        c = dataclasses.replace(cfg, flops_weight=lam)
        model, hist = train_lexlip(data, c, vocab, tmp_path / str(lam), tc, progress=False)
        lex, _ = model.encode_items(data.patches, data.patch_mask)
        # The regularised quantity itself, on the final item codes.
        flops[lam] = float((np.asarray(lex.mean(axis=0)).ravel() ** 2).sum())
        assert hist[-1]["flops"] >= 0
    assert flops[20.0] < 0.6 * flops[0.0]


class _Crash(Exception):
    pass


@pytest.mark.parametrize("crash_at", [(1, 2), (2, 1)])
def test_resume_equals_uninterrupted(tmp_path, setup, crash_at: tuple[int, int]) -> None:
    cfg, vocab, data = setup
    tc = LexLIPTrainConfig(
        pretrain_steps=2, contrastive_steps=2, batch_size=4, checkpoint_every=1, log_every=1
    )
    full, hist_full = train_lexlip(data, cfg, vocab, tmp_path / "full", tc, progress=False)

    def crash(phase: int, step: int, record: dict) -> None:
        if (phase, step) == crash_at:
            raise _Crash

    with pytest.raises(_Crash):
        train_lexlip(data, cfg, vocab, tmp_path / "cut", tc, progress=False, on_step=crash)
    assert (tmp_path / "cut" / "checkpoint").is_dir()
    resumed, hist = train_lexlip(
        data, cfg, vocab, tmp_path / "cut", tc, resume=True, progress=False
    )
    assert hist == hist_full
    for (k, a), b in zip(
        full.trainable_state().items(), resumed.trainable_state().values(), strict=True
    ):
        assert torch.equal(a, b), k


def test_resume_refuses_other_settings(tmp_path, setup) -> None:
    cfg, vocab, data = setup
    tc = LexLIPTrainConfig(pretrain_steps=2, contrastive_steps=1, batch_size=4, checkpoint_every=1)

    def crash(phase: int, step: int, record: dict) -> None:
        if step == 1:
            raise _Crash

    with pytest.raises(_Crash):
        train_lexlip(data, cfg, vocab, tmp_path, tc, progress=False, on_step=crash)
    other = dataclasses.replace(tc, new_lr=5e-4)
    with pytest.raises(SparsemmError, match="other settings"):
        train_lexlip(data, cfg, vocab, tmp_path, other, resume=True, progress=False)


def test_bad_inputs() -> None:
    data = tiny_data(4)
    with pytest.raises(SparsemmError):
        LexLIPData(data.patches, data.patch_mask[:, :2], data.captions, data.pair_item)
    with pytest.raises(SparsemmError):
        LexLIPData(data.patches, data.patch_mask, data.captions[:3], data.pair_item)
    with pytest.raises(SparsemmError):
        LexLIPTrainConfig(pretrain_steps=0, contrastive_steps=0)
    with pytest.raises(SparsemmError):
        LexLIPTrainConfig(batch_size=1)
    vocab = corpus_lexicon(data.captions, load_tokenizer(tiny_config()), min_count=1)
    cfg = tiny_config(lexicon_size=len(vocab), image_dim=5)
    with pytest.raises(SparsemmError, match="width"):
        train_lexlip(data, cfg, vocab, "/nonexistent/x", LexLIPTrainConfig(), progress=False)


def test_cli_train_lexlip(tmp_path) -> None:
    import argparse

    from fakes import KeywordEncoder
    from sparsemm.data.collection import write_collection
    from sparsemm_experiments.cli.train_lexlip import register_model

    data = tiny_data(12)
    items = [
        {"id": f"i{i}", "captions": [], "split": "train" if i < 9 else "test"} for i in range(12)
    ]
    texts = [
        {"item": int(it), "text": c} for c, it in zip(data.captions, data.pair_item, strict=True)
    ]
    enc = KeywordEncoder(keywords=WORDS)
    temb = enc.encode_text([t["text"] for t in texts])
    col = write_collection(
        tmp_path / "col",
        items,
        {"name": enc.name, "dim": enc.dim},
        image_emb=np.eye(12, enc.dim, dtype=np.float32) + 0.1,
        text_emb=temb,
        texts=texts,
    )
    parser = argparse.ArgumentParser()
    register_model(parser.add_subparsers(dest="model"))
    args = parser.parse_args(
        [
            "lexlip",
            str(col.root),
            "-o",
            str(tmp_path / "m"),
            "--pretrain-steps",
            "2",
            "--contrastive-steps",
            "2",
            "--batch-size",
            "4",
            "--queue-size",
            "8",
            "--vocab-min-count",
            "1",
            "--no-progress",
        ]
    )
    assert args.func(args) == 0
    model = LexLIPModel.from_pretrained(tmp_path / "m")
    assert model.config.image_input == "captions" and model.config.image_dim == enc.dim
    assert set(model.terms) >= set(WORDS)
