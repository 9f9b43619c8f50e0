"""The rows of task.name="table" as prompts of a vision-language policy (model.vision):
each row's one image, its placeholder tokens and its patches, by the Hugging Face processor's
rules (Qwen2-VL / Qwen2.5-VL).

With model.vision every row holds exactly one image (the policy runs one per prompt,
models/vision/policy.py; 0 or 2+ is a bad row), and every image takes one grid:

1. resize: the image to data.image_size x data.image_size pixels (S; Pillow's bicubic, HF's
   `resize`, data/vision_processor.py resize_bicubic), S a multiple of patch_size * merge_size;
2. prompt: the last user message's content becomes [{"type": "image"}, {"type": "text", "text":
   content}], which Qwen2-VL's chat template renders as
   <|vision_start|><|image_pad|><|vision_end|> before the text (without a chat template the three
   tokens are put before the prompt text); the one <|image_pad|> is then repeated
   (S / patch_size)^2 / merge_size^2 times (models/vision/placeholders.expand_image_placeholders,
   the processor's `replace_image_token`);
3. patches: process_images (HF's Qwen2VLImageProcessor rules) with min_pixels = max_pixels =
   S * S, so that smart_resize keeps the S x S image; the batch's `pixel_values` is
   (B, (S / patch_size)^2, C * temporal_patch_size * patch_size^2) float32, and the task's
   image_grid (1, S / patch_size, S / patch_size) for every row.

The patch sizes are model.path's config.json vision_config (a Qwen2.5-VL checkpoint) when it has
one, else model.vision's patch_size, temporal_patch_size and spatial_merge_size.
"""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from grpo_jax.data.table_files import BadRow
from grpo_jax.data.vision_processor import VisionProcessorSpec, process_images, resize_bicubic
from grpo_jax.errors import ConfigError
from grpo_jax.models.vision.placeholders import expand_image_placeholders

VISION_TOKENS = ("<|vision_start|>", "<|image_pad|>", "<|vision_end|>")
PATCH_FIELDS = ("patch_size", "temporal_patch_size", "spatial_merge_size")


@dataclasses.dataclass(frozen=True)
class TableVision:
  """What the table task needs for image rows: the processor settings, the side S every image
  is resized to and the tokenizer's <|image_pad|> id."""
  spec: VisionProcessorSpec
  image_size: int
  image_token_id: int

  @property
  def image_grid(self) -> tuple[int, int, int]:
    """(1, S / patch_size, S / patch_size): every row's image_grid_thw."""
    side = self.image_size // self.spec.patch_size
    return (1, side, side)

  def expand(self, ids) -> list[int]:
    """One prompt's ids with its one <|image_pad|> repeated image_token_count(image_grid)
    times (the processor's rule)."""
    return expand_image_placeholders([ids], [self.image_grid], image_token_id=self.image_token_id,
                                     merge_size=self.spec.merge_size)[0].tolist()

  def fit(self, images: list) -> np.ndarray:
    """The row's one image resized to (S, S, 3) uint8; not exactly one image is a BadRow."""
    if len(images) != 1:
      raise BadRow(f"has {len(images)} images; a vision-language policy (model.vision) takes "
                   f"exactly one image per row, so give it one in its 'images' column",
                   "rows without exactly one image")
    return resize_bicubic(np.asarray(images[0]), self.image_size, self.image_size)

  def pixel_values(self, images: list) -> np.ndarray:
    """(B, patches, C * T * P * P) float32 of B (S, S, 3) uint8 images (process_images)."""
    values, _ = process_images(images, self.spec)
    return values.reshape(len(images), -1, values.shape[-1]).astype(np.float32)


