"""Images in the data (issue 57, the data slice): the generated visual task (deterministic per
(seed, index), answers true by a re-count of the pixels, the blank control), PNG writing, and
the table task's images column (paths and base64 read as uint8 RGB; an image that cannot be
read is one sentence naming the data file, its line and the image, before any compute)."""

import base64
import json
import os

import numpy as np
import pytest

from grpo_jax.data import visual_count
from grpo_jax.data.images import ImageLoadError, load_image, png_bytes, write_png
from grpo_jax.errors import ConfigError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _blobs(mask: np.ndarray) -> int:
  """The number of 8-connected components of a bool mask (a flood fill, independent of the
  generator's own record)."""
  seen = np.zeros_like(mask)
  count = 0
  for start in zip(*np.nonzero(mask)):
    if seen[start]:
      continue
    count += 1
    stack = [start]
    seen[start] = True
    while stack:
      y, x = stack.pop()
      for dy in (-1, 0, 1):
        for dx in (-1, 0, 1):
          ny, nx = y + dy, x + dx
          if 0 <= ny < mask.shape[0] and 0 <= nx < mask.shape[1] and mask[ny, nx] \
              and not seen[ny, nx]:
            seen[ny, nx] = True
            stack.append((ny, nx))
  return count


def test_a_row_is_a_function_of_seed_and_index_alone():
  for variant in visual_count.VARIANTS:
    a = visual_count.make_row(3, 17, variant)
    b = visual_count.make_row(3, 17, variant)
    assert png_bytes(a.image) == png_bytes(b.image) and (a.question, a.answer) == (b.question,
                                                                                   b.answer)
    assert a.image.shape == (64, 64, 3) and a.image.dtype == np.uint8
    others = [visual_count.make_row(s, i, variant).image for s, i in ((4, 17), (3, 18))]
    assert all(not np.array_equal(a.image, o) for o in others)
  # a row does not depend on the rows drawn before it, nor on the other variant's
  first = png_bytes(visual_count.make_row(3, 17).image)
  for i in range(5):
    visual_count.make_row(3, i, "bars")
  assert png_bytes(visual_count.make_row(3, 17).image) == first


def test_count_answers_are_true_by_a_recount_of_the_pixels():
  answers = []
  for index in list(range(60)) + list(visual_count.split_indices("test", 20)):
    row = visual_count.make_row(0, index)
    colour = row.question.split()[2]
    assert row.question == f"How many {colour} shapes are in the image?"
    mask = np.all(row.image == visual_count.COLOURS[colour], axis=-1)
    assert _blobs(mask) == int(row.answer), index
    assert 1 <= len(row.shapes) <= 6 and len({s.colour for s in row.shapes}) <= 3
    painted = np.any(row.image != visual_count.BACKGROUND, axis=-1)
    assert _blobs(painted) == len(row.shapes)  # non-overlapping, none touching
    answers.append(int(row.answer))
  assert set(answers) == {1, 2, 3, 4}


def test_bars_answers_are_true_by_a_measure_of_the_columns():
  for index in range(40):
    row = visual_count.make_row(0, index, "bars")
    painted = np.any(row.image != visual_count.BACKGROUND, axis=-1)
    left, right = painted[:, :32].sum(0).max(), painted[:, 32:].sum(0).max()
    assert row.answer == ("left" if left > right else "right")
    assert abs(int(left) - int(right)) >= 4


def test_blank_images_keep_the_question_and_answer():
  seen = visual_count.make_row(0, 5)
  blank = visual_count.make_row(0, 5, blank=True)
  assert (blank.question, blank.answer) == (seen.question, seen.answer)
  assert np.all(blank.image == visual_count.BLANK_VALUE) and blank.image.shape == (64, 64, 3)
  assert png_bytes(blank.image) == png_bytes(visual_count.make_row(0, 9, blank=True).image)


def test_splits_are_disjoint_index_ranges():
  train, test = visual_count.split_indices("train", 100), visual_count.split_indices("test", 100)
  assert not set(train) & set(test) and train[0] == 0 and test[0] == visual_count.TEST_START
  with pytest.raises(ValueError):
    visual_count.split_indices("dev", 3)


