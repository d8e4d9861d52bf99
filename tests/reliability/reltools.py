"""Helpers of the reliability tests: the CLI error contract, SIGKILL-ing a writer mid-way,
and deterministic artefact versions a killed subprocess and the test both rebuild.

Kept importable without pytest so the ``python -c`` writers started by the crash tests can
use it (they get this folder on PYTHONPATH).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

HERE = Path(__file__).resolve().parent
SRC = HERE.parents[1] / "src"


# --------------------------------------------------------------------------------- the CLI


@dataclass
class CliResult:
    code: int
    out: str
    err: str

    def one_line_error(self, *fragments: str) -> str:
        """Assert the error contract: exit 2, one stderr line 'error: ...' holding every
        fragment, last on stderr, no traceback (log lines and progress bars may precede it).
        Returns the line."""
        lines = [ln for ln in self.err.splitlines() if ln.strip()]
        errors = [ln for ln in lines if ln.startswith("error: ")]
        assert self.code == 2, (self.code, self.out, self.err)
        assert "Traceback" not in self.err, self.err
        assert len(errors) == 1 and lines[-1] == errors[0], self.err
        for frag in fragments:
            assert frag in errors[0], (frag, errors[0])
        return errors[0]


def run_cli(main: Callable[[list[str]], int], argv: list[str], capsys: Any) -> CliResult:
    capsys.readouterr()
    code = main(argv)
    captured = capsys.readouterr()
    return CliResult(code, captured.out, captured.err)


def cli_subprocess(
    argv: Sequence[str], verbs: Sequence[str], preexec: Callable[[], None] | None = None
) -> CliResult:
    """Run ``sparsemm argv`` in a fresh interpreter with only ``verbs`` of the library loaded
    (and those pyproject.toml's entry points add)."""
    from declared import SUBPROCESS_PRELUDE

    script = (
        SUBPROCESS_PRELUDE + "import sys\n"
        "from sparsemm.cli import main as m\n"
        f"m.VERBS = tuple(v for v in {tuple(verbs)!r} if v in m.VERBS)\n"
        "sys.exit(m.main(sys.argv[1:]))\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        env=child_env(),
        preexec_fn=preexec,
    )
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


# --------------------------------------------------------------------------- kill -9 helpers


def child_env() -> dict[str, str]:
    """Environment of the writer subprocesses: this folder and src importable, one thread."""
    path = os.pathsep.join([str(HERE), str(SRC), os.environ.get("PYTHONPATH", "")])
    return {
        **os.environ,
        "PYTHONPATH": path,
        "OMP_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
        "NUMBA_NUM_THREADS": "1",
    }


def start(script: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", script],
        env=child_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill9(proc: subprocess.Popen[str]) -> None:
    """SIGKILL ``proc`` (nothing of it runs after this: no finally, no atexit) and reap it."""
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL, (proc.returncode, proc.stderr and proc.stderr.read())


def kill_when(proc: subprocess.Popen[str], ready: Callable[[], bool], timeout: float = 60) -> None:
    """Poll ``ready()`` every millisecond; SIGKILL ``proc`` as soon as it holds."""
    limit = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"the writer exited ({proc.returncode}) before the kill: {err}")
        if time.monotonic() > limit:
            proc.kill()
            raise AssertionError("the writer never reached the kill point")
        time.sleep(0.001)
    kill9(proc)


def kill_after(proc: subprocess.Popen[str], ready: Callable[[], bool], delay: float) -> None:
    """Wait until ``ready()`` (the writer is under way), then SIGKILL it ``delay`` s later."""
    limit = time.monotonic() + 60
    while not ready():
        if proc.poll() is not None:
            err = proc.stderr.read() if proc.stderr else ""
            raise AssertionError(f"the writer exited ({proc.returncode}) early: {err}")
        assert time.monotonic() < limit, "the writer never got under way"
        time.sleep(0.001)
    time.sleep(delay)
    assert proc.poll() is None, "the writer finished before the kill"
    kill9(proc)


# ---------------------------------------------------------- deterministic artefact versions

INDEX_DIM = 64


def index_version(v: int, n: int) -> tuple[sp.csr_matrix, list[str]]:
    """Codes and ids of index version ``v``: ``n`` items, ~8 non-zeros each."""
    rng = np.random.default_rng(1000 + v)
    rows = np.repeat(np.arange(n), 8)
    cols = rng.integers(0, INDEX_DIM, size=n * 8)
    vals = rng.random(n * 8).astype(np.float32) + 0.01
    codes = sp.csr_matrix((vals, (rows, cols)), shape=(n, INDEX_DIM), dtype=np.float32)
    codes.sum_duplicates()
    return codes, [f"v{v}-{i}" for i in range(n)]


def collection_version(v: int, n: int) -> dict[str, Any]:
    """Keyword arguments of ``write_collection`` for collection version ``v`` (n items)."""
    rng = np.random.default_rng(2000 + v)
    items = [{"id": f"v{v}-{i}", "captions": [f"item {i} of version {v}"]} for i in range(n)]
    emb = rng.normal(size=(n, 16)).astype(np.float32)
    texts = [{"item": i, "text": it["captions"][0]} for i, it in enumerate(items)]
    return {
        "items": items,
        "encoder": {"name": "versions", "dim": 16},
        "image_emb": emb,
        "text_emb": emb[:, ::-1].copy(),
        "texts": texts,
        "extra": {"v": v},
    }


def captioned_collection(path: Path, encoder: str = "enc", seed: int = 0) -> Path:
    """Write a 24-item, 8-d collection of the ``train`` split, two captions per item."""
    from sparsemm.data.collection import write_collection

    rng = np.random.default_rng(seed)
    items = [{"id": f"i{i}", "captions": [f"c{i}", f"d{i}"], "split": "train"} for i in range(24)]
    emb = rng.normal(size=(24, 8)).astype(np.float32)
    texts = [{"item": i, "text": c} for i, it in enumerate(items) for c in it["captions"]]
    write_collection(
        path,
        items,
        {"name": encoder, "dim": 8},
        image_emb=emb,
        text_emb=np.repeat(emb, 2, axis=0),
        texts=texts,
    )
    return path


def train_data(n_items: int = 160, per_item: int = 4, dim: int = 32, latent: int = 96) -> Any:
    """(image_emb, text_emb, pair_item, bias, SRConfig) of a small, deterministic SR run."""
    from sparsemm.models.sr import SRConfig

    rng = np.random.default_rng(7)
    img = rng.normal(size=(n_items, dim)).astype(np.float32)
    img /= np.linalg.norm(img, axis=1, keepdims=True)
    pair_item = np.repeat(np.arange(n_items), per_item)
    txt = img[pair_item] + 0.3 * rng.normal(size=(len(pair_item), dim)).astype(np.float32)
    bias = sp.random(
        len(pair_item), latent, density=0.03, random_state=7, format="csr", dtype=np.float32
    )
    return (
        img,
        txt,
        pair_item,
        bias,
        SRConfig(text_dim=dim, image_dim=dim, latent_dim=latent, top_k=12),
    )


def sr_version(v: int) -> Any:
    """SR model version ``v``: its own shape (latent_dim 20 + v) and weights seeded by v."""
    import torch

    from sparsemm.models.sr import SRConfig, SRModel

    torch.manual_seed(v)
    return SRModel(SRConfig(text_dim=8, image_dim=8, latent_dim=20 + v, top_k=4))
