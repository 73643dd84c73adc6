"""ColOut, RandAugment and AugMix on Pillow images, as torchvision pipelines hold them before ToTensor.

Checked against computations that do not go through our conversion: pixels picked by hand with
numpy from Composer's recipe for the kept rows and columns, Pillow's own ``ImageOps.equalize``,
and the tensor path on the image converted by hand (``np.asarray``, as ``PILToTensor`` does).
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
import torch
from helpers.support import REPO

from composer_bridge.algorithms import AugmentAndMixTransform, ColOutTransform, RandAugmentTransform
from composer_bridge.functional import augmix_image, colout_batch, randaugment_image

Image = pytest.importorskip("PIL.Image")
ImageOps = pytest.importorskip("PIL.ImageOps")

HEIGHT, WIDTH = 12, 9


def rgb_image(seed: int = 0, height: int = HEIGHT, width: int = WIDTH) -> Image.Image:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    return Image.fromarray(pixels)


def as_mode(image: Image.Image, mode: str) -> Image.Image:
    if mode in ("I;16", "I"):
        return image.convert("L").convert("I").point(lambda v: v * 200).convert(mode)
    if mode == "F":
        return image.convert("L").convert("F").point(lambda v: v / 7)
    if mode == "P":
        palette = image.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
        palette.info["transparency"] = 3
        return palette
    return image.convert(mode)


def kept_by_hand(height: int, width: int, p_row: float, p_col: float, seed: int) -> tuple[list[int], list[int]]:
    """Composer's recipe: a random permutation of the rows (then columns), keep the first int((1-p)*size), sorted."""
    generator = torch.Generator().manual_seed(seed)
    rows = sorted(torch.randperm(height, generator=generator)[: max(1, int((1 - p_row) * height))].tolist())
    cols = sorted(torch.randperm(width, generator=generator)[: max(1, int((1 - p_col) * width))].tolist())
    return rows, cols


def to_tensor_by_hand(image: Image.Image) -> torch.Tensor:
    """``uint8`` ``(C, H, W)``: what torchvision's ``PILToTensor`` gives for an L or RGB image."""
    array = np.array(image)
    return torch.from_numpy(array[:, :, None] if array.ndim == 2 else array).permute(2, 0, 1).contiguous()


# --- ColOut ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["RGB", "L", "1", "P", "RGBA", "LA", "CMYK", "I;16", "I", "F"])
def test_colout_keeps_exactly_the_drawn_pixels_of_any_mode(mode: str) -> None:
    image = as_mode(rgb_image(), mode)
    transform = ColOutTransform(p_row=0.25, p_col=1 / 3, generator=torch.Generator().manual_seed(5))
    out = transform(image)
    rows, cols = kept_by_hand(HEIGHT, WIDTH, 0.25, 1 / 3, seed=5)
    assert isinstance(out, Image.Image) and out.mode == image.mode and out.size == (len(cols), len(rows))
    expected = np.asarray(image)[np.ix_(rows, cols)]
    assert np.array_equal(np.asarray(out), expected)
    if mode == "P":
        assert out.getpalette() == image.getpalette() and out.info["transparency"] == 3


def test_colout_on_a_pillow_image_equals_the_tensor_path_with_the_same_draws() -> None:
    image = rgb_image(1)
    out = colout_batch(image, p_row=0.3, p_col=0.2, generator=torch.Generator().manual_seed(7))
    tensor = colout_batch(to_tensor_by_hand(image), p_row=0.3, p_col=0.2, generator=torch.Generator().manual_seed(7))
    assert torch.equal(to_tensor_by_hand(out), tensor)
    torch.manual_seed(3)  # the transform without a generator draws from torch's global one
    first = ColOutTransform()(image)
    torch.manual_seed(3)
    assert np.array_equal(np.asarray(first), np.asarray(ColOutTransform()(to_tensor_by_hand(image)).permute(1, 2, 0)))


