"""Convert the MTCNN face detector weights of the facenet-pytorch wheel to safetensors.

    pip download --no-deps facenet-pytorch==2.6.0 -d /tmp/fp
    python scripts/derive_mtcnn.py /tmp/fp/facenet_pytorch-2.6.0-py3-none-any.whl

reads ``facenet_pytorch/data/{pnet,rnet,onet}.pt`` from the wheel with
``torch.load(weights_only=True)`` (plain state dicts, no code is unpickled), writes
``src/sparsemm/encoders/data/mtcnn.safetensors`` (keys ``pnet.*``, ``rnet.*``, ``onet.*``)
and the package's MIT licence beside it as ``MTCNN-LICENSE``, and prints the SHA-256 to put
in ``sparsemm.encoders.faces.WEIGHTS_SHA256``.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import zipfile
from pathlib import Path

import torch
from safetensors.torch import save

OUT = Path(__file__).resolve().parents[1] / "src" / "sparsemm" / "encoders" / "data"
PROVENANCE = """
The weights in mtcnn.safetensors are those of facenet-pytorch 2.6.0 (PyPI, MIT licence
above), converted to safetensors by sparsemm's scripts/derive_mtcnn.py. facenet-pytorch
ported them from David Sandberg's facenet (MIT), which converted the models released with
K. Zhang, Z. Zhang, Z. Li and Y. Qiao, "Joint Face Detection and Alignment using
Multi-task Cascaded Convolutional Networks", IEEE Signal Processing Letters, 2016.
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("wheel", type=Path, help="facenet_pytorch-2.6.0-py3-none-any.whl")
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    tensors: dict[str, torch.Tensor] = {}
    with zipfile.ZipFile(args.wheel) as z:
        for net in ("pnet", "rnet", "onet"):
            raw = z.read(f"facenet_pytorch/data/{net}.pt")
            state = torch.load(io.BytesIO(raw), weights_only=True, map_location="cpu")
            for k, v in state.items():
                tensors[f"{net}.{k}"] = v.float().contiguous()
        licence = next(n for n in z.namelist() if n.endswith("LICENSE.md"))
        text = z.read(licence).decode("utf-8")
    data = save(dict(sorted(tensors.items())))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "mtcnn.safetensors").write_bytes(data)
    (args.out / "MTCNN-LICENSE").write_text(text.rstrip() + "\n" + PROVENANCE, encoding="utf-8")
    print(f"{len(tensors)} tensors, sha256 {hashlib.sha256(data).hexdigest()}")


if __name__ == "__main__":
    main()
