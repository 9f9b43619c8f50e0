"""A Math-Shepherd-style process reward model (PRM): a causal LM that scores each step of a
completion by the probability it puts on a "good" label token at the step's separator.

Convention (Math-Shepherd, Wang et al. 2024, arXiv:2312.08935). Every step of a solution ends
with a step tag (Math-Shepherd's "ки"); the PRM is a causal LM fine-tuned so that its
next-token distribution right after reading a tag puts mass on "+" (the step is good) or "-"
(bad). A step's score is the "good" probability renormalised over the two label tokens:

    score = softmax([logit_good, logit_bad])[0] = sigmoid(logit_good - logit_bad)

with the logits read at the tag's own position (the output after reading it), as the
Math-Shepherd dataset card (huggingface.co/datasets/peiyi9979/Math-Shepherd: "ки" marks the
position for predicting the step score, "+" / "-" the labels) and the reference inference of
the released PRM (peiyi9979/math-shepherd-mistral-7b-prm; e.g. openreasoner/openr's
prm/infer_fns.py) do. The label and tag ids are the caller's: Math-Shepherd's are "+", "-"
and "ки"; a Qwen-based PRM may use " +", " -" and a blank-line tag.

Same-tokenizer assumption. The PRM reads the POLICY's completion token ids as they are, so it
must share the policy's tokenizer (vocabulary and ids; e.g. both from one base model), and the
separator must be a single token of that vocabulary that the policy writes between its steps
(e.g. "\\n\\n", or a step tag the policy was taught to emit). Nothing is re-tokenised here; a
PRM with another tokenizer needs the completions decoded and re-encoded on the host first.

Feeding process supervision (rl.advantage="process"). `prm_token_scores` gives a score at
every completion token and marks the step ends; `step_rewards_from_token_scores` turns them
into (step_rewards (B, K), step_end_index (B, K), step_mask (B, K)), the triple a task's
`step_rewards` returns and `grpo_jax.rl.token_advantages.process_advantages` consumes: step j
of completion i ends at completion token step_end_index[i, j] (0-based, inclusive) and every
token gets the sum of the group-normalised rewards of the steps ending at or after it.
Both functions are jittable (ids, max_steps and the config static).
"""

from __future__ import annotations

import operator

import jax
import jax.numpy as jnp

from grpo_jax.models.attention import soft_cap
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import decoder_apply, positions_from_mask
from grpo_jax.models.lora import base_params


def _check_token_id(name: str, value, vocab_size: int) -> int:
  """value as a Python int in [0, vocab_size), or a ValueError naming it."""
  try:
    value = operator.index(value)
  except TypeError:
    raise ValueError(f"{name} must be a Python int (a static token id); got {value!r}.") from None
  if not 0 <= value < vocab_size:
    raise ValueError(f"{name}={value} is not a token id of the PRM's vocabulary "
                     f"[0, {vocab_size}).")
  return value


def _check_pair(tokens_name: str, tokens, mask_name: str, mask) -> None:
  """tokens and mask must be equal-shaped (B, L) arrays."""
  if jnp.ndim(tokens) != 2 or jnp.shape(mask) != jnp.shape(tokens):
    raise ValueError(f"{tokens_name} {tuple(jnp.shape(tokens))} and {mask_name} "
                     f"{tuple(jnp.shape(mask))} must be (B, L) arrays of one shape.")


def label_logits(params, model_cfg: ModelConfig, hidden, label_ids) -> jax.Array:
  """The vocabulary projection of normed hidden states (..., H) restricted to the label
  columns: (..., len(label_ids)) float32, logits[..., k] = hidden . W[:, label_ids[k]] with W
  the tied embedding's transpose or lm_head (as the Decoder projects, in the compute dtype),
  soft-capped as the Decoder's logits are (model_cfg.final_softcap, Gemma 2). No (..., V)
  array is made."""
  dtype, params = model_cfg.dtype, base_params(params)  # no adapter on the vocabulary
  ids = jnp.asarray(label_ids, jnp.int32)
  if model_cfg.tie_embeddings:
    weight = jnp.take(params["embed_tokens"]["embedding"], ids, axis=0).astype(dtype).T
  else:
    weight = jnp.take(params["lm_head"]["kernel"], ids, axis=1).astype(dtype)
  return soft_cap(jnp.dot(hidden.astype(dtype), weight).astype(jnp.float32),
                  model_cfg.final_softcap)


def step_end_mask(completion_tokens, completion_mask, separator_id: int,
                  score_last: bool = True) -> jax.Array:
  """(B, N) bool: the completion tokens that end a step.

      is_step_end[b, t] = m[b, t] and (tok[b, t] == separator_id
                                        or (score_last and t == last[b]))

  with last[b] the index of row b's last masked-in token (the final step, which ends at the
  EOS or at the length limit, usually without a separator); a row with no masked-in token has
  no step end."""
  mask = jnp.asarray(completion_mask).astype(bool)
  ends = mask & (jnp.asarray(completion_tokens) == separator_id)
  if score_last:
    length = mask.shape[1]
    last = length - 1 - jnp.argmax(mask[:, ::-1], axis=1)
    ends = ends | (mask & (jnp.arange(length)[None, :] == last[:, None]))
  return ends


