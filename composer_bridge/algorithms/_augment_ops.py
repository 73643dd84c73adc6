"""Batched image augmentations on tensors, on Composer's severity scale (shared by RandAugment and AugMix).

Images are ``(N, C, H, W)`` floating tensors with values in ``[0, 1]``, on any device. Each
primitive changes every image of the batch with its own parameter (a tensor of ``N`` values):
no PIL, no torchvision, no loop over images. The primitives follow the definitions of Pillow's
``ImageOps``/``ImageEnhance`` that Composer's augmentations call, written on the 0..255 grid of
8-bit images where Pillow's definition is discrete (posterize, solarize, equalize):

==============  ==========================================================================
autocontrast    stretch each channel so its darkest pixel is 0 and its brightest 1
equalize        per channel, map levels so their histogram is flat (Pillow's look-up table)
posterize       keep the top ``bits`` bits of each 8-bit level
solarize        invert the levels ``>= threshold`` (on the 0..256 scale)
rotate          turn by ``degrees`` counter-clockwise about the centre, bilinear, black fill
shear_x/_y      source ``x + f*y`` (``y + f*x``) from the top-left corner, bilinear
translate_x/_y  source ``x + t`` (``y + t``) pixels, black fill
color           blend with the luma image (ITU-R 601), factor 0 = grey, 1 = unchanged
contrast        blend with the mean luma (a flat grey image)
brightness      blend with black
sharpness       blend with a 3x3 smoothing (Pillow's SMOOTH kernel; border pixels unchanged)
==============  ==========================================================================

The random magnitudes follow Composer's ``augmentation_primitives``: an op's level is drawn
from ``U(0.1, severity)`` and mapped linearly onto its range at ``severity == 10`` (30 degrees,
a 0.3 shear, a third of the image, 4 bits, 256 levels), signed at random for the geometric ops;
the blends draw their factor symmetrically around 1 (``U(1, severity)`` or
``U(1 - 0.09 * severity, 1)``, brightness above 1 scaled by 0.75), or, in the ``"original"``
set, as ``0.1 + 0.18 * level``.

Every draw comes from one ``torch.Generator``, a fixed number of draws per step whatever the ops
chosen, so a run reproduces from the generator's seed. On the CPU each op runs on the images
that chose it (``index_select``); on an accelerator every op runs on the whole batch and
``torch.where`` keeps each image's choice, so nothing asks the device how many images chose
what (no host-device synchronisation).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import torch
import torch.nn.functional as F

from composer_bridge.algorithms._draws import log_gamma
from composer_bridge.algorithms._pil_images import is_pil_image, levels_to_pil, pil_to_levels

if TYPE_CHECKING:
    from PIL.Image import Image as PILImage

__all__ = [
    "AUGMENTATION_SETS",
    "affine",
    "augment_batch",
    "augment_step",
    "autocontrast",
    "brightness",
    "check_augmentation_set",
    "check_normalization",
    "check_severity",
    "chunks",
    "color",
    "contrast",
    "denormalize",
    "draw_step",
    "equalize",
    "magnitudes",
    "normalize",
    "posterize",
    "rotate",
    "sample_dirichlet",
    "sample_symmetric_beta",
    "sharpness",
    "shear_x",
    "shear_y",
    "solarize",
    "to_batch",
    "translate_x",
    "translate_y",
]

_SAFE = ("autocontrast", "equalize", "posterize", "rotate", "solarize", "shear_x", "shear_y", "translate_x",
         "translate_y")

#: Composer's augmentation sets, by name: ``"all"``, ``"safe"`` (no op that also makes the
#: ImageNet-C/CIFAR-10-C corruptions) and ``"original"`` (the AugMix paper's blend factors).
AUGMENTATION_SETS: dict[str, tuple[str, ...]] = {
    "all": (*_SAFE, "color", "contrast", "brightness", "sharpness"),
    "safe": _SAFE,
    "original": (*_SAFE, "color_original", "contrast_original", "brightness_original", "sharpness_original"),
}

_AFFINE = ("rotate", "shear_x", "shear_y", "translate_x", "translate_y")


# --- the deterministic primitives ----------------------------------------------------------------

def _per_image(values: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
    """``(N,)`` values as ``(N, 1, 1, 1)`` in the images' dtype and device, to broadcast per image."""
    return values.to(device=images.device, dtype=images.dtype).view(-1, 1, 1, 1)


