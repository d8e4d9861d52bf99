"""The demo report: an offline HTML page comparing methods on exclusion queries.

For each query ("sneaker but not bag") the methods' ranked results sit side by side (a CSS
grid, one column per method); every result shows its thumbnail, rank, score and labels (an
excluded label is highlighted, an item carrying one gets a red border and a marker) and a
collapsible explanation: the concept dimensions it matched (contribution and words) and the
excluded concepts checked (the item's mass on their dimensions). A row of word clouds shows
the concept dimensions involved. Benchmark tables, stage timings and the commands that
reproduce the run follow.

The page is one self-contained ``index.html`` (inline CSS, no JavaScript, no CDN); images
and word clouds are files in the report folder linked by relative paths, so the folder can
be moved or zipped as a whole. :func:`result_grid_png` draws a result grid as one PNG (for a
README).
"""

from __future__ import annotations

import hashlib
import html
import logging
import math
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote

from PIL import Image, ImageDraw, ImageFont

from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open

logger = logging.getLogger(__name__)

THUMB_PX = 256  # longest side of an image copied into the report (about 2x its display size)
SMALL_PX = 128  # images at most this big are upscaled with crisp pixels (Fashion-MNIST)
MAX_WORDS = 8  # words shown per concept dimension in an explanation


# ------------------------------------------------------------------------------- data


@dataclass
class ResultItem:
    """One ranked result of one method.

    ``image``: path of the picture (absolute, or relative to the report folder); None or ""
    shows the caption in place of a picture. ``matched``: ``(dim, contribution, words)`` of
    the concept dimensions the item matched. ``excluded``: ``(term, dims checked, item mass
    on those dims, words)`` per excluded term. ``violates``: the item carries an excluded
    concept (ground truth), drawn with a red border and a marker.
    """

    id: str
    image: str | None
    score: float
    labels: list[str] = field(default_factory=list)
    caption: str = ""
    violates: bool = False
    matched: list[tuple[int, float, list[str]]] = field(default_factory=list)
    excluded: list[tuple[str, list[int], float, list[str]]] = field(default_factory=list)
    score_text: str = ""  # how the score is shown ("92%" for a match probability)

    @classmethod
    def from_hit(cls, hit: Any, image: str | None, exclude: Iterable[str] = ()) -> ResultItem:
        """Build from a :class:`sparsemm.query.hits.Hit` (or its ``to_dict()``);
        ``violates`` is set when one of the hit's labels is an ``exclude`` term."""
        labels = [str(x) for x in _get(hit, "labels") or []]
        banned = {_norm(t) for t in exclude}
        matched = [
            (int(_get(c, "dim")), float(_get(c, "weight")), [str(w) for w in _get(c, "words")])
            for c in _get(hit, "matched") or []
        ]
        excluded = [
            (
                str(_get(c, "term")),
                [int(d) for d in _get(c, "dims")],
                float(_get(c, "item_mass")),
                [str(w) for w in _get(c, "words") or []],
            )
            for c in _get(hit, "excluded") or []
        ]
        return cls(
            id=str(_get(hit, "id")),
            image=image,
            score=float(_get(hit, "score")),
            labels=labels,
            caption=str(_get(hit, "caption") or ""),
            violates=any(_norm(lab) in banned for lab in labels),
            matched=matched,
            excluded=excluded,
        )


@dataclass
class QueryPanel:
    """One query: the methods' result columns (method -> ranked results), their metrics
    (method -> {metric: value}) and word clouds ``(caption, PNG path)`` of the concept
    dimensions involved."""

    query: str
    include: list[str]
    exclude: list[str]
    columns: dict[str, list[ResultItem]]
    metrics: dict[str, dict[str, float]] = field(default_factory=dict)
    clouds: list[tuple[str, str]] = field(default_factory=list)


@dataclass
class DemoReport:
    """The whole report. ``summary_md``: a few paragraphs in a small Markdown subset
    (``#`` headings, ``-`` bullets, ``**bold**``, `` `code` ``; everything else is text).
    ``tables``: ``(title, header, rows)``; ``timings``: stage -> seconds; ``commands``:
    shell lines that reproduce the run or start the server."""

    title: str
    summary_md: str = ""
    panels: list[QueryPanel] = field(default_factory=list)
    tables: list[tuple[str, list[str], list[list[str]]]] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    commands: list[str] = field(default_factory=list)
    # method name -> what it is, shown under the summary (the columns' and tables' names)
    legend: dict[str, str] = field(default_factory=dict)


