"""The demo report: every query and column present, text escaped, links portable, violation
markers exactly on violating items; the result-grid PNG has the documented size."""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pytest
from PIL import Image

from sparsemm.errors import SparsemmError
from sparsemm.query.hits import ExcludedCheck, Hit, MatchedConcept
from sparsemm_experiments.viz.report import (
    DemoReport,
    QueryPanel,
    ResultItem,
    grid_png_size,
    markdown_lite,
    render_demo_report,
    result_grid_png,
)

EVIL = "<script>alert('x')</script> & co"
VOID = {"img", "meta", "br", "hr", "link", "input", "source"}


# ------------------------------------------------------------------- a tiny DOM for checks


@dataclass
class Node:
    tag: str
    attrs: dict[str, str]
    children: list[Node] = field(default_factory=list)
    text: str = ""

    def classes(self) -> set[str]:
        return set(self.attrs.get("class", "").split())

    def walk(self) -> list[Node]:
        out = [self]
        for c in self.children:
            out.extend(c.walk())
        return out

    def find(self, tag: str, cls: str | None = None) -> list[Node]:
        return [n for n in self.walk() if n.tag == tag and (cls is None or cls in n.classes())]

    def all_text(self) -> str:
        return self.text + "".join(c.all_text() for c in self.children)


class TreeBuilder(HTMLParser):
    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.root = Node("root", {})
        self.stack = [self.root]

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        node = Node(tag, {k: v or "" for k, v in attrs})
        self.stack[-1].children.append(node)
        if tag not in VOID:
            self.stack.append(node)

    def handle_endtag(self, tag: str) -> None:
        assert self.stack[-1].tag == tag, f"</{tag}> closes <{self.stack[-1].tag}>"
        self.stack.pop()

    def handle_data(self, data: str) -> None:
        self.stack[-1].children.append(Node("#text", {}, text=data))


def parse(html_text: str) -> Node:
    builder = TreeBuilder()
    builder.feed(html_text)
    builder.close()
    assert builder.stack == [builder.root], "unclosed tags"
    return builder.root


# ------------------------------------------------------------------------------ fixtures


def tiny_png(path: Path, colour: tuple[int, int, int], size: tuple[int, int] = (24, 24)) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, colour).save(path)
    return str(path)


def make_report(src: Path, out: Path) -> DemoReport:
    """Two queries, two methods each; images live outside the report folder (``src``)
    except one already inside it (``out/own/inside.png``, linked by a relative path)."""
    red = tiny_png(src / "red img.png", (220, 30, 30))
    green = tiny_png(src / "green.png", (30, 200, 30))
    blue = tiny_png(src / "nested" / "blue.png", (30, 30, 220), size=(400, 300))
    tiny_png(out / "own" / "inside.png", (200, 200, 0))
    cloud = tiny_png(src / "cloud-7.png", (255, 255, 255), size=(64, 40))

    def item(
        i: str, image: str | None, labels: list[str], violates: bool, **kw: object
    ) -> ResultItem:
        return ResultItem(
            id=i,
            image=image,
            score=1.0 - 0.1 * len(i),
            labels=labels,
            caption=kw.pop("caption", f"caption of {i}"),
            violates=violates,
            **kw,  # type: ignore[arg-type]
        )

    sneaker_dense = [
        item("d1", red, ["sneaker", "bag"], True),
        item("d2", green, ["sneaker"], False),
        item("d3", blue, ["bag", "sneaker", "coat"], True),
    ]
    sneaker_sr = [
        item(
            "s1",
            green,
            ["sneaker"],
            False,
            matched=[(7, 0.61, ["sneaker", "trainer"]), (12, 0.05, ["lace"])],
            excluded=[("bag", [3, 9], 0.0, ["bag", "handbag"])],
            caption=EVIL,
        ),
        item("s2", "own/inside.png", ["sneaker", "shirt"], False),
        item("s3", None, ["sneaker", "bag"], True, excluded=[("bag", [3, 9], 0.42, ["bag"])]),
    ]
    dress = QueryPanel(
        query="dress but not <b>sandal</b>",
        include=["dress"],
        exclude=["sandal"],
        columns={
            "dense (LiT)": [item("x1", red, ["dress", "sandal"], True)],
            "SR": [item("y1", green, ["dress"], False)],
        },
        metrics={"SR": {"precision@k": 1.0}},
    )
    return DemoReport(
        title="Demo & <report>",
        summary_md="# Heading\n\nSome **bold** and `code`; <i>raw</i> stays text.\n\n- one\n- two",
        panels=[
            QueryPanel(
                query="sneaker but not bag",
                include=["sneaker"],
                exclude=["bag"],
                columns={"dense (LiT)": sneaker_dense, "SR": sneaker_sr},
                metrics={
                    "dense (LiT)": {"precision@k": 0.333, "violations@k": 0.667},
                    "SR": {"precision@k": 0.667, "violations@k": 0.333},
                },
                clouds=[("dim 7 (sneaker)", cloud), ("dim 3 <bag>", cloud)],
            ),
            dress,
        ],
        tables=[("Benchmark", ["method", "AP@10"], [["SR", "**0.640**"], ["dense <x>", "0.5"]])],
        timings={"encode": 12.5, "train": 75.0},
        commands=["sparsemm serve runs/demo/collection --port 8000 && echo '<ok>'"],
    )


