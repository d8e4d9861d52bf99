"""What reading a photo costs `sparsemm up`: classes, regions and faces, per photo.

Builds 2-megapixel JPEGs (1732 x 1155, quality 90) from the real photographs bundled with
scikit-image (or from ``--photos DIR``), then times the photo model's
:class:`~sparsemm.models.concept_evidence.EvidenceReader` over them, as ``up`` runs it after
encoding: one decode (JPEG draft mode), the whole-image classifier pass, the tiles' pass
(one batch), and the face detector. Prints seconds a photo, per stage and in all, with the
machine's load average beside it (the figure is only as quiet as the machine).

    python benchmarks/photo_reading.py [--photos DIR] [--n 24] [--threads 2] [-o OUT]

Writes ``config.json`` and ``metrics.json`` into OUT when given.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from _common import git_commit

SIZE = (1732, 1155)  # 2.0 megapixels, 3:2


def sample_photos(src: Path | None, n: int, folder: Path) -> list[Path]:
    """``n`` 2-megapixel JPEGs made from real photos (cycled when there are fewer)."""
    from PIL import Image

    if src is None:
        import skimage

        src = Path(skimage.__file__).parent / "data"
    files = sorted(
        p
        for p in src.iterdir()
        if p.suffix.lower() in {".jpg", ".jpeg", ".png"} and p.stat().st_size > 20_000
    )
    out = []
    for i in range(n):
        with Image.open(files[i % len(files)]) as im:
            rgb = im.convert("RGB").resize(SIZE)
        path = folder / f"photo-{i:03d}.jpg"
        rgb.save(path, quality=90)
        out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--photos", type=Path, default=None, help="folder of photos to resize")
    ap.add_argument("--n", type=int, default=24, help="photos to read")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (the 2 cores)")
    ap.add_argument("-o", "--out", type=Path, default=None)
    args = ap.parse_args(argv)

    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    from sparsemm.encoders.hf import load_image
    from sparsemm.models.concept_evidence import FACE_MAX_SIDE, EvidenceReader, tile_boxes
    from sparsemm.models.imagenet_concepts import cached_imagenet_concepts

    model = cached_imagenet_concepts()
    reader = EvidenceReader(model)
    cfg = model.config
    with tempfile.TemporaryDirectory() as tmp:
        photos = sample_photos(args.photos, args.n, Path(tmp))
        reader.read(photos[:2])  # warm-up: weights paged in, kernels chosen
        stages: dict[str, list[float]] = {"decode": [], "whole": [], "regions": [], "faces": []}
        total = []
        for p in photos:
            t0 = time.perf_counter()
            pil = load_image(p, max_side=FACE_MAX_SIDE)
            t1 = time.perf_counter()
            model.class_probabilities(reader.backbone.pooled_full([pil], side=cfg.image_size))
            t2 = time.perf_counter()
            if cfg.regions:
                crops = [pil.crop(b) for b in tile_boxes(pil.size, cfg)]
                model.class_probabilities(
                    reader.backbone.pooled_squares(crops, side=cfg.image_size)
                )
            t3 = time.perf_counter()
            reader.faces.detect(pil)
            t4 = time.perf_counter()
            for k, v in zip(stages, (t1 - t0, t2 - t1, t3 - t2, t4 - t3), strict=True):
                stages[k].append(v)
            t5 = time.perf_counter()
            reader.read([p])  # the whole reader, as `up` calls it
            total.append(time.perf_counter() - t5)
    load = os.getloadavg()
    metrics: dict[str, Any] = {
        "photos": args.n,
        "megapixels": round(SIZE[0] * SIZE[1] / 1e6, 2),
        "tiles": len(tile_boxes(SIZE, cfg)) if cfg.regions else 0,
        "seconds_per_photo": {k: round(float(np.median(v)), 4) for k, v in stages.items()},
        "reader_seconds_per_photo_median": round(float(np.median(total)), 4),
        "reader_seconds_per_photo_p90": round(float(np.quantile(total, 0.9)), 4),
        "load_average": [round(x, 2) for x in load],
        "threads": args.threads,
        "git_commit": git_commit(),
    }
    print(
        f"{args.n} photos of {metrics['megapixels']} MP, {metrics['tiles']} tiles each: "
        f"{metrics['reader_seconds_per_photo_median']:.3f} s a photo (median; p90 "
        f"{metrics['reader_seconds_per_photo_p90']:.3f} s), stages "
        + ", ".join(f"{k} {v:.3f}" for k, v in metrics["seconds_per_photo"].items())
        + f"; load average {load[0]:.2f}"
    )
    if args.out is not None:
        from sparsemm.io import write_json

        args.out.mkdir(parents=True, exist_ok=True)
        write_json(
            args.out / "config.json",
            {**vars(args), "photos": str(args.photos), "out": str(args.out)},
        )
        write_json(args.out / "metrics.json", metrics)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
