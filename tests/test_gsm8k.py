"""GSM8K data and scoring, on the real data (../shared/data/gsm8k when present, else the
committed excerpt tests/data/gsm8k) and model-style outputs."""

import json
import os

import pytest

from grpo_jax.errors import InputError
from grpo_jax.data.gsm8k import load_jsonl, load_tfds
from grpo_jax.rewards import gsm8k as R

DATA = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "..", "shared",
                    "data", "gsm8k")


EXCERPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "gsm8k")
FULL = os.path.isfile(os.path.join(DATA, "train.jsonl"))


@pytest.fixture(scope="module")
def train_records():
  return load_jsonl(os.path.join(DATA if FULL else EXCERPT, "train.jsonl"))


def test_the_committed_excerpt_loads_with_gold_answers():
  records = load_jsonl(os.path.join(EXCERPT, "train.jsonl"))
  assert len(records) == 300 and records[0]["gold"] == "72"  # Natalia's clips
  assert len(load_jsonl(os.path.join(EXCERPT, "test.jsonl"))) == 40


@pytest.mark.skipif(not FULL, reason="the full GSM8K is not at ../shared/data/gsm8k (a clone "
                                     "without it: the excerpt test covers loading)")
def test_real_gsm8k_loads_with_gold_answers(train_records):
  test = load_jsonl(os.path.join(DATA, "test.jsonl"))
  assert len(train_records) == 7473 and len(test) == 1319
  assert train_records[0]["gold"] == "72"  # Natalia's clips
  # Every gold answer is a normalised number, and the strict reward of the reference solution
  # itself is 1 (the answer line is "#### <gold>").
  for record in train_records[:500] + test[:500]:
    assert R.normalize_number(record["gold"]) == record["gold"]
    assert R.strict_reward(record["answer"], record["gold"]) == 1.0
  assert any("," in r["answer"].splitlines()[-1] for r in train_records)  # commas occur


@pytest.mark.parametrize("completion,strict,flexible", [
    ("so the total is 1234.\n#### 1,234", "1234", "1,234"),  # flexible keeps the comma
    ("She pays $18.00 in all.", None, "18.00"),
    ("The answer is 18.", None, "18."),
    ("I am not sure.", None, "."),  # verl's loop ends on the only match, '.'
    ("no digits and no dots", None, None),
    ("#### 18\nWait, let me recount: 3 + 4 = 7.", "18", "7."),  # the last number
    ("#### -7", "-7", "-7"),
    ("#### 3.50", "3.50", "3.50"),
    ("#### $5", None, "5"),  # the strict pattern wants digits right after '#### '
])
def test_extraction_is_verls(completion, strict, flexible):
  assert R.extract_strict(completion) == strict
  assert R.extract_flexible(completion) == flexible


# verl's scores, written out by hand from verl/utils/reward_score/gsm8k.py (compute_score with
# format_score 0), for the four kinds of completion where grpo_jax used to score higher, and a
# few where every rule agrees: (completion, gold, verl strict, verl flexible, lenient strict,
# lenient flexible).
VERL_SCORES = [
    ("Total: 6 + 12 = 18.\n#### 18.", "18", 0.0, 0.0, 1.0, 1.0),  # a trailing '.'
    ("So she pays 18 dollars.\n#### 18.00", "18", 0.0, 0.0, 1.0, 1.0),  # '.00'
    ("She earns 1,234 dollars in all", "1234", 0.0, 0.0, 0.0, 1.0),  # flexible: a comma
    ("#### 1,234", "1234", 1.0, 0.0, 1.0, 1.0),  # strict drops commas, flexible does not
    ("The answer is 18. Hope this helps!", "18", 0.0, 0.0, 0.0, 1.0),  # text after it
    ("6 + 12 = 18\n#### 18", "18", 1.0, 1.0, 1.0, 1.0),
    ("#### 18\nso 18 it is", "18", 1.0, 1.0, 1.0, 1.0),
    ("#### -7", "-7", 1.0, 1.0, 1.0, 1.0),
    ("#### 19", "18", 0.0, 0.0, 0.0, 0.0),
    ("I do not know", "18", 0.0, 0.0, 0.0, 0.0),
    ("x" * 300 + "\n#### 18", "18", 1.0, 1.0, 1.0, 1.0),
    ("#### 18\n" + "x" * 300, "18", 0.0, 0.0, 0.0, 0.0),  # beyond the last 300 characters
]


@pytest.mark.parametrize("completion,gold,strict,flexible,lenient_strict,lenient_flexible",
                         VERL_SCORES)
def test_strict_and_flexible_equal_verls_scorer(completion, gold, strict, flexible,
                                                lenient_strict, lenient_flexible):
  assert R.strict_reward(completion, gold) == strict
  assert R.flexible_reward(completion, gold) == flexible
  assert R.strict_lenient_reward(completion, gold) == lenient_strict
  assert R.flexible_lenient_reward(completion, gold) == lenient_flexible


