"""A generated visual question whose answer needs the image: 64x64 RGB images of
coloured squares and discs, "How many <colour> shapes?", and the integer answer; or two bars,
"Which bar is taller, left or right?". Pure NumPy, deterministic from (seed, index).

Row `index` of seed `seed` draws everything from its own generator,
np.random.default_rng([seed, index, VARIANT_IDS[variant]]), so a row never depends on which
other rows are drawn or in what order. The training split is indices [0, TEST_START), the
held-out split [TEST_START, 2 * TEST_START): `split_indices`.

count: 2 or 3 colours of COLOURS are drawn for the image, the first of them asked about; the
  answer a is uniform in 1..4 (so a policy blind to the image scores 1/4 at best), and 0..2
  more shapes take the other colours: 1-6 shapes in all, each a square of side 2r+1 or a disc
  of radius r, r in 3..6. Shapes are placed by rejection so that their boxes are at least GAP
  pixels apart, hence each shape is one connected blob of exactly its colour.
bars: two vertical bars of different heights (at least 4 pixels apart) and random colours; the
  answer is "left" or "right".
blank=True keeps the question and answer but replaces the image by BLANK_VALUE everywhere: the
control under which a policy can do no better than the answers' prior.

`write_table` writes rows as {split}.jsonl + PNG files, a folder task.name='table' reads
(data.source=<folder>): python -m grpo_jax.data.visual_count --out DIR [--variant bars].
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

import numpy as np

from grpo_jax.data.images import write_png

SIZE = 64
TEST_START = 1_000_000
GAP = 2  # pixels between the boxes of two shapes
BACKGROUND = (245, 245, 245)
BLANK_VALUE = 128
COLOURS = {"red": (220, 30, 30), "green": (30, 160, 50), "blue": (30, 70, 220),
           "yellow": (230, 200, 20)}
VARIANT_IDS = {"count": 0, "bars": 1}
SPLITS = {"train": 0, "test": TEST_START}


@dataclasses.dataclass(frozen=True)
class Shape:
  kind: str  # "square" or "disc"
  colour: str
  y: int  # centre row
  x: int  # centre column
  r: int  # half side / radius


@dataclasses.dataclass
class VisualRow:
  image: np.ndarray  # (SIZE, SIZE, 3) uint8
  question: str
  answer: str
  shapes: tuple  # the drawn shapes (Shape for count; for bars (left height, right height))


def shape_mask(shape: Shape, size: int = SIZE) -> np.ndarray:
  """(size, size) bool: a square |dy|, |dx| <= r, or a disc dy^2 + dx^2 <= r^2 + r (about
  (r + 1/2)^2: round, within the square), around (y, x)."""
  yy, xx = np.mgrid[:size, :size]
  dy, dx = yy - shape.y, xx - shape.x
  if shape.kind == "square":
    return (np.abs(dy) <= shape.r) & (np.abs(dx) <= shape.r)
  return dy * dy + dx * dx <= shape.r * shape.r + shape.r


def _apart(a: Shape, b: Shape) -> bool:
  """The boxes [c - r, c + r] of a and b are at least GAP pixels apart along some axis."""
  return (abs(a.y - b.y) > a.r + b.r + GAP) or (abs(a.x - b.x) > a.r + b.r + GAP)


def _place(rng, colours: list) -> list:
  """One shape of each of `colours`, with boxes inside the image and pairwise apart (by
  rejection; a draw that cannot fit restarts the whole image, from the same generator)."""
  while True:
    shapes = []
    for _ in range(200):
      r = int(rng.integers(3, 7))
      shape = Shape(str(rng.choice(["square", "disc"])), colours[len(shapes)],
                    int(rng.integers(r, SIZE - r)), int(rng.integers(r, SIZE - r)), r)
      if all(_apart(shape, other) for other in shapes):
        shapes.append(shape)
        if len(shapes) == len(colours):
          return shapes


def count_row(rng) -> VisualRow:
  """A count question (module docstring) from the row's generator."""
  colours = [str(c) for c in rng.permutation(list(COLOURS))[:int(rng.integers(2, 4))]]
  asked, answer = colours[0], int(rng.integers(1, 5))
  others = [str(rng.choice(colours[1:])) for _ in range(int(rng.integers(0, 3)))]
  shapes = _place(rng, [asked] * answer + others)
  image = np.full((SIZE, SIZE, 3), BACKGROUND, np.uint8)
  for shape in shapes:
    image[shape_mask(shape)] = COLOURS[shape.colour]
  return VisualRow(image, f"How many {asked} shapes are in the image?", str(answer),
                   tuple(shapes))