def test_png_round_trips_through_pillow(tmp_path):
  image = visual_count.make_row(1, 2).image
  write_png(str(tmp_path / "a.png"), image)
  np.testing.assert_array_equal(load_image("a.png", str(tmp_path)), image)
  uri = "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()
  np.testing.assert_array_equal(load_image(uri, "/nowhere"), image)
  np.testing.assert_array_equal(load_image({"bytes": png_bytes(image), "path": None}, ""), image)


def test_16_bit_and_transparent_images_read_as_their_pixels(tmp_path):
  """Round 5's V10 and V11: a 16-bit greyscale PNG is scaled to 8 bits (40000 of 65535 -> 156;
  Pillow's convert clipped it to 255), and an image with alpha is composited onto white exactly
  as transformers' convert_to_rgb does (it lost its alpha: a transparent pixel read dark)."""
  from PIL import Image  # noqa: PLC0415
  from transformers.image_transforms import convert_to_rgb  # noqa: PLC0415
  Image.fromarray(np.full((4, 4), 40000, np.uint16)).save(tmp_path / "deep.png")
  assert (load_image("deep.png", str(tmp_path)) == 156).all()
  rgba = np.zeros((4, 4, 4), np.uint8)
  rgba[..., :3] = (10, 20, 30)
  rgba[:, 2:, 3] = 128
  rgba[:, :1, 3] = 0
  rgba[:, 1:2, 3] = 255
  image = Image.fromarray(rgba)
  image.save(tmp_path / "alpha.png")
  got = load_image("alpha.png", str(tmp_path))
  assert got[0, 0].tolist() == [255, 255, 255] and got[0, 1].tolist() == [10, 20, 30]
  np.testing.assert_array_equal(got, np.asarray(convert_to_rgb(image)))
  (tmp_path / "adir.png").mkdir()  # round 5's V04: it was said not to exist
  with pytest.raises(ImageLoadError, match=r"adir.png is a folder, not an image file$"):
    load_image("adir.png", str(tmp_path))


def test_the_docs_samples_are_the_generators_rows():
  for k, index in enumerate((1000002, 1000004)):
    with open(os.path.join(ROOT, "docs", "img", f"visual_count_sample_{k}.png"), "rb") as f:
      assert f.read() == png_bytes(visual_count.make_row(0, index).image)


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
  from tests.hf_fixtures import save_tiny_tokenizer  # noqa: PLC0415
  return save_tiny_tokenizer(str(tmp_path_factory.mktemp("tok")))


def _task(source, tokenizer, **data):
  from grpo_jax.data.table import TableTask  # noqa: PLC0415
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  from grpo_jax.rewards.functions import load_reward_functions  # noqa: PLC0415
  config = get_defaults()
  config.task.name = "table"
  config.data.update(dict(source=str(source), max_prompt_tokens=64, **data))
  config.reward.fns = "answer_number"
  return TableTask(config.data, tokenizer, load_reward_functions(config), 8, log=lambda *_: None)


def test_the_written_task_reads_as_a_table_with_its_images(tmp_path, tokenizer):
  visual_count.write_table(str(tmp_path / "vc"), seed=0, train=6, test=3)
  task = _task(tmp_path / "vc", tokenizer)
  assert len(task.train) == 6 and len(task.test) == 3
  batch = task.test_batch(3)
  for row, images in zip(visual_count.split_indices("test", 3), batch.images):
    expected = visual_count.make_row(0, row)
    assert len(images) == 1 and images[0].dtype == np.uint8
    np.testing.assert_array_equal(images[0], expected.image)
  assert "images" not in task.column_names and batch.gold[0] == visual_count.make_row(
      0, visual_count.TEST_START).answer
  train = task.train_batch(2, 4, seed=1)
  assert len(train.images) == 4 and all(len(i) == 1 for i in train.images)