def _get(obj: Any, name: str) -> Any:
    return obj[name] if isinstance(obj, Mapping) else getattr(obj, name)


def _norm(term: str) -> str:
    return " ".join(str(term).lower().split())


# ----------------------------------------------------------------------------- assets


class _Assets:
    """Puts pictures into the report folder and hands out relative links to them.

    A file already inside ``out_dir`` is linked where it is; any other file is copied into
    ``out_dir/<kind>/`` under a name made from its stem and a hash of its path (pictures are
    shrunk to ``thumb_px`` on their longest side), once per source file.
    """

    def __init__(self, out_dir: Path, thumb_px: int) -> None:
        self.out_dir = out_dir
        self.root = out_dir.resolve()
        self.thumb_px = thumb_px
        self._done: dict[tuple[str, Path], tuple[str, tuple[int, int]]] = {}

    def link(self, src: str | os.PathLike[str], kind: str, what: str) -> tuple[str, bool]:
        """(URL-quoted relative href, is-small) for ``src``; ``what`` names it in errors."""
        path = Path(src).expanduser()
        if not path.is_absolute():
            path = self.out_dir / path
        path = path.resolve()
        if not path.is_file():
            raise SparsemmError(
                f"{what}: image file not found: {path} (paths are absolute or relative to "
                f"the report folder {self.out_dir})"
            )
        key = (kind, path)
        if key not in self._done:
            if path.is_relative_to(self.root):
                rel, size = path.relative_to(self.root), _image_size(path, what)
            else:
                rel, size = self._copy(path, kind, what)
            self._done[key] = (quote(rel.as_posix(), safe="/"), size)
        href, size = self._done[key]
        return href, max(size) <= SMALL_PX

    def _copy(self, path: Path, kind: str, what: str) -> tuple[Path, tuple[int, int]]:
        digest = hashlib.sha1(str(path).encode()).hexdigest()[:10]
        stem = re.sub(r"[^A-Za-z0-9._-]+", "-", path.stem).strip("-.")[:40] or "image"
        try:
            with Image.open(path) as src:
                src.load()
                fmt = "JPEG" if src.format == "JPEG" else "PNG"
                pic: Image.Image = src.copy()
        except (OSError, ValueError, Image.DecompressionBombError) as exc:
            raise SparsemmError(f"{what}: cannot read image {path} ({exc})") from exc
        if max(pic.size) > self.thumb_px:
            pic.thumbnail((self.thumb_px, self.thumb_px), Image.Resampling.LANCZOS)
        if pic.mode not in (
            ("RGB", "L") if fmt == "JPEG" else ("1", "L", "LA", "P", "RGB", "RGBA")
        ):
            pic = pic.convert("RGBA" if fmt == "PNG" and "A" in pic.getbands() else "RGB")
        rel = Path(kind) / f"{stem}-{digest}.{'jpg' if fmt == 'JPEG' else 'png'}"
        with atomic_open(self.out_dir / rel, "wb") as fh:
            pic.save(fh, format=fmt, **({"quality": 88} if fmt == "JPEG" else {}))
        return rel, pic.size


def _image_size(path: Path, what: str) -> tuple[int, int]:
    try:
        with Image.open(path) as im:
            return im.size
    except (OSError, ValueError) as exc:
        raise SparsemmError(f"{what}: cannot read image {path} ({exc})") from exc


# ---------------------------------------------------------------------------- helpers


def _e(text: Any) -> str:
    return html.escape(str(text), quote=True)


def _fmt(value: Any, digits: int = 3) -> str:
    if isinstance(value, bool) or value is None:
        return "n/a" if value is None else str(value)
    if isinstance(value, int):
        return str(value)
    try:
        v = float(value)
    except (TypeError, ValueError):
        return str(value)
    return f"{v:.{digits}f}" if math.isfinite(v) else "n/a"


