"""Teacher-forced scoring: per-token log-probs and entropies of completions given prompts."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp

from grpo_jax.models.attention import soft_cap
from grpo_jax.models.config import ModelConfig
from grpo_jax.models.decoder import decoder_apply, positions_from_mask
from grpo_jax.models.lora import base_params
from grpo_jax.models.packing import pack_tokens, packed_index, unpack_tokens


def completion_logits(params, model_cfg: ModelConfig, prompt_tokens, prompt_mask,
                      completion_tokens, completion_mask, return_hidden: bool = False,
                      project: bool = True, routes=None, record_routing: bool = False,
                      inputs=None):
  """Logits predicting each completion token, (B, N, V), from one no-cache forward pass.

  The sequence is [prompt (left-padded, P) | completion (N)]; the logits at position P-1+t
  predict completion token t. Only those N positions are projected onto the vocabulary;
  project=False returns their normed hidden states (B, N, H) instead (see `vocab_logits`).
  routes (B, P + N, L, k): a mixture's routing to replay (Rollout.routes); record_routing:
  returns (that result, the pass's own routing: moe.sown_routing). inputs: the prompts'
  PromptInputs (models/prompt_inputs.py: a vision-language prompt's embeddings and rotary
  ids, completion token k at next_position + k, as the sampler placed it); None for text.
  """
  prompt_len = prompt_tokens.shape[1]
  num_new = completion_tokens.shape[1]
  tokens = jnp.concatenate([prompt_tokens, completion_tokens], axis=1)
  mask = jnp.concatenate([prompt_mask, completion_mask], axis=1).astype(bool)
  positions = positions_from_mask(mask) if inputs is None else inputs.with_completion(num_new)
  out = decoder_apply(model_cfg, params, tokens, positions, mask, None, 0,
                      return_hidden=return_hidden, logits_window=(prompt_len - 1, num_new),
                      project=project, routes=routes, record_routing=record_routing,
                      prefix_embeddings=None if inputs is None else inputs.embeddings)
  out, routing = out if record_routing else (out, None)
  result = (out[0], out[2]) if project and return_hidden else out[0]
  return (result, routing) if record_routing else result


def _prompts_once(prompt_mask, group: int, inputs):
  """(mask, positions, prefix embeddings or None) of the distinct prompts: every G-th row."""
  firsts = prompt_mask[::group].astype(bool)
  if inputs is None:
    return firsts, positions_from_mask(firsts), None
  return firsts, inputs.positions[..., ::group, :], inputs.embeddings[::group]


def _completion_positions(kv_mask, prompt_len: int, inputs):
  """The rotary ids of the completion inputs kv_mask[:, P:] (each row's own)."""
  if inputs is None:
    return positions_from_mask(kv_mask)[:, prompt_len:]
  return inputs.with_completion(kv_mask.shape[1] - prompt_len)[..., prompt_len:]


def shared_prompt_hidden(params, model_cfg: ModelConfig, prompt_tokens, prompt_mask,
                         completion_tokens, completion_mask, group: int, inputs=None):
  """completion_logits(..., project=False), the normed hidden states (B, N, H) predicting each
  completion token, for rows that come in runs of `group` consecutive rows with the same
  prompt (a GRPO batch: each prompt's G samples side by side): each prompt runs through the
  decoder once, not G times.

  In every layer the B/G distinct prompts run first and write their keys and values into a
  cache; the cache is repeated G times and completion tokens 0..N-2 run against it (they
  predict tokens 1..N-1; the last prompt position predicts token 0). Both streams share one
  layer step (Decoder's prompt_group, DecoderLayer), differentiated and rematerialised by
  model.remat: the gradients of a prompt's G rows meet in its one pass. The same values as the
  per-row forward up to rounding; the prompt's share of the forward and backward FLOPs is
  divided by G. inputs: the rows' PromptInputs (completion_logits), the same for a group."""
  prompt_len = prompt_tokens.shape[1]
  num_new = completion_tokens.shape[1]
  firsts, first_positions, prefix = _prompts_once(prompt_mask, group, inputs)
  if num_new == 1:  # the prompt's last position predicts the only token
    last, _ = decoder_apply(model_cfg, params, prompt_tokens[::group], first_positions, firsts,
                            logits_window=(prompt_len - 1, 1), project=False,
                            prefix_embeddings=prefix)
    return jnp.repeat(last, group, axis=0)
  kv_mask = jnp.concatenate([prompt_mask, completion_mask[:, :num_new - 1]],
                            axis=1).astype(bool)
  positions = _completion_positions(kv_mask, prompt_len, inputs)
  hidden, _ = decoder_apply(model_cfg, params,
                            (prompt_tokens[::group], completion_tokens[:, :num_new - 1]),
                            (first_positions, positions), (firsts, kv_mask),
                            project=False, prompt_group=group, prefix_embeddings=prefix)
  return hidden


def vocab_logits(params, model_cfg: ModelConfig, hidden):
  """The decoder's vocabulary projection of normed hidden states (..., H) -> (..., V) float32:
  the tied embedding's transpose, or lm_head, in the compute dtype (as the Decoder does)."""
  dtype, params = model_cfg.dtype, base_params(params)  # no adapter on the vocabulary
  if model_cfg.tie_embeddings:
    weight = params["embed_tokens"]["embedding"].astype(dtype).T
  else:
    weight = params["lm_head"]["kernel"].astype(dtype)
  return soft_cap(jnp.dot(hidden.astype(dtype), weight).astype(jnp.float32),
                  model_cfg.final_softcap)


def chunked_logprobs_and_entropy(params, model_cfg: ModelConfig, hidden, tokens,
                                 temperature: float = 1.0, chunk: int = 64, keep_cutoff=None):
  """token_logprobs_and_entropy(vocab_logits(hidden), tokens, temperature, keep_cutoff)
  computed `chunk` positions at a time, each chunk rematerialised in the backward pass: no
  (B, N, V) array exists, only one (B, chunk, V) at a time (chunk 0: in one piece). hidden
  (B, N, H), tokens (B, N) -> two (B, N) float32 arrays."""
  project = lambda h: vocab_logits(params, model_cfg, h)  # noqa: E731
  if not chunk:
    return token_logprobs_and_entropy(project(hidden), tokens, temperature, keep_cutoff)
  batch, length, width = hidden.shape
  chunks = -(-length // chunk)
  pad = chunks * chunk - length
  split = lambda x: jnp.swapaxes(  # noqa: E731  (chunks, B, chunk, ...)
      jnp.pad(x, [(0, 0), (0, pad)] + [(0, 0)] * (x.ndim - 2)).reshape(
          batch, chunks, chunk, *x.shape[2:]), 0, 1)

  @jax.checkpoint
  def one(part):
    h, t, c = part
    return token_logprobs_and_entropy(project(h), t, temperature, c)

  cutoff = None if keep_cutoff is None else split(keep_cutoff)
  logp, entropy = jax.lax.map(one, (split(hidden), split(tokens), cutoff))
  join = lambda x: jnp.swapaxes(x, 0, 1).reshape(batch, chunks * chunk)[:, :length]  # noqa
  return join(logp), join(entropy)


def packed_completion_scores(params, model_cfg: ModelConfig, seqs, temperature: float,
                             return_hidden: bool, group: int, capacity: int, inputs=None):
  """completion_scores with the completion tokens packed (models/packing.py): each prompt runs
  once for its `group` rows (shared_prompt_hidden's two streams; group 1 = each row its own),
  and the completion stream's per-token work runs on at most `capacity` tokens, those of
  completion_mask[:, :N-1] (the inputs that predict tokens 1..N-1), gathered into one packed
  row. The log-probs come back (B, N) (0 where masked), as from completion_scores."""
  rows, num_new = seqs.completion_tokens.shape
  prompt_len = seqs.prompt_tokens.shape[1]
  real = seqs.completion_mask[:, :num_new - 1].astype(bool)
  index = packed_index(real, capacity)
  kv_mask = jnp.concatenate([seqs.prompt_mask.astype(bool), real], axis=1)
  positions = _completion_positions(kv_mask, prompt_len, inputs)
  packed_positions = (pack_tokens(positions, index) if positions.ndim == 2 else
                      jax.vmap(lambda p: pack_tokens(p, index))(positions))
  firsts, first_positions, prefix = _prompts_once(seqs.prompt_mask, group, inputs)
  (last, packed), _ = decoder_apply(
      model_cfg, params, (seqs.prompt_tokens[::group],
                          pack_tokens(seqs.completion_tokens[:, :num_new - 1], index)),
      (first_positions, packed_positions), (firsts, kv_mask),
      project=False, prompt_group=group, token_index=index, prefix_embeddings=prefix)
  # Where each hidden state's prediction lands in the (B, N) completion: a prompt's last
  # position predicts token 0 of each of its rows, input (b, t) predicts token (b, t + 1).
  row, col = index // (num_new - 1), index % (num_new - 1)
  target = jnp.concatenate([jnp.arange(rows, dtype=jnp.int32) * num_new,
                            jnp.where(row < rows, row * num_new + col + 1, rows * num_new)])
  hidden = jnp.concatenate([last[:, 0], packed[0]])[None]  # (1, B + C, H)
  take = lambda x: pack_tokens(x, target)  # noqa: E731  (B, N) -> (1, B + C)
  cutoff = getattr(seqs, "keep_cutoff", None)
  cutoff = None if cutoff is None else take(cutoff)
  logp, entropy = chunked_logprobs_and_entropy(  # the unpacked passes' (rows, chunk, V) bound
      params, model_cfg, hidden, take(seqs.completion_tokens), temperature,
      model_cfg.logits_chunk * rows, cutoff)
  place = lambda x: unpack_tokens(x, target, rows, num_new)  # noqa: E731  (1, B + C, ...) -> rows
  return place(logp), place(entropy), place(hidden) if return_hidden else None


def completion_scores(params, model_cfg: ModelConfig, seqs, temperature: float = 1.0,
                      return_hidden: bool = False, prompt_group: int = 1,
                      token_capacity: int | None = None, replay_routes: bool = False,
                      record_routing: bool = False, inputs=None):
  """(log-probs, entropies, hidden or None) of a batch's completion tokens (seqs has
  prompt_tokens, prompt_mask, completion_tokens, completion_mask), unmasked. With
  model_cfg.logits_chunk = C > 0 the vocabulary is reached C positions at a time
  (chunked_logprobs_and_entropy); else in one (B, N, V) piece. prompt_group = G > 1: the rows
  come in runs of G with the same prompt, and each prompt is run once (shared_prompt_hidden).
  With seqs.keep_cutoff (the keep-sampling mask: a Rollout's or Batch's), the log-probs are of
  the policy renormalised over the tokens the sampler's truncation left available
  (token_logprobs_and_entropy). token_capacity = C: the completion tokens packed into C
  slots (packed_completion_scores; the values up to rounding).
  A mixture of experts (the passes without prompt_group or packing): replay_routes replays
  seqs.routes (routing replay); record_routing appends the pass's own routing
  (moe.sown_routing) to the result. inputs: each row's PromptInputs (completion_logits; a
  vision-language policy's, models/vision/policy.py), on every path."""
  moe = record_routing or replay_routes
  if moe and (token_capacity or prompt_group > 1):
    raise ValueError("routing replay and its records run on the per-row forward; set "
                     "rl.pack_tokens=0 and rl.shared_prompt_forward=False for an MoE model.")
  if token_capacity:
    return packed_completion_scores(params, model_cfg, seqs, temperature, return_hidden,
                                    prompt_group, token_capacity, inputs)
  args = (params, model_cfg, seqs.prompt_tokens, seqs.prompt_mask, seqs.completion_tokens,
          seqs.completion_mask)
  cutoff = getattr(seqs, "keep_cutoff", None)
  if prompt_group == 1 and not model_cfg.logits_chunk and not moe:  # the decoder projects
    out = completion_logits(*args, return_hidden=return_hidden, inputs=inputs)
    logits, hidden = out if return_hidden else (out, None)
    logp, entropy = token_logprobs_and_entropy(logits, seqs.completion_tokens, temperature,
                                               cutoff)
    return logp, entropy, hidden
  routing = None
  if prompt_group > 1:
    hidden = shared_prompt_hidden(*args, prompt_group, inputs)
  elif moe:
    hidden, routing = completion_logits(*args, project=False, record_routing=True,
                                        routes=seqs.routes if replay_routes else None,
                                        inputs=inputs)
  else:
    hidden = completion_logits(*args, project=False, inputs=inputs)
  logp, entropy = chunked_logprobs_and_entropy(params, model_cfg, hidden, seqs.completion_tokens,
                                               temperature, model_cfg.logits_chunk, cutoff)
  result = (logp, entropy, hidden if return_hidden else None)
  return (*result, routing) if record_routing else result


def token_logprobs_and_entropy(logits, tokens, temperature: float = 1.0, keep_cutoff=None):
  """log pi(token) and H(pi) per position for pi = softmax(logits / temperature).

  logits (B, N, V), tokens (B, N) -> two (B, N) float32 arrays. The same arithmetic as
  jax.nn.log_softmax (shift by the stop-gradient max, subtract log-sum-exp), but the token is
  picked from the shifted logits rather than from the (B, N, V) log-softmax: XLA's backward
  pass of this form was over twice as fast on CPU at a 32k vocabulary (benchmarks/RESULTS.md).

  keep_cutoff (B, N), the keep-sampling mask (DeepSeek-V3.2; rollout/sampling.keep_record):
  the log-prob is that of pi renormalised over the set S the sampler's top-k / top-p left,
  S = {v : log pi(v) >= cutoff} (and the token itself):  log pi(t) - log sum_{v in S} pi(v).
  The set is chosen without a gradient; the renormalisation is differentiated. The entropy
  stays that of pi.
  """
  if temperature not in (0.0, 1.0):
    logits = logits / temperature
  logits = logits.astype(jnp.float32)
  shifted = logits - jax.lax.stop_gradient(jnp.max(logits, axis=-1, keepdims=True))
  log_z = jnp.log(jnp.sum(jnp.exp(shifted), axis=-1))
  logp = jnp.take_along_axis(shifted, tokens[..., None], axis=-1)[..., 0] - log_z
  logp_all = shifted - log_z[..., None]
  entropy = -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)
  if keep_cutoff is not None:
    vocab = jnp.arange(logits.shape[-1], dtype=tokens.dtype)
    in_set = jax.lax.stop_gradient((logp_all >= keep_cutoff[..., None])
                                   | (vocab == tokens[..., None]))
    kept = jnp.sum(jnp.where(in_set, jnp.exp(shifted), 0.0), axis=-1)
    logp = logp - (jnp.log(kept) - log_z)
  return logp, entropy


def completion_logprobs(params, model_cfg: ModelConfig, prompt_tokens, prompt_mask,
                        completion_tokens, completion_mask, temperature: float = 1.0):
  """(log-probs, entropies), each (B, N), zeroed where completion_mask is False."""
  seqs = types.SimpleNamespace(prompt_tokens=prompt_tokens, prompt_mask=prompt_mask,
                               completion_tokens=completion_tokens,
                               completion_mask=completion_mask)
  logp, entropy, _ = completion_scores(params, model_cfg, seqs, temperature)
  mask = completion_mask.astype(bool)
  return jnp.where(mask, logp, 0.0), jnp.where(mask, entropy, 0.0)
