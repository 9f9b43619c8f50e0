"""task.name="visual": a visual question whose answer needs the image (data/visual_count.py's
rows: which of two bars is taller, or how many shapes of a colour), for a vision-language
policy (model.vision; configs/grpo_vision_tiny.py).

A prompt is "<bos><vision_start>" + the image's placeholder tokens + "<vision_end>" + the
question + a hint naming the answers, in a character tokenizer; the answer is one character ("L"
or "R" for bars, "1".."4" for count) and the completion one token, rewarded 1 when it is the
answer (exact_match). Each prompt's image is run through the image processor
(data/vision_processor.py, HF's Qwen2VLImageProcessor rules) to the model's patches, one grid for
every image (64 x 64 pixels), and the placeholder is expanded to that image's token count by
models/vision/placeholders.py (the processor's rule). The batch carries the patches as
`pixel_values` (B, patches, C*T*P*P); the sampler and every pass of the update read them.

The streams are pure functions of their arguments: training row `position` of seed s is
visual_count.make_row(s, position), the held-out split the first test_size rows of
visual_count's test indices under seed 0, the same for every run. task.blank=True replaces
every image by one grey (visual_count's blank control): the question and answer stay, so a
policy's gain over chance can only come from the images.
"""

from __future__ import annotations

import dataclasses
import string

import numpy as np

from grpo_jax.data import visual_count
from grpo_jax.data.supervised import SupervisedBatch
from grpo_jax.data.task import check_eval_size, register_task, reward_name
from grpo_jax.data.tokenizer import CharTask, CharTokenizer, pad_rows
from grpo_jax.data.vision_processor import VisionProcessorSpec, process_images
from grpo_jax.errors import ConfigError
from grpo_jax.models.vision.placeholders import expand_image_placeholders
from grpo_jax.rewards.registry import get_reward

ANSWERS = {"bars": {"left": "L", "right": "R"}, "count": {str(n): str(n) for n in range(1, 5)}}
HINTS = {"bars": " L or R?", "count": " 1-4?"}
ALPHABET = string.ascii_letters + string.digits + " ?,.-"
VISION_SPECIALS = ("<vision_start>", "<image_pad>", "<vision_end>")


class VisionCharTokenizer(CharTokenizer):
  """CharTokenizer(ALPHABET) and, after its ids, Qwen2-VL's three image tokens: vision_start,
  the image placeholder (image_token_id), vision_end. They decode to no text."""

  def __init__(self):
    super().__init__(ALPHABET)
    base = super().vocab_size
    self.vision_start_id, self.image_token_id, self.vision_end_id = base, base + 1, base + 2

  @property
  def vocab_size(self) -> int:
    return len(self._specials) + len(self.alphabet) + len(VISION_SPECIALS)

  def decode(self, ids, stop_at_eos: bool = True) -> str:
    """The characters of `ids`; the image tokens (and any id past them) give no text."""
    return super().decode([i for i in np.asarray(ids).tolist() if i < self.vision_start_id],
                          stop_at_eos)


@dataclasses.dataclass
class VisualBatch:
  prompt_tokens: np.ndarray  # (B, P) int32, left-padded
  prompt_mask: np.ndarray  # (B, P) bool
  pixel_values: np.ndarray  # (B, patches, C*T*P*P) float32: each prompt's image, processed
  target_tokens: np.ndarray  # (B, 1) int32: the answer's character
  target_mask: np.ndarray  # (B, 1) bool
  answers: list  # the answer as the task writes it ("L", "3")
  questions: list  # the question text


