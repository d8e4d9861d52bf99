"""The project's own documents: the version named alike in pyproject.toml, ``__version__`` and
the changelog's newest release; no working-round numbers ("session 13", "issue 15") in the
user-facing documents or under docs/; and every relative link of those documents leads to a
file and heading that exist."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import sparsemm

ROOT = Path(__file__).resolve().parents[1]
# The documents a reader starts from (the rest of docs/ is reached through them).
ENTRY_DOCS = ("README.md", "CHANGELOG.md", "CONTRIBUTING.md", "docs/architecture.md")
# Every document a user reads: the entry documents and all of docs/.
USER_DOCS = tuple(
    dict.fromkeys(
        ENTRY_DOCS + tuple(p.relative_to(ROOT).as_posix() for p in sorted(ROOT.glob("docs/*.md")))
    )
)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
WORKING_ROUND = re.compile(r"\b(?:session|issue)s?[ -]\d+", re.I)


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


def test_docs_folder_is_covered() -> None:
    """The checks below see every page under docs/, not only the entry documents."""
    assert "docs/results.md" in USER_DOCS and "docs/negation.md" in USER_DOCS
    assert len(USER_DOCS) == len(set(USER_DOCS)) > len(ENTRY_DOCS)


def test_working_round_pattern() -> None:
    for said in ("session 13", "Session 6's runs", "(issue 15)", "Issues 31 and", "issue-16"):
        assert WORKING_ROUND.search(said), said
    for fine in ("an issue with 3 photos", "sessions of the server", "tissue 5"):
        assert not WORKING_ROUND.search(fine), fine


@pytest.mark.parametrize("name", USER_DOCS)
def test_user_documents_name_no_working_rounds(name: str) -> None:
    text = (ROOT / name).read_text(encoding="utf-8")
    found = WORKING_ROUND.findall(text)
    assert not found, f"{name} speaks of how it was made: {found}"


@pytest.mark.parametrize("name", USER_DOCS)
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