def bars_row(rng) -> VisualRow:
  """A bars question (module docstring): bars 12 pixels wide at columns 12 and 40, heights in
  [8, 56] differing by at least 4, each coloured from COLOURS."""
  while True:
    heights = rng.integers(8, 57, size=2)
    if abs(int(heights[0]) - int(heights[1])) >= 4:
      break
  names = list(COLOURS)
  image = np.full((SIZE, SIZE, 3), BACKGROUND, np.uint8)
  for left, height in zip((12, 40), heights):
    image[SIZE - 4 - int(height):SIZE - 4, left:left + 12] = COLOURS[str(rng.choice(names))]
  answer = "left" if heights[0] > heights[1] else "right"
  return VisualRow(image, "Which bar is taller, the left one or the right one?", answer,
                   (int(heights[0]), int(heights[1])))


VARIANTS = {"count": count_row, "bars": bars_row}


def make_row(seed: int, index: int, variant: str = "count", blank: bool = False) -> VisualRow:
  """Row `index` of `variant` under `seed` (module docstring); blank: the image replaced by
  BLANK_VALUE everywhere, question and answer kept."""
  if variant not in VARIANTS:
    raise ValueError(f"variant={variant!r} is unknown; valid: {', '.join(VARIANTS)}")
  row = VARIANTS[variant](np.random.default_rng([seed, index, VARIANT_IDS[variant]]))
  if blank:
    row.image = np.full((SIZE, SIZE, 3), BLANK_VALUE, np.uint8)
  return row


def split_indices(split: str, count: int) -> range:
  """The first `count` row indices of a split: train [0, ...), test [TEST_START, ...)."""
  if split not in SPLITS or not 0 <= count <= TEST_START:
    raise ValueError(f"split={split!r}, count={count}; valid splits {', '.join(SPLITS)} with "
                     f"at most {TEST_START} rows")
  return range(SPLITS[split], SPLITS[split] + count)


def write_table(folder: str, seed: int = 0, train: int = 1000, test: int = 200,
                variant: str = "count", blank: bool = False) -> dict:
  """{split: jsonl path}: folder/{train,test}.jsonl, one {"prompt", "answer", "images":
  ["images/<split>_<index>.png"]} line per row, with the PNGs under folder/images/. Every file
  is written under a temporary name and renamed over the old one (the PNGs first) once all
  are written: an interrupted rewrite leaves the folder's previous table whole."""
  os.makedirs(os.path.join(folder, "images"), exist_ok=True)
  paths, images = {}, []
  try:
    for split, count in (("train", train), ("test", test)):
      paths[split] = os.path.join(folder, f"{split}.jsonl")
      with open(paths[split] + ".tmp", "w") as f:
        for index in split_indices(split, count):
          row = make_row(seed, index, variant, blank)
          name = f"images/{split}_{index:07d}.png"
          images.append(os.path.join(folder, name))
          write_png(images[-1] + ".tmp", row.image)
          f.write(json.dumps({"prompt": row.question, "answer": row.answer,
                              "images": [name]}) + "\n")
  except BaseException:
    for path in images + list(paths.values()):
      if os.path.exists(path + ".tmp"):
        os.remove(path + ".tmp")
    raise
  for path in images + list(paths.values()):
    os.replace(path + ".tmp", path)
  return paths


def main(argv=None) -> None:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="the folder to write")
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--train", type=int, default=1000, help="training rows")
  parser.add_argument("--test", type=int, default=200, help="held-out rows")
  parser.add_argument("--variant", choices=sorted(VARIANTS), default="count")
  parser.add_argument("--blank", action="store_true", help="constant images (the control)")
  args = parser.parse_args(argv)
  paths = write_table(args.out, args.seed, args.train, args.test, args.variant, args.blank)
  print(f"wrote {args.train} + {args.test} rows: {paths['train']}, {paths['test']}")


if __name__ == "__main__":
  main()
