"""LoRA on a vision-language policy (issue 57 item 4): adapters on the text decoder, the tower
frozen or trained in full by model.vision.train_tower (models/vision/build.py's docstring).
The base never moves, step 0 is the start model, adapters change the policy by W + s A B, and a
resume rebuilds the frozen base."""

import json

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.models.lora import LoraParams
from grpo_jax.models.vision.build import check_vision_config
from grpo_jax.models.vision.policy import vlm_policy_params
from grpo_jax.train.run.sections import ModelSection
from grpo_jax.train.run.setup import build_model, build_task, initial_adapters
from tests.test_vlm_policy import largest_logit_gap, recipe, sample, update_logprobs


def lora_recipe(train_tower=False, steps=2, kl_coef=0.0):
  config = recipe()
  config.rl.kl_coef = kl_coef
  config.lora.rank = 4
  config.model.vision.train_tower = train_tower
  config.train.update(steps=steps, eval_every=2, eval_size=8, eval_batch_size=8,
                      checkpoint_every=0, num_samples=0)
  config.rollout.num_prompts = 4
  config.rl.entropy_coef = 0.01  # a gradient for every param whatever the (rare) rewards
  return config


def start_of(config):
  """(model config, the run's start params, its task): train()'s build for config.seed=0."""
  task = build_task(config)
  cfg, params = build_model(ModelSection.of(config), jax.random.fold_in(jax.random.key(0), 0),
                            task)
  return cfg, params, task


def largest_change(a, b) -> float:
  return max(float(jnp.abs(x - y).max()) for x, y in zip(jax.tree.leaves(a),
                                                          jax.tree.leaves(b)))


@pytest.fixture(scope="module")
def lora_policy():
  config = lora_recipe()
  cfg, params, task = start_of(config)
  adapters = initial_adapters(ModelSection.of(config).lora, params, jax.random.key(4), cfg)
  return cfg, params, task, adapters


def test_the_scale_is_on_the_decoder_and_the_adapters_on_its_kernels(lora_policy):
  cfg, params, _, adapters = lora_policy
  assert cfg.text.lora_scale == pytest.approx(32.0 / 4) and cfg.lora_scale == cfg.text.lora_scale
  assert set(adapters) == {"text"}  # train_tower=False: the tower is in the base only
  q = adapters["text"]["layers"]["self_attn"]["q_proj"]
  assert q["lora_a"].shape == (2, 64, 4) and q["lora_b"].shape == (2, 4, 4, 16)
  assert set(adapters["text"]["layers"]["mlp"]) == {"gate_proj", "up_proj", "down_proj"}


def test_step_zero_is_the_full_model_and_adapters_are_w_plus_s_ab(lora_policy):
  cfg, params, task, adapters = lora_policy
  batch = task.train_batch(0, 3, seed=0)
  lora = LoraParams(params, adapters)
  rollout = sample(lora, cfg, task, batch, jax.random.key(0), temperature=1.3)
  mask = np.asarray(rollout.completion_mask)
  full = np.asarray(update_logprobs(params, cfg, rollout, 1.3))
  np.testing.assert_allclose(np.asarray(update_logprobs(lora, cfg, rollout, 1.3))[mask],
                             full[mask], atol=1e-6)
  # The sampler under LoRA draws the full model's tokens with its log-probs (same key).
  plain = sample(params, cfg, task, batch, jax.random.key(0), temperature=1.3)
  np.testing.assert_array_equal(np.asarray(rollout.completion_tokens),
                                np.asarray(plain.completion_tokens))
  np.testing.assert_allclose(np.asarray(rollout.logprobs)[mask],
                             np.asarray(plain.logprobs)[mask], atol=1e-6)
  # B != 0: each adapted kernel is W + s A B (numpy), the tower the base's, and the policy moves.
  moved = jax.tree_util.tree_map_with_path(
      lambda path, x: x + 0.05 if path[-1].key == "lora_b" else x, adapters)
  merged = vlm_policy_params(LoraParams(params, moved), cfg)
  ad = moved["text"]["layers"]["self_attn"]["o_proj"]
  want = np.asarray(params["text"]["layers"]["self_attn"]["o_proj"]["kernel"]) + \
      cfg.text.lora_scale * np.einsum("lhdr,lre->lhde", np.asarray(ad["lora_a"]),
                                      np.asarray(ad["lora_b"]))
  np.testing.assert_allclose(merged["text"]["layers"]["self_attn"]["o_proj"]["kernel"], want,
                             rtol=1e-5, atol=1e-6)
  assert merged["vision"] is params["vision"]
  np.testing.assert_array_equal(merged["text"]["embed_tokens"]["embedding"],
                                params["text"]["embed_tokens"]["embedding"])
  changed = np.abs(np.asarray(update_logprobs(LoraParams(params, moved), cfg, rollout, 1.3))
                   - full)[mask]
  assert changed.max() > 1e-3


