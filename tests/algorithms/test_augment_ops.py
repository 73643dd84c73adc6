"""The batched augmentation primitives against per-pixel loops written from Pillow's definitions (and
against Pillow itself when it is installed), and the severity scale against Composer's formulas."""

from __future__ import annotations

import math

import pytest
import torch

from composer_bridge.algorithms import _augment_ops as ops

N, C, H, W = 4, 3, 16, 16


def grid_images(seed: int = 0, channels: int = C) -> torch.Tensor:
    """Random images on the 8-bit grid (k / 255), the values Pillow works with."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (N, channels, H, W), generator=g).to(torch.float32) / 255


def levels(channel: torch.Tensor) -> list[list[int]]:
    return [[round(float(v) * 255) for v in row] for row in channel]


# --- per-pixel references, one image at a time, from Pillow's C/Python definitions ------------------

def ref_autocontrast(image: torch.Tensor) -> torch.Tensor:
    out = []
    for channel in image.tolist():
        low, high = min(map(min, channel)), max(map(max, channel))
        out.append([[(v - low) / (high - low) if high > low else v for v in row] for row in channel])
    return torch.tensor(out)


def ref_equalize(image: torch.Tensor) -> torch.Tensor:
    out = image.clone()
    for c in range(image.shape[0]):
        grid = levels(image[c])
        histogram = [0] * 256
        for row in grid:
            for v in row:
                histogram[v] += 1
        present = [count for count in histogram if count]
        step = (sum(present) - present[-1]) // 255 if len(present) > 1 else 0
        if not step:
            continue
        table, running = [], step // 2
        for i in range(256):
            table.append(min(255, running // step))
            running += histogram[i]
        for y, row in enumerate(grid):
            for x, v in enumerate(row):
                out[c, y, x] = table[v] / 255
    return out


def ref_posterize(image: torch.Tensor, bits: int) -> torch.Tensor:
    mask = ~(2 ** (8 - bits) - 1) & 0xFF
    return torch.tensor([[[(v & mask) / 255 for v in row] for row in levels(ch)] for ch in image])


def ref_solarize(image: torch.Tensor, threshold: int) -> torch.Tensor:
    return torch.tensor([[[(v if v < threshold else 255 - v) / 255 for v in row] for row in levels(ch)]
                         for ch in image])


def ref_affine(image: torch.Tensor, matrix: tuple[float, ...]) -> torch.Tensor:
    """Pillow's bilinear affine transform: source = matrix @ (x + 0.5, y + 0.5); outside -> 0; edges clamped."""
    a, b, c, d, e, f = matrix
    channels, height, width = image.shape
    pixels = image.tolist()
    out = [[[0.0] * width for _ in range(height)] for _ in range(channels)]
    for y in range(height):
        for x in range(width):
            sx, sy = a * (x + 0.5) + b * (y + 0.5) + c, d * (x + 0.5) + e * (y + 0.5) + f
            if not (0 <= sx < width and 0 <= sy < height):
                continue
            sx, sy = sx - 0.5, sy - 0.5
            x0, y0 = math.floor(sx), math.floor(sy)
            dx, dy = sx - x0, sy - y0
            xa, xb = min(max(x0, 0), width - 1), min(max(x0 + 1, 0), width - 1)
            ya, yb = min(max(y0, 0), height - 1), min(max(y0 + 1, 0), height - 1)
            for ch in range(channels):
                top = pixels[ch][ya][xa] * (1 - dx) + pixels[ch][ya][xb] * dx
                bottom = pixels[ch][yb][xa] * (1 - dx) + pixels[ch][yb][xb] * dx
                out[ch][y][x] = top * (1 - dy) + bottom * dy
    return torch.tensor(out)


def pillow_rotation(degrees: float, width: int, height: int) -> tuple[float, ...]:
    """The matrix Pillow's Image.rotate(degrees) builds (counter-clockwise, about the centre)."""
    angle = -math.radians(degrees)
    a, b, d, e = math.cos(angle), math.sin(angle), -math.sin(angle), math.cos(angle)
    cx, cy = width / 2, height / 2
    return (a, b, a * -cx + b * -cy + cx, d, e, d * -cx + e * -cy + cy)


