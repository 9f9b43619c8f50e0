"""The TPU and GPU paths, checked on this CPU host without the hardware: the RL step, the sampler
(prefill and decode loop) and the evaluation lower for "tpu" and for "cuda" (jax's
`lowering_platforms`) with the platform table's choices for that platform
(parallel/choices.py), and the TPU programs hold the Pallas flash attention kernel that the
table chooses there (its `tpu_custom_call`). Lowering is not compiling: what only the device's
compiler checks (the kernel's Mosaic compile, memory) needs the device (docs/accelerators.md)."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from grpo_jax.defaults import rl_defaults
from grpo_jax.parallel.choices import choose
from grpo_jax.rollout.sampler import Sampling
from grpo_jax.train.learner.experience import RewardInputs
from grpo_jax.train.learner.state import create_train_state, make_optimizer
from grpo_jax.train.learner.step import StepSpec, make_rl_step
from tests.fixtures import perturbed_params, tiny_model_config

# jax's lowering platform -> the platform table's column
PLATFORMS = {"tpu": "tpu", "cuda": "gpu"}
# The kernels each platform's table chooses, by the custom-call name they lower to, per
# program: the teacher-forced passes (the RL step) and the prefill (the sampler, the
# evaluation). The decode loop keeps XLA's attention everywhere (choices.py says why).
KERNELS = {"tpu": {"tpu_custom_call"}, "cuda": set()}
PROMPTS = np.array([[0, 1, 5, 6, 3, 7, 8, 4], [1, 9, 4, 4, 3, 2, 5, 6]], np.int32)
NEW, GROUP = 8, 2


def _programs(platform: str) -> dict:
  """{program name: (function, its arguments)} with `platform`'s table choices."""
  where = PLATFORMS[platform]
  cfg = tiny_model_config(vocab_size=16, compute_dtype=choose("model.compute_dtype",
                                                              platform=where),
                          attention_impl=choose("model.attention_impl", platform=where))
  params = jax.eval_shape(lambda: perturbed_params(cfg))  # traced only: no CPU kernel runs
  sampling = Sampling(cfg, NEW, eos_id=2, pad_id=0, temperature=1.0,
                      decode_loop=choose("rollout.decode_loop", platform=where))
  grouped = sampling.grouped(GROUP)
  mask, key = PROMPTS != 0, jax.random.key(0)
  rollout = jax.eval_shape(lambda p: grouped(p, PROMPTS, mask, key), params)
  rl = rl_defaults(kl_coef=0.05)
  optimizer = make_optimizer(ml_collections.ConfigDict(dict(
      learning_rate=1e-3, warmup_steps=1, weight_decay=0.0, b1=0.9, b2=0.99,
      max_grad_norm=1.0)), 10)
  state = jax.eval_shape(lambda p: create_train_state(p, optimizer, key, None, rl.kl_coef),
                         params)
  rewards = RewardInputs(jax.ShapeDtypeStruct((rollout.completion_tokens.shape[0],),
                                              jnp.float32), {}, jnp.int32(0))
  step = make_rl_step(StepSpec(cfg, rl, optimizer, GROUP, 1.0, NEW))
  return {
      "rl_step": (step, (state, rollout, rewards)),
      "sampler": (lambda p, t, m, k: grouped.with_stats(p, t, m, k), (params, PROMPTS, mask,
                                                                      key)),
      "evaluation": (lambda p, t, m: sampling.greedy()(p, t, m, jax.random.key(0)),
                     (params, PROMPTS, mask)),
  }


@pytest.mark.parametrize("platform", sorted(PLATFORMS))
def test_programs_lower_with_the_platform_choices(platform):
  """Each program lowers for the platform; the kernels its table row chooses are in it."""
  found = {}
  for name, (fn, args) in _programs(platform).items():
    text = jax.jit(fn).trace(*args).lower(lowering_platforms=(platform,)).as_text()
    found[name] = {k for k in ("tpu_custom_call", "__cudnn$fmha") if k in text}
    assert "func.func public @main" in text, name
  if platform == "tpu":  # the teacher-forced passes (3 per layer scan: forward, dq, dkv) and
    # the prefill of the sampler and of the evaluation
    assert all(found[name] == KERNELS[platform] for name in found), found
  else:
    assert not any(found.values()), found


def test_cudnn_attention_needs_cudnn_to_lower():
  """jax.nn.dot_product_attention's cuDNN kernel (model.attention_impl="cudnn") checks for
  cuDNN when it lowers, so on a host without it the cuDNN path is checked on a GPU run only
  (benchmarks/accelerator_check.py); the table's GPU choice is the XLA path."""
  q = jax.ShapeDtypeStruct((1, 128, 4, 64), jnp.bfloat16)
  fn = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, is_causal=True,
                                                             implementation="cudnn"))
  try:
    text = fn.trace(q, q, q).lower(lowering_platforms=("cuda",)).as_text()
  except RuntimeError as e:
    assert "cuDNN is not detected" in str(e)
  else:  # a host with cuDNN (a GPU machine)
    assert "cudnn" in text.lower()
  assert choose("model.attention_impl", platform="gpu") == "xla"
