"""The project's own documents: the version named alike in pyproject.toml, ``__version__`` and
the changelog's newest release; no working-round numbers in the user-facing documents; and
every relative link of the documents a reader starts from leads to a file and heading that
exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import sparsemm

ROOT = Path(__file__).resolve().parents[1]
# The documents a reader starts from (the rest of docs/ is reached through them).
ENTRY_DOCS = ("README.md", "CHANGELOG.md", "CONTRIBUTING.md", "docs/architecture.md")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a Markdown heading."""
    text = re.sub(r"[`*_]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    return {slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", text, re.M)}


def test_slug_matches_github() -> None:
    assert slug("A search: from the command line to a printed hit") == (
        "a-search-from-the-command-line-to-a-printed-hit"
    )
    assert slug('Image queries: "more like this, but not X"') == (
        "image-queries-more-like-this-but-not-x"
    )
    assert slug("The default scorer (`match`)") == "the-default-scorer-match"


def test_the_version_is_the_changelogs_newest_release() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    version = re.search(r'^version = "([^"]+)"', pyproject, re.M)
    assert version, "pyproject.toml names no version"
    releases = re.findall(
        r"^## (\d+\.\d+\.\d+) ", (ROOT / "CHANGELOG.md").read_text(encoding="utf-8"), re.M
    )
    assert releases, "CHANGELOG.md has no '## X.Y.Z (date)' release heading"
    assert version.group(1) == sparsemm.__version__ == releases[0]
    assert sorted(releases, key=lambda v: tuple(map(int, v.split(".")))) == releases[::-1]


@pytest.mark.parametrize("name", ["README.md", "CHANGELOG.md", "CONTRIBUTING.md"])
def test_user_documents_name_no_working_rounds(name: str) -> None:
    text = (ROOT / name).read_text(encoding="utf-8")
    found = re.findall(r"\b(?:session|issue)s? \d+", text, re.I)
    assert not found, f"{name} speaks of how it was made: {found}"


@pytest.mark.parametrize("name", ENTRY_DOCS)
def test_relative_links_lead_to_files_and_headings_that_exist(name: str) -> None:
    doc = ROOT / name
    text = re.sub(r"```.*?```", "", doc.read_text(encoding="utf-8"), flags=re.S)
    bad = []
    for target in LINK.findall(text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto: not checked offline
        file_part, _, anchor = target.partition("#")
        path = (doc.parent / file_part).resolve() if file_part else doc
        if not path.exists():
            bad.append(f"{target}: no such file")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            bad.append(f"{target}: no such heading")
    assert not bad, f"{name}: " + "; ".join(bad)
