"""save_pretrained / from_pretrained shared by every sparse model: config.json + safetensors.

A model folder holds ``config.json`` and ``model.safetensors`` (plus whatever else its
trainer keeps there: ``history.json``, ``checkpoint/``, tokenizer files). The pair must
change together: weights of one model read with the config of another either fail to load
or, worse, load with the wrong settings. :meth:`PretrainedMixin.save_pretrained` therefore
commits a new pair with one rename:

1. both files are written (and fsynced) into a temp folder ``.pretrained.tmp.<pid>.*``;
2. the folder is renamed to ``.pretrained.pending`` (:func:`sparsemm.io.replace_dir`): the
   commit point, the new pair is now the folder's model;
3. each file is hard-linked out of it over the top-level name (``os.replace``);
4. ``.pretrained.pending`` is deleted.

:meth:`~PretrainedMixin.from_pretrained` reads the pair from ``.pretrained.pending`` while a
complete one is there (a kill in step 3 left the top-level files mixed) and from the folder
itself otherwise - which is also how folders written before this layout are read. A kill
before step 2 leaves the old pair; the next save removes the temp folder and finishes a
pending commit first.

The ``training`` entry of config.json (not a field of the config dataclass, so checkpoints
and configs compare as before) records what the model was trained on; see
:func:`encoder_record` and :func:`check_encoders`.

Integrity: config.json's ``weights_sha256`` entry is the SHA-256 of model.safetensors (the
pair is committed together, so it always describes the weights beside it).
``from_pretrained`` refuses weights that do not match it, and any NaN/inf weight (naming the
tensor) even without a checksum; ``save_pretrained`` refuses to write non-finite weights.
Folders saved before the checksum load with a warning (finiteness checked only).

A model is an ``nn.Module`` (trained with torch) or an :class:`ArrayModule`: named numpy
arrays, read and written through ``safetensors.numpy``, for what needs no training (the
photo concept model) and for a trained model's inference side (:mod:`sparsemm.models.sr_lite`,
:mod:`sparsemm.models.lit_lite`). Both write the same file, so an ``ArrayModule`` loads a
folder its torch model saved. This module imports torch only for an ``nn.Module``: a search
loads its models without it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Self, TypeVar

import numpy as np
from safetensors import SafetensorError

from sparsemm.errors import SparsemmError
from sparsemm.io import (
    atomic_open,
    fsync_dir,
    json_sha256,
    pid_alive,
    read_json,
    replace_dir,
    write_error,
    write_json,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

T = TypeVar("T", bound="PretrainedMixin")

CONFIG_FILE = "config.json"
WEIGHTS_FILE = "model.safetensors"
MODEL_FILES = (WEIGHTS_FILE, CONFIG_FILE)
PENDING_DIR = ".pretrained.pending"  # a committed pair not yet moved to the top level
TMP_PREFIX = ".pretrained.tmp."  # + "<pid>.": a pair being written
TRAINING_KEY = "training"  # config.json entry: what the model was trained on
DIGEST_KEY = "weights_sha256"  # config.json entry: SHA-256 of model.safetensors


def topk_mask(x: torch.Tensor, k: int) -> torch.Tensor:
    """(n, d) bool mask of each row's k largest entries (all of them when k >= d); SR's and
    VDR's TopK."""
    import torch

    k = min(int(k), x.shape[1])
    idx = x.topk(k, dim=1).indices
    return torch.zeros_like(x, dtype=torch.bool).scatter_(1, idx, True)


def one_line(exc: Exception, limit: int = 300) -> str:
    """The gist of a (multi-line) torch/safetensors error on one line: load_state_dict lists
    every mismatched tensor on its own line under an "Error(s) in loading ..." heading."""
    lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
    if len(lines) > 1 and lines[0].startswith("Error(s) in loading"):
        lines = lines[1:]
    text = lines[0] if lines else type(exc).__name__
    if len(lines) > 1:
        text += f" (and {len(lines) - 1} more)"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def nonfinite_tensors(tensors: Mapping[str, Any]) -> list[str]:
    """Names of the floating-point tensors (torch tensors or numpy arrays) holding NaN or
    inf, each with its bad count."""
    bad = []
    for name, t in tensors.items():
        if isinstance(t, np.ndarray):
            if not np.issubdtype(t.dtype, np.floating):
                continue
            n, size = int(t.size - np.count_nonzero(np.isfinite(t))), int(t.size)
        else:
            if not t.is_floating_point():
                continue
            n, size = int((~t.isfinite()).sum()), int(t.numel())
        if n:
            bad.append(f"{name} ({n} of {size} values)")
    return bad