def test_colout_drops_the_same_rows_and_columns_from_a_pillow_or_tensor_mask() -> None:
    image = rgb_image(2)
    mask = Image.fromarray(np.arange(HEIGHT * WIDTH, dtype=np.uint8).reshape(HEIGHT, WIDTH))
    rows, cols = kept_by_hand(HEIGHT, WIDTH, 0.25, 1 / 3, seed=11)

    def transform():
        return ColOutTransform(p_row=0.25, p_col=1 / 3, generator=torch.Generator().manual_seed(11))

    small, small_mask = transform()((image, mask))
    assert np.array_equal(np.asarray(small_mask), np.asarray(mask)[np.ix_(rows, cols)])
    assert np.array_equal(np.asarray(small), np.asarray(image)[np.ix_(rows, cols)])
    tensor_mask = torch.from_numpy(np.array(mask)).long()
    assert torch.equal(transform()((image, tensor_mask))[1], tensor_mask[rows][:, cols])
    label = torch.tensor(3)
    assert transform()((image, label))[1] is label  # a class label is left alone
    other_size = Image.new("L", (4, 4))
    assert transform()((image, other_size))[1] is other_size  # 'auto': not the image's size, left alone
    with pytest.raises(TypeError, match="resize_target=True.*got int"):
        ColOutTransform(resize_target=True)((image, 3))
    with pytest.raises(ValueError, match="per_sample=True.*Pillow image"):
        colout_batch(image, per_sample=True)


# --- RandAugment and AugMix ----------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["RGB", "L"])
@pytest.mark.parametrize("augment", ["randaugment", "augmix"])
def test_augmentations_on_a_pillow_image_equal_the_uint8_tensor_path(mode: str, augment: str) -> None:
    image = rgb_image(3, 16, 16).convert(mode)
    function = randaugment_image if augment == "randaugment" else augmix_image
    out = function(image, severity=9, generator=torch.Generator().manual_seed(4))
    tensor = function(to_tensor_by_hand(image), severity=9, generator=torch.Generator().manual_seed(4))
    assert isinstance(out, Image.Image) and out.mode == mode and out.size == image.size
    assert torch.equal(to_tensor_by_hand(out), tensor)
    assert not torch.equal(tensor, to_tensor_by_hand(image))
    # ...which is the float path (ToTensor first) rounded to 8-bit levels: the only difference
    floats = function(to_tensor_by_hand(image).float() / 255, severity=9, generator=torch.Generator().manual_seed(4))
    assert torch.equal(to_tensor_by_hand(out), (floats * 255).round().to(torch.uint8))

    transform = RandAugmentTransform(severity=9) if augment == "randaugment" else AugmentAndMixTransform(severity=9)
    torch.manual_seed(6)
    first = transform(image)
    torch.manual_seed(6)
    assert torch.equal(to_tensor_by_hand(first), transform(to_tensor_by_hand(image)))


@pytest.mark.parametrize("mode", ["RGB", "L"])
def test_randaugment_with_equalize_is_pillows_equalize(mode: str) -> None:
    image = rgb_image(5, 16, 16).convert(mode)
    out = RandAugmentTransform(depth=1, augmentation_set=["equalize"])(image)
    assert np.array_equal(np.asarray(out), np.asarray(ImageOps.equalize(image)))
    copy = randaugment_image(image, depth=0)
    assert copy is not image and np.array_equal(np.asarray(copy), np.asarray(image))


def test_augmix_of_one_equalize_chain_mixes_the_image_with_pillows_equalize() -> None:
    image = rgb_image(6, 16, 16)
    out = np.asarray(augmix_image(image, depth=1, width=1, augmentation_set=["equalize"],
                                  generator=torch.Generator().manual_seed(2))).astype(np.float64)
    x, equalized = np.asarray(image).astype(np.float64), np.asarray(ImageOps.equalize(image)).astype(np.float64)
    spread = equalized - x
    k = np.unravel_index(np.abs(spread).argmax(), spread.shape)
    m = (out[k] - x[k]) / spread[k]  # the one mixing weight, read off the pixel that moved most
    assert 0 < m < 1
    assert np.abs(out - ((1 - m) * x + m * equalized)).max() <= 1.0  # every pixel, within the 8-bit rounding


@pytest.mark.parametrize("mode", ["RGBA", "P", "I;16", "F"])
def test_augmentations_refuse_modes_without_8_bit_colour_channels_and_say_how_to_convert(mode: str) -> None:
    image = as_mode(rgb_image(), mode)
    for call in (lambda: RandAugmentTransform()(image), lambda: AugmentAndMixTransform()(image)):
        with pytest.raises(TypeError, match=f"got mode '{mode}'.*convert\\('RGB'\\)"):
            call()


def test_pillow_stays_unimported_by_the_library() -> None:
    code = (
        "import sys, torch, composer_bridge.algorithms as a, composer_bridge.functional\n"
        "a.ColOutTransform()(torch.rand(3, 8, 8)); a.RandAugmentTransform()(torch.rand(3, 8, 8))\n"
        "print('PIL' in sys.modules)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