@register_task("visual", capabilities=("warmup",))
class VisualTask(CharTask):
  """Generated image + question rows (module docstring) for a model with model.vision."""

  def __init__(self, variant: str, blank: bool, test_size: int, spec: VisionProcessorSpec,
               max_new_tokens: int, reward: str = "exact_match"):
    if variant not in ANSWERS:
      raise ConfigError(f"task.variant={variant!r}; use one of {', '.join(ANSWERS)}.")
    if not 0 < test_size <= 100_000:
      raise ConfigError(f"task.test_size={test_size}; use 1 to 100000 held-out rows.")
    if max_new_tokens != 1:
      raise ConfigError(f"rollout.max_new_tokens={max_new_tokens}; task.name='visual' answers "
                        f"with one token, set it to 1.")
    self.variant, self.blank, self.test_size, self.spec = variant, blank, test_size, spec
    self.reward = get_reward(reward, "tokens", "visual")
    self.tokenizer = VisionCharTokenizer()
    self.max_new_tokens = 1
    _, grid = process_images([visual_count.make_row(0, 0, variant).image], spec)
    self.image_grid = tuple(int(g) for g in grid[0])
    self.image_token_id = self.tokenizer.image_token_id
    # The longest question either variant asks ("yellow" the longest colour).
    longest = {"bars": visual_count.bars_row(np.random.default_rng(0)).question,
               "count": "How many yellow shapes are in the image?"}[variant]
    self.prompt_len = len(self._prompt_ids(longest))
    self.text_prompt_len = 1 + len(self.tokenizer.encode(longest + HINTS[variant]))

  def _prompt_ids(self, question: str) -> list:
    tok = self.tokenizer
    ids = ([tok.bos_id, tok.vision_start_id, tok.image_token_id, tok.vision_end_id]
           + tok.encode(question + HINTS[self.variant]))
    return expand_image_placeholders([ids], [self.image_grid], image_token_id=tok.image_token_id,
                                     merge_size=self.spec.merge_size)[0].tolist()

  def rows(self, seed: int, indices) -> VisualBatch:
    """The prompts of visual_count rows `indices` under `seed`."""
    rows = [visual_count.make_row(seed, int(i), self.variant, self.blank) for i in indices]
    pixel_values, grids = process_images([r.image for r in rows], self.spec)
    patches = pixel_values.reshape(len(rows), -1, pixel_values.shape[-1])
    prompts = [self._prompt_ids(r.question) for r in rows]
    tokens, mask = pad_rows(prompts, self.prompt_len, self.tokenizer.pad_id, left=True)
    answers = [ANSWERS[self.variant][r.answer] for r in rows]
    targets = np.asarray([self.tokenizer.encode(a) for a in answers], np.int32).reshape(-1, 1)
    return VisualBatch(tokens, mask, patches.astype(np.float32), targets,
                       np.ones(targets.shape, bool), answers, [r.question for r in rows])

  def warmup_batch(self, step: int, count: int, seed: int, carry_drop_fraction=None):
    """The supervised warm-up's rows, text only (the decoder's own text; warmup.steps > 0):
    training rows [step x count, ...) of `seed` as "<bos>" + question + hint, without the image
    run, and the answer as the target. The decoder learns the answer's form and prior; which
    answer is right needs the image, so the text alone stays at chance."""
    del carry_drop_fraction  # (the addition task's noise)
    batch = self.train_batch(step * count, count, seed)
    tok = self.tokenizer
    prompts = [[tok.bos_id] + tok.encode(q + HINTS[self.variant]) for q in batch.questions]
    tokens, mask = pad_rows(prompts, self.text_prompt_len, tok.pad_id, left=True)
    return SupervisedBatch(tokens, mask, batch.target_tokens, batch.target_mask)

  # The Task protocol (grpo_jax.data.task): eos_id, pad_id, decode, score and eval_scores are
  # CharTask's.
  def train_batch(self, position: int, count: int, seed: int) -> VisualBatch:
    # (the training indices wrap before the held-out ones begin)
    return self.rows(seed, [(position + i) % visual_count.TEST_START for i in range(count)])

  def test_batch(self, size: int) -> VisualBatch:
    check_eval_size(size, self.test_size, f"task.test_size={self.test_size}")
    return self.rows(0, visual_count.split_indices("test", size))

  @staticmethod
  def check_config(config) -> None:
    if config.model.get("vision") is None:
      raise ConfigError("task.name='visual' needs a vision-language model; set model.vision "
                        "(configs/grpo_vision_tiny.py shows one).")
    get_reward(reward_name(config, "exact_match"), "tokens", "visual")

  @classmethod
  def from_config(cls, config, log=print, *, variant="bars", blank=False,
                  test_size=500) -> "VisualTask":
    """The task's fields (task.*): variant "bars" or "count"; blank: every image one grey
    (the control); test_size held-out rows. The patches follow model.vision's patch sizes."""
    del log
    v = config.model.vision
    spec = VisionProcessorSpec(min_pixels=16 * 16, max_pixels=visual_count.SIZE ** 2,
                               patch_size=int(v.patch_size),
                               temporal_patch_size=int(v.temporal_patch_size),
                               merge_size=int(v.spatial_merge_size))
    return cls(variant, bool(blank), int(test_size), spec, int(config.rollout.max_new_tokens),
               reward_name(config, "exact_match"))

  def labels(self, batch: VisualBatch) -> list[str]:
    return list(batch.answers)

  def prompt_texts(self, batch: VisualBatch) -> list[str]:
    return [f"<image> {q}{HINTS[self.variant]}" for q in batch.questions]