def weights_file_bytes(
    tensors: Mapping[str, Any], metadata: dict[str, str], what: str, out: Path
) -> tuple[bytes, str]:
    """(safetensors bytes, their SHA-256) of finite ``tensors`` (all torch tensors, or all
    numpy arrays: the same file either way); SparsemmError when any holds NaN or inf (a
    diverged run must not be saved as a model)."""
    bad = nonfinite_tensors(tensors)
    if bad:
        raise SparsemmError(
            f"not saving the {what} model to {out}: its weights hold NaN or inf values "
            f"({', '.join(bad[:3])}); training diverged - lower the learning rate"
        )
    if all(isinstance(t, np.ndarray) for t in tensors.values()):
        from safetensors.numpy import save as save_arrays

        data = save_arrays(dict(tensors), metadata=metadata)
    else:
        from safetensors.torch import save as save_bytes

        data = save_bytes(dict(tensors), metadata=metadata)
    return data, hashlib.sha256(data).hexdigest()


_SCALARS: dict[str, tuple[type, ...]] = {"bool": (bool,), "int": (int,), "float": (int, float)}


def check_field_types(config: Any) -> None:
    """ValueError naming the first field of a config dataclass whose value is not of its
    declared scalar type (bool, int, float, str; a tuple of str): a config.json edited to
    ``"face_unit": "yes"`` is refused when loaded, not at the first use of the field. A
    bool is no int or float here, and a float must be finite."""
    import math

    for f in dataclasses.fields(config):
        value, kind = getattr(config, f.name), str(f.type)
        if kind in _SCALARS:
            ok = isinstance(value, _SCALARS[kind]) and (kind == "bool" or type(value) is not bool)
            ok = ok and not (isinstance(value, float) and not math.isfinite(value))
        elif kind == "str":
            ok = isinstance(value, str)
        elif kind == "tuple[str, ...]":
            ok = isinstance(value, list | tuple) and all(isinstance(v, str) for v in value)
        else:
            continue
        if not ok:
            raise ValueError(f"{f.name} must be of type {kind}, got {value!r}"[:160])


def check_weights(d: Path, want: Any, digest: str | None, state: Mapping[str, Any]) -> None:
    """Refuse a model folder's weights whose SHA-256 ``digest`` differs from config.json's
    ``want`` (None: saved before the checksum - warned) or that hold NaN/inf values."""
    if want is not None and not isinstance(want, str):
        raise SparsemmError(f"{d}/config.json is malformed ({DIGEST_KEY!r} is not a string)")
    if want is not None and digest is not None and digest != want:
        raise SparsemmError(
            f"{d}/model.safetensors is corrupt or does not match config.json (its SHA-256 "
            "differs from the checksum saved with it: damaged, modified or another "
            "model's file); re-create the model"
        )
    bad = nonfinite_tensors(state)
    if bad:
        raise SparsemmError(
            f"{d}/model.safetensors holds NaN or inf weights ({', '.join(bad[:3])}); "
            "the file is damaged or training diverged; re-create the model"
        )
    if want is None:
        log.warning(
            "%s has no weights checksum (saved by an older sparsemm): only its values are "
            "checked; save it again to add one",
            d,
        )


def config_digest(model_dir: str | Path) -> str | None:
    """SHA-256 (canonical JSON) of a saved model's settings: its config.json without the
    weights checksum and the training record, so retraining with the same settings keeps
    it. An index records it and a searcher compares (an edited ``presence_bias`` once moved
    a cat to 98% "dog" without a word). None without a readable config.json."""
    path = pair_dir(model_dir) / CONFIG_FILE
    try:
        raw = read_json(path)
    except (SparsemmError, OSError):
        return None
    if not isinstance(raw, dict):
        return None
    return json_sha256({k: v for k, v in raw.items() if k not in (DIGEST_KEY, TRAINING_KEY)})


def sweep_temp_dirs(folder: Path, prefix: str, keep: tuple[str, ...] = ()) -> None:
    """Delete ``folder/<prefix><pid>.*`` folders whose writer (pid) is gone, e.g. killed.

    Temp folders of live processes (a concurrent writer, this process) and the names in
    ``keep`` (e.g. a folder :func:`sparsemm.io.replace_dir` parked) are left alone; names
    without a pid (an older sparsemm's temp folders) are swept too.
    """
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            if not entry.name.startswith(prefix) or not entry.is_dir(follow_symlinks=False):
                continue
            if entry.name in keep:
                continue
            pid = entry.name[len(prefix) :].split(".", 1)[0]
            if pid.isdigit() and pid_alive(int(pid)):
                continue
            log.debug("removing %s, left by a killed writer", entry.path)
            shutil.rmtree(entry.path, ignore_errors=True)