@pytest.fixture()
def rendered(tmp_path: Path) -> tuple[Path, DemoReport, str, Node]:
    out = tmp_path / "report"
    report = make_report(tmp_path / "src", out)
    index = render_demo_report(out, report)
    assert index == out / "index.html"
    text = index.read_text(encoding="utf-8")
    return out, report, text, parse(text)


# --------------------------------------------------------------------------------- tests


def test_every_query_and_column_is_shown(rendered: tuple[Path, DemoReport, str, Node]) -> None:
    _, report, text, dom = rendered
    panels = dom.find("section", "panel")
    assert len(panels) == len(report.panels)
    for node, panel in zip(panels, report.panels, strict=True):
        assert panel.query in node.find("h2")[0].all_text()
        columns = node.find("div", "column")
        assert [c.attrs["data-method"] for c in columns] == list(panel.columns)
        for col, (method, items) in zip(columns, panel.columns.items(), strict=True):
            assert col.find("h3")[0].all_text() == method
            cards = col.find("li", "card")
            assert [c.attrs["data-id"] for c in cards] == [it.id for it in items]
            ranks = [c.find("span", "rank")[0].all_text() for c in cards]
            assert ranks == [f"#{r}" for r in range(1, len(items) + 1)]
    # the metrics line: given values and the measured count of violating results
    dense = panels[0].find("div", "column")[0].find("p", "metrics")[0].all_text()
    assert "precision@k 0.333" in dense and "2 of 3 shown carry an excluded concept" in dense
    assert "Benchmark" in text and "12.5 s" in text and "1 min 15 s" in text


def test_text_is_escaped(rendered: tuple[Path, DemoReport, str, Node]) -> None:
    _, _, text, dom = rendered
    assert "<script" not in text  # the page has no script at all, and EVIL is escaped
    assert "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; co" in text
    assert "<b>sandal</b>" not in text and "dress but not &lt;b&gt;sandal&lt;/b&gt;" in text
    assert "<i>raw</i>" not in text and "&lt;i&gt;raw&lt;/i&gt;" in text
    assert "<title>Demo &amp; &lt;report&gt;</title>" in text
    assert "echo &#x27;&lt;ok&gt;&#x27;" in text
    assert "dense &lt;x&gt;" in text
    assert "<strong>0.640</strong>" in text and "<strong>bold</strong>" in text
    # the caption reaches the reader as the original string
    s1 = next(c for c in dom.find("li", "card") if c.attrs["data-id"] == "s1")
    assert s1.find("p", "caption")[0].all_text() == EVIL