def ref_blend(image: torch.Tensor, kind: str, factor: float) -> torch.Tensor:
    channels, height, width = image.shape
    p = image.tolist()
    luma = [[0.299 * p[0][y][x] + 0.587 * p[1][y][x] + 0.114 * p[2][y][x] for x in range(width)]
            for y in range(height)]
    mean_luma = sum(map(sum, luma)) / (height * width)
    out = [[[0.0] * width for _ in range(height)] for _ in range(channels)]
    for ch in range(channels):
        for y in range(height):
            for x in range(width):
                v = p[ch][y][x]
                if kind == "color":
                    degenerate = luma[y][x]
                elif kind == "contrast":
                    degenerate = mean_luma
                elif kind == "brightness":
                    degenerate = 0.0
                elif 0 < y < height - 1 and 0 < x < width - 1:  # sharpness: SMOOTH inside, border kept
                    around = sum(p[ch][y + i][x + j] for i in (-1, 0, 1) for j in (-1, 0, 1))
                    degenerate = (around + 4 * v) / 13
                else:
                    degenerate = v
                out[ch][y][x] = min(max(degenerate + factor * (v - degenerate), 0.0), 1.0)
    return torch.tensor(out)


# --- the primitives against the references -------------------------------------------------------

def test_autocontrast_stretches_each_channel_and_leaves_flat_ones() -> None:
    x = grid_images() * 0.5 + 0.2
    x[1, 2] = 0.4  # a flat channel
    out = ops.autocontrast(x)
    for i in range(N):
        torch.testing.assert_close(out[i], ref_autocontrast(x[i]), rtol=0, atol=1e-6)
    assert torch.equal(out[1, 2], x[1, 2])


def test_equalize_matches_pillows_table_exactly() -> None:
    # 32x32 images: with 1,024 pixels Pillow's step is > 1, so its rounding term (step // 2) counts.
    x = torch.randint(0, 256, (3, C, 32, 32), generator=torch.Generator().manual_seed(0)).to(torch.float32) / 255
    x[0] = (x[0] * 40).round() / 255  # a narrow histogram
    x[2, 1] = 0.5  # one level: unchanged
    out = ops.equalize(x)
    for i in range(3):
        assert torch.equal(out[i], ref_equalize(x[i])), i
    assert torch.equal(out[2, 1], x[2, 1])


def test_the_device_histogram_counts_as_the_host_one() -> None:
    keys = torch.randint(0, 700, (5000,), dtype=torch.int32, generator=torch.Generator().manual_seed(0))
    assert torch.equal(ops._count(keys, 768, on_cpu=True), ops._count(keys, 768, on_cpu=False))


def test_posterize_and_solarize_match_the_8_bit_definitions_exactly() -> None:
    x = grid_images()
    bits, thresholds = torch.tensor([1, 2, 4, 8]), torch.tensor([256.0, 200.0, 128.0, 0.0])
    post, sol = ops.posterize(x, bits), ops.solarize(x, thresholds)
    for i in range(N):
        torch.testing.assert_close(post[i], ref_posterize(x[i], int(bits[i])), rtol=0, atol=1e-7)
        torch.testing.assert_close(sol[i], ref_solarize(x[i], int(thresholds[i])), rtol=0, atol=1e-6)
    assert torch.equal(sol[0], x[0]) and torch.allclose(sol[3], 1 - x[3])


@pytest.mark.parametrize("kind, values", [
    ("rotate", [0.0, 30.0, -17.0, 9.0]),
    ("shear_x", [0.3, -0.3, 0.1, 0.0]),
    ("shear_y", [0.3, -0.3, 0.1, -0.05]),
    ("translate_x", [5.0, -5.0, 0.0, 2.0]),
    ("translate_y", [5.0, -5.0, 0.0, 15.0]),
])
def test_geometric_ops_resample_as_pillows_bilinear_affine(kind: str, values: list[float]) -> None:
    x = grid_images(1)
    out = getattr(ops, kind)(x, torch.tensor(values))
    for i, v in enumerate(values):
        matrix = {
            "rotate": pillow_rotation(v, W, H), "shear_x": (1, v, 0, 0, 1, 0), "shear_y": (1, 0, 0, v, 1, 0),
            "translate_x": (1, 0, v, 0, 1, 0), "translate_y": (1, 0, 0, 0, 1, v),
        }[kind]
        torch.testing.assert_close(out[i], ref_affine(x[i], matrix), rtol=0, atol=1e-5)