def _complete(folder: Path) -> bool:
    return all((folder / name).is_file() for name in MODEL_FILES)


def pair_dir(model_dir: str | Path) -> Path:
    """The folder holding the model's current config.json + model.safetensors: the pending
    commit while a complete one exists (see the module docstring), else ``model_dir``."""
    d = Path(model_dir)
    pending = d / PENDING_DIR
    return pending if _complete(pending) else d


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:  # a file system without hard links
        shutil.copyfile(src, dst)
        with open(dst, "rb") as fh:
            os.fsync(fh.fileno())


def _finish_pending(out: Path) -> None:
    """Steps 3-4 of a save: move a committed pair to the top level, drop the pending folder."""
    pending = out / PENDING_DIR
    if not pending.is_dir():
        return
    if _complete(pending):
        for name in MODEL_FILES:
            tmp = out / f".{name}.{os.getpid()}.link"
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            _link_or_copy(pending / name, tmp)
            os.replace(tmp, out / name)
        fsync_dir(out)
    # Complete: now moved in. Incomplete: a kill while deleting it, after the move.
    shutil.rmtree(pending)


def _signature(folder: Path) -> tuple[tuple[int, int, int], ...]:
    """(inode, mtime, size) of the pair's files: changes when a writer replaces them."""
    out = []
    for name in MODEL_FILES:
        try:
            st = os.stat(folder / name)
        except FileNotFoundError:
            return ()
        out.append((st.st_ino, st.st_mtime_ns, st.st_size))
    return tuple(out)


