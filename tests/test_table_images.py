"""task.name="table" rows with images for a vision-language policy (model.vision; issue 57): the
prompt ids equal transformers' Qwen2_5_VLProcessor's for the same chat and image, the patches
equal HF's Qwen2VLImageProcessor's at data.image_size, a missing image file is one sentence
naming it and its row, and a 2-step RL run on such a table samples with the rows' images."""

import json
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
tokenizers = pytest.importorskip("tokenizers")
transformers = pytest.importorskip("transformers")

from grpo_jax.data import visual_count  # noqa: E402
from grpo_jax.errors import InputError  # noqa: E402

SIZE = 32  # data.image_size: the 64 x 64 bars images resized to 32 x 32, a (1, 4, 4) grid
VISION = dict(depth=2, hidden_size=32, intermediate_size=40, num_heads=2, patch_size=8,
              temporal_patch_size=2, spatial_merge_size=2, window_size=32,
              fullatt_block_indexes=[1])
# Qwen2-VL's chat template (its image / video parts and default system message), without the
# "Picture N:" labels.
TEMPLATE = (
    "{% for message in messages %}{% if loop.first and message['role'] != 'system' %}"
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n{% endif %}"
    "<|im_start|>{{ message['role'] }}\n{% if message['content'] is string %}"
    "{{ message['content'] }}<|im_end|>\n{% else %}{% for content in message['content'] %}"
    "{% if content['type'] == 'image' or 'image' in content or 'image_url' in content %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% elif content['type'] == 'video' %}"
    "<|vision_start|><|video_pad|><|vision_end|>{% elif 'text' in content %}"
    "{{ content['text'] }}{% endif %}{% endfor %}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
WORDS = ["<unk>", "<pad>", "system", "user", "assistant", "You", "are", "a", "helpful", ".",
         "Which", "bar", "is", "taller", ",", "the", "left", "one", "or", "right", "?",
         "Natalia", "sold", "48", "clips", "in", "April"]  # (the tokenizer check's probe line)
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>",
            "<|video_pad|>"]


def save_tokenizer(directory):
  """A WordLevel tokenizer over the bars question's words with Qwen2-VL's special tokens and
  chat template (TEMPLATE), saved to `directory`."""
  from transformers import PreTrainedTokenizerFast
  model = tokenizers.models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<unk>")
  tok = tokenizers.Tokenizer(model)
  tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>",
                                 eos_token="<|im_end|>", additional_special_tokens=SPECIALS)
  fast.chat_template = TEMPLATE
  fast.save_pretrained(directory)
  return fast


def save_tiny_vl(directory, tokenizer):
  """A random Qwen2.5-VL beside the tokenizer: its tower has model.vision's patch sizes."""
  from transformers import Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration
  ids = dict(zip(SPECIALS, tokenizer.convert_tokens_to_ids(SPECIALS)))
  text = dict(vocab_size=48, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
              rope_parameters=dict(rope_type="default", rope_theta=10000.0,
                                   mrope_section=[2, 3, 3]),
              eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
              bos_token_id=None)
  torch.manual_seed(0)
  config = Qwen2_5_VLConfig(text_config=text, vision_config=dict(VISION, out_hidden_size=64),
                            image_token_id=ids["<|image_pad|>"],
                            video_token_id=ids["<|video_pad|>"],
                            vision_start_token_id=ids["<|vision_start|>"],
                            vision_end_token_id=ids["<|vision_end|>"], tie_word_embeddings=False)
  Qwen2_5_VLForConditionalGeneration(config).float().save_pretrained(directory)


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
  """(the table folder: 8 + 4 bars rows with PNGs, the VL checkpoint folder, a folder holding
  the tokenizer alone)."""
  table = str(tmp_path_factory.mktemp("bars"))
  visual_count.write_table(table, train=8, test=4, variant="bars")
  model = str(tmp_path_factory.mktemp("tiny_vl"))
  save_tiny_vl(model, save_tokenizer(model))
  tokenizer_only = str(tmp_path_factory.mktemp("tokenizer"))
  save_tokenizer(tokenizer_only)
  return table, model, tokenizer_only