def check_a_lora_run(state, start, train_tower: bool, steps: int) -> None:
  """The base is the start (text and tower), every adapter moved off B = 0, and the tower
  trained (a moved copy in the trainable params) or frozen (in the base only)."""
  assert int(state.step) == steps and state.ref_params is None
  assert largest_change(state.base_params, start) == 0
  b = [x for p, x in jax.tree_util.tree_flatten_with_path(state.params["text"])[0]
       if p[-1].key == "lora_b"]
  assert len(b) == 7  # every projection, stacked over the 2 layers: each layer's moved
  assert min(float(jnp.abs(x).reshape(2, -1).max(1).min()) for x in b) > 0
  if train_tower:
    assert largest_change(state.params["vision"], start["vision"]) > 0
  else:
    assert set(state.params) == {"text"}


def test_a_frozen_tower_under_lora_stays_in_the_base(tmp_path):
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  config = lora_recipe(train_tower=False, kl_coef=0.05)  # the reference: the base dict
  _, start, _ = start_of(config)
  state = train(config, str(tmp_path), log=lambda *a, **k: None).train
  check_a_lora_run(state, start, False, 2)
  kl = [json.loads(line)["kl"] for line in open(tmp_path / "metrics.jsonl")
        if "kl" in json.loads(line)]
  assert len(kl) == 2 and all(np.isfinite(kl))


def test_a_trained_tower_learns_beside_the_adapters_and_a_resume_rebuilds_the_base(tmp_path):
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  _, start, _ = start_of(lora_recipe(True))
  first = train(lora_recipe(True, steps=2, kl_coef=0.05), str(tmp_path),
                log=lambda *a, **k: None).train
  check_a_lora_run(first, start, True, 2)
  trained = jax.tree.map(np.asarray, first.params)
  lines = []
  longer = lora_recipe(True, steps=3, kl_coef=0.05)
  longer.train.allow_config_change = True  # (its cosine rate spread over 3 steps, not 2)
  again = train(longer, str(tmp_path),
                log=lambda *a, **k: lines.append(" ".join(map(str, a)))).train
  assert any("resumed from checkpoint" in s and "LoRA adapters" in s for s in lines), lines
  check_a_lora_run(again, start, True, 3)  # the base rebuilt: the start again
  assert largest_change(again.params, trained) > 0  # step 3 learned from step 2's params
  # Step 3 samples with step 2's moved adapters and tower: its KL to the base is > 0 (steps 1
  # and 2 sample the base itself: the warm-up's first learning rate is 0).
  kl = {r["step"]: r["kl"] for r in map(json.loads, open(tmp_path / "metrics.jsonl"))
        if "kl" in r}
  assert kl[1] == 0 and kl[3] > 0, kl


def test_lora_from_a_folder_exports_a_peft_adapter_that_transformers_loads(tmp_path):
  """A Qwen2.5-VL folder (our export of the random recipe) as model.path, 2 LoRA steps, then
  workdir/peft_adapter on transformers' model of that folder: its logits equal the trained
  policy's (base + s A B), float32, 1e-4."""
  peft = pytest.importorskip("peft")
  from transformers import Qwen2_5_VLForConditionalGeneration  # noqa: PLC0415
  from grpo_jax.models.hf_export import export_vlm_checkpoint  # noqa: PLC0415
  from grpo_jax.train.stages.rl import train  # noqa: PLC0415
  config = lora_recipe()
  cfg, params, task = start_of(config)
  export_vlm_checkpoint(params, cfg, tmp_path / "base")
  config.model.path = str(tmp_path / "base")
  config.lora.export_adapter = True
  check_vision_config(config)
  state = train(config, str(tmp_path / "run"), log=lambda *a, **k: None).train
  base = Qwen2_5_VLForConditionalGeneration.from_pretrained(
      str(tmp_path / "base"), attn_implementation="eager")
  model = peft.PeftModel.from_pretrained(base, str(tmp_path / "run" / "peft_adapter")).eval()
  trained = vlm_policy_params(LoraParams(state.base_params, state.params), cfg)
  assert largest_change(trained["text"], params["text"]) > 0
  assert largest_logit_gap(model, trained, task, cfg) < 1e-4