def _seconds(s: float) -> str:
    if not math.isfinite(s):
        return "n/a"
    if s < 60:
        return f"{s:.1f} s" if s >= 1 else f"{s * 1000:.0f} ms"
    minutes, rest = divmod(s, 60)
    return f"{int(minutes)} min {rest:.0f} s"


_INLINE = [
    (re.compile(r"`([^`]+)`"), r"<code>\1</code>"),
    (re.compile(r"\*\*(.+?)\*\*"), r"<strong>\1</strong>"),
]


def _inline(text: str) -> str:
    """Escape, then turn `code` and **bold** into tags (safe: the text is already escaped)."""
    out = _e(text)
    for pattern, repl in _INLINE:
        out = pattern.sub(repl, out)
    return out


def markdown_lite(text: str) -> str:
    """HTML for a small Markdown subset: ``#``/``##``/``###`` headings, ``-``/``*`` bullet
    lists, blank-line separated paragraphs, ``**bold**`` and `` `code` ``. All text is
    escaped; no raw HTML passes through."""
    out: list[str] = []
    para: list[str] = []
    items: list[str] = []

    def flush() -> None:
        if para:
            out.append(f"<p>{_inline(' '.join(para))}</p>")
            para.clear()
        if items:
            out.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in items) + "</ul>")
            items.clear()

    for raw in text.splitlines():
        line = raw.strip()
        heading = re.match(r"^(#{1,3})\s+(.*)$", line)
        bullet = re.match(r"^[-*]\s+(.*)$", line)
        if not line:
            flush()
        elif heading:
            flush()
            level = len(heading.group(1)) + 2  # the page owns h1/h2
            out.append(f"<h{level}>{_inline(heading.group(2))}</h{level}>")
        elif bullet:
            if para:
                flush()
            items.append(bullet.group(1))
        elif items and raw[:1].isspace():
            items[-1] += " " + line  # continuation of a bullet
        else:
            if items:
                flush()
            para.append(line)
    flush()
    return "\n".join(out)


_NUMERIC = re.compile(
    r"^([-+−]?(\d[\d,]*\.?\d*|\.\d+)(e[-+]?\d+)?\s*(%|ms|s|x)?\s*[*†‡]*|\d+ min \d+ s)$"
)


def _cell(text: Any, tag: str = "td") -> str:
    raw = str(text)
    plain = raw.replace("**", "").strip()
    cls = ' class="num"' if _NUMERIC.match(plain) else ""
    return f"<{tag}{cls}>{_inline(raw)}</{tag}>"


def _words(words: Sequence[str]) -> str:
    shown = ", ".join(str(w) for w in list(words)[:MAX_WORDS])
    return _e(shown) if shown else '<span class="muted">(no words)</span>'


# ---------------------------------------------------------------------------- render