def config_for(table, model, tmp_path, **data):
  """configs/grpo_vision_tiny.py's model section over a table of image rows."""
  import importlib.util  # noqa: PLC0415
  from grpo_jax.defaults import get_defaults  # noqa: PLC0415
  path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs",
                      "grpo_vision_tiny.py")
  spec = importlib.util.spec_from_file_location("grpo_vision_tiny", path)
  recipe = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(recipe)
  config = recipe.get_config()
  config.task = get_defaults().task
  config.task.name = "table"
  config.model.path = model
  rewards = tmp_path / "side_reward.py"
  rewards.write_text("def side(prompts, completions, answer, **columns):\n"
                     "  return [float(a in c) for a, c in zip(answer, completions)]\n")
  config.reward.fns = f"{rewards}:side"
  config.data.update(dict(dict(source=table, image_size=SIZE, max_prompt_tokens=64), **data))
  return config


def build(config):
  from grpo_jax.train.run.setup import build_task  # noqa: PLC0415
  return build_task(config, log=lambda *_: None)


def _rows(table, split="test"):
  with open(os.path.join(table, f"{split}.jsonl")) as f:
    return [json.loads(line) for line in f]


def _images(table, rows):
  from grpo_jax.data.images import load_image  # noqa: PLC0415
  return [load_image(r["images"][0], table) for r in rows]


def _hf_processor(model):
  """transformers' Qwen2_5_VLProcessor over our tokenizer and Qwen2VLImageProcessor (its Pillow
  backend) at SIZE x SIZE pixels, offline; its video-processor class check skipped for None."""
  from transformers import AutoTokenizer, Qwen2_5_VLProcessor, Qwen2VLImageProcessorPil

  class ImagesOnlyProcessor(Qwen2_5_VLProcessor):
    def check_argument_for_proper_class(self, name, argument):
      if argument is not None:
        return super().check_argument_for_proper_class(name, argument)

  images = Qwen2VLImageProcessorPil(patch_size=8, merge_size=2, temporal_patch_size=2,
                                    min_pixels=SIZE * SIZE, max_pixels=SIZE * SIZE)
  return ImagesOnlyProcessor(image_processor=images, video_processor=None,
                             tokenizer=AutoTokenizer.from_pretrained(model),
                             chat_template=TEMPLATE)


