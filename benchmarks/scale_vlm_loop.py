"""The RL loop's own programs for benchmarks/scale_vlm.py (`--what rl_step,sampler_loop`): what a
run with a vision-language policy (model.vision; models/vision/build.py) compiles, built the way
the loop builds it, on abstract inputs.

  rl_step       the learner's jitted RL step (train/learner/step.py make_rl_step(StepSpec(...)),
                jitted with the state donated, as train/stages/rl_advance.py does): rewards ->
                GRPO advantages, the reference pass (rl.kl_coef > 0), then the update's
                minibatches of micro-batches through learner/forward.policy_and_values (models/vision/policy.py's prompt inputs)
                (each row's image encoded, merged, the decoder over prompt + completion), AdamW.
                The state is jax.eval_shape of train/stages/rl.initial_state (params, AdamW
                moments, the reference copy); the Rollout's `images` (rows, patches, patch_dim)
                float32 and its version, RewardInputs(rewards, {}, prompts consumed).
  sampler_loop  the training rollout: Sampling(...).with_stats(params, prompts, mask, key,
                images=...) (rollout/sampler.py -> models/vision/policy.vlm_prompt_inputs: the images
                encoded once per prompt, each prompt prefilled once and shared by its G rows,
                --new decode steps), on rows / G prompts.

The recipe: configs/grpo_gsm8k.py's rl and optim sections (kl_coef 0.001 with k3 KL in the
loss, token-mean, mu = 1, 4 minibatches x 4 micro-batches; AdamW lr 1e-6, clip 1.0, wd 0.01),
with what the loop refuses for image prompts turned off (rl.shared_prompt_forward,
rl.pack_tokens: build.py's _REFUSED) and --minibatches / --micro-batches when given. The model:
scale_vlm's VlmConfig (--dtype, --remat, --logits-chunk) with image_grid (1, gh, gw) of --image
and its image_token_id, as build.py fills them from the task; the tower trained (the default,
model.vision.train_tower=True).
"""

from __future__ import annotations

import dataclasses

EOS_ID = 151645  # Qwen2.5's <|im_end|> (traced in the sampler: its value changes nothing)


def loop_config(cfg, image: int):
  """cfg with the run's image grid, (1, image / patch, image / patch), as build.py sets it."""
  side = image // cfg.vision.patch_size
  return dataclasses.replace(cfg, image_grid=(1, side, side))


def recipe(minibatches: int | None, micro_batches: int | None):
  """(rl, optim) sections of configs/grpo_gsm8k.py, rl fitted to image prompts (module
  docstring); minibatches / micro_batches None: the recipe's."""
  from configs import grpo_gsm8k  # noqa: PLC0415
  config = grpo_gsm8k.get_config()
  rl = config.rl
  rl.shared_prompt_forward = False
  rl.pack_tokens = 0
  if minibatches is not None:
    rl.num_minibatches = minibatches
  if micro_batches is not None:
    rl.num_micro_batches = micro_batches
  return rl, config.optim


def abstract_rollout(cfg, rows: int, prompt_len: int, new: int):
  """(Rollout, RewardInputs) of `rows` rows as jax.ShapeDtypeStructs: prompts (rows,
  prompt_len), completions (rows, new), each row's image (rows, patches, patch_dim) float32."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from grpo_jax.rollout.types import Rollout  # noqa: PLC0415
  from grpo_jax.train.learner.experience import RewardInputs  # noqa: PLC0415
  sds = jax.ShapeDtypeStruct
  t, h, w = cfg.image_grid
  tokens = lambda n, dtype: sds((rows, n), dtype)  # noqa: E731
  rollout = Rollout(tokens(prompt_len, jnp.int32), tokens(prompt_len, jnp.bool_),
                    tokens(new, jnp.int32), tokens(new, jnp.bool_), tokens(new, jnp.float32),
                    sds((rows,), jnp.bool_), tokens(new, jnp.bool_),
                    version=sds((rows,), jnp.int32),
                    images=sds((rows, t * h * w, cfg.vision.patch_dim), jnp.float32))
  return rollout, RewardInputs(sds((rows,), jnp.float32), {}, sds((), jnp.int32))


def rl_step_program(cfg, params, *, rows: int, prompt_len: int, new: int, group: int,
                    minibatches: int | None = None, micro_batches: int | None = None):
  """(rl_step, abstract (state, rollout, reward_inputs), facts) of the loop's learner step."""
  import jax  # noqa: PLC0415
  from benchmarks.state_bytes import tree_gib  # noqa: PLC0415
  from grpo_jax.train.learner.state import make_optimizer  # noqa: PLC0415
  from grpo_jax.train.learner.step import StepSpec, make_rl_step  # noqa: PLC0415
  from grpo_jax.train.stages.rl import initial_state  # noqa: PLC0415
  rl, optim = recipe(minibatches, micro_batches)
  optimizer = make_optimizer(optim, 100)
  state = jax.eval_shape(lambda p, k: initial_state(rl, cfg, p, optimizer, k), params,
                         jax.random.key(0))
  rollout, inputs = abstract_rollout(cfg, rows, prompt_len, new)
  step = make_rl_step(StepSpec(cfg, rl, optimizer, group, temperature=1.0, max_new_tokens=new))
  facts = dict(kl_coef=float(rl.kl_coef), reference=state.ref_params is not None,
               minibatches=int(rl.num_minibatches), micro_batches=int(rl.num_micro_batches),
               state_gib=round(tree_gib(state), 4))
  return step, (state, rollout, inputs), facts


def sampler_loop_program(cfg, params, *, prompts: int, prompt_len: int, new: int, group: int):
  """(sample, abstract (params, prompt_tokens, prompt_mask, key, images), facts) of the
  training rollout: Sampling.with_stats(..., images=) -> (Rollout, DecodeStats)."""
  import jax  # noqa: PLC0415
  import jax.numpy as jnp  # noqa: PLC0415
  from grpo_jax.rollout.sampler import Sampling  # noqa: PLC0415
  sampling = Sampling(cfg, new, EOS_ID % cfg.text.vocab_size, 0, temperature=1.0,
                      group_size=group)

  def sample(params, prompt_tokens, prompt_mask, key, images):
    return sampling.with_stats(params, prompt_tokens, prompt_mask, key, images=images)

  sds = jax.ShapeDtypeStruct
  t, h, w = cfg.image_grid
  abstract = (params, sds((prompts, prompt_len), jnp.int32),
              sds((prompts, prompt_len), jnp.bool_), jax.eval_shape(lambda: jax.random.key(0)),
              sds((prompts, t * h * w, cfg.vision.patch_dim), jnp.float32))
  return sample, abstract, dict(sampler_prompts=prompts, sampler_group=group)