CSS = """
:root {
  --bg: #f6f7f9; --fg: #1d2430; --muted: #667085; --card: #fff; --line: #d9dde5;
  --accent: #2f5fd0; --accent-soft: #e5ecfb; --bad: #c0261b; --bad-soft: #fdecea;
  --ok: #067647; --ok-soft: #e3f4ea;
  font-family: system-ui, -apple-system, "Segoe UI", Roboto, sans-serif;
  color: var(--fg); background: var(--bg); line-height: 1.45;
}
body { margin: 0 auto; padding: 0 1.5rem 3rem; max-width: 1500px; }
h1 { font-size: 1.6rem; margin: 1.4rem 0 0.4rem; }
h2 { font-size: 1.25rem; margin: 2rem 0 0.5rem; }
h3 { font-size: 1rem; margin: 0 0 0.2rem; }
code, pre { font-family: ui-monospace, "DejaVu Sans Mono", Menlo, monospace; font-size: 0.88em; }
p code, li code { background: #eceff4; padding: 0 0.25em; border-radius: 3px; }
.muted { color: var(--muted); }
nav.toc { background: var(--card); border: 1px solid var(--line); border-radius: 10px;
  padding: 0.5rem 1rem; }
nav.toc ul { margin: 0.3rem 0; padding-left: 1.4rem; columns: 2; }
a { color: var(--accent); }
.summary { max-width: 60rem; }
table.data { border-collapse: collapse; background: var(--card); margin: 0.4rem 0 1.2rem;
  font-size: 0.9rem; }
table.data th, table.data td { border: 1px solid var(--line); padding: 0.25rem 0.6rem;
  text-align: left; }
table.data th { background: #eef1f6; }
table.data td.num, table.data th.num { text-align: right; font-variant-numeric: tabular-nums; }
table.data caption { text-align: left; font-weight: 600; padding: 0.2rem 0; }
.panel { background: var(--card); border: 1px solid var(--line); border-radius: 12px;
  padding: 0.8rem 1.1rem 1.1rem; margin: 1.4rem 0; }
.panel h2 { margin-top: 0.2rem; }
.panel h2 .qnum { color: var(--muted); font-weight: 500; margin-right: 0.4rem; }
.terms { margin: 0 0 0.7rem; font-size: 0.92rem; }
.term { display: inline-block; padding: 0 0.5em; border-radius: 999px; margin: 0 0.15em; }
.term.inc { background: var(--ok-soft); color: var(--ok); }
.term.exc { background: var(--bad-soft); color: var(--bad); text-decoration: line-through; }
.columns { display: grid; grid-template-columns: repeat(var(--ncols), minmax(0, 1fr));
  gap: 1.2rem; }
.column { border-top: 3px solid var(--accent); padding-top: 0.4rem; min-width: 0; }
.column .metrics { font-size: 0.85rem; color: var(--muted); margin: 0 0 0.5rem; }
.column .metrics b { color: var(--fg); font-weight: 600; }
.column .metrics .viol { color: var(--bad); }
ol.grid { list-style: none; margin: 0; padding: 0; display: grid;
  grid-template-columns: repeat(auto-fill, minmax(9.5rem, 1fr)); gap: 0.6rem; }
.card { border: 2px solid var(--line); border-radius: 8px; padding: 0.35rem; background: #fff;
  min-width: 0; font-size: 0.8rem; }
.card.violates { border: 3px solid var(--bad); background: var(--bad-soft); }
/* An opened explanation widens its card to the whole row: picture left, text right. */
.card:has(details[open]) { grid-column: 1 / -1; display: grid; column-gap: 0.8rem;
  grid-template-columns: minmax(8rem, 12rem) minmax(0, 1fr); align-content: start; }
.card:has(details[open]) > * { grid-column: 2; }
.card:has(details[open]) > .thumb { grid-column: 1; grid-row: 1 / span 4; align-self: start; }
.card:has(details[open]) > .caption { display: none; }
.thumb { position: relative; margin: 0; aspect-ratio: 1 / 1; background: #f0f2f5;
  border-radius: 5px; overflow: hidden; display: flex; align-items: center;
  justify-content: center; }
.thumb img { width: 100%; height: 100%; object-fit: contain; }
.thumb img.px { image-rendering: pixelated; }
.thumb .textonly { padding: 0.5rem; font-size: 0.8rem; color: var(--muted); }
.rank { position: absolute; top: 4px; left: 4px; background: rgba(29, 36, 48, 0.78);
  color: #fff; font-weight: 600; border-radius: 4px; padding: 0 0.35em; font-size: 0.78rem; }
.violation { position: absolute; top: 4px; right: 4px; background: var(--bad); color: #fff;
  font-weight: 700; border-radius: 4px; padding: 0 0.35em; font-size: 0.72rem; }
.meta { display: flex; justify-content: space-between; gap: 0.3rem; margin-top: 0.25rem; }
.meta .score { font-variant-numeric: tabular-nums; font-weight: 600; }
.meta .id { color: var(--muted); overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
ul.labels { list-style: none; padding: 0; margin: 0.2rem 0; display: flex; flex-wrap: wrap;
  gap: 0.2rem; }
ul.labels li { background: #eef1f6; border-radius: 999px; padding: 0 0.45em; }
ul.labels li.inc { background: var(--ok-soft); color: var(--ok); }
ul.labels li.exc { background: var(--bad); color: #fff; font-weight: 600; }
.caption { margin: 0.15rem 0; color: #3a4352; display: -webkit-box; -webkit-line-clamp: 2;
  -webkit-box-orient: vertical; overflow: hidden; }
details { margin-top: 0.25rem; }
details summary { cursor: pointer; color: var(--accent); }
details[open] .caption-full { margin: 0.3rem 0; }
table.expl { border-collapse: collapse; margin: 0.3rem 0; font-size: 0.8rem; width: 100%; }
table.expl th, table.expl td { border-bottom: 1px solid var(--line); padding: 0.1rem 0.4rem;
  text-align: left; vertical-align: top; }
table.expl th { white-space: nowrap; }
table.expl td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
.expl-title { font-weight: 600; margin: 0.4rem 0 0; }
.check.ok { color: var(--ok); }
.check.present { color: var(--bad); font-weight: 600; }
.legend { display: grid; grid-template-columns: max-content 1fr; gap: 0.2rem 1rem;
  font-size: 0.9rem; margin: 1rem 0; }
.legend strong { grid-column: 1 / -1; }
.legend dt { font-family: monospace; }
.legend dd { margin: 0; color: var(--muted); }
.clouds { display: flex; flex-wrap: wrap; gap: 0.8rem; margin-top: 1rem; }
.clouds figure { margin: 0; background: #fff; border: 1px solid var(--line);
  border-radius: 8px; padding: 0.3rem; }
.clouds img { display: block; max-width: 320px; height: auto; }
.clouds figcaption { font-size: 0.8rem; color: var(--muted); text-align: center; }
pre.commands { background: #1d2430; color: #e8ecf3; padding: 0.7rem 1rem; border-radius: 8px;
  overflow-x: auto; }
footer { margin-top: 2rem; color: var(--muted); font-size: 0.8rem; }
"""


