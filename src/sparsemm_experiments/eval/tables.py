"""Markdown tables for reports: the one helper every report builds its tables with."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def md_table(
    header: Sequence[object], rows: Iterable[Sequence[object]], align: str | None = None
) -> list[str]:
    """The lines of a Markdown table: ``header``, the separator and one line per row (cells
    through ``str``). ``align`` has one letter per column, ``l`` (``---``) or ``r``
    (``---:``); default all ``l``."""
    names = [str(h) for h in header]
    align = align if align is not None else "l" * len(names)
    if len(align) != len(names) or set(align) - {"l", "r"}:
        raise ValueError(f"align needs one of 'l'/'r' per column ({len(names)}), got {align!r}")
    separator = "|" + "".join("---:|" if a == "r" else "---|" for a in align)
    out = ["| " + " | ".join(names) + " |", separator]
    for row in rows:
        cells = [str(c) for c in row]
        if len(cells) != len(names):
            raise ValueError(f"a row has {len(cells)} cells for {len(names)} columns: {cells}")
        out.append("| " + " | ".join(cells) + " |")
    return out