def test_integer_translations_shift_pixels_and_fill_black() -> None:
    x = grid_images(2)
    out = ops.translate_x(x, torch.tensor([3.0, -3.0, 0.0, 16.0]))
    torch.testing.assert_close(out[0, ..., :-3], x[0, ..., 3:], rtol=0, atol=1e-6)
    assert torch.equal(out[0, ..., -3:], torch.zeros(C, H, 3))
    torch.testing.assert_close(out[1, ..., 3:], x[1, ..., :-3], rtol=0, atol=1e-6)
    torch.testing.assert_close(out[2], x[2], rtol=0, atol=1e-6)
    assert torch.equal(out[3], torch.zeros(C, H, W))


@pytest.mark.parametrize("kind", ["color", "contrast", "brightness", "sharpness"])
def test_blends_match_the_per_pixel_definition(kind: str) -> None:
    x = grid_images(3)
    factors = torch.tensor([0.0, 0.4, 1.0, 2.5])
    out = getattr(ops, kind)(x, factors)
    for i in range(N):
        torch.testing.assert_close(out[i], ref_blend(x[i], kind, float(factors[i])), rtol=0, atol=1e-5)
    assert torch.allclose(out[2], x[2], atol=1e-6)  # factor 1 leaves the image as it is


def test_color_leaves_single_channel_images_alone() -> None:
    x = grid_images(channels=1)
    assert torch.allclose(ops.color(x, torch.tensor([0.0, 0.5, 2.0, 9.0])), x)


# --- against Pillow itself ---------------------------------------------------------------------------

def _pillow_cases() -> list[tuple[str, list[float], float]]:
    """(op, per-image values, tolerance in 8-bit levels): Pillow rounds or truncates to 8 bits."""
    return [
        ("autocontrast", [0, 0, 0, 0], 1.0), ("equalize", [0, 0, 0, 0], 0.0),
        ("posterize", [1, 2, 3, 4], 0.0), ("solarize", [256, 200, 128, 1], 0.0),
        ("rotate", [0, 30, -17, 9], 1.0), ("shear_x", [0.3, -0.3, 0.1, -0.05], 1.0),
        ("shear_y", [0.3, -0.3, 0.1, -0.05], 1.0), ("translate_x", [5, -5, 0, 2], 0.0),
        ("translate_y", [5, -5, 0, 2], 0.0),
        # Pillow rounds the grey image to 8 bits first; its error grows with |1 - factor|.
        ("color", [0.2, 1.0, 1.7, 9.0], 5.0), ("contrast", [0.2, 1.0, 1.7, 9.0], 5.0),
        ("brightness", [0.2, 1.0, 1.7, 0.75], 1.0), ("sharpness", [0.2, 1.0, 1.7, 9.0], 5.0),
    ]


