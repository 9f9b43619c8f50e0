"""Qwen2.5-VL's text side against transformers: mRoPE positions and their decode continuation,
the mRoPE rotation, the placeholder expansion (against Qwen2_5_VLProcessor) and the merge of the
image features into the text embeddings (issue 57)."""

import types

import jax
import numpy as np
import pytest

from grpo_jax.errors import ConfigError
from grpo_jax.models import rope
from grpo_jax.models.attention import rotary_embedding
from grpo_jax.models.vision import mrope, placeholders

torch = pytest.importorskip("torch")
qwen = pytest.importorskip("transformers.models.qwen2_5_vl.modeling_qwen2_5_vl")

PAD, START, IMAGE, END = 1, 8, 9, 10
MERGE = 2
GRIDS = np.array([[1, 4, 6], [1, 8, 4], [1, 6, 6]])  # 6, 8 and 9 image tokens


def _hf_model_stub(rope_deltas=None):
  """The attributes Qwen2_5_VLModel.get_rope_index / compute_3d_position_ids read, so HF's own
  code runs without building a model."""
  stub = types.SimpleNamespace(
      config=types.SimpleNamespace(vision_config=types.SimpleNamespace(
          spatial_merge_size=MERGE, tokens_per_second=2)),
      rope_deltas=rope_deltas)
  stub.get_vision_position_ids = lambda *a, **k: qwen.Qwen2_5_VLModel.get_vision_position_ids(
      stub, *a, **k)
  stub.get_rope_index = lambda *a, **k: qwen.Qwen2_5_VLModel.get_rope_index(stub, *a, **k)
  return stub


def _image(n):
  return [START] + [IMAGE] * n + [END]


def _batch():
  """Left-padded rows: two images with text between, one image, text only, image first."""
  rows = [[2, 3] + _image(6) + [5] + _image(8) + [6, 7],
          [4, 2, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3],
          [2] + _image(9) + [6]]
  width = max(map(len, rows)) + 1
  ids = np.array([[PAD] * (width - len(r)) + r for r in rows])
  mask = np.array([[0] * (width - len(r)) + [1] * len(r) for r in rows])
  return ids, mask


def _hf_rope_index(ids, mask, grids):
  ids_t = torch.tensor(ids)
  position_ids, deltas = qwen.Qwen2_5_VLModel.get_rope_index(
      _hf_model_stub(), ids_t, mm_token_type_ids=(ids_t == IMAGE).int(),
      image_grid_thw=torch.tensor(grids), attention_mask=torch.tensor(mask))
  return position_ids.numpy(), deltas.numpy()


def test_positions_and_deltas_equal_get_rope_index_with_left_padding():
  ids, mask = _batch()
  positions, deltas = mrope.mrope_position_ids(ids, GRIDS, mask, image_token_id=IMAGE,
                                               merge_size=MERGE)
  hf_positions, hf_deltas = _hf_rope_index(ids, mask, GRIDS)
  np.testing.assert_array_equal(positions, hf_positions)
  np.testing.assert_array_equal(deltas, hf_deltas)
  assert deltas[1, 0] == 0 and deltas[0, 0] < 0  # text-only row; images shorten positions


def test_decode_positions_continue_like_hf_with_a_cache():
  ids, mask = _batch()
  _, deltas = mrope.mrope_position_ids(ids, GRIDS, mask, image_token_id=IMAGE, merge_size=MERGE)
  steps = np.arange(4)
  ours = np.asarray(mrope.decode_position_ids(deltas, mask.sum(1), steps))
  stub = _hf_model_stub(rope_deltas=torch.tensor(deltas))
  for k in steps:
    full_mask = torch.tensor(np.concatenate([mask, np.ones((len(ids), k + 1), int)], axis=1))
    cache = types.SimpleNamespace(get_seq_length=lambda: ids.shape[1] + int(k))
    hf = qwen.Qwen2_5_VLModel.compute_3d_position_ids(
        stub, input_ids=None, image_grid_thw=None, video_grid_thw=None,
        inputs_embeds=torch.zeros(len(ids), 1, 4), attention_mask=full_mask, cache=cache)
    np.testing.assert_array_equal(ours[:, :, k], hf[:, :, -1].numpy())
  positions, _ = mrope.mrope_position_ids(ids, GRIDS, mask, image_token_id=IMAGE,
                                          merge_size=MERGE)
  np.testing.assert_array_equal(ours[0, :, 0], positions.max(axis=(0, 2)) + 1)