def test_links_resolve_inside_the_report_folder(
    rendered: tuple[Path, DemoReport, str, Node], tmp_path: Path
) -> None:
    out, _, _, dom = rendered
    links = [n.attrs["src"] for n in dom.find("img")]
    links += [n.attrs["href"] for n in dom.find("a") if not n.attrs["href"].startswith("#")]
    links += [n.attrs["href"] for n in dom.find("link")]
    assert len(links) == 9  # 7 result pictures (one of 8 items has none) + 2 word clouds
    root = out.resolve()
    for link in links:
        assert "://" not in link and not link.startswith("/"), link
        target = (out / unquote(link)).resolve()
        assert target.is_relative_to(root) and target.is_file(), link
    # copies go to images/ and clouds/; one source file -> one copy; inside files stay put
    assert len(list((out / "images").iterdir())) == 3
    assert len(list((out / "clouds").iterdir())) == 1
    assert "own/inside.png" in links
    # a large picture is shrunk to the thumbnail size, a small one kept as it is
    sizes = sorted(Image.open(p).size for p in (out / "images").iterdir())
    assert sizes == [(24, 24), (24, 24), (256, 192)]
    # the folder is portable: moved elsewhere, every link still resolves
    moved = tmp_path / "elsewhere" / "r"
    shutil.move(str(out), str(moved))
    shutil.rmtree(tmp_path / "src")
    assert all((moved / unquote(link)).is_file() for link in links)


def test_violation_marker_exactly_on_violating_items(
    rendered: tuple[Path, DemoReport, str, Node],
) -> None:
    _, report, _, dom = rendered
    expected = {
        (p.query, m, it.id): it.violates
        for p in report.panels
        for m, its in p.columns.items()
        for it in its
    }
    seen = {}
    for panel, node in zip(report.panels, dom.find("section", "panel"), strict=True):
        for col in node.find("div", "column"):
            for card in col.find("li", "card"):
                markers = card.find("span", "violation")
                assert len(markers) <= 1
                key = (panel.query, col.attrs["data-method"], card.attrs["data-id"])
                seen[key] = bool(markers)
                assert ("violates" in card.classes()) == bool(markers)
    assert seen == expected
    assert sum(expected.values()) == 4 and len(expected) == 8


def test_labels_and_explanations(rendered: tuple[Path, DemoReport, str, Node]) -> None:
    _, _, _, dom = rendered
    cards = {c.attrs["data-id"]: c for c in dom.find("li", "card")}
    d1_labels = {li.all_text(): li.classes() for li in cards["d1"].find("ul", "labels")[0].children}
    assert d1_labels == {"sneaker": {"inc"}, "bag": {"exc"}}
    details = cards["s1"].find("details")[0]
    rows = details.find("tr")
    dims = [r.attrs.get("data-dim") for r in rows if "data-dim" in r.attrs]
    assert dims == ["7", "12"]
    assert "0.610" in details.all_text() and "sneaker, trainer" in details.all_text()
    checks = details.find("tr", "check")
    assert [c.attrs["data-term"] for c in checks] == ["bag"]
    assert "ok" in checks[0].classes() and "3, 9" in checks[0].all_text()
    bad = cards["s3"].find("tr", "check")[0]
    assert "present" in bad.classes() and "0.420" in bad.all_text()
    # an item with no picture shows its caption instead
    assert cards["s3"].find("div", "textonly")[0].all_text() == "caption of s3"
    assert not cards["s3"].find("img")


def test_from_hit_reads_searcher_hits() -> None:
    hit = Hit(
        rank=1,
        row=4,
        id="c9",
        score=0.75,
        caption="a sneaker and a bag",
        labels=["sneaker", "Bag"],
        matched=[MatchedConcept(dim=2, weight=0.5, words=["sneaker"])],
        excluded=[ExcludedCheck(term="bag", dims=[5], item_mass=0.3, words=["bag"])],
    )
    item = ResultItem.from_hit(hit, "x.png", exclude=["bag"])
    assert item.violates and item.image == "x.png" and item.score == 0.75
    assert item.matched == [(2, 0.5, ["sneaker"])]
    assert item.excluded == [("bag", [5], 0.3, ["bag"])]
    again = ResultItem.from_hit(hit.to_dict(), None, exclude=["coat"])
    assert not again.violates and again.matched == item.matched