def test_images_from_base64_and_absolute_paths_and_rows_without(tmp_path, tokenizer):
  image = visual_count.make_row(0, 1).image
  write_png(str(tmp_path / "abs.png"), image)
  uri = "data:image/png;base64," + base64.b64encode(png_bytes(image)).decode()
  rows = [{"prompt": "Count?", "answer": "1", "images": [uri, str(tmp_path / "abs.png")]},
          {"prompt": "No image?", "answer": "2"}] * 5
  (tmp_path / "d").mkdir()
  with open(tmp_path / "d" / "rows.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  task = _task(tmp_path / "d" / "rows.jsonl", tokenizer, test_fraction=0.5)
  every = [item for item in task.train + task.test]
  with_images = [item[4] for item in every if len(item) > 4]
  assert len(with_images) == 5 and all(len(item) == 4 for item in every if item[1] == "2")
  for images in with_images:
    np.testing.assert_array_equal(images[0], image)
    np.testing.assert_array_equal(images[1], image)


@pytest.mark.parametrize("entry, needle", [
    ("images/missing.png", "missing.png does not exist"),
    ("data:image/png;base64,@@@", "is not valid base64"),
    ("data:image/png;base64," + base64.b64encode(b"not a png").decode(),
     "is not a readable image"),
    ("broken.png", "broken.png is not a readable image"),
])
def test_an_image_that_cannot_be_read_is_one_sentence_naming_file_and_row(tmp_path, tokenizer,
                                                                          entry, needle):
  (tmp_path / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
  good = {"prompt": "How many?", "answer": "1"}
  lines = [good] * 4 + [dict(good, images=[entry])] + [good] * 4
  with open(tmp_path / "rows.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in lines)
  with pytest.raises(ConfigError) as raised:
    _task(tmp_path / "rows.jsonl", tokenizer)
  message = str(raised.value)
  assert f"{tmp_path / 'rows.jsonl'}:5 has an image that cannot be read" in message
  assert needle in message and "\n" not in message and message.count(". ") == 0, message
  # skip: the row is dropped and counted, never kept as a text-only row
  task = _task(tmp_path / "rows.jsonl", tokenizer, on_bad_row="skip")
  assert len(task.train) + len(task.test) == 8


def test_an_interrupted_rewrite_leaves_the_previous_table_whole(tmp_path, monkeypatch):
  folder = str(tmp_path / "vc")
  visual_count.write_table(folder, train=3, test=2, variant="count")
  before = {name: (tmp_path / "vc" / name).read_bytes() for name in
            ["train.jsonl", "test.jsonl"] + [f"images/{n}" for n in os.listdir(f"{folder}/images")]}
  calls = []

  def interrupted(path, image):  # Ctrl-C at the third image
    calls.append(path)
    if len(calls) == 3:
      raise KeyboardInterrupt
    write_png(path, image)
  monkeypatch.setattr(visual_count, "write_png", interrupted)
  with pytest.raises(KeyboardInterrupt):
    visual_count.write_table(folder, train=3, test=2, variant="bars")
  after = {name: (tmp_path / "vc" / name).read_bytes() for name in before}
  assert after == before
  assert sorted(os.listdir(folder)) == ["images", "test.jsonl", "train.jsonl"]
  assert len(os.listdir(f"{folder}/images")) == 5  # no temporary file left


def test_an_entry_of_another_kind_is_refused_in_one_sentence():
  with pytest.raises(ImageLoadError, match="is not a path, a data:image"):
    load_image(42, "")


def test_reward_fn_weights_reach_each_function_and_the_weighted_sum(tmp_path, tokenizer,
                                                                   monkeypatch):
  """reward.fns with reward.fn_weights: each loaded function carries its own weight, and the
  table's training reward is their weighted sum (benchmarks/mutation_check.py's
  reward_fn_weights_ignored; the README's learning run alone could not catch it)."""
  from grpo_jax.data import table  # noqa: PLC0415
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  from grpo_jax.rewards.functions import load_reward_functions  # noqa: PLC0415
  visual_count.write_table(str(tmp_path / "vc"), seed=0, train=4, test=2)
  config = get_defaults()
  config.task.name = "table"
  config.data.update(dict(source=str(tmp_path / "vc"), max_prompt_tokens=64))
  config.reward.fns, config.reward.fn_weights = "answer_number,answer_number", "0.5,2"
  functions = load_reward_functions(config)
  assert [f.weight for f in functions] == [0.5, 2.0]
  task = table.TableTask(config.data, tokenizer, functions, 8, log=lambda *_: None)
  scores = iter([np.array([1.0, 0.0, 3.0]), np.array([0.0, 1.0, -1.0])])
  monkeypatch.setattr(table, "call_reward", lambda *args: next(scores))
  got = task.score(task.train_batch(0, 3, 0), np.zeros((3, 2), np.int32), np.ones((3, 2), bool), 1)
  np.testing.assert_allclose(got, [0.5, 2.0, -0.5])