def test_mismatched_images_are_config_errors():
  ids, mask = _batch()
  with pytest.raises(ConfigError, match="more image placeholder runs"):
    mrope.mrope_position_ids(ids, GRIDS[:2], mask, image_token_id=IMAGE, merge_size=MERGE)
  with pytest.raises(ConfigError, match="needs 12 consecutive"):
    mrope.mrope_position_ids(ids, [[1, 4, 12], *GRIDS[1:]], mask, image_token_id=IMAGE)
  with pytest.raises(ConfigError, match="fewer placeholder runs"):
    mrope.mrope_position_ids(ids, [*GRIDS, [1, 2, 2]], mask, image_token_id=IMAGE)
  with pytest.raises(ConfigError, match="mrope_section"):
    mrope.mrope_frequency_axes([2, 3, 2], 16)


def test_adjacent_images_each_take_their_own_grid():
  ids = np.array([[2] + [IMAGE] * 6 + [IMAGE] * 8 + [3]])
  positions, deltas = mrope.mrope_position_ids(ids, GRIDS[:2], image_token_id=IMAGE)
  first, second = mrope.vision_position_ids(1, GRIDS[0], MERGE), mrope.vision_position_ids(
      4, GRIDS[1], MERGE)
  np.testing.assert_array_equal(positions[:, 0, 1:15], np.concatenate([first, second], 1))
  assert positions[0, 0, 15] == 8 and deltas[0, 0] == 9 - 16


def _hf_rotate(q, k, positions, theta, section):
  """HF's rotated (q, k) and the inverse frequencies its rotary embedding computed."""
  head_dim = q.shape[-1]
  config = qwen.Qwen2_5_VLTextConfig(
      hidden_size=head_dim * 2, num_attention_heads=2, num_key_value_heads=1,
      rope_parameters={"rope_type": "default", "rope_theta": theta, "mrope_section": section})
  rotary = qwen.Qwen2_5_VLRotaryEmbedding(config)
  q_t, k_t = (torch.tensor(np.asarray(a)).transpose(1, 2) for a in (q, k))
  cos, sin = rotary(q_t, torch.tensor(np.asarray(positions)))
  q_hf, k_hf = qwen.apply_rotary_pos_emb(q_t, k_t, cos, sin)
  return (q_hf.transpose(1, 2).numpy(), k_hf.transpose(1, 2).numpy()), rotary.inv_freq.numpy()


def test_mrope_rotation_equals_hf_within_1e6():
  """Random q/k, at image positions with models/rope.py's frequencies and at random positions
  up to 4096 with HF's float32 ones (rope.py's are float64 rounded once, 1 ulp apart from HF's
  on some frequencies: 4e-5 apart at position 4096, 2e-7 at the positions of these images)."""
  ids, mask = _batch()
  batch, length, head_dim, theta, section = *ids.shape, 16, 1_000_000.0, [2, 3, 3]
  keys = jax.random.split(jax.random.key(0), 3)
  q = jax.random.normal(keys[0], (batch, length, 2, head_dim))
  k = jax.random.normal(keys[1], (batch, length, 1, head_dim))
  image_positions, _ = mrope.mrope_position_ids(ids, GRIDS, mask, image_token_id=IMAGE)
  random_positions = np.asarray(jax.random.randint(keys[2], (3, batch, length), 0, 4096))
  ours_inv_freq, factor = rope.rope_frequencies("default", {}, theta, head_dim, 0)
  for positions, use_hf_frequencies in ((image_positions, False), (random_positions, True)):
    want, hf_inv_freq = _hf_rotate(q, k, positions, theta, section)
    inv_freq = hf_inv_freq if use_hf_frequencies else ours_inv_freq
    rotate = jax.jit(mrope.apply_mrope, static_argnums=(2, 3, 4))
    ours = [rotate(x, positions, tuple(inv_freq.tolist()), tuple(section), factor)
            for x in (q, k)]
    for got, expected in zip(ours, want):
      np.testing.assert_allclose(np.asarray(got), expected, atol=1e-6, rtol=0)