def _labels_html(labels: Sequence[str], include: set[str], exclude: set[str]) -> str:
    if not labels:
        return ""
    parts = []
    for lab in labels:
        n = _norm(lab)
        cls = ' class="exc"' if n in exclude else ' class="inc"' if n in include else ""
        title = ' title="an excluded concept"' if n in exclude else ""
        parts.append(f"<li{cls}{title}>{_e(lab)}</li>")
    return '<ul class="labels">' + "".join(parts) + "</ul>"


def _explanation(item: ResultItem) -> str:
    if not item.matched and not item.excluded and not item.caption:
        return ""
    out = ["<details><summary>why this result</summary>"]
    if item.caption:
        out.append(f'<p class="caption-full">{_e(item.caption)}</p>')
    if item.matched:
        out.append('<p class="expl-title">Matched concepts</p>')
        out.append('<table class="expl"><tr><th>dim</th><th>contribution</th><th>words</th></tr>')
        for dim, contribution, words in item.matched:
            out.append(
                f'<tr data-dim="{_e(dim)}"><td>{_e(dim)}</td>'
                f'<td class="num">{_fmt(contribution)}</td><td>{_words(words)}</td></tr>'
            )
        out.append("</table>")
    if item.excluded:
        out.append('<p class="expl-title">Excluded concepts checked</p>')
        out.append(
            '<table class="expl"><tr><th>term</th><th>dims checked</th>'
            "<th>item mass</th><th>words</th></tr>"
        )
        labelled = {_norm(x) for x in item.labels}
        for term, dims, mass, words in item.excluded:
            absent = not (math.isfinite(mass) and mass > 0.0)
            cls, verdict = ("ok", "✓ absent") if absent else ("present", "✗ present")
            # The labels are what the item shows: the verdict never contradicts them.
            if item.labels and _norm(term) in labelled:
                cls = "present"
                verdict = "✗ present (its labels)" + ("; the codes missed it" if absent else "")
            elif item.labels and not absent:
                cls, verdict = "ok", "✓ not in its labels (some mass on the dims)"
            dim_text = ", ".join(str(d) for d in list(dims)[:12])
            if len(dims) > 12:
                dim_text += f" +{len(dims) - 12}"
            out.append(
                f'<tr class="check {cls}" data-term="{_e(term)}"><td>{_e(term)}</td>'
                f"<td>{_e(dim_text or 'none')}</td>"
                f'<td class="num">{_fmt(mass)} {verdict}</td><td>{_words(words)}</td></tr>'
            )
        out.append("</table>")
    out.append("</details>")
    return "".join(out)