class PretrainedMixin:
    """Mixin for ``nn.Module`` (or :class:`ArrayModule`) subclasses built as
    ``Model(config)`` from a dataclass config.

    Subclasses set ``config_class`` and ``model_type`` (written into config.json so a folder
    from another model type is refused with a clear message). ``training_info`` (JSON, or
    None) is saved as config.json's ``training`` entry and restored by ``from_pretrained``.
    """

    config_class: ClassVar[type]
    model_type: ClassVar[str]
    config: Any
    training_info: dict[str, Any] | None = None

    def save_pretrained(self, out_dir: str | Path) -> Path:
        """Write config.json + model.safetensors into ``out_dir`` as one atomic change
        (other files in the folder are kept); see the module docstring."""
        out = Path(out_dir)
        if out.exists() and not out.is_dir():
            raise SparsemmError(f"{out} exists and is not a folder; choose another output folder")
        if isinstance(self, ArrayModule):
            tensors: dict[str, Any] = self.state_dict()
        else:
            import torch

            assert isinstance(self, torch.nn.Module)
            tensors = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        meta = {"model_type": self.model_type}
        data, digest = weights_file_bytes(tensors, meta, self.model_type, out)
        config = {"model_type": self.model_type, **dataclasses.asdict(self.config)}
        if self.training_info is not None:
            config[TRAINING_KEY] = dict(self.training_info)
        config[DIGEST_KEY] = digest
        try:
            out.mkdir(parents=True, exist_ok=True)
            _finish_pending(out)  # a save a kill interrupted after its commit point
            sweep_temp_dirs(out, TMP_PREFIX)
            tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}.", dir=out))
        except OSError as exc:
            raise write_error(exc, out) from exc
        try:
            with atomic_open(tmp / WEIGHTS_FILE, "wb") as fh:
                fh.write(data)
            write_json(tmp / CONFIG_FILE, config)
            fsync_dir(tmp)
            replace_dir(tmp, out / PENDING_DIR)  # the commit point
        except BaseException as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(exc, OSError):
                raise write_error(exc, out) from exc
            raise
        try:
            _finish_pending(out)
        except OSError as exc:  # committed: readers use the pending pair until a retry
            raise write_error(exc, out) from exc
        return out

    @classmethod
    def from_pretrained(cls: type[T], model_dir: str | Path) -> T:
        d = Path(model_dir)
        # A writer may swap the pair while it is read: re-read when it changed meanwhile.
        for _attempt in range(3):
            src = pair_dir(d)
            before = _signature(src)
            if not before:
                raise SparsemmError(
                    f"{d} is not a saved {cls.model_type} model (needs config.json and "
                    "model.safetensors)"
                )
            raw = read_json(src / CONFIG_FILE)
            error: Exception | None = None
            digest = None
            try:
                data = (src / WEIGHTS_FILE).read_bytes()
                digest = hashlib.sha256(data).hexdigest()
                state = cls._read_state(data)
            except (OSError, ValueError, SafetensorError) as exc:
                state, error = {}, exc
            if pair_dir(d) == src and _signature(src) == before:
                break
        return cls._build(d, raw, state, error, digest)

    @classmethod
    def _read_state(cls, data: bytes) -> dict[str, Any]:
        """The tensors of a model.safetensors file: numpy arrays for an
        :class:`ArrayModule` (no torch imported), torch tensors for an ``nn.Module``."""
        if issubclass(cls, ArrayModule):
            from safetensors.numpy import load as load_arrays

            return dict(load_arrays(data))
        from safetensors.torch import load as load_bytes

        return dict(load_bytes(data))

    @classmethod
    def _build(
        cls: type[T],
        d: Path,
        raw: Any,
        state: dict[str, Any],
        error: Exception | None,
        digest: str | None = None,
    ) -> T:
        if not isinstance(raw, dict):
            raise SparsemmError(
                f"{d}/config.json is malformed (a JSON object was expected, got "
                f"{type(raw).__name__}); re-create the model"
            )
        raw = dict(raw)
        mtype = raw.pop("model_type", None)
        if mtype != cls.model_type:
            raise SparsemmError(f"{d} holds a {mtype!r} model, not {cls.model_type!r}")
        training = raw.pop(TRAINING_KEY, None)
        if training is not None and not isinstance(training, dict):
            raise SparsemmError(f"{d}/config.json is malformed ('training' is not an object)")
        want = raw.pop(DIGEST_KEY, None)
        if error is None:  # unreadable weights: reported below, with the config's shapes
            check_weights(d, want, digest, state)
        fields = {f.name for f in dataclasses.fields(cls.config_class)}
        unknown = set(raw) - fields
        if unknown:
            raise SparsemmError(
                f"{d}/config.json has fields this sparsemm does not know: {sorted(unknown)}; "
                "upgrade sparsemm"
            )
        try:
            config = cls.config_class(**raw)
            # shapes first, on the meta device (no memory; an ArrayModule only declares
            # them): a config that disagrees with the weights (latent_dim: 1e9) is refused
            # before anything is allocated
            if issubclass(cls, ArrayModule):
                shell = cls(config)
            else:
                import torch

                with torch.device("meta"):
                    shell = cls(config)  # type: ignore[call-arg]
        except (SparsemmError, TypeError, ValueError, OverflowError) as exc:  # wrong values
            raise SparsemmError(
                f"{d}/config.json is malformed ({exc}); re-create the model"
            ) from exc
        try:
            if error is not None:
                raise error
            if isinstance(shell, ArrayModule):
                shell.load_state_dict(state)  # checks names and shapes, then keeps them
                model = shell
            else:
                assert isinstance(shell, torch.nn.Module)
                with warnings.catch_warnings():  # copying into meta tensors is a no-op: fine
                    warnings.simplefilter("ignore", UserWarning)
                    shell.load_state_dict(state)  # checks names and shapes only
                model = cls(config)
                assert isinstance(model, torch.nn.Module)
                model.load_state_dict(state)
        except (RuntimeError, OSError, ValueError, SafetensorError) as exc:
            raise SparsemmError(
                f"{d}/model.safetensors is corrupt or does not match config.json "
                f"({one_line(exc)}); re-create the model"
            ) from exc
        model.training_info = training
        model.eval()
        return model


