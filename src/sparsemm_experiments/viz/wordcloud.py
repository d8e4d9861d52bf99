"""Word clouds of concept dimensions (PNG), drawn with the ``wordcloud`` package.

A sparse concept dimension (SR / SPINE, VDR, SpLiCE) is read through its top words; a word
cloud shows them at a size that grows with their weight. Rendering uses the font bundled
with ``wordcloud`` (DroidSansMono), so no system font is needed, and a fixed ``seed`` gives
the same pixels (and the same PNG bytes) every time.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open

logger = logging.getLogger(__name__)

MAX_SIDE = 4096  # a cloud larger than this is almost certainly a unit mistake


def bundled_font() -> str:
    """Path of the TrueType font shipped inside the ``wordcloud`` package."""
    try:
        import wordcloud as wc_pkg
    except ImportError:  # pragma: no cover - wordcloud is a core dependency
        raise SparsemmError(
            "word clouds need the 'wordcloud' package: pip install 'wordcloud>=1.9'"
        ) from None
    font = Path(wc_pkg.__file__).resolve().parent / "DroidSansMono.ttf"
    if not font.is_file():  # pragma: no cover - a broken install
        raise SparsemmError(f"the wordcloud package has no bundled font at {font}; reinstall it")
    return str(font)


def check_weights(
    weights: Mapping[str, float] | Iterable[tuple[str, float]],
) -> dict[str, float]:
    """Validate ``{word: weight}`` (or ``(word, weight)`` pairs): non-empty, words non-blank,
    weights positive and finite.

    Returns a plain dict with stripped words (a repeated word keeps its larger weight).
    Raises SparsemmError naming the offending entries.
    """
    pairs = list(weights.items() if isinstance(weights, Mapping) else weights)
    if not pairs:
        raise SparsemmError(
            "a word cloud needs at least one word with a positive weight; got an empty mapping"
        )
    clean: dict[str, float] = {}
    bad: list[str] = []
    for word, raw in pairs:
        key = str(word).strip()
        try:
            value = float(raw)
        except (TypeError, ValueError):
            bad.append(f"{word!r}: {raw!r}")
            continue
        if not key:
            bad.append(f"{word!r} (blank word)")
        elif not math.isfinite(value) or value <= 0.0:
            bad.append(f"{key!r}: {value!r}")
        else:
            clean[key] = max(value, clean.get(key, 0.0))
    if bad:
        shown = ", ".join(bad[:5]) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
        raise SparsemmError(
            "word-cloud weights must be positive and finite with non-blank words; "
            f"bad entries: {shown}. Drop them (or pass absolute values) before plotting."
        )
    return clean


def concept_cloud(
    weights: Mapping[str, float],
    out_png: str | Path,
    width: int = 320,
    height: int = 200,
    seed: int = 0,
    colormap: str = "Dark2",
    background: str = "white",
    max_words: int = 100,
) -> Path:
    """Write a ``width`` x ``height`` PNG word cloud of ``{word: weight}``; return its path.

    Word size follows weight (``relative_scaling=0.5``); layout and colours come from a
    ``random.Random(seed)``, so equal inputs give identical pixels. Words that no longer fit
    the canvas are left out (logged at debug level). The PNG is written atomically.
    """
    clean = check_weights(weights)
    if not (8 <= int(width) <= MAX_SIDE and 8 <= int(height) <= MAX_SIDE):
        raise SparsemmError(
            f"word-cloud size must lie in 8..{MAX_SIDE} pixels per side, got {width}x{height}"
        )
    if max_words < 1:
        raise SparsemmError(f"max_words must be >= 1, got {max_words}")
    from wordcloud import WordCloud

    cloud: Any = WordCloud(
        font_path=bundled_font(),
        width=int(width),
        height=int(height),
        background_color=background,
        colormap=colormap,
        random_state=int(seed),
        max_words=int(max_words),
        prefer_horizontal=0.9,
        relative_scaling=0.5,
        min_font_size=6,
        margin=2,
        collocations=False,
    )
    try:
        cloud.generate_from_frequencies(clean)
    except ValueError as exc:  # "Couldn't find space to draw"
        raise SparsemmError(
            f"could not fit any word into a {width}x{height} cloud ({exc}); use a larger size"
        ) from exc
    placed = len(cloud.layout_)
    if placed < min(len(clean), max_words):
        logger.debug("word cloud %s: %d of %d words fit", out_png, placed, len(clean))
    image = cloud.to_image()
    out = Path(out_png)
    with atomic_open(out, "wb") as fh:
        image.save(fh, format="PNG")
    return out


def dimension_cloud(
    words: Sequence[str],
    scores: Sequence[float] | None,
    out_png: str | Path,
    width: int = 320,
    height: int = 200,
    seed: int = 0,
    **kwargs: Any,
) -> Path:
    """Word cloud of one concept dimension's top words (most important first).

    ``scores``: the words' values on the dimension (e.g. SPINE activations), same length as
    ``words``; None sizes them by rank, ``w_i = (n - i) / n`` for the i-th of n words.
    Other keyword arguments go to :func:`concept_cloud`.
    """
    words = [str(w) for w in words]
    if not words:
        raise SparsemmError("dimension_cloud needs at least one word; the dimension has none")
    if scores is None:
        n = len(words)
        values = [(n - i) / n for i in range(n)]
    else:
        values = [float(s) for s in scores]
        if len(values) != len(words):
            raise SparsemmError(
                f"dimension_cloud got {len(words)} words but {len(values)} scores; "
                "pass one score per word or scores=None"
            )
    weights = check_weights(
        zip(words, values, strict=True)
    )  # a repeated word keeps its larger score
    return concept_cloud(weights, out_png, width=width, height=height, seed=seed, **kwargs)