def _card(
    item: ResultItem, rank: int, assets: _Assets, include: set[str], exclude: set[str]
) -> str:
    cls = "card violates" if item.violates else "card"
    if item.image:
        href, small = assets.link(item.image, "images", f"result {item.id!r}")
        alt = item.caption or item.id
        px = ' class="px"' if small else ""
        pic = f'<img src="{_e(href)}" alt="{_e(alt)}"{px}>'
    else:
        pic = f'<div class="textonly">{_e(item.caption or item.id)}</div>'
    marker = (
        '<span class="violation" title="carries an excluded concept">✕ excluded</span>'
        if item.violates
        else ""
    )
    score = item.score_text or _fmt(item.score)
    return (
        f'<li class="{cls}" data-id="{_e(item.id)}">'
        f'<figure class="thumb">{pic}<span class="rank">#{rank}</span>{marker}</figure>'
        f'<div class="meta"><span class="score" title="score">{score}</span>'
        f'<span class="id" title="{_e(item.id)}">{_e(item.id)}</span></div>'
        f"{_labels_html(item.labels, include, exclude)}"
        f'<p class="caption" title="{_e(item.caption)}">{_e(item.caption)}</p>'
        f"{_explanation(item)}</li>"
    )


def _metrics_line(items: Sequence[ResultItem], metrics: Mapping[str, float]) -> str:
    parts = [f"{_e(name)} <b>{_fmt(value)}</b>" for name, value in metrics.items()]
    n_bad = sum(1 for it in items if it.violates)
    viol = f"{n_bad} of {len(items)} shown carry an excluded concept"
    parts.append(f'<span class="viol">{viol}</span>' if n_bad else viol)
    return '<p class="metrics">' + " · ".join(parts) + "</p>"


def _panel(num: int, panel: QueryPanel, assets: _Assets) -> str:
    include = {_norm(t) for t in panel.include}
    exclude = {_norm(t) for t in panel.exclude}
    terms = "".join(f'<span class="term inc">{_e(t)}</span>' for t in panel.include)
    if panel.exclude:
        terms += " but not " + "".join(
            f'<span class="term exc">{_e(t)}</span>' for t in panel.exclude
        )
    extra = set(panel.metrics) - set(panel.columns)
    if extra:
        logger.warning(
            "query %r: metrics for methods without a column ignored: %s",
            panel.query,
            ", ".join(sorted(extra)),
        )
    out = [
        f'<section class="panel" id="q{num}">',
        f'<h2><span class="qnum">Query {num}</span>“{_e(panel.query)}”</h2>',
        f'<p class="terms">{terms}</p>',
    ]
    if not panel.columns:
        out.append('<p class="muted">No results.</p>')
    else:
        out.append(f'<div class="columns" style="--ncols: {len(panel.columns)}">')
        for method, items in panel.columns.items():
            out.append(f'<div class="column" data-method="{_e(method)}"><h3>{_e(method)}</h3>')
            out.append(_metrics_line(items, panel.metrics.get(method, {})))
            if items:
                out.append('<ol class="grid">')
                out.extend(
                    _card(it, rank, assets, include, exclude) for rank, it in enumerate(items, 1)
                )
                out.append("</ol>")
            else:
                out.append('<p class="muted">No results.</p>')
            out.append("</div>")
        out.append("</div>")
    if panel.clouds:
        out.append('<div class="clouds">')
        for caption, png in panel.clouds:
            href, _ = assets.link(png, "clouds", f"word cloud {caption!r}")
            out.append(
                f'<figure><img src="{_e(href)}" alt="{_e(caption)}">'
                f"<figcaption>{_e(caption)}</figcaption></figure>"
            )
        out.append("</div>")
    out.append("</section>")
    return "\n".join(out)


