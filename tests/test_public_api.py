"""The public API: names exported lazily from ``sparsemm``, and the README's Python example
run as written on a tiny collection built here with those names."""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import sparsemm
from fakes import FashionWords, fashion_collection

README = Path(__file__).resolve().parents[1] / "README.md"
DEMO_COLLECTION = "runs/collages-demo/collection"


def readme_example() -> str:
    """The fenced Python block after ``<!-- api-example -->`` in the README."""
    m = re.search(r"<!-- api-example -->\s*```python\n(.*?)```", README.read_text(), re.S)
    assert m, "README has no <!-- api-example --> python block"
    return m.group(1)


def test_readme_example_runs_and_leaves_the_excluded_object_out(tmp_path: Path) -> None:
    code = readme_example()
    assert DEMO_COLLECTION in code and len(code.strip().splitlines()) <= 5
    col = fashion_collection(tmp_path)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code.replace(DEMO_COLLECTION, str(col)), {})
    lines = out.getvalue().splitlines()
    assert len(lines) == 5
    ids = [line.split()[1] for line in lines]
    assert [line.split()[0] for line in lines] == ["1", "2", "3", "4", "5"]
    # the sneakers without a bag come first; no item with a bag is ranked above them
    assert set(ids[:3]) == {"s1", "s2", "s3"}, lines
    assert "sb1" not in ids[:3] and "sb2" not in ids[:3]


def test_every_exported_name_resolves_and_is_listed() -> None:
    assert set(sparsemm.__all__) == {*sparsemm._LAZY, "SparsemmError", "__version__"}
    for name in sparsemm.__all__:
        assert getattr(sparsemm, name) is not None, name
        assert name in dir(sparsemm)
    assert sparsemm.Searcher.__module__ == "sparsemm.query.searcher"
    assert sparsemm.parse_query("dog but not cat").exclude == ("cat",)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        _ = sparsemm.nope  # type: ignore[attr-defined]


def test_import_sparsemm_stays_cheap() -> None:
    code = (
        "import json, sys, sparsemm; "
        "print(json.dumps([m for m in ('numpy', 'scipy', 'torch') if m in sys.modules]))"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout) == []


def test_keyword_fake_scores_as_expected() -> None:
    """The fixture's encoder: one dimension per keyword (so the expected ranking holds)."""
    v = FashionWords().encode_text(["a sneaker and a bag"])
    np.testing.assert_allclose(v[0, :2], [2**-0.5, 2**-0.5], rtol=1e-6)