@pytest.mark.parametrize("name, values, tolerance", _pillow_cases(), ids=[c[0] for c in _pillow_cases()])
def test_each_primitive_matches_pillow_within_its_8_bit_rounding(name: str, values: list[float],
                                                                  tolerance: float) -> None:
    pil = pytest.importorskip("PIL")
    from PIL import Image, ImageEnhance, ImageOps

    del pil
    x = grid_images(4)
    value = torch.tensor(values, dtype=torch.float64)
    ours = {"autocontrast": lambda: ops.autocontrast(x), "equalize": lambda: ops.equalize(x)}.get(
        name, lambda: getattr(ops, name)(x, value.to(torch.int64) if name == "posterize" else value))()

    def pillow(image: Image.Image, v: float) -> Image.Image:
        bilinear = Image.Resampling.BILINEAR
        affine = Image.Transform.AFFINE
        return {
            "autocontrast": lambda: ImageOps.autocontrast(image), "equalize": lambda: ImageOps.equalize(image),
            "posterize": lambda: ImageOps.posterize(image, int(v)), "solarize": lambda: ImageOps.solarize(image, int(v)),
            "rotate": lambda: image.rotate(v, resample=bilinear),
            "shear_x": lambda: image.transform(image.size, affine, (1, v, 0, 0, 1, 0), resample=bilinear),
            "shear_y": lambda: image.transform(image.size, affine, (1, 0, 0, v, 1, 0), resample=bilinear),
            "translate_x": lambda: image.transform(image.size, affine, (1, 0, v, 0, 1, 0), resample=bilinear),
            "translate_y": lambda: image.transform(image.size, affine, (1, 0, 0, 0, 1, v), resample=bilinear),
            "color": lambda: ImageEnhance.Color(image).enhance(v),
            "contrast": lambda: ImageEnhance.Contrast(image).enhance(v),
            "brightness": lambda: ImageEnhance.Brightness(image).enhance(v),
            "sharpness": lambda: ImageEnhance.Sharpness(image).enhance(v),
        }[name]()

    for i in range(N):
        image = Image.fromarray((x[i] * 255).round().to(torch.uint8).permute(1, 2, 0).numpy())
        result = pillow(image, float(values[i]))
        reference = torch.frombuffer(bytearray(result.tobytes()), dtype=torch.uint8).to(torch.float32)
        reference = reference.view(H, W, C).permute(2, 0, 1)
        difference = (ours[i] * 255 - reference).abs().max().item()
        assert difference <= tolerance + 1e-3, f"{name}[{i}]: {difference:.3f} levels from Pillow"


# --- the severity scale against Composer's formulas ---------------------------------------------------

def composer_magnitude(name: str, severity: float, u_level: float, u_sign: float, u_branch: float,
                       u_factor: float) -> float:
    """Composer's augmentation_primitives with its numpy draws replaced by the given uniforms."""
    level = 0.1 + (severity - 0.1) * u_level  # np.random.uniform(0.1, severity)
    sign = -1 if u_sign > 0.5 else 1
    if name == "posterize":
        return 4 - int(level * 4 / 10)
    if name == "solarize":
        return 256 - int(level * 256 / 10)
    if name == "rotate":
        return int(level * 30 / 10) * sign
    if name in ("shear_x", "shear_y"):
        return float(level) * 0.3 / 10.0 * sign
    if name == "translate_x":
        return int(level * (W / 3) / 10) * sign
    if name == "translate_y":
        return int(level * (H / 3) / 10) * sign
    if name.endswith("_original"):
        return float(level) * 1.8 / 10.0 + 0.1
    if u_branch > 0.5:
        factor = 1 + (severity - 1) * u_factor  # np.random.uniform(1, severity)
    else:
        factor = (1 - 0.09 * severity) + (0.09 * severity) * u_factor  # np.random.uniform(1 - 0.09 * severity, 1)
    return factor * 0.75 if name == "brightness" and factor > 1 else factor


@pytest.mark.parametrize("severity", [0, 3, 9, 10])
def test_magnitudes_follow_composers_severity_scale(severity: float) -> None:
    names = [n for n in {*ops.AUGMENTATION_SETS["all"], *ops.AUGMENTATION_SETS["original"]}
             if n not in ("autocontrast", "equalize")]
    draws = ops.draw_step(200, 13, torch.Generator().manual_seed(severity), torch.device("cpu"))
    for name in names:
        ours = ops.magnitudes(name, draws, severity, H, W)
        for i in range(200):
            expected = composer_magnitude(name, severity, float(draws.level[i]), float(draws.sign[i]),
                                          float(draws.branch[i]), float(draws.factor[i]))
            assert float(ours[i]) == pytest.approx(expected, abs=1e-12), (name, i)


def test_the_ranges_at_full_severity_are_composers() -> None:
    draws = ops.draw_step(4000, 13, torch.Generator().manual_seed(1), torch.device("cpu"))
    rotate = ops.magnitudes("rotate", draws, 10, H, W)
    assert rotate.abs().max() <= 30 and rotate.min() < -20 and rotate.max() > 20
    assert set(ops.magnitudes("posterize", draws, 10, H, W).tolist()) == {1, 2, 3, 4}
    assert ops.magnitudes("translate_x", draws, 10, H, 30).abs().max() <= 10
    contrast = ops.magnitudes("contrast", draws, 9, H, W)
    assert contrast.min() >= 1 - 0.81 and contrast.max() <= 9 and (contrast < 1).float().mean().item() == pytest.approx(0.5, abs=0.05)