def table_vision(config, tokenizer) -> TableVision | None:
  """The image settings of a table task under model.vision (module docstring); None without
  model.vision (text rows). A data.image_size that is not a positive multiple of
  patch_size * merge_size, or a tokenizer without <|image_pad|>, is a ConfigError."""
  if config.model.get("vision") is None:
    return None
  config_file = os.path.join(config.model.path or "", "config.json")
  checkpoint = {}
  if config.model.path and os.path.isfile(config_file):
    with open(config_file) as f:
      checkpoint = json.load(f)
  vision = checkpoint.get("vision_config")  # the patch sizes (module docstring)
  where, fix = (f"{config_file}'s vision_config", "point model.path at a Qwen2.5-VL checkpoint "
                "with its own config.json")
  if vision is None:
    vision, where = dict(config.model.vision), "model.vision"
    fix = "set them (configs/grpo_vision_tiny.py shows a tower)"
  missing = [k for k in PATCH_FIELDS if k not in vision]
  if missing:
    raise ConfigError(f"{where} lacks {', '.join(missing)}; {fix}.")
  sizes = {k: int(vision[k]) for k in PATCH_FIELDS}
  patch, merge = sizes["patch_size"], sizes["spatial_merge_size"]
  size = int(config.data.image_size)
  if size <= 0 or size % (patch * merge):
    fitted = max(1, round(size / (patch * merge))) * patch * merge
    raise ConfigError(f"data.image_size={size} is not a positive multiple of patch_size * "
                      f"spatial_merge_size = {patch * merge}; set it to e.g. {fitted}.")
  specials = tokenizer.convert_tokens_to_ids(list(VISION_TOKENS))
  unknown = [t for t, i in zip(VISION_TOKENS, specials)
             if i is None or i == tokenizer.unk_token_id]
  if unknown:
    raise ConfigError(f"the tokenizer of model.path={config.model.path} has no "
                      f"{', '.join(unknown)}; use a Qwen2-VL / Qwen2.5-VL checkpoint's tokenizer.")
  image_token_id = int(specials[1])
  declared = checkpoint.get("image_token_id")
  if declared is not None and int(declared) != image_token_id:
    raise ConfigError(f"{config_file} has image_token_id={declared} but the tokenizer's "
                      f"<|image_pad|> is {image_token_id}; use the tokenizer that came with "
                      f"the checkpoint.")
  spec = VisionProcessorSpec(min_pixels=size * size, max_pixels=size * size, patch_size=patch,
                             temporal_patch_size=sizes["temporal_patch_size"],
                             merge_size=merge)
  return TableVision(spec, size, image_token_id)


def image_messages(messages: list) -> list:
  """The conversation with an image before the last user message's text (the chat template's
  {"type": "image"} content part)."""
  last = max(i for i, m in enumerate(messages) if m["role"] == "user")
  out = [dict(m) for m in messages]
  out[last]["content"] = [{"type": "image"}, {"type": "text", "text": messages[last]["content"]}]
  return out


def render_with_image(task, messages: list) -> str:
  """The prompt text of a conversation with one image (module docstring, step 2)."""
  if task.use_chat_template and getattr(task.tokenizer, "chat_template", None):
    return task.tokenizer.apply_chat_template(image_messages(messages), tokenize=False,
                                              add_generation_prompt=True)
  return "".join(VISION_TOKENS) + task.render(messages)


def image_prompt_ids(task, vision: TableVision, messages: list) -> list[int]:
  """A row's prompt ids with its image's placeholder tokens expanded. A chat template that
  renders no <|image_pad|> for the image is a ConfigError; text holding one more is a BadRow."""
  ids = task.tokenizer(render_with_image(task, messages), add_special_tokens=False)["input_ids"]
  found = sum(int(i == vision.image_token_id) for i in ids)
  if found == 0:
    raise ConfigError("the chat template of model.path renders no <|image_pad|> for an image "
                      "content part ({'type': 'image'}); use a Qwen2-VL / Qwen2.5-VL "
                      "tokenizer's chat template, or set data.use_chat_template=False.")
  if found > 1:
    raise BadRow(f"has {found - 1} <|image_pad|> tokens in its text besides its image's; remove "
                 f"them from the prompt", "rows whose text holds <|image_pad|>")
  return vision.expand(ids)