def test_gold_answers_are_verls_preprocessing():
  assert R.gold_answer("She has 1,234 in all.\n#### 1,234") == "1234"
  assert R.gold_answer("3 - 10 = -7\n#### -7") == "-7"
  with pytest.raises(ValueError, match="no '#### <number>'"):
    R.gold_answer("the answer is 7")


def test_only_the_last_300_characters_are_searched():
  early = "#### 42\n" + "x" * 300
  assert R.extract_strict(early) is None and R.extract_strict(early[-300:]) is None
  assert R.extract_strict("x" * 300 + "#### 42") == "42"


def test_scores_and_format_score():
  assert R.strict_reward("#### 1,234", "1234") == 1.0
  assert R.strict_reward("#### 1,235", "1234") == 0.0
  assert R.strict_reward("#### 1,235", "1234", format_score=0.1) == 0.1
  assert R.strict_reward("no answer", "1234", format_score=0.1) == 0.0
  assert R.flexible_reward("The answer is 18", "18") == 1.0
  assert R.format_reward("#### 9", "18") == 1.0 and R.format_reward("9", "18") == 0.0
  with pytest.raises(ValueError, match="reward.name='exact' is unknown; valid: gsm8k_flexible"):
    R.get_reward_function("exact")


def test_malformed_lines_name_file_and_line(tmp_path):
  path = tmp_path / "train.jsonl"
  good = json.dumps({"question": "1+1?", "answer": "2\n#### 2"})
  path.write_text(good + "\n" + "{not json\n")
  with pytest.raises(ValueError, match=rf"{path}:2 is not valid JSON"):
    load_jsonl(str(path))
  path.write_text(good + "\n" + json.dumps({"question": "q"}) + "\n")
  with pytest.raises(ValueError, match=rf"{path}:2 lacks a string 'question' or 'answer'"):
    load_jsonl(str(path))
  path.write_text(json.dumps({"question": "q", "answer": "no marker"}) + "\n")
  with pytest.raises(ValueError, match=rf"{path}:1: GSM8K answer .* has no '#### <number>'"):
    load_jsonl(str(path))
  with pytest.raises(InputError, match="set data.path"):
    load_jsonl(str(tmp_path / "missing.jsonl"))


def test_tfds_fails_fast_offline(tmp_path):
  import time
  start = time.perf_counter()
  with pytest.raises(InputError, match="tfds|tensorflow-datasets"):
    load_tfds("train", data_dir=str(tmp_path))
  assert time.perf_counter() - start < 30  # no minutes of retries


def test_a_folder_without_tokenizer_files_is_refused(tmp_path):
  """transformers returns a 1-token tokenizer for a checkpoint folder without its tokenizer
  files; every prompt would encode to nothing. The loader refuses it in one sentence."""
  from grpo_jax.data.tokenizer import load_hf_tokenizer  # noqa: PLC0415
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  from tests.hf_fixtures import save_tiny_qwen2  # noqa: PLC0415
  path = save_tiny_qwen2(str(tmp_path / "ckpt"))
  assert len(load_hf_tokenizer(path)) > 1  # with its files: accepted
  for name in os.listdir(path):
    if name.startswith("tokenizer") or name == "chat_template.jinja":
      os.remove(os.path.join(path, name))
  with pytest.raises(ConfigError) as err:
    load_hf_tokenizer(path)
  message = str(err.value)
  assert message.startswith(
      f"the tokenizer in model.path={path} cannot encode task text (1 token(s) in its "
      f"vocabulary, 'Natalia sold 48 clips in April.' -> 0 ids -> '', eos id "), message
  assert message.endswith("); the folder needs the checkpoint's tokenizer files "
                          "(tokenizer.json, tokenizer_config.json).")


def test_fetch_writes_jsonl_that_the_task_reads(tmp_path):
  """grpo_jax.data.fetch_gsm8k (its `datasets` loader replaced by the committed excerpt, no
  network): the files it writes load with their gold answers; the recipe's default data.path
  is inside the run's folder, not ../shared."""
  from configs import grpo_gsm8k  # noqa: PLC0415
  from grpo_jax.data.fetch_gsm8k import fetch  # noqa: PLC0415
  splits = {s: load_jsonl(os.path.join(EXCERPT, f"{s}.jsonl")) for s in ("train", "test")}
  asked = []
  fake = lambda name, config: asked.append((name, config)) or splits  # noqa: E731
  counts = fetch(str(tmp_path / "gsm8k"), load_dataset=fake)
  assert asked == [("openai/gsm8k", "main")]
  for split in ("train", "test"):
    written = load_jsonl(str(tmp_path / "gsm8k" / f"{split}.jsonl"))
    assert counts[split] == len(written) == len(splits[split])
    assert [r["question"] for r in written] == [r["question"] for r in splits[split]]
  assert sorted(os.listdir(tmp_path / "gsm8k")) == ["test.jsonl", "train.jsonl"]
  assert grpo_gsm8k.get_config().data.path == "data/gsm8k"