def test_prompts_and_patches_equal_the_hf_processors(folders, tmp_path):
  table, model, _ = folders
  task = build(config_for(table, model, tmp_path))
  assert task.image_grid == (1, SIZE // 8, SIZE // 8)
  rows = _rows(table)
  batch = task.test_batch(len(rows))
  processor = _hf_processor(model)
  assert task.image_token_id == processor.image_token_id
  messages = [[{"role": "user", "content": [{"type": "image"}, {"type": "text",
                                                                 "text": r["prompt"]}]}]
              for r in rows]
  texts = [processor.apply_chat_template(m, tokenize=False, add_generation_prompt=True)
           for m in messages]
  hf = processor(text=texts, images=_images(table, rows), return_tensors="np")
  mask = np.asarray(batch.prompt_mask)
  for i in range(len(rows)):  # (a) the prompt ids: the same rendering and expansion
    np.testing.assert_array_equal(np.asarray(batch.prompt_tokens)[i][mask[i]],
                                  hf["input_ids"][i])
  assert int((hf["input_ids"][0] == task.image_token_id).sum()) == 4  # (4 x 4 patches) / 2^2
  # (b) the patches: HF's image processor on the 64 x 64 images at data.image_size
  np.testing.assert_array_equal(hf["image_grid_thw"], [task.image_grid] * len(rows))
  assert batch.pixel_values.shape == (len(rows), 16, 3 * 2 * 8 * 8)
  assert batch.pixel_values.dtype == np.float32
  np.testing.assert_array_equal(batch.pixel_values.reshape(-1, 384), hf["pixel_values"])
  assert batch.user_text[0] == rows[0]["prompt"] and batch.gold[0] == rows[0]["answer"]


def test_a_random_towers_patch_sizes_come_from_model_vision(folders, tmp_path):
  """Without a VL config.json under model.path, model.vision's patch sizes set the grid."""
  table, model, tokenizer_only = folders
  from_checkpoint = build(config_for(table, model, tmp_path)).test_batch(2)
  task = build(config_for(table, tokenizer_only, tmp_path))
  batch = task.test_batch(2)
  assert task.image_grid == (1, 4, 4)
  np.testing.assert_array_equal(batch.prompt_tokens, from_checkpoint.prompt_tokens)
  np.testing.assert_array_equal(batch.pixel_values, from_checkpoint.pixel_values)
  config = config_for(table, tokenizer_only, tmp_path)
  config.model.vision.patch_size = 4
  task = build(config)
  assert task.image_grid == (1, 8, 8) and task.test_batch(1).pixel_values.shape == (1, 64, 96)
  # The policy over a folder holding only the tokenizer: model.vision's random tower, model's
  # random decoder (a vocabulary that covers the tokenizer), fitted to the task's grid.
  import jax  # noqa: PLC0415
  from grpo_jax import config as config_lib  # noqa: PLC0415
  from grpo_jax.train.run.sections import ModelSection  # noqa: PLC0415
  from grpo_jax.train.run.setup import build_model  # noqa: PLC0415
  config_lib.validate(config)
  cfg, params = build_model(ModelSection.of(config), jax.random.key(0), task)
  assert cfg.image_grid == (1, 8, 8) and cfg.vision.patch_size == 4
  assert cfg.image_token_id == task.image_token_id
  assert cfg.text.hidden_size == config.model.hidden_size and "vision" in params


def test_text_tables_have_no_images_without_model_vision(folders, tmp_path):
  table, model, _ = folders
  config = config_for(table, model, tmp_path)
  del config.model["vision"]
  task = build(config)
  batch = task.test_batch(2)
  assert batch.pixel_values is None and not hasattr(task, "image_grid")
  ids = np.asarray(batch.prompt_tokens)[0][np.asarray(batch.prompt_mask)[0]]
  text = task.tokenizer.decode(ids)
  assert "<|image_pad|>" not in text and batch.images[0][0].shape == (64, 64, 3)


def _write_rows(folder, rows):
  os.makedirs(folder, exist_ok=True)
  for split in ("train", "test"):
    with open(os.path.join(folder, f"{split}.jsonl"), "w") as f:
      f.write("".join(json.dumps(r) + "\n" for r in rows))


def test_a_missing_image_or_not_one_image_is_one_sentence(folders, tmp_path):
  table, model, _ = folders
  rows = [dict(r, images=[os.path.join(table, r["images"][0])]) for r in _rows(table, "train")[:2]]
  broken = tmp_path / "broken"
  _write_rows(broken, [rows[0], dict(rows[1], images=["gone.png"])])
  with pytest.raises(InputError) as e:  # (c)
    build(config_for(str(broken), model, tmp_path))
  message = str(e.value)
  assert message.startswith(f"{broken}/train.jsonl:2 has an image that cannot be read (image "
                            f"file {broken}/gone.png does not exist); fix the row")
  assert message.count(". ") == 0 and message.endswith(".")
  for images, count in (([], 0), ([rows[0]["images"][0]] * 2, 2)):
    _write_rows(broken, [rows[0], dict(rows[1], images=images)])
    with pytest.raises(InputError, match=rf"train.jsonl:2 has {count} images; a vision-language "
                       r"policy \(model.vision\) takes exactly one image per row"):
      build(config_for(str(broken), model, tmp_path))


def test_an_image_size_off_the_patch_grid_is_one_sentence(folders, tmp_path):
  from grpo_jax.errors import ConfigError  # noqa: PLC0415
  table, model, _ = folders
  with pytest.raises(ConfigError, match=r"data.image_size=40 is not a positive multiple of "
                     r"patch_size \* spatial_merge_size = 16; set it to e.g. 32"):
    build(config_for(table, model, tmp_path, image_size=40))


def test_two_rl_steps_sample_with_the_rows_images(folders, tmp_path, monkeypatch):
  from grpo_jax.train.sources import collect  # noqa: PLC0415
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  table, model, _ = folders
  config = config_for(table, model, tmp_path)
  config.rollout.update(num_prompts=2, group_size=2, max_new_tokens=2)
  config.train.update(steps=2, eval_every=2, eval_size=4, eval_batch_size=4,
                      checkpoint_every=0, num_samples=0)
  seen = []
  score_round = collect.score_round

  def recording(task, prompts, rollout, *args, **kwargs):
    seen.append((np.asarray(prompts.pixel_values), np.asarray(rollout.images)))
    return score_round(task, prompts, rollout, *args, **kwargs)
  monkeypatch.setattr(collect, "score_round", recording)
  train(config, str(tmp_path / "run"), log=lambda *a, **k: None)
  assert len(seen) == 2  # one sampling round per step
  for pixel_values, images in seen:  # each completion row carries its prompt's image
    assert pixel_values.shape == (2, 16, 384)
    np.testing.assert_array_equal(images, np.repeat(pixel_values, 2, axis=0))
  with open(tmp_path / "run" / "metrics.jsonl") as f:
    records = [json.loads(line) for line in f]
  assert any("eval_accuracy" in r for r in records)