class ArrayModule:
    """The torch-free counterpart of an ``nn.Module``'s weights, for a model's inference
    side: named float32 numpy arrays whose shapes the constructor declares
    (:meth:`declare`, nothing allocated) and :meth:`load_state_dict` fills. A
    :class:`PretrainedMixin` subclass of it saves and loads the same ``model.safetensors``
    (same tensor names and shapes) as an ``nn.Module`` would, through ``safetensors.numpy``:
    a search reads a model without importing torch. Arrays are reached as attributes
    (``self.fc_weight``) or by name (:meth:`array`: ``"enc_text.weight"``)."""

    def __init__(self) -> None:
        self._shapes: dict[str, tuple[int, ...]] = {}
        self._arrays: dict[str, np.ndarray] = {}

    def declare(self, name: str, *shape: int) -> None:
        """Declare the float32 array ``name`` of ``shape`` (filled by load_state_dict)."""
        if any(int(n) < 0 for n in shape):
            raise ValueError(f"{name} would have a negative dimension {shape}")
        self._shapes[name] = tuple(int(n) for n in shape)

    def array(self, name: str) -> np.ndarray:
        try:
            return self._arrays[name]
        except KeyError:
            raise AttributeError(f"{type(self).__name__} has no loaded array {name!r}") from None

    def __getattr__(self, name: str) -> Any:
        # only reached when normal lookup fails: the loaded arrays, by name
        if name.startswith("_"):
            raise AttributeError(name)
        return self.array(name)

    def state_dict(self) -> dict[str, np.ndarray]:
        """The arrays by name (contiguous float32), as ``nn.Module.state_dict`` gives them."""
        missing = sorted(set(self._shapes) - set(self._arrays))
        if missing:
            raise ValueError(f"{type(self).__name__} has no weights loaded for {missing}")
        return {k: np.ascontiguousarray(self._arrays[k]) for k in self._shapes}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Keep ``state``'s arrays (as float32), refusing missing, unexpected or mis-shaped
        names before any is kept, with ``nn.Module.load_state_dict``'s message (a ValueError
        whose lines :func:`one_line` shortens)."""
        problems = []
        missing = [k for k in self._shapes if k not in state]
        unexpected = [k for k in state if k not in self._shapes]
        if missing:
            problems.append(f"Missing key(s) in state_dict: {', '.join(map(repr, missing))}.")
        if unexpected:
            problems.append(f"Unexpected key(s) in state_dict: {', '.join(map(repr, unexpected))}.")
        for k, shape in self._shapes.items():
            if k in state and tuple(np.shape(state[k])) != shape:
                problems.append(
                    f"size mismatch for {k}: copying a param with shape "
                    f"{tuple(np.shape(state[k]))} from checkpoint, the shape in current model "
                    f"is {shape}."
                )
        if problems:
            head = f"Error(s) in loading state_dict for {type(self).__name__}:"
            raise ValueError("\n\t".join([head, *problems]))
        self._arrays = {k: np.ascontiguousarray(state[k], dtype=np.float32) for k in self._shapes}

    def eval(self) -> Self:
        """Nothing to switch (no dropout, no batch norm): ``nn.Module.eval``'s counterpart."""
        return self


# --------------------------------------------------------------------------- training record


def _encoder_entry(info: Mapping[str, Any]) -> dict[str, Any]:
    entry: dict[str, Any] = {"name": str(info.get("name")), "dim": info.get("dim")}
    if info.get("model"):
        entry["model"] = str(info["model"])
    return entry


def encoder_record(manifest: Mapping[str, Any], collection: str | Path | None = None) -> dict:
    """The ``training`` record of a model trained on a collection with this manifest: the
    image and text encoders (name, model, dim) and, optionally, the collection's path."""
    image = manifest["encoder"]
    text = manifest.get("text_encoder") or image
    rec: dict[str, Any] = {
        "image_encoder": _encoder_entry(image),
        "text_encoder": _encoder_entry(text),
    }
    if collection is not None:
        rec["collection"] = str(Path(collection).resolve())
    return rec


def _describe(entry: Mapping[str, Any]) -> str:
    model = f" {entry['model']}" if entry.get("model") else ""
    return f"{entry.get('name')}{model} ({entry.get('dim')}-d)"


def _same_encoder(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """Same name and dim; same model too, compared by its last path component (a hub id
    and a local copy of it agree), except for precomputed tables, whose model is a file."""
    if a.get("name") != b.get("name") or a.get("dim") != b.get("dim"):
        return False
    ma, mb = a.get("model"), b.get("model")
    if a.get("name") == "precomputed" or not ma or not mb:
        return True
    return bool(Path(str(ma)).name == Path(str(mb)).name)


class EncoderMismatch(SparsemmError):
    """A model was trained on other encoders than a collection's (:func:`check_encoders`)."""


def check_encoders(
    training: Mapping[str, Any] | None,
    manifest: Mapping[str, Any],
    model_dir: str | Path,
    collection_dir: str | Path,
) -> None:
    """Raise SparsemmError when a model's ``training`` record names other encoders than the
    collection manifest's (a model's codes mean nothing on another encoder's embeddings).
    Models without a record (trained before sparsemm kept one) pass."""
    if not training:
        return
    here = encoder_record(manifest)
    diffs = []
    for side in ("image", "text"):
        trained = training.get(f"{side}_encoder")
        if isinstance(trained, Mapping) and not _same_encoder(trained, here[f"{side}_encoder"]):
            diffs.append(
                f"{side}s: trained on {_describe(trained)}, the collection has "
                f"{_describe(here[f'{side}_encoder'])}"
            )
    if diffs:
        raise EncoderMismatch(
            f"the model {model_dir} was trained on a collection from other encoders than "
            f"{collection_dir} ({'; '.join(diffs)}), so its codes would mean nothing there; "
            "train a model on this collection or encode it with the model's encoders"
        )