# --- one step over a batch ---------------------------------------------------------------------------

PRIMITIVE_OF = {
    "autocontrast": lambda x, v: ops.autocontrast(x), "equalize": lambda x, v: ops.equalize(x),
    "posterize": ops.posterize, "solarize": ops.solarize, "rotate": ops.rotate, "shear_x": ops.shear_x,
    "shear_y": ops.shear_y, "translate_x": ops.translate_x, "translate_y": ops.translate_y, "color": ops.color,
    "contrast": ops.contrast, "brightness": ops.brightness, "sharpness": ops.sharpness,
}


@pytest.mark.parametrize("grouped", [True, False], ids=["grouped", "masked"])
def test_a_step_gives_each_image_its_own_op_as_a_loop_over_images_would(grouped: bool) -> None:
    x = torch.rand(26, C, H, W, generator=torch.Generator().manual_seed(5))
    names = ops.AUGMENTATION_SETS["all"]
    draws = ops.draw_step(26, len(names), torch.Generator().manual_seed(6), torch.device("cpu"))
    active = torch.arange(26) % 5 != 0
    out = ops.augment_step(x, names, draws, 9, active, grouped=grouped)
    assert len(set(draws.choice[active].tolist())) >= 8  # the batch mixes many ops
    for i in range(26):
        if not active[i]:
            assert torch.equal(out[i], x[i])
            continue
        name = names[int(draws.choice[i])]
        value = ops.magnitudes(name, draws, 9, H, W)[i : i + 1]
        torch.testing.assert_close(out[i : i + 1], PRIMITIVE_OF[name](x[i : i + 1], value), rtol=0, atol=1e-6)


# --- mixing weights ------------------------------------------------------------------------------------

def test_dirichlet_rows_sum_to_one_and_beta_has_its_moments() -> None:
    g = torch.Generator().manual_seed(0)
    weights = ops.sample_dirichlet(1.0, 20000, 3, g, torch.device("cpu"))
    torch.testing.assert_close(weights.sum(1), torch.ones(20000, dtype=weights.dtype))
    assert weights.mean(0).tolist() == pytest.approx([1 / 3] * 3, abs=0.01)
    beta = ops.sample_symmetric_beta(1.0, 20000, g, torch.device("cpu"))
    assert beta.mean().item() == pytest.approx(0.5, abs=0.01) and beta.var().item() == pytest.approx(1 / 12, abs=0.004)
    small = ops.sample_symmetric_beta(0.05, 20000, g, torch.device("cpu"))
    assert torch.isfinite(small).all() and ((small < 0.01) | (small > 0.99)).float().mean() > 0.7


# --- layouts and arguments -----------------------------------------------------------------------------

def test_to_batch_reads_uint8_and_single_images_and_gives_them_back() -> None:
    image = torch.randint(0, 256, (3, 5, 7), dtype=torch.uint8)
    batch, restore = ops.to_batch(image, "f")
    assert batch.shape == (1, 3, 5, 7) and batch.dtype == torch.float32
    assert torch.equal(restore(batch), image)
    half = torch.rand(2, 3, 4, 4).to(torch.bfloat16)
    batch, restore = ops.to_batch(half, "f")
    assert batch.dtype == torch.float32 and restore(batch).dtype == torch.bfloat16
    with pytest.raises(TypeError, match=r"f needs floating images in \[0, 1\] or uint8.*int64"):
        ops.to_batch(torch.zeros(1, 3, 4, 4, dtype=torch.int64), "f")
    with pytest.raises(TypeError, match=r"f needs an image tensor.*\(4, 4\)"):
        ops.to_batch(torch.zeros(4, 4), "f")


def test_sets_and_names_are_checked() -> None:
    assert ops.check_augmentation_set("safe", "f") == ops.AUGMENTATION_SETS["safe"]
    assert ops.check_augmentation_set(["rotate", "color"], "f") == ("rotate", "color")
    with pytest.raises(ValueError, match=r"augmentation_set='most'.*\['all', 'original', 'safe'\]"):
        ops.check_augmentation_set("most", "f")
    with pytest.raises(ValueError, match=r"unknown ops \['spin'\]"):
        ops.check_augmentation_set(["rotate", "spin"], "f")
