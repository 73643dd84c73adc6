"""Images per second: RandAugment and AugMix on a whole batch (ours) vs one Pillow image at a time.

The per-sample side is what Composer's RandAugment and AugMix do in the data loader workers:
each image goes through a chain of Pillow ops (``ImageOps``/``ImageEnhance``/``Image.transform``,
the same ops and severity scale as ours), drawn with Python's ``random``. It is timed two ways:
Pillow images in and out (a dataset that decodes to Pillow and applies the transform before
``ToTensor``), and float tensors in and out (each image converted to Pillow and back, as
Composer's functional forms do for tensors). Ours is :func:`~composer_bridge.functional.randaugment_image`
/ :func:`~composer_bridge.functional.augmix_image` on a float ``(N, 3, S, S)`` batch on the CPU.

All sides run on the same CPU with the same number of threads (``--threads``, default 1: Pillow
is single-threaded per worker, and one thread gives steadier numbers on a shared machine). The
sides are interleaved run by run and the median of ``--repeats`` runs is reported, so a busy
moment of the machine hits them alike. Without Pillow the script says so and exits (status 0).

Usage::

    .venv/bin/python benchmarks/augment_throughput.py            # --sizes 32,224 --batch 64 --repeats 5 --threads 1
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from composer_bridge.functional import augmix_image, randaugment_image

try:
    from PIL import Image, ImageEnhance, ImageOps
except ImportError:  # pragma: no cover - depends on the environment
    Image = None  # type: ignore[assignment]


# --- the per-sample Pillow side: Composer's ops and severity scale, one image at a time -------------

def _level(severity: float, rng: random.Random) -> float:
    return rng.uniform(0.1, severity)


def _signed(value: float, rng: random.Random) -> float:
    return -value if rng.random() > 0.5 else value


def _symmetric(severity: float, rng: random.Random) -> float:
    return rng.uniform(1, severity) if rng.random() > 0.5 else rng.uniform(1 - 0.09 * severity, 1)


def _affine(image: Any, matrix: tuple[float, ...]) -> Any:
    return image.transform(image.size, Image.Transform.AFFINE, matrix, resample=Image.Resampling.BILINEAR)


def _brightness(image: Any, severity: float, rng: random.Random) -> Any:
    factor = _symmetric(severity, rng)
    return ImageEnhance.Brightness(image).enhance(factor * 0.75 if factor > 1 else factor)


PIL_OPS: list[Callable[[Any, float, random.Random], Any]] = [
    lambda im, s, rng: ImageOps.autocontrast(im),
    lambda im, s, rng: ImageOps.equalize(im),
    lambda im, s, rng: ImageOps.posterize(im, 4 - int(_level(s, rng) * 4 / 10)),
    lambda im, s, rng: im.rotate(_signed(int(_level(s, rng) * 30 / 10), rng), resample=Image.Resampling.BILINEAR),
    lambda im, s, rng: ImageOps.solarize(im, 256 - int(_level(s, rng) * 256 / 10)),
    lambda im, s, rng: _affine(im, (1, _signed(_level(s, rng) * 0.03, rng), 0, 0, 1, 0)),
    lambda im, s, rng: _affine(im, (1, 0, 0, _signed(_level(s, rng) * 0.03, rng), 1, 0)),
    lambda im, s, rng: _affine(im, (1, 0, _signed(int(_level(s, rng) * im.size[0] / 30), rng), 0, 1, 0)),
    lambda im, s, rng: _affine(im, (1, 0, 0, 0, 1, _signed(int(_level(s, rng) * im.size[1] / 30), rng))),
    lambda im, s, rng: ImageEnhance.Color(im).enhance(_symmetric(s, rng)),
    lambda im, s, rng: ImageEnhance.Contrast(im).enhance(_symmetric(s, rng)),
    _brightness,
    lambda im, s, rng: ImageEnhance.Sharpness(im).enhance(_symmetric(s, rng)),
]


def pil_randaugment(image: Any, severity: float, depth: int, rng: random.Random) -> Any:
    for _ in range(depth):
        image = rng.choice(PIL_OPS)(image, severity, rng)
    return image


def pil_augmix(image: Any, severity: float, width: int, alpha: float, rng: random.Random) -> Any:
    """AugMix of one Pillow image (random chain depth 1..3), mixed in float32 as Composer does."""
    import numpy as np

    gammas = [rng.gammavariate(alpha, 1.0) for _ in range(width)]
    weights = [g / sum(gammas) for g in gammas]
    mixing = rng.betavariate(alpha, alpha)
    combination = np.zeros((image.size[1], image.size[0], 3), dtype=np.float32)
    for k in range(width):
        augmented = image.copy()
        for _ in range(rng.randint(1, 3)):
            augmented = rng.choice(PIL_OPS)(augmented, severity, rng)
        combination += weights[k] * np.asarray(augmented, dtype=np.float32)
    mixed = (1 - mixing) * np.asarray(image, dtype=np.float32) + mixing * combination
    return Image.fromarray(mixed.astype(np.uint8))


def to_pil(image: torch.Tensor) -> Any:
    return Image.fromarray((image * 255).round().to(torch.uint8).permute(1, 2, 0).contiguous().numpy())


def to_tensor(image: Any) -> torch.Tensor:
    flat = torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
    return flat.view(image.size[1], image.size[0], 3).permute(2, 0, 1).to(torch.float32) / 255


# --- timing ----------------------------------------------------------------------------------------

def rate(fn: Callable[[], Any], images: int) -> float:
    start = time.perf_counter()
    fn()
    return images / (time.perf_counter() - start)


def measure(size: int, batch: int, repeats: int) -> list[tuple[str, dict[str, float]]]:
    g = torch.Generator().manual_seed(0)
    x = torch.rand(batch, 3, size, size, generator=g)
    pil_images = [to_pil(img) for img in x]
    rng = random.Random(0)
    cases: dict[str, dict[str, Callable[[], Any]]] = {
        "RandAugment (severity 9, depth 2)": {
            "ours": lambda: randaugment_image(x, 9, 2, generator=g),
            "pil": lambda: [pil_randaugment(im, 9, 2, rng) for im in pil_images],
            "pil_tensors": lambda: torch.stack([to_tensor(pil_randaugment(to_pil(t), 9, 2, rng)) for t in x]),
        },
        "AugMix (severity 3, width 3, depth 1-3)": {
            "ours": lambda: augmix_image(x, 3, -1, 3, 1.0, generator=g),
            "pil": lambda: [pil_augmix(im, 3, 3, 1.0, rng) for im in pil_images],
            "pil_tensors": lambda: torch.stack([to_tensor(pil_augmix(to_pil(t), 3, 3, 1.0, rng)) for t in x]),
        },
    }
    rows = []
    for label, sides in cases.items():
        for fn in sides.values():  # warm-up
            fn()
        runs: dict[str, list[float]] = {name: [] for name in sides}
        for _ in range(repeats):
            for name, fn in sides.items():
                runs[name].append(rate(fn, batch))
        rows.append((label, {name: statistics.median(values) for name, values in runs.items()}))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="32,224", help="image sides, comma-separated")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if Image is None:
        print("Pillow is not installed: nothing to compare with (pip install pillow -c constraints.txt).")
        return 0
    torch.set_num_threads(args.threads)
    import PIL

    print(f"Machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, load average "
          f"{os.getloadavg()[0]:.1f}; torch {torch.__version__} ({args.threads} thread(s)), Pillow {PIL.__version__}, "
          f"Python {platform.python_version()}; batch {args.batch}, median of {args.repeats} runs.\n")
    print("| augmentation | image size | ours, batch (img/s) | Pillow per image (img/s) | ours ÷ Pillow "
          "| Pillow from/to tensors (img/s) | ours ÷ that |")
    print("|---|---|---|---|---|---|---|")
    for size in (int(s) for s in args.sizes.split(",")):
        for label, r in measure(size, args.batch, args.repeats):
            print(f"| {label} | {size}x{size} | {r['ours']:,.0f} | {r['pil']:,.0f} | {r['ours'] / r['pil']:.1f}x "
                  f"| {r['pil_tensors']:,.0f} | {r['ours'] / r['pil_tensors']:.1f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