def _table(title: str, header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    out = ['<table class="data">']
    if title:
        out.append(f"<caption>{_e(title)}</caption>")
    if header:
        out.append("<thead><tr>" + "".join(f"<th>{_inline(h)}</th>" for h in header))
        out.append("</tr></thead>")
    out.append("<tbody>")
    out.extend("<tr>" + "".join(_cell(c) for c in row) + "</tr>" for row in rows)
    out.append("</tbody></table>")
    return "\n".join(out)


def render_demo_html(report: DemoReport, out_dir: str | Path, thumb_px: int = THUMB_PX) -> str:
    """The report page as a string; images and clouds outside ``out_dir`` are copied in."""
    from sparsemm import __version__

    out = Path(out_dir)
    assets = _Assets(out, thumb_px)
    body: list[str] = [f"<h1>{_e(report.title)}</h1>"]
    if report.summary_md.strip():
        body.append(f'<div class="summary">{markdown_lite(report.summary_md)}</div>')
    if report.legend:
        entries = "".join(
            f"<dt>{_e(name)}</dt><dd>{_e(what)}</dd>" for name, what in report.legend.items()
        )
        body.append(f'<dl class="legend"><strong>Methods</strong>{entries}</dl>')
    toc = []
    if report.tables:
        toc.append('<li><a href="#tables">Results tables</a></li>')
    toc.extend(
        f'<li><a href="#q{i}">Query {i}: “{_e(p.query)}”</a></li>'
        for i, p in enumerate(report.panels, 1)
    )
    if report.timings:
        toc.append('<li><a href="#timings">Timings</a></li>')
    if report.commands:
        toc.append('<li><a href="#commands">Commands</a></li>')
    if toc:
        body.append('<nav class="toc"><strong>Contents</strong><ul>' + "".join(toc) + "</ul></nav>")
    if report.tables:
        body.append('<h2 id="tables">Results tables</h2>')
        body.extend(_table(t, h, r) for t, h, r in report.tables)
    if report.panels:
        body.append(
            '<h2 id="queries">Queries</h2><p class="muted">Methods side by side; a red border '
            "and ✕ mark a result that carries an excluded concept (by its labels). Open "
            "“why this result” for the concept dimensions it matched and the excluded concepts "
            "checked.</p>"
        )
        body.extend(_panel(i, p, assets) for i, p in enumerate(report.panels, 1))
    if report.timings:
        body.append('<h2 id="timings">Timings</h2>')
        rows = [[stage, _seconds(float(s))] for stage, s in report.timings.items()]
        total = sum(float(s) for s in report.timings.values() if math.isfinite(float(s)))
        rows.append(["**total**", f"**{_seconds(total)}**"])
        body.append(_table("", ["stage", "time"], rows))
    if report.commands:
        body.append('<h2 id="commands">Commands</h2>')
        lines = "\n".join(f"$ {_e(c)}" for c in report.commands)
        body.append(f'<pre class="commands"><code>{lines}</code></pre>')
    body.append(f"<footer>Generated by sparsemm {_e(__version__)}.</footer>")
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>{_e(report.title)}</title>\n<style>{CSS}</style>\n</head>\n<body>\n"
        + "\n".join(body)
        + "\n</body>\n</html>\n"
    )


def render_demo_report(out_dir: str | Path, report: DemoReport, thumb_px: int = THUMB_PX) -> Path:
    """Write ``out_dir/index.html`` for ``report``; return its path.

    Result images and word clouds outside ``out_dir`` are copied into ``out_dir/images`` and
    ``out_dir/clouds`` (pictures shrunk to ``thumb_px`` on the longest side); files already
    inside ``out_dir`` are linked in place. Every link is relative, so the folder is portable.
    Raises SparsemmError for a missing or unreadable image.
    """
    if thumb_px < 16:
        raise SparsemmError(f"thumb_px must be >= 16, got {thumb_px}")
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise SparsemmError(f"{out} exists and is not a folder; choose another report folder")
    out.mkdir(parents=True, exist_ok=True)
    page = render_demo_html(report, out, thumb_px)
    index = out / "index.html"
    with atomic_open(index, "w") as fh:
        fh.write(page)
    logger.info("wrote %s (%d query panels)", index, len(report.panels))
    return index


# ------------------------------------------------------------------------ grid picture


BORDER = 4  # frame around each thumbnail: red for a violation, light grey otherwise
GAP = 6  # space between cells and around the edge
LABEL_H = 16  # text strip under each cell: rank and score
TITLE_H = 24  # optional title line


def grid_png_size(n: int, cols: int = 5, thumb: int = 96, title: bool = False) -> tuple[int, int]:
    """(width, height) in pixels of :func:`result_grid_png` for ``n`` items.

    A cell is the thumbnail plus a ``BORDER`` frame and a ``LABEL_H`` text strip; cells are
    ``GAP`` apart and from the edge; a title adds ``TITLE_H``.
    """
    cols = min(cols, max(n, 1))
    rows = max(1, math.ceil(n / cols))
    cell_w = thumb + 2 * BORDER
    cell_h = cell_w + LABEL_H
    width = cols * cell_w + (cols + 1) * GAP
    height = rows * cell_h + (rows + 1) * GAP + (TITLE_H if title else 0)
    return width, height