def prm_token_scores(params, model_cfg: ModelConfig, prompt_tokens, prompt_mask,
                     completion_tokens, completion_mask, separator_id: int, good_id: int,
                     bad_id: int, score_last: bool = True):
  """The PRM's step score at every completion token, and which tokens end a step.

  One no-cache forward over [prompt (left-padded, P) | completion (right-padded, N)] with
  positions from the mask; completion token t is at sequence position P + t and its score is
  read from the output at that position (after reading the token):

      scores[b, t] = softmax([z[b, P+t, good_id], z[b, P+t, bad_id]])[0]
                   = sigmoid(z[b, P+t, good_id] - z[b, P+t, bad_id])         (0 where ~m)
      is_step_end  = step_end_mask(completion_tokens, completion_mask, separator_id, score_last)

  Only the two label columns of the vocabulary projection are computed. With score_last the
  final step's score is read after the row's last real token (often the EOS), where a PRM
  trained with a tag after every step sees no tag: it is the PRM's judgement of the whole
  solution so far, which an RL run may prefer to replace by the outcome reward.
  Returns (scores (B, N) float32, is_step_end (B, N) bool).
  """
  _check_pair("prompt_tokens", prompt_tokens, "prompt_mask", prompt_mask)
  _check_pair("completion_tokens", completion_tokens, "completion_mask", completion_mask)
  if jnp.shape(prompt_tokens)[0] != jnp.shape(completion_tokens)[0]:
    raise ValueError(f"prompt_tokens has {jnp.shape(prompt_tokens)[0]} rows but "
                     f"completion_tokens {jnp.shape(completion_tokens)[0]}; they must match.")
  vocab = model_cfg.vocab_size
  separator_id = _check_token_id("separator_id", separator_id, vocab)
  good_id = _check_token_id("good_id", good_id, vocab)
  bad_id = _check_token_id("bad_id", bad_id, vocab)
  if good_id == bad_id:
    raise ValueError(f"good_id and bad_id are both {good_id}; the PRM needs two distinct "
                     f"label tokens.")
  prompt_len, num_new = jnp.shape(prompt_tokens)[1], jnp.shape(completion_tokens)[1]
  tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1).astype(jnp.int32)
  mask = jnp.concatenate([prompt_mask, completion_mask], axis=1).astype(bool)
  hidden, _ = decoder_apply(model_cfg, params, tokens, positions_from_mask(mask), mask, None, 0,
                            logits_window=(prompt_len, num_new), project=False)
  logits = label_logits(params, model_cfg, hidden, (good_id, bad_id))  # (B, N, 2)
  completion_mask = jnp.asarray(completion_mask).astype(bool)
  scores = jnp.where(completion_mask, jax.nn.softmax(logits, axis=-1)[..., 0], 0.0)
  return scores, step_end_mask(completion_tokens, completion_mask, separator_id, score_last)


def step_rewards_from_token_scores(scores, is_step_end, max_steps: int):
  """Per-step rewards in `process_advantages`' layout, K = max_steps slots per row.

  The step ends of row b, in order, are the t with is_step_end[b, t]; say there are n of them.
  Rows with n <= K fill slots 0..n-1. Rows with n > K keep their FIRST K-1 ends and their LAST
  one (the final step, where the answer is, always keeps its reward); the dropped middle steps'
  tokens then count towards the next kept step (their own rewards are lost):

      rank[b, t]  = #{s <= t : is_step_end[b, s]} - 1
      kept        = is_step_end and (rank < K-1 or rank == n-1),  slot = min(rank, K-1)
      step_rewards[b, slot] = scores[b, t],  step_end_index[b, slot] = t   (for kept t)
      step_mask[b, k] = k < min(n, K)

  Empty slots hold reward 0 and index 0. scores, is_step_end: (B, N). Returns (step_rewards
  (B, K) float32, step_end_index (B, K) int32, step_mask (B, K) bool).
  """
  if not (isinstance(max_steps, int) and max_steps >= 1):
    raise ValueError(f"max_steps={max_steps!r}; it must be a whole number >= 1.")
  if jnp.ndim(scores) != 2 or jnp.shape(is_step_end) != jnp.shape(scores):
    raise ValueError(f"scores {tuple(jnp.shape(scores))} and is_step_end "
                     f"{tuple(jnp.shape(is_step_end))} must be (B, N) arrays of one shape.")
  ends = jnp.asarray(is_step_end).astype(bool)
  batch, length = ends.shape
  rank = jnp.cumsum(ends, axis=1, dtype=jnp.int32) - 1
  count = jnp.sum(ends, axis=1, dtype=jnp.int32)[:, None]
  kept = ends & ((rank < max_steps - 1) | (rank == count - 1))
  slot = jnp.where(kept, jnp.minimum(rank, max_steps - 1), max_steps)  # max_steps: dropped
  rows = jnp.arange(batch)[:, None]
  step_rewards = jnp.zeros((batch, max_steps), jnp.float32).at[rows, slot].set(
      jnp.asarray(scores, jnp.float32), mode="drop")
  positions = jnp.broadcast_to(jnp.arange(length, dtype=jnp.int32), (batch, length))
  step_end_index = jnp.zeros((batch, max_steps), jnp.int32).at[rows, slot].set(
      positions, mode="drop")
  step_mask = jnp.arange(max_steps)[None, :] < jnp.minimum(count, max_steps)
  return step_rewards, step_end_index, step_mask
