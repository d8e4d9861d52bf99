"""End to end in a real browser: Playwright drives the system Chromium against uvicorn.

Types a query, sees the grid of server-made thumbnails, leaves out a concept through the "but
not" box and then through a concept chip, and checks that the items carrying it disappear;
then searches by image ("more like this" on a result, and an uploaded picture) and sees items
that break the query marked. Screenshots go to
the test's tmp folder and to ``runs/`` at the repository root (``$SPARSEMM_SCREENSHOTS``).

Needs ``pip install playwright`` (no ``playwright install``: the Debian ``chromium`` package
is used). Skipped when either is missing; ``SPARSEMM_CHROMIUM`` overrides the browser path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from webtoy import ITEMS, NO_IMAGE, StripeImageEncoder, WebKeywordEncoder, draw

from sparsemm.query.searcher import Searcher
from sparsemm.web.app import create_app

REPO = Path(__file__).resolve().parents[2]
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
TIMEOUT_MS = 15_000


def chromium_path() -> str | None:
    path = os.environ.get("SPARSEMM_CHROMIUM")
    if path:
        return path if Path(path).is_file() else None
    for name in ("chromium", "chromium-browser"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None


sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (pip install playwright)"
)
uvicorn = pytest.importorskip("uvicorn", reason="the web extra (uvicorn) is not installed")
CHROMIUM = chromium_path()
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        CHROMIUM is None,
        reason="no Chromium found (apt-get install chromium, or set SPARSEMM_CHROMIUM)",
    ),
]


@pytest.fixture()
def server(web_collection: Path) -> Iterator[str]:
    """uvicorn on a free 127.0.0.1 port in a thread; yields the base URL."""
    searcher = Searcher(
        web_collection, encoder=WebKeywordEncoder(), image_encoder=StripeImageEncoder()
    )
    # The page mechanics are checked against exact sets: serve the hard `filter` (the
    # default scorer's soft ranking is tested in tests/query and tests/eval).
    searcher.default_strategy = "filter"
    app = create_app(searcher=searcher)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    config = uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off")
    srv = uvicorn.Server(config)
    thread = threading.Thread(target=srv.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=10)
        sock.close()


def screenshot_dir() -> Path:
    """Where the screenshots go: $SPARSEMM_SCREENSHOTS, else ``runs/`` at the repository root."""
    path = Path(os.environ.get("SPARSEMM_SCREENSHOTS") or REPO / "runs")
    path.mkdir(parents=True, exist_ok=True)
    return path


def shown_ids(page: Any) -> set[str]:
    return set(page.eval_on_selector_all("#results .card", "cards => cards.map(c => c.dataset.id)"))


def wait_for_query(page: Any, text: str) -> None:
    page.wait_for_selector(f"#results[data-query='{text}']:not([aria-busy])", state="attached")


def with_(obj: str, without: tuple[str, ...] = ()) -> set[str]:
    return {i for i, o in ITEMS.items() if obj in o and not set(without) & set(o)}


def test_search_page_end_to_end(server: str, tmp_path: Path) -> None:
    with sync_api.sync_playwright() as pw:
        context = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh user-data dir
            executable_path=CHROMIUM,
            headless=True,
            args=CHROMIUM_ARGS,
            viewport={"width": 1280, "height": 900},
        )
        try:
            page = context.new_page()
            page.set_default_timeout(TIMEOUT_MS)
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on(  # a refused query's 400 is an answer the page shows (step 1b)
                "console",
                lambda msg: (
                    errors.append(msg.text)
                    if msg.type == "error" and "status of 400" not in msg.text
                    else None
                ),
            )
            page.goto(server + "/")
            page.wait_for_selector("body[data-ready='true']", state="attached")
            assert "24 items" in page.inner_text("#collection-info")
            # the query box suggests a search this collection answers (/api/health)
            example = json.loads(page.evaluate("fetch('api/health').then(r => r.text())"))
            assert page.get_attribute("#include", "placeholder") == f"e.g. {example['example']}"

            # 1. a query: the dog images come back as a grid of loaded images
            page.fill("#include", "dog")
            page.click("#search-button")
            wait_for_query(page, "dog")
            first = shown_ids(page)
            assert with_("dog") <= first
            assert with_("dog", without=("cat",)) and with_("dog") & with_("cat")
            page.wait_for_function(
                "() => [...document.querySelectorAll('#results img')]"
                ".every(i => i.complete && i.naturalWidth > 0)"
            )
            n_images = page.locator("#results .card img").count()
            assert n_images >= len(with_("dog") - set(NO_IMAGE))
            srcs = page.eval_on_selector_all("#results .card img", "i => i.map(x => x.src)")
            assert all("/thumbs/" in s for s in srcs)  # thumbnails, not the full images
            assert page.inner_text("#status").startswith(f"Showing {len(first)} of ")
            # an item without an image is a caption card
            card = page.locator(f".card[data-id='{NO_IMAGE[0]}'] .caption-card")
            assert card.inner_text() == ITEMS[NO_IMAGE[0]][0]
            # a photo with copies names their paths on its card, once
            assert page.locator(".card[data-id='d1'] .also").inner_text() == "also: backup/d1.png"
            assert page.locator(".card .also").count() == 1
            # a long file name (a photo without a caption shows its name) wraps inside the
            # card: the rank and score stay on it
            page.eval_on_selector(
                "#results .card .caption", "c => { c.textContent = 'IMG_' + 'x'.repeat(120) }"
            )
            inside = page.eval_on_selector(
                "#results .card",
                "c => { const s = c.querySelector('.score').getBoundingClientRect();"
                " const b = c.getBoundingClientRect(); return s.right <= b.right + 0.5"
                " && s.left >= b.left && s.width > 0 }",
            )
            assert inside
            # the strategy menu: a photo user sees no research scorers; "advanced" offers
            # what the collection can run (as /api/health says)
            health = page.evaluate("() => fetch('/api/health').then(r => r.json())")
            assert page.locator("#strategy").is_hidden()
            offered = page.eval_on_selector_all("#strategy option", "os => os.map(o => o.value)")
            assert offered == [health["default_strategy"]]
            page.check("#advanced")
            offered = page.eval_on_selector_all("#strategy option", "os => os.map(o => o.value)")
            assert offered == health["strategies"] and page.locator("#strategy").is_visible()

            # 1b. a refused query, then an empty one: the error stands alone, the previous
            # answer's grid is not left under it to read as this query's answer
            page.fill("#include", "dog but not dog")
            page.click("#search-button")
            page.wait_for_selector("#error:not([hidden])")
            assert page.locator("#results .card").count() == 0
            assert page.inner_text("#status") == "" and page.locator("#more").is_hidden()
            page.fill("#include", "dog")
            page.click("#search-button")
            wait_for_query(page, "dog")
            page.fill("#include", "")
            page.click("#search-button")
            page.wait_for_selector("#error:not([hidden])")
            assert "Type what to search for" in page.inner_text("#error")
            assert page.locator("#results .card").count() == 0

            # 1c. a photo folder's card (served answer rewritten: a name in nested folders,
            # no caption, ImageNet's faint classes among the matched concepts): the path
            # wraps at its folders on lines of its own, only concepts that matter are chips
            def photo_folder(route: Any) -> None:
                body = route.fetch().json()
                hit = body["hits"][0]
                hit["caption"] = ""
                hit["id"] = "holiday/2024/summer/day1/IMG_20240612_184512.jpg"
                top = max(c["weight"] for c in hit["matched"])
                hit["matched"] += [
                    {"dim": 4, "weight": 0.02 * top, "words": ["wig"]},
                    {"dim": 5, "weight": 0.1 * top, "words": ["bassoon"]},
                ]
                route.fulfill(json=body)

            page.route("**/api/search", photo_folder)
            page.fill("#include", "dog")
            page.click("#search-button")
            wait_for_query(page, "dog")
            page.unroute("**/api/search", photo_folder)
            first = page.locator("#results .card").first
            assert first.locator(".chip[data-term='wig']").count() == 0
            assert first.locator(".chip[data-term='bassoon']").count() == 0
            assert first.locator(".chip").count() >= 1
            page.click("#results .card:nth-child(2) .thumb")  # the panel narrows the grid
            page.wait_for_selector("#panel h3")
            box = first.locator(".caption").bounding_box()
            card = first.bounding_box()
            assert box and card and box["width"] >= 0.6 * card["width"], (box, card)
            size = first.locator(".caption").evaluate("c => getComputedStyle(c).fontSize")
            line = 1.4 * float(size.removesuffix("px"))  # a "normal" line height, at most
            # 48 characters on at most 5 lines, not one or two characters a line
            assert box["height"] <= 5 * line, (box, line)

            # 1d. the "why" panel of an item with no captions (a photo folder) shows no
            # stray "null" where the other captions would be listed
            def captionless(route: Any) -> None:
                body = route.fetch().json()
                body["item"]["captions"] = []
                body["item"]["caption"] = ""
                route.fulfill(json=body)

            page.route("**/api/items/*/explain*", captionless)
            page.click("#results .card:nth-child(3) .thumb")
            page.wait_for_selector("#panel .concepts, #panel h3 >> text=Excluded")
            assert "null" not in page.inner_text("#panel")
            page.unroute("**/api/items/*/explain*", captionless)
            page.click("#panel-close")
            page.fill("#include", "dog")

            # 2. leave out cat through the "but not" box
            page.fill("#exclude", "cat")
            page.press("#exclude", "Enter")
            wait_for_query(page, "dog -cat")
            after_box = shown_ids(page)
            assert with_("dog", without=("cat",)) <= after_box
            assert not after_box & with_("cat")

            # 3. leave out ball by clicking its concept chip on a dog-with-ball result
            chip = page.locator(".card[data-id='db1'] .chip[data-term='ball']")
            assert chip.is_enabled()
            # the searched term is shown, never offered as an exclusion
            searched = page.locator(".card[data-id='db1'] .chip[data-term='dog']")
            assert searched.evaluate("c => c.tagName") == "SPAN"
            chip.click()
            wait_for_query(page, "dog -cat -ball")
            assert page.input_value("#exclude") == "cat, ball"
            after_chip = shown_ids(page)
            assert after_chip == with_("dog", without=("cat", "ball"))
            assert "but not" in page.inner_text("#status")

            # 4. the explanation of a result: matched concepts and the excluded checks
            page.click(".card[data-id='d3'] .thumb")
            page.wait_for_selector("#panel .checks li[data-term='ball']")
            panel = page.inner_text("#panel")
            assert "Matched concepts" in panel and "dog" in panel
            assert page.locator("#panel .check.ok").count() == 2  # cat and ball: absent
            assert page.url.endswith("?q=dog&not=cat%2C+ball")

            shot = tmp_path / "web-screenshot.png"
            page.screenshot(path=str(shot), full_page=True)
            assert shot.stat().st_size > 10_000
            shots = screenshot_dir()
            shutil.copyfile(shot, shots / "web-screenshot.png")

            # 5. a concept's own page: its words and top items; back to the explanation
            page.click("#panel tr[data-dim='0'] button.link")
            page.wait_for_selector("#panel .mini-grid .mini")
            assert "Concept dim 0" in page.inner_text("#panel")
            top = page.eval_on_selector_all("#panel .mini", "m => m.map(x => x.dataset.id)")
            assert top and all("dog" in ITEMS[i] for i in top)
            page.click("#panel button.link >> text=back")
            page.wait_for_selector("#panel .checks")

            # 6. a sentence with its negation, typed into the include box
            page.fill("#exclude", "")
            page.fill("#include", "A dog playing, but there is no cat in sight.")
            page.click("#search-button")
            page.wait_for_selector("#results[data-query='dog playing -cat']", state="attached")
            assert "but not “cat”" in page.inner_text("#status")
            assert not shown_ids(page) & with_("cat")  # the page serves `filter` here

            # 7. only an exclusion: ranked by absence
            page.fill("#include", "")
            page.fill("#exclude", "dog")
            page.press("#exclude", "Enter")
            page.wait_for_selector("#results[data-query='-dog']", state="attached")
            assert "anything but not “dog”" in page.inner_text("#status")

            # 8. the served scorer: each card says how strongly it carries each term; an
            # excluded term reads as the chance the item shows it ("cat 0% (left out)"),
            # never "not cat 0.00" (which read as the chance of no cat)
            page.select_option("#strategy", "hybrid")
            page.fill("#include", "dog")
            page.fill("#exclude", "cat")
            page.click("#search-button")
            page.wait_for_selector("#results .card .evidence")
            line = page.inner_text("#results .card:first-child .evidence")
            assert line.startswith("dog ") and "not " not in line
            assert re.search(r" · cat (\d+%|<1%|\d\.\d\d) \(left out\)$", line), line

            # 9. items that break the query are marked (code_a ignores the exclusion)
            page.select_option("#strategy", "code_a")
            page.fill("#exclude", "ball")
            page.click("#search-button")
            wait_for_query(page, "dog -ball")
            marked = page.eval_on_selector_all(
                "#results .card.violates", "cs => cs.map(c => c.dataset.id)"
            )
            assert set(marked) == shown_ids(page) & with_("ball")
            assert with_("dog") & with_("ball") <= set(marked)
            assert "has ball" in page.inner_text(".card[data-id='db1'] .violation")
            page.click(".card[data-id='db1'] .thumb")  # its "why" agrees with its labels
            page.wait_for_selector("#panel .checks li.check.bad[data-term='ball']")
            page.click("#panel-close")
            page.screenshot(path=str(shots / "web-screenshot-marks.png"), full_page=True)

            # 10. more like this: a result's code with the "but not" terms
            page.select_option("#strategy", "filter")
            page.fill("#exclude", "cat")
            page.click(".card[data-id='d3'] .like-button")
            wait_for_query(page, "like item d3 -cat")
            liked = shown_ids(page)
            assert liked and not liked & with_("cat") and "d3" in liked
            assert "More like item d3" in page.inner_text("#like-bar")
            assert page.url.endswith("?like=d3&not=cat")
            page.click(".card[data-id='d1'] .thumb")
            page.wait_for_selector("#panel .checks li[data-term='cat']")
            assert "null" not in page.inner_text("#panel")
            assert "dog" in page.inner_text("#panel table.concepts")

            # 11. an uploaded picture (pizza and car) but not car
            picture = tmp_path / "pizza_car.png"
            draw(["pizza", "car"], picture)
            page.fill("#exclude", "car")
            page.set_input_files("#upload", str(picture))
            wait_for_query(page, "like uploaded image -car")
            uploaded = shown_ids(page)
            assert uploaded and uploaded <= with_("pizza", without=("car",)) | with_("dog")
            assert set(sorted(uploaded)[:1]) <= with_("pizza", without=("car",))
            assert "your picture pizza_car.png" in page.inner_text("#like-bar")
            page.screenshot(path=str(shots / "web-screenshot-like.png"), full_page=True)
            # typing a query again leaves the image search
            page.fill("#include", "tree")
            page.click("#search-button")
            wait_for_query(page, "tree -car")
            assert page.locator("#like-bar").is_hidden()
            assert not errors, errors
        finally:
            context.close()