def test_text_only_positions_are_plain_rope():
  x = jax.random.normal(jax.random.key(1), (2, 5, 2, 16))
  positions = np.tile(np.arange(5), (2, 1))
  inv_freq, _ = rope.rope_frequencies("default", {}, 10_000.0, 16, 0)
  got = mrope.apply_mrope(x, np.broadcast_to(positions, (3, 2, 5)), inv_freq, [2, 3, 3])
  np.testing.assert_allclose(got, rotary_embedding(x, positions, 10_000.0, inv_freq), atol=1e-6)


def _processor():
  """Qwen2_5_VLProcessor over a WordLevel tokenizer with Qwen's vision special tokens and
  Qwen2VLImageProcessor, all offline. The processor's class check of its video processor is
  skipped for None (no video processor without torchvision; images only here)."""
  tokenizers = pytest.importorskip("tokenizers")
  from transformers import PreTrainedTokenizerFast, Qwen2VLImageProcessor, Qwen2_5_VLProcessor

  words = ["<unk>", "<pad>", "what", "is", "this", "and", "?", "compare"]
  model = tokenizers.models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>")
  tokenizer = tokenizers.Tokenizer(model)
  tokenizer.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
  fast = PreTrainedTokenizerFast(
      tokenizer_object=tokenizer, unk_token="<unk>", pad_token="<pad>",
      additional_special_tokens=["<|vision_start|>", "<|image_pad|>", "<|vision_end|>",
                                 "<|video_pad|>"])
  assert fast.convert_tokens_to_ids(["<|vision_start|>", "<|image_pad|>"]) == [START, IMAGE]

  class ImagesOnlyProcessor(Qwen2_5_VLProcessor):
    def check_argument_for_proper_class(self, name, argument):
      if argument is not None:
        return super().check_argument_for_proper_class(name, argument)

  images = Qwen2VLImageProcessor(min_pixels=28 * 28 * 4, max_pixels=28 * 28 * 64)
  return ImagesOnlyProcessor(image_processor=images, tokenizer=fast, video_processor=None)


def test_expansion_equals_qwen2_5_vl_processor():
  processor = _processor()
  image = "<|vision_start|><|image_pad|><|vision_end|>"
  texts = [f"what is {image} and {image} ?", f"compare {image} this", "what is this ?"]
  rng = np.random.default_rng(0)
  pictures = [rng.integers(0, 255, shape, dtype=np.uint8)
              for shape in ((56, 84, 3), (112, 56, 3), (84, 84, 3))]
  out = processor(images=pictures, text=texts, padding=True, padding_side="left",
                  return_tensors="np")
  grids = out["image_grid_thw"]
  rows = [processor.tokenizer(t)["input_ids"] for t in texts]
  ours = placeholders.expand_image_placeholders(rows, grids, image_token_id=IMAGE,
                                                merge_size=processor.image_processor.merge_size)
  mask = out["attention_mask"].astype(bool)
  for row, expanded in enumerate(ours):
    np.testing.assert_array_equal(expanded, out["input_ids"][row][mask[row]])
  np.testing.assert_array_equal(out["mm_token_type_ids"], out["input_ids"] == IMAGE)
  positions, deltas = mrope.mrope_position_ids(out["input_ids"], grids, out["attention_mask"],
                                               image_token_id=IMAGE)
  hf_positions, hf_deltas = _hf_rope_index(out["input_ids"], out["attention_mask"], grids)
  np.testing.assert_array_equal(positions, hf_positions)
  np.testing.assert_array_equal(deltas, hf_deltas)
  with pytest.raises(ConfigError, match="3 image placeholders"):
    placeholders.expand_image_placeholders(rows, grids[:2], image_token_id=IMAGE)


def test_merge_equals_masked_scatter():
  ids, _ = _batch()
  embeddings = jax.random.normal(jax.random.key(2), (*ids.shape, 8))
  features = jax.random.normal(jax.random.key(3), (int((ids == IMAGE).sum()), 8))
  placeholders.check_image_features(ids, features, image_token_id=IMAGE)
  merge = jax.jit(placeholders.merge_image_features, static_argnums=3)
  got = merge(embeddings, ids, features, IMAGE)
  mask = torch.tensor(ids == IMAGE).unsqueeze(-1).expand(*ids.shape, 8)
  want = torch.tensor(np.asarray(embeddings)).masked_scatter(mask, torch.tensor(
      np.asarray(features)))
  np.testing.assert_array_equal(np.asarray(got), want.numpy())
  with pytest.raises(ConfigError, match="23 image tokens but the image features have 22"):
    placeholders.check_image_features(ids, features[:-1], image_token_id=IMAGE)