def _rows(images: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``images[index]`` along the batch; on the flattened rows, several times faster than on 4-D."""
    return images.reshape(images.shape[0], -1).index_select(0, index).view(-1, *images.shape[1:])


def _levels(images: torch.Tensor) -> torch.Tensor:
    """The nearest 8-bit level (0..255) of every pixel, as floating-point integers."""
    return (images * 255).round_().clamp_(0, 255)


def autocontrast(images: torch.Tensor) -> torch.Tensor:
    """Stretch each channel of each image linearly to ``[0, 1]`` (flat channels unchanged)."""
    low, high = torch.aminmax(images.flatten(-2), dim=-1)
    low, span = low[..., None, None], (high - low)[..., None, None]
    flat = span <= 0
    scale = torch.where(flat, torch.ones_like(span), 1 / torch.where(flat, torch.ones_like(span), span))
    return (images - torch.where(flat, torch.zeros_like(low), low)).mul_(scale).clamp_(0, 1)


def _count(keys: torch.Tensor, size: int, on_cpu: bool) -> torch.Tensor:
    """How often each of ``0..size-1`` occurs in ``keys`` (int64)."""
    if on_cpu:
        return torch.bincount(keys, minlength=size)
    # bincount reads its input's maximum back on the host; a scatter does not wait for the device.
    counts = torch.zeros(size, dtype=torch.int64, device=keys.device)
    return counts.scatter_add_(0, keys.to(torch.int64), torch.ones_like(keys, dtype=torch.int64))


def equalize(images: torch.Tensor) -> torch.Tensor:
    """Histogram-equalise each channel with Pillow's look-up table on the 8-bit levels.

    With ``step = (pixels - count of the brightest level) // 255``, level ``i`` maps to
    ``min(255, (step // 2 + pixels below level i) // step)``; a channel with ``step == 0``
    (one or two levels) is left unchanged.
    """
    n, c, h, w = images.shape
    # Level + 256 * channel number: one histogram (bincount) and one table look-up for the batch.
    offsets = torch.arange(0, n * c * 256, 256, device=images.device, dtype=torch.int32).view(n * c, 1)
    keys = (_levels(images).reshape(n * c, h * w).to(torch.int32) + offsets).flatten()
    counts = _count(keys, n * c * 256, images.device.type == "cpu").view(n * c, 256)
    present = torch.arange(256, device=images.device).expand(n * c, 256)
    brightest = counts.gather(1, torch.where(counts > 0, present, -1).amax(dim=1, keepdim=True))
    step = (h * w - brightest) // 255
    below = counts.cumsum(dim=1) - counts
    table = ((step // 2 + below) // step.clamp(min=1)).clamp_(max=255).to(images.dtype).div_(255)
    equalised = table.flatten().index_select(0, keys).view(n, c, h, w)
    return equalised.lerp_(images, (step <= 0).to(images.dtype).view(n, c, 1, 1))


def posterize(images: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """Keep the top ``bits[i]`` bits (0..8) of each 8-bit level of image ``i``."""
    drop = 2.0 ** (8 - _per_image(bits, images))
    return _levels(images).div_(drop).floor_().mul_(drop / 255)


def solarize(images: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Invert (``1 - x``) the pixels whose 8-bit level is ``>= threshold[i]`` (0..256; 256 inverts none)."""
    # Half a level below the threshold: a pixel at level k (k / 255 in floating point) counts as k.
    limit = (_per_image(threshold, images) - 0.5) / 255
    # x + inverted * (1 - 2x) rather than torch.where, which is several times slower on the CPU.
    inverted = (images >= limit).to(images.dtype)
    return inverted.mul_(1 - 2 * images).add_(images)


def _blend(images: torch.Tensor, degenerate: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """``degenerate + factor * (images - degenerate)`` clipped to ``[0, 1]`` (Pillow's ``Image.blend``)."""
    return (images - degenerate).mul_(_per_image(factor, images)).add_(degenerate).clamp_(0, 1)


def _luma(images: torch.Tensor) -> torch.Tensor:
    """``(N, 1, H, W)``: ITU-R 601 luma for RGB (Pillow's ``convert("L")``), the channel mean otherwise."""
    if images.shape[1] == 3:
        return 0.299 * images[:, 0:1] + 0.587 * images[:, 1:2] + 0.114 * images[:, 2:3]
    return images.mean(dim=1, keepdim=True)


def color(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Saturation: blend each image with its grey version (factor 0 = grey, 1 = unchanged, 2 = twice as vivid)."""
    return _blend(images, _luma(images), factor)


def contrast(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Contrast: blend each image with a flat grey at its mean luma."""
    return _blend(images, _luma(images).mean(dim=(-3, -2, -1), keepdim=True), factor)


def brightness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Brightness: blend each image with black (``factor * x``, clipped)."""
    return (images * _per_image(factor, images)).clamp_(0, 1)


def _smooth(images: torch.Tensor) -> torch.Tensor:
    """Pillow's SMOOTH filter (3x3, centre 5, others 1, / 13) inside the image; border pixels kept."""
    h, w = images.shape[-2:]
    if h < 3 or w < 3:
        return images
    # The 3x3 box sum from shifted slices (faster on the CPU than a pooling or a convolution), plus
    # 4x the centre, so the centre counts 5.
    rows = images[..., :-2, :] + images[..., 1:-1, :]
    rows += images[..., 2:, :]
    box = rows[..., :-2] + rows[..., 1:-1]
    box += rows[..., 2:]
    inner = box.add_(images[..., 1:-1, 1:-1], alpha=4).div_(13)
    smoothed = images.clone()
    smoothed[..., 1:-1, 1:-1] = inner
    return smoothed


def sharpness(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Sharpness: blend each image with its smoothed version (factor 0 = smooth, 2 = sharpened)."""
    return _blend(images, _smooth(images), factor)


def affine(images: torch.Tensor, matrices: torch.Tensor) -> torch.Tensor:
    """Resample image ``i`` at ``matrices[i] @ (x, y, 1)`` for each output pixel ``(x, y)``, as Pillow does.

    Coordinates are in pixels with pixel centres at ``k + 0.5``. A source point outside the
    image gives black; inside it, bilinear interpolation with the edge pixels repeated
    (Pillow's ``Image.transform(AFFINE, BILINEAR)``).
    """
    n, _, h, w = images.shape
    m = matrices.to(device=images.device, dtype=torch.float64)
    a, b, shift_x, d, e, shift_y = (m[:, i // 3, i % 3] for i in range(6))
    # The same map in grid_sample's coordinates (-1 and 1 are the image's outer edges), where a
    # pixel coordinate p is 2 p / size - 1.
    theta = torch.stack((
        a, b * (h / w), a + b * (h / w) + 2 * shift_x / w - 1,
        d * (w / h), e, d * (w / h) + e + 2 * shift_y / h - 1,
    ), dim=-1).to(images.dtype)
    # The sampling grid of the output pixel centres, written straight into its two halves
    # (F.affine_grid's batched matrix product is many times slower on the CPU).
    u = (torch.arange(w, device=images.device, dtype=images.dtype) * 2 + 1) / w - 1
    v = (torch.arange(h, device=images.device, dtype=images.dtype) * 2 + 1) / h - 1
    grid = torch.empty(n, h, w, 2, device=images.device, dtype=images.dtype)
    for axis in (0, 1):
        row = theta[:, 3 * axis : 3 * axis + 3]
        torch.add(row[:, 0, None, None] * u.view(1, 1, w), row[:, 1, None, None] * v.view(1, h, 1) + row[:, 2, None, None],
                  out=grid[..., axis])
    warped = F.grid_sample(images, grid, mode="bilinear", padding_mode="border", align_corners=False)
    inside = grid.abs().amax(dim=-1) <= 1  # the source point lies on the image: else black
    return warped.mul_(inside.unsqueeze(1).to(images.dtype))


def _matrices(kind: str, value: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """``(N, 2, 3)`` source-from-output matrices of one geometric op, one per value."""
    v = value.to(torch.float32)
    one, zero = torch.ones_like(v), torch.zeros_like(v)
    if kind == "rotate":
        # Pillow's Image.rotate(degrees): counter-clockwise about (W / 2, H / 2).
        angle = v * (-math.pi / 180)
        cos, sin = torch.cos(angle), torch.sin(angle)
        cx, cy = width / 2, height / 2
        rows = (cos, sin, cx - cos * cx - sin * cy, -sin, cos, cy + sin * cx - cos * cy)
    elif kind == "shear_x":
        rows = (one, v, zero, zero, one, zero)
    elif kind == "shear_y":
        rows = (one, zero, zero, v, one, zero)
    elif kind == "translate_x":
        rows = (one, zero, v, zero, one, zero)
    else:  # translate_y
        rows = (one, zero, zero, zero, one, v)
    return torch.stack(rows, dim=-1).view(-1, 2, 3)


def rotate(images: torch.Tensor, degrees: torch.Tensor) -> torch.Tensor:
    """Rotate image ``i`` by ``degrees[i]`` counter-clockwise about its centre (bilinear, black corners)."""
    return affine(images, _matrices("rotate", degrees, images.shape[-2], images.shape[-1]))


def shear_x(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Shear horizontally: output pixel ``(x, y)`` reads ``(x + factor * y, y)``."""
    return affine(images, _matrices("shear_x", factor, images.shape[-2], images.shape[-1]))


def shear_y(images: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """Shear vertically: output pixel ``(x, y)`` reads ``(x, y + factor * x)``."""
    return affine(images, _matrices("shear_y", factor, images.shape[-2], images.shape[-1]))


def translate_x(images: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
    """Shift horizontally: output pixel ``(x, y)`` reads ``(x + pixels, y)`` (black where that is outside)."""
    return affine(images, _matrices("translate_x", pixels, images.shape[-2], images.shape[-1]))


def translate_y(images: torch.Tensor, pixels: torch.Tensor) -> torch.Tensor:
    """Shift vertically: output pixel ``(x, y)`` reads ``(x, y + pixels)``."""
    return affine(images, _matrices("translate_y", pixels, images.shape[-2], images.shape[-1]))


_PIXEL_OPS: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "autocontrast": lambda images, value: autocontrast(images),
    "equalize": lambda images, value: equalize(images),
    "posterize": posterize,
    "solarize": solarize,
    "color": color,
    "contrast": contrast,
    "brightness": brightness,
    "sharpness": sharpness,
    "color_original": color,
    "contrast_original": contrast,
    "brightness_original": brightness,
    "sharpness_original": sharpness,
}


# --- the severity scale ---------------------------------------------------------------------------

class StepDraws(NamedTuple):
    """The random numbers of one augmentation step, one of each per image."""

    choice: torch.Tensor  #: which op of the set (int64)
    level: torch.Tensor  #: U(0, 1), becomes the level U(0.1, severity)
    sign: torch.Tensor  #: U(0, 1); > 0.5 negates a geometric op
    branch: torch.Tensor  #: U(0, 1); > 0.5 draws a blend factor above 1
    factor: torch.Tensor  #: U(0, 1), becomes the blend factor

    def rows(self, rows: slice) -> StepDraws:
        """The draws of the images ``rows`` of the batch."""
        return StepDraws(*(values[rows] for values in self))


#: On the CPU a batch is augmented a few images at a time, each chunk through all its steps while
#: it is in the cache: about this many values per chunk (the whole batch at once elsewhere).
CPU_CHUNK_VALUES = 2**19


def chunks(images: torch.Tensor) -> list[slice]:
    """Slices of the batch to augment one after the other (one slice except on the CPU)."""
    n = images.shape[0]
    if images.device.type != "cpu":
        return [slice(0, n)]
    size = max(1, CPU_CHUNK_VALUES // max(1, images[0].numel()))
    return [slice(start, min(start + size, n)) for start in range(0, n, size)]


def draw_step(n: int, num_ops: int, generator: torch.Generator | None, device: torch.device) -> StepDraws:
    """Draw one step's numbers on the generator's device (``device`` when there is no generator)."""
    where = generator.device if generator is not None else device
    choice = torch.randint(num_ops, (n,), generator=generator, device=where)
    uniform = torch.rand(4, n, generator=generator, device=where)
    return StepDraws(choice, *uniform.unbind(0))


def _int_parameter(level: torch.Tensor, maxval: float) -> torch.Tensor:
    """Composer's ``int(level * maxval / 10)``."""
    return torch.trunc(level * maxval / 10)


class _Scale(NamedTuple):
    """One step's draws on the severity scale, for every image (computed once per step)."""

    level: torch.Tensor  #: U(0.1, severity)
    sign: torch.Tensor  #: -1 or 1
    symmetric: torch.Tensor  #: a blend factor around 1: U(1, severity) or U(1 - 0.09 * severity, 1)

    @classmethod
    def of(cls, draws: StepDraws, severity: float) -> _Scale:
        precision = torch.float32 if draws.level.device.type == "mps" else torch.float64  # MPS has no float64
        level = 0.1 + (severity - 0.1) * draws.level.to(precision)
        sign = 1 - 2 * (draws.sign > 0.5).to(precision)
        u = draws.factor.to(precision)
        symmetric = torch.where(draws.branch > 0.5, 1 + (severity - 1) * u, (1 - 0.09 * severity) + 0.09 * severity * u)
        return cls(level, sign, symmetric)

    def select(self, index: torch.Tensor) -> _Scale:
        return _Scale(*(values.index_select(0, index.to(values.device)) for values in self))


def _magnitude(name: str, scale: _Scale, height: int, width: int) -> torch.Tensor:
    level, sign = scale.level, scale.sign
    if name == "posterize":
        return (4 - _int_parameter(level, 4)).to(torch.int64)
    if name == "solarize":
        return 256 - _int_parameter(level, 256)
    if name == "rotate":
        return _int_parameter(level, 30) * sign
    if name in ("shear_x", "shear_y"):
        return level * (0.3 / 10) * sign
    if name == "translate_x":
        return _int_parameter(level, width / 3) * sign
    if name == "translate_y":
        return _int_parameter(level, height / 3) * sign
    if name.endswith("_original"):
        return level * (1.8 / 10) + 0.1
    if name == "brightness":
        return torch.where(scale.symmetric > 1, scale.symmetric * 0.75, scale.symmetric)
    return scale.symmetric  # color, contrast, sharpness; ignored by autocontrast and equalize


def magnitudes(name: str, draws: StepDraws, severity: float, height: int, width: int) -> torch.Tensor:
    """Op ``name``'s parameter for each image from one step's draws, on Composer's severity scale."""
    return _magnitude(name, _Scale.of(draws, severity), height, width)


# --- one step over a batch ----------------------------------------------------------------------

def augment_step(images: torch.Tensor, names: Sequence[str], draws: StepDraws, severity: float,
                 active: torch.Tensor | None = None, grouped: bool | None = None) -> torch.Tensor:
    """Apply to each image the op ``names[draws.choice[i]]`` at its drawn magnitude.

    Args:
        images: ``(N, C, H, W)`` in ``[0, 1]``.
        names: the augmentation set.
        draws: this step's draws (from :func:`draw_step`), on any device.
        severity: 0..10.
        active: optional ``(N,)`` bools; images where it is ``False`` are left unchanged.
        grouped: run each op on the images that chose it (needs the choices on the host), or
            every op on all images and keep each image's choice; default: grouped on the CPU.
    """
    if grouped is None:
        grouped = images.device.type == "cpu"
    choice = draws.choice.to(images.device)
    if active is not None:
        choice = torch.where(active.to(images.device), choice, -1)
    scale = _Scale.of(draws, severity)
    if grouped:
        return _grouped_step(images, names, choice, scale)
    return _masked_step(images, names, choice, scale)


def _grouped_step(images: torch.Tensor, names: Sequence[str], choice: torch.Tensor, scale: _Scale) -> torch.Tensor:
    """Each op on the images that chose it (the choices are read on the host)."""
    n, _, h, w = images.shape
    order = torch.argsort(choice, stable=True)
    counts = torch.bincount(choice + 1, minlength=len(names) + 1).tolist()
    groups = dict(enumerate(order.split(counts), start=-1))  # op index -> the images that chose it
    out = torch.empty(images.shape, dtype=images.dtype, device=images.device)  # contiguous, whatever the input
    flat_out = out.view(n, -1)

    def put(index: torch.Tensor, result: torch.Tensor) -> None:
        flat_out.index_copy_(0, index, result.reshape(index.numel(), -1))

    if counts[0]:  # images left out of this step (AugMix's shorter chains)
        put(groups[-1], _rows(images, groups[-1]))
    geometric = [k for k, name in enumerate(names) if name in _AFFINE and counts[k + 1]]
    if geometric:
        # All geometric ops of the step are one resampling, each image with its own matrix.
        index = torch.cat([groups[k] for k in geometric])
        matrices = torch.cat([_matrices(names[k], _magnitude(names[k], scale.select(groups[k]), h, w), h, w)
                              for k in geometric])
        put(index, affine(_rows(images, index), matrices))
    for k, name in enumerate(names):
        if name in _AFFINE or not counts[k + 1]:
            continue
        value = _magnitude(name, scale.select(groups[k]), h, w)
        put(groups[k], _PIXEL_OPS[name](_rows(images, groups[k]), value))
    return out


def _masked_step(images: torch.Tensor, names: Sequence[str], choice: torch.Tensor, scale: _Scale) -> torch.Tensor:
    """Every op on every image, each image keeping its own choice: nothing is read back on the host."""
    n, _, h, w = images.shape
    out = images
    geometric = [k for k, name in enumerate(names) if name in _AFFINE]
    if geometric:
        matrices = torch.eye(2, 3, device=images.device).expand(n, 2, 3)
        wanted = torch.zeros(n, dtype=torch.bool, device=images.device)
        for k in geometric:
            kind = _matrices(names[k], _magnitude(names[k], scale, h, w), h, w).to(images.device)
            matrices = torch.where((choice == k).view(n, 1, 1), kind, matrices)
            wanted |= choice == k
        out = torch.where(wanted.view(n, 1, 1, 1), affine(images, matrices), out)
    for k, name in enumerate(names):
        if name in _AFFINE:
            continue
        value = _magnitude(name, scale, h, w).to(images.device)
        out = torch.where((choice == k).view(n, 1, 1, 1), _PIXEL_OPS[name](images, value), out)
    return out


# --- mixing weights for AugMix (from the one gamma sampler, _draws.log_gamma) ---------------------

def sample_dirichlet(alpha: float, n: int, width: int, generator: torch.Generator | None,
                     device: torch.device) -> torch.Tensor:
    """``(n, width)`` rows drawn from Dirichlet(alpha, ..., alpha)."""
    return torch.softmax(log_gamma(alpha, (n, width), generator, device), dim=-1)


def sample_symmetric_beta(alpha: float, n: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """``(n,)`` draws from Beta(alpha, alpha)."""
    pair = log_gamma(alpha, (n, 2), generator, device)
    return torch.sigmoid(pair[:, 0] - pair[:, 1])


# --- arguments and layouts --------------------------------------------------------------------------

def check_severity(severity: float, where: str, default: float) -> None:
    if isinstance(severity, bool) or not isinstance(severity, (int, float)) or not 0 <= severity <= 10:
        raise ValueError(
            f"{where}(severity={severity!r}): severity must be a number in [0, 10] (10 is the strongest: "
            f"30-degree rotations, shifts of a third of the image). The default is {default}."
        )


def check_augmentation_set(augmentation_set: str | Sequence[str], where: str) -> tuple[str, ...]:
    """The op names of a set given by name (``"all"``, ``"safe"``, ``"original"``) or as a sequence of names."""
    if isinstance(augmentation_set, str):
        if augmentation_set not in AUGMENTATION_SETS:
            raise ValueError(
                f"{where}(augmentation_set={augmentation_set!r}): unknown set; choose one of "
                f"{sorted(AUGMENTATION_SETS)} or pass a sequence of op names."
            )
        return AUGMENTATION_SETS[augmentation_set]
    names = tuple(augmentation_set)
    known = set(_AFFINE) | set(_PIXEL_OPS)
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        raise ValueError(
            f"{where}(augmentation_set={augmentation_set!r}): "
            f"{'unknown ops ' + repr(unknown) if unknown else 'no op given'}; the ops are {sorted(known)}."
        )
    return names


def to_batch(img: torch.Tensor | PILImage, where: str) -> tuple[torch.Tensor, Callable[[torch.Tensor], Any]]:
    """``img`` as a floating ``(N, C, H, W)`` batch in ``[0, 1]``, and the function that puts a result back.

    ``(C, H, W)`` images become a batch of one; ``uint8`` images are read as ``level / 255`` and
    rounded back; half-precision images are computed in float32. A Pillow image (mode ``"L"`` or
    ``"RGB"``) takes the ``uint8`` path and comes back as a Pillow image of its mode, so it gets
    exactly what its ``uint8`` tensor would. Values outside ``[0, 1]`` are left for the caller to
    clip (chunk by chunk, while they are in the cache).
    """
    if is_pil_image(img):
        images, restore_levels = to_batch(pil_to_levels(img, where), where)
        return images, lambda result: levels_to_pil(restore_levels(result), img)
    if not isinstance(img, torch.Tensor) or img.ndim not in (3, 4):
        raise TypeError(
            f"{where} needs an image tensor (C, H, W), a batch (N, C, H, W) or a Pillow image, got "
            f"{type(img).__name__}{tuple(img.shape) if isinstance(img, torch.Tensor) else ''}."
        )
    dtype = img.dtype
    if dtype == torch.uint8:
        images = img.to(torch.float32) / 255
    elif dtype.is_floating_point:
        images = img.to(torch.float32) if dtype in (torch.float16, torch.bfloat16) else img
    else:
        raise TypeError(f"{where} needs floating images in [0, 1] or uint8 images, got dtype {dtype}.")
    single = img.ndim == 3
    if single:
        images = images.unsqueeze(0)

    def restore(result: torch.Tensor) -> torch.Tensor:
        if single:
            result = result.squeeze(0)
        if dtype == torch.uint8:
            return (result * 255).round_().clamp_(0, 255).to(torch.uint8)
        return result.to(dtype)

    return images, restore


Normalization = tuple[float, ...] | None


def check_normalization(mean: float | Sequence[float] | None, std: float | Sequence[float] | None,
                        where: str) -> tuple[Normalization, Normalization]:
    """``mean``/``std`` as tuples of floats (both ``None`` when the images are already in ``[0, 1]``)."""
    if mean is None and std is None:
        return None, None
    values = []
    for name, given in (("mean", mean), ("std", std)):
        items = (given,) if isinstance(given, (int, float)) and not isinstance(given, bool) else given
        if (items is None or isinstance(items, (str, bytes)) or not isinstance(items, Sequence) or not items
                or not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in items)):
            raise ValueError(
                f"{where}({name}={given!r}): give mean and std together, each a number or one number per channel "
                "(what your data was normalised with, e.g. mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)), "
                "or neither for images in [0, 1]."
            )
        values.append(tuple(float(v) for v in items))
    if any(v <= 0 for v in values[1]):
        raise ValueError(f"{where}(std={std!r}): every standard deviation must be > 0.")
    return values[0], values[1]


def _channel_view(values: tuple[float, ...], images: torch.Tensor, where: str) -> torch.Tensor:
    if len(values) not in (1, images.shape[1]):
        raise ValueError(
            f"{where}: mean/std have {len(values)} values but the images have {images.shape[1]} channels; give one "
            "value, or one per channel."
        )
    return torch.tensor(values, dtype=images.dtype).view(1, -1, 1, 1).to(images.device, non_blocking=True)


def denormalize(images: torch.Tensor, mean: Normalization, std: Normalization, where: str) -> torch.Tensor:
    """Normalised images back to ``[0, 1]``: ``images * std + mean`` (unchanged when ``mean`` is ``None``)."""
    if mean is None or std is None:
        return images
    return images * _channel_view(std, images, where) + _channel_view(mean, images, where)


def normalize(images: torch.Tensor, mean: Normalization, std: Normalization) -> torch.Tensor:
    """The inverse of :func:`denormalize`."""
    if mean is None or std is None:
        return images
    return (images - _channel_view(mean, images, "")) / _channel_view(std, images, "")


def augment_batch(
    state: Any, input_key: Any, mean: Normalization, std: Normalization, where: str,
    augment: Callable[[torch.Tensor, torch.Generator], torch.Tensor],
) -> None:
    """What RandAugment and AugMix do at ``AFTER_DATALOADER``: augment the batch's images in place.

    Reads the images at ``input_key``, takes them back to ``[0, 1]`` (``mean``/``std``), applies
    ``augment(images, generator)`` with the state's generator for ``where`` on the images' device,
    and stores the result normalised again.
    """
    images = state.batch_get_item(input_key)
    if not isinstance(images, torch.Tensor) or images.ndim != 4:
        raise TypeError(
            f"{where} needs an image tensor (N, C, H, W) at input_key={input_key!r}, got "
            f"{type(images).__name__}{tuple(images.shape) if isinstance(images, torch.Tensor) else ''}."
        )
    generator = state.generator(where, images.device)
    augmented = augment(denormalize(images, mean, std, where), generator)
    state.batch_set_item(input_key, normalize(augmented, mean, std))