def test_missing_image_is_a_clear_error(tmp_path: Path) -> None:
    panel = QueryPanel("a", ["a"], [], {"SR": [ResultItem("i1", str(tmp_path / "nope.png"), 1.0)]})
    with pytest.raises(SparsemmError, match=r"i1.*not found"):
        render_demo_report(tmp_path / "r", DemoReport("t", panels=[panel]))
    (tmp_path / "bad.png").write_bytes(b"not a png")
    panel.columns["SR"][0].image = str(tmp_path / "bad.png")
    with pytest.raises(SparsemmError, match="cannot read image"):
        render_demo_report(tmp_path / "r", DemoReport("t", panels=[panel]))
    assert not (tmp_path / "r" / "index.html").exists()


def test_markdown_lite_escapes_everything() -> None:
    out = markdown_lite("## Title <x>\n\n- a **b** `<c>`\n- d\n\nplain & text")
    assert out == (
        "<h4>Title &lt;x&gt;</h4>\n<ul><li>a <strong>b</strong> <code>&lt;c&gt;</code></li>"
        "<li>d</li></ul>\n<p>plain &amp; text</p>"
    )


def test_result_grid_png_size_and_borders(tmp_path: Path) -> None:
    a = tiny_png(tmp_path / "a.png", (0, 0, 255), size=(28, 28))
    items = [ResultItem(f"i{k}", a, 1.0 - k / 10, violates=k in (0, 4)) for k in range(7)]
    items[5].image = None
    out = result_grid_png(items, tmp_path / "g.png", cols=3, thumb=40)
    with Image.open(out) as im:
        # cell 48 px (40 + 2 * 4 border) + 16 px text; 6 px gaps: 3*48 + 4*6, 3*64 + 4*6
        assert im.size == (168, 216) == grid_png_size(7, cols=3, thumb=40)
        px = np.asarray(im.convert("RGB")).astype(int)
    red, grey = np.array([192, 38, 27]), np.array([217, 221, 229])
    assert (px[6, 6] == red).all()  # item 0: top-left cell frame
    assert (px[6, 6 + 48 + 6] == grey).all()  # item 1
    assert (px[6 + 64 + 6, 6 + 48 + 6] == red).all()  # item 4: row 1, col 1
    assert (px[6 + 24, 6 + 24] == [0, 0, 255]).all()  # the picture, scaled into the cell
    titled = result_grid_png(items[:2], tmp_path / "t.png", cols=5, thumb=40, title="SR")
    with Image.open(titled) as im:
        assert im.size == (2 * 48 + 3 * 6, 64 + 2 * 6 + 24)
    with pytest.raises(SparsemmError, match="at least one"):
        result_grid_png([], tmp_path / "e.png")


def test_why_panel_never_contradicts_the_labels(tmp_path: Path) -> None:
    from sparsemm_experiments.viz.report import render_demo_html

    item = ResultItem(
        "i1",
        None,
        1.0,
        labels=["bag", "sneaker"],
        caption="a bag beside a sneaker",
        violates=True,
        excluded=[("bag", [3, 4], 0.0, ["bag"]), ("coat", [5], 0.2, ["coat"])],
    )
    panel = QueryPanel("sneaker but not bag", ["sneaker"], ["bag", "coat"], {"SR": [item]})
    report = DemoReport("t", panels=[panel], legend={"hybrid": "the served default"})
    html = render_demo_html(report, tmp_path)
    # codes saw no bag, but the labels say bag: present; coat has mass but no label: absent
    assert '<tr class="check present" data-term="bag">' in html
    assert "the codes missed it" in html and "✓ absent" not in html
    assert '<tr class="check ok" data-term="coat">' in html
    assert "<dt>hybrid</dt><dd>the served default</dd>" in html


def test_method_legend_names_every_strategy() -> None:
    from sparsemm_experiments.demo_report import method_legend

    legend = method_legend(["slq", "match", "avg_emb_0.5", "not-a-strategy", "slq"])
    assert list(legend) == ["slq", "match", "avg_emb_0.5"]
    assert "served default" in legend["match"] and "without" in legend["slq"]