def _font(size: int) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    from sparsemm_experiments.viz.wordcloud import bundled_font

    try:
        return ImageFont.truetype(bundled_font(), size)
    except (OSError, SparsemmError):  # pragma: no cover - a broken wordcloud install
        return ImageFont.load_default()


def result_grid_png(
    items: Sequence[ResultItem],
    out_png: str | Path,
    cols: int = 5,
    thumb: int = 96,
    title: str | None = None,
    base_dir: str | Path | None = None,
) -> Path:
    """Draw ranked results as a grid PNG (for a README); return its path.

    Row-major, rank 1 top left; each cell shows the picture fitted into ``thumb`` x ``thumb``
    with a red frame when the item violates the query, and a strip "#rank score". Relative
    image paths are taken from ``base_dir`` (default: the folder of ``out_png``). The size is
    :func:`grid_png_size`.
    """
    if not items:
        raise SparsemmError("result_grid_png needs at least one result")
    if cols < 1 or not 16 <= thumb <= 1024:
        raise SparsemmError(f"need cols >= 1 and 16 <= thumb <= 1024, got {cols}, {thumb}")
    out = Path(out_png)
    base = Path(base_dir) if base_dir is not None else out.parent
    width, height = grid_png_size(len(items), cols, thumb, title is not None)
    cols = min(cols, len(items))
    canvas = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(canvas)
    small, big = _font(11), _font(14)
    top = GAP
    if title is not None:
        draw.text((GAP, TITLE_H // 2 + 2), title, fill=(29, 36, 48), font=big, anchor="lm")
        top += TITLE_H
    cell = thumb + 2 * BORDER
    for i, item in enumerate(items):
        r, c = divmod(i, cols)
        x = GAP + c * (cell + GAP)
        y = top + r * (cell + LABEL_H + GAP)
        frame = (192, 38, 27) if item.violates else (217, 221, 229)
        draw.rectangle([x, y, x + cell - 1, y + cell - 1], fill=frame)
        draw.rectangle(
            [x + BORDER, y + BORDER, x + BORDER + thumb - 1, y + BORDER + thumb - 1],
            fill=(240, 242, 245),
        )
        if item.image:
            path = Path(item.image).expanduser()
            path = path if path.is_absolute() else base / path
            try:
                with Image.open(path) as im:
                    pic = im.convert("RGB")
            except (OSError, ValueError) as exc:
                raise SparsemmError(
                    f"result {item.id!r}: cannot read image {path} ({exc})"
                ) from exc
            scale = thumb / max(pic.size)
            size = (max(1, round(pic.width * scale)), max(1, round(pic.height * scale)))
            # Nearest neighbour keeps tiny pictures (Fashion-MNIST) crisp when enlarged.
            resample = Image.Resampling.NEAREST if scale > 1 else Image.Resampling.LANCZOS
            pic = pic.resize(size, resample)
            canvas.paste(
                pic,
                (x + BORDER + (thumb - size[0]) // 2, y + BORDER + (thumb - size[1]) // 2),
            )
        else:
            text = (item.caption or item.id)[: max(4, thumb // 7)]
            draw.text((x + BORDER + 3, y + BORDER + 3), text, fill=(102, 112, 133), font=small)
        colour = (192, 38, 27) if item.violates else (29, 36, 48)
        mid = y + cell + LABEL_H // 2
        draw.text(
            (x + 1, mid),
            f"#{i + 1}  {item.score_text or _fmt(item.score)}",
            fill=colour,
            font=small,
            anchor="lm",
        )
        if item.violates:  # a drawn cross: the bundled font has no such glyph
            r = LABEL_H // 2 - 3
            cx = x + cell - r - 2
            draw.line([cx - r, mid - r, cx + r, mid + r], fill=colour, width=2)
            draw.line([cx - r, mid + r, cx + r, mid - r], fill=colour, width=2)
    with atomic_open(out, "wb") as fh:
        canvas.save(fh, format="PNG")
    return out
