"""save_pretrained / from_pretrained shared by every sparse model: config.json + safetensors."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, ClassVar, TypeVar

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as save_bytes

from sparsemm.errors import SparsemmError
from sparsemm.io import atomic_open, read_json, write_json

T = TypeVar("T", bound="PretrainedMixin")


class PretrainedMixin:
    """Mixin for ``nn.Module`` subclasses built as ``Model(config)`` from a dataclass config.

    Subclasses set ``config_class`` and ``model_type`` (written into config.json so a folder
    from another model type is refused with a clear message).
    """

    config_class: ClassVar[type]
    model_type: ClassVar[str]
    config: Any

    def save_pretrained(self, out_dir: str | Path) -> Path:
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        assert isinstance(self, torch.nn.Module)
        tensors = {k: v.detach().contiguous() for k, v in self.state_dict().items()}
        with atomic_open(out / "model.safetensors", "wb") as fh:
            fh.write(save_bytes(tensors, metadata={"model_type": self.model_type}))
        write_json(
            out / "config.json",
            {"model_type": self.model_type, **dataclasses.asdict(self.config)},
        )
        return out

    @classmethod
    def from_pretrained(cls: type[T], model_dir: str | Path) -> T:
        d = Path(model_dir)
        if not (d / "config.json").is_file() or not (d / "model.safetensors").is_file():
            raise SparsemmError(
                f"{d} is not a saved {cls.model_type} model (needs config.json and "
                "model.safetensors)"
            )
        raw = read_json(d / "config.json")
        mtype = raw.pop("model_type", None)
        if mtype != cls.model_type:
            raise SparsemmError(f"{d} holds a {mtype!r} model, not {cls.model_type!r}")
        fields = {f.name for f in dataclasses.fields(cls.config_class)}
        unknown = set(raw) - fields
        if unknown:
            raise SparsemmError(
                f"{d}/config.json has fields this sparsemm does not know: {sorted(unknown)}; "
                "upgrade sparsemm"
            )
        config = cls.config_class(**raw)
        model = cls(config)  # type: ignore[call-arg]
        assert isinstance(model, torch.nn.Module)
        try:
            model.load_state_dict(load_file(str(d / "model.safetensors")))
        except (RuntimeError, OSError, ValueError, SafetensorError) as exc:
            raise SparsemmError(
                f"{d}/model.safetensors is corrupt or does not match config.json ({exc}); "
                "re-create the model"
            ) from exc
        model.eval()
        return model
