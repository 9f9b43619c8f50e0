"""Images of data rows: reading one (a path, a data URI, bytes, a `datasets` Image feature) into a
uint8 RGB array, and writing PNG files byte for byte the same on every machine.

Reading decodes with Pillow (a dependency of matplotlib, so installed with grpo_jax); without it
every image is refused in one sentence. Writing is pure NumPy + zlib (`png_bytes`): the PNG
spec's 8-bit RGB, non-interlaced, filter 0 on every scanline, one IDAT chunk, zlib level 9.
"""

from __future__ import annotations

import base64
import binascii
import io
import os
import struct
import zlib

import numpy as np

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
DATA_URI_PREFIX = "data:image/"


class ImageLoadError(ValueError):
  """An image of a row that cannot be read; the message names it and why (no trailing period)."""


def _chunk(kind: bytes, body: bytes) -> bytes:
  """One PNG chunk: length (big-endian u32), type, body, CRC-32 of type + body."""
  return struct.pack(">I", len(body)) + kind + body + struct.pack(
      ">I", zlib.crc32(kind + body) & 0xFFFFFFFF)


def png_bytes(image: np.ndarray) -> bytes:
  """The PNG file of an (H, W, 3) uint8 image: IHDR (W, H, bit depth 8, colour type 2 = RGB,
  compression 0, filter 0, interlace 0), one IDAT of zlib(level 9) over the scanlines each
  prefixed by filter byte 0, IEND. Deterministic: the same array gives the same bytes."""
  image = np.asarray(image)
  if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
    raise ValueError(f"png_bytes takes an (H, W, 3) uint8 image, not {image.dtype} "
                     f"{image.shape}")
  height, width = image.shape[:2]
  rows = np.concatenate([np.zeros((height, 1), np.uint8), image.reshape(height, width * 3)], 1)
  header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
  return (PNG_SIGNATURE + _chunk(b"IHDR", header)
          + _chunk(b"IDAT", zlib.compress(rows.tobytes(), 9)) + _chunk(b"IEND", b""))


def write_png(path: str, image: np.ndarray) -> None:
  """`png_bytes(image)` written to path."""
  with open(path, "wb") as f:
    f.write(png_bytes(image))


def to_rgb(image) -> np.ndarray:
  """(H, W, 3) uint8 RGB of a PIL image, as transformers' `convert_to_rgb` (the Qwen2-VL image
  processor's first step) makes it: an image with an alpha channel composited onto white (a
  transparent pixel is white, not its hidden colour), every other mode converted.
  One deliberate difference: 16-bit greyscale is scaled to 8 bits (v / 257), where Pillow's
  convert, and so transformers, clips every value above 255 to white."""
  from PIL import Image  # noqa: PLC0415
  if image.mode.startswith("I;16") or image.mode == "I":
    grey = np.asarray(image).astype(np.float64)
    scale = 257.0 if image.mode.startswith("I;16") or grey.max(initial=0) <= 65535 else 16843009.0
    grey = np.clip(np.round(grey / scale), 0, 255).astype(np.uint8)
    return np.repeat(grey[..., None], 3, axis=-1)
  if image.mode == "RGB":
    return np.asarray(image, np.uint8)
  rgba = image.convert("RGBA")
  white = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
  return np.asarray(Image.alpha_composite(white, rgba).convert("RGB"), np.uint8)


def decode_image(data: bytes, what: str) -> np.ndarray:
  """(H, W, 3) uint8 RGB of an encoded image (any format Pillow reads); `what` names it in the
  ImageLoadError raised when it cannot be read."""
  try:
    from PIL import Image  # noqa: PLC0415  (matplotlib's dependency)
  except ImportError:
    raise ImageLoadError(f"image {what} cannot be decoded: Pillow is not installed "
                         f"(pip install pillow)") from None
  try:
    with Image.open(io.BytesIO(data)) as opened:
      return to_rgb(opened)
  except Exception as e:  # noqa: BLE001  PIL raises many kinds for unreadable bytes
    raise ImageLoadError(f"image {what} is not a readable image (Pillow: {type(e).__name__})"
                         ) from None


def _b64(text: str, what: str) -> bytes:
  try:
    return base64.b64decode(text, validate=True)
  except (binascii.Error, ValueError):
    raise ImageLoadError(f"image {what} is not valid base64") from None


def load_image(value, base_dir: str) -> np.ndarray:
  """(H, W, 3) uint8 RGB of one entry of a row's images column:
    * a path (str): relative to base_dir (the data file's folder) unless absolute;
    * a data URI "data:image/<type>;base64,<bytes>";
    * bytes (a Parquet / datasets binary column);
    * a dict {"bytes": bytes or base64 text, "path": ...} (a `datasets` Image feature; its path
      is read when bytes is empty);
    * a PIL image (a decoded `datasets` Image feature).
  Anything else, a missing file or unreadable bytes raise ImageLoadError naming it."""
  if isinstance(value, str) and value.startswith(DATA_URI_PREFIX):
    what = f"data URI {value[:30]!r}"
    head, _, body = value.partition(",")
    if not head.endswith(";base64"):
      raise ImageLoadError(f"image {what} is a data URI without ';base64,'")
    return decode_image(_b64(body, what), what)
  if isinstance(value, str):
    path = value if os.path.isabs(value) else os.path.join(base_dir, value)
    if os.path.isdir(path):  # a folder is named as a folder, not as missing
      raise ImageLoadError(f"image file {path} is a folder, not an image file")
    if not os.path.isfile(path):
      raise ImageLoadError(f"image file {path} does not exist")
    with open(path, "rb") as f:
      return decode_image(f.read(), f"file {path}")
  if isinstance(value, (bytes, bytearray)):
    return decode_image(bytes(value), f"of {len(value)} bytes")
  if isinstance(value, dict) and ("bytes" in value or "path" in value):
    data = value.get("bytes")
    if data:
      what = f"bytes of {value.get('path') or 'a datasets Image'}"
      return decode_image(_b64(data, what) if isinstance(data, str) else bytes(data), what)
    if value.get("path"):
      return load_image(str(value["path"]), base_dir)
  if hasattr(value, "convert") and hasattr(value, "size"):  # a PIL image
    return to_rgb(value)
  raise ImageLoadError(f"image entry {str(value)[:40]!r} ({type(value).__name__}) is not a "
                       f"path, a data:image/...;base64 URI, bytes or a {{'bytes', 'path'}} "
                       f"object")


def image_dir(source: str) -> str:
  """The folder relative image paths are read from: data.source when it is a folder, else the
  folder of the data file (the working directory for a hub id)."""
  if os.path.isdir(source):
    return source
  return os.path.dirname(os.path.abspath(source)) if os.path.isfile(source) else os.getcwd()


def load_row_images(value, base_dir: str) -> list:
  """[(H, W, 3) uint8] of a row's images column: a list of entries (load_image), or one entry
  alone; None or an empty list is a row without images."""
  if value is None:
    return []
  entries = value if isinstance(value, (list, tuple)) else [value]
  return [load_image(entry, base_dir) for entry in entries]
