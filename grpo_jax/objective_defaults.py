"""The defaults of the two sections whose fields partly come from registered entries: `config.rl`
(rl_defaults: the section's own fields, then the hyperparameters the built-in estimators, policy
losses, objectives and off-policy corrections declare) and `config.dpo` (dpo_defaults: the same
with the preference losses). grpo_jax/defaults.py builds every other section and calls these two;
`--print_config` reads the field docs from both files (grpo_jax/config_docs.py)."""

from __future__ import annotations

import ml_collections

from grpo_jax.registry import declared_defaults


def rl_defaults(**overrides) -> ml_collections.ConfigDict:
  """Every field of `config.rl`, with GRPO defaults (sources in docs/rl_suite.md): the
  section's own below, then the hyperparameters that the built-in estimators, policy losses and
  objectives declare with their defaults (advantage_eps, lam, whiten_advantages, clip_eps_low,
  clip_eps_high, dual_clip_c, log_ratio_clamp, drpo_*, is_high, is_low, decoupled_cap,
  cispo_eps_*; grpo_jax/rl/estimators.py, losses.py, drpo.py, corrections.py)."""
  from grpo_jax.rl import drpo, online_dpo  # noqa: F401,PLC0415  rl.objective "drpo", "online_dpo"
  from grpo_jax.rl.estimators import ESTIMATORS  # noqa: PLC0415
  from grpo_jax.rl.losses import POLICY_LOSSES  # noqa: PLC0415
  from grpo_jax.rl.objective import OBJECTIVES  # noqa: PLC0415
  from grpo_jax.rl.corrections import IS_CORRECTIONS  # noqa: PLC0415
  section = dict(
      advantage="grpo",  # a registered estimator (grpo_jax/rl/estimators.py)
      gamma=1.0,  # the discount of returns (verl: 1.0)
      loss="ppo_clip",  # a registered policy loss (grpo_jax/rl/losses.py): ppo_clip, gspo
      # A registered objective (grpo_jax/rl/objective.py): "policy_gradient" (rl.loss, KL,
      # entropy and value terms, aggregated), "drpo" (grpo_jax/rl/drpo.py; its drpo_* fields) or
      # "online_dpo" (grpo_jax/rl/online_dpo.py: DPO on each group's best and worst sample,
      # beta = kl_coef)
      objective="policy_gradient",
      tis_cap=0.0,  # truncated importance sampling cap (e.g. 2.0); 0 = off
      # Off-policy correction of the sampler's tokens (grpo_jax/rl/corrections.py): "none",
      # "tis_token" / "tis_sequence" / "tis_geometric" (truncated at is_high), "mis_token" /
      # "mis_sequence" / "mis_geometric" (IcePop: masked outside [is_low, is_high]),
      # "decoupled_ppo" (AReaL; its decoupled_cap), verl's rejection sampling "rs_<level>_<k>"
      # (grpo_jax/rl/rejection.py; level token, seq_sum, seq_mean, seq_max; k = k1, k2, k3) and
      # "rs_veto", or one weight joined to rejections by "+": e.g. "tis_sequence+rs_seq_mean_k1"
      is_correction="none",
      # verl's rollout_is_batch_normalize: the tis_* / mis_* weights divided by their batch mean
      is_batch_normalize=False,
      # the k1 rejections keep tokens (rows) with rs_low <= mu/pi_prox <= rs_high (the row's
      # geometric mean for seq_mean_k1; verl's presets 2.0, 1.001); rs_low 0 = 1/rs_high
      rs_low=0.0, rs_high=2.0,
      rs_kl_max=0.01,  # the k2 / k3 rejections keep a divergence <= this (verl's k3 presets)
      # "rs_veto" drops a row with any token whose pi_prox/mu < this (verl 0.6's default)
      rs_veto_threshold=1e-4,
      # Asynchronous RL (docs/async.md): the batch of step t is sampled by the policy of step
      # max(0, t - max_staleness), so sampling and host rewards of later batches overlap the
      # update; 0 = synchronous (on-policy).
      max_staleness=0,
      entropy_coef=0.0,
      loss_aggregation="token-mean",  # one of LOSS_AGGREGATIONS
      kl_coef=0.04,  # beta; 0 = no KL (no reference forward pass, no reference copy held)
      kl_estimator="k3", kl_clamp=20.0,  # |logp - ref| clamp (verl: 20); 0 = off
      kl_in="loss",  # "loss" (GRPO) or "reward" (PPO / InstructGPT per-token penalty)
      # On-policy distillation (grpo_jax/rl/distill.py): a frozen teacher (an HF folder with the
      # policy's tokenizer) scores the policy's own samples; the per-token reverse KL
      # log pi(a_t) - log pi_T(a_t), weighted by distill_coef, is a per-token reward ("reward":
      # -coef * KL_t added to each token's advantage, as Tinker's on-policy distillation) or a
      # loss term ("loss": + coef * the rl.kl_estimator of KL(pi || pi_T), as the KL to the
      # reference); 0 = off. Mixed with the task's rewards, which still give the advantages.
      distill_teacher="", distill_coef=0.0, distill_in="reward",
      # a teacher URL that needs a token (serve_teacher's GRPO_JAX_TEACHER_TOKEN): the NAME of
      # the environment variable holding it, sent as Authorization: Bearer; "" = none
      distill_teacher_token_env="",
      # a teacher URL's client (docs/remote_services.md): each request must end within
      # timeout_s seconds (connect, send, the whole answer); timeouts, connection errors, 5xx and
      # 429 are retried max_retries times, after backoff_s * 2**k s (at most 8 s); then the run
      # stops, saving its last completed step
      distill_teacher_timeout_s=60.0, distill_teacher_max_retries=5,
      distill_teacher_backoff_s=1.0,
      # DeepSeek-V3.2 (grpo_jax/rl/off_policy.py): the KL term weighted by pi / pi_old, eq. (7)
      unbiased_kl=False,
      # ... and off-policy sequence masking, eq. (9): no policy-gradient loss on a completion
      # with a negative advantage whose mean log(pi_sampler / pi) exceeds this delta; 0 = off
      opsm_delta=0.0,
      # ... and the keep-sampling mask: the sampler records which tokens rollout.top_k /
      # top_p left available at each position, and every log-prob of the update (current,
      # old, reference, sampler) is renormalised over that set (grpo_jax/models/scoring.py)
      keep_sampling_mask=False,
      adaptive_kl=False, kl_target=0.1, kl_horizon=10_000.0,
      ref_update_every=0,  # refresh the reference every N steps; 0 = frozen
      ref_mix=1.0,  # ref <- mix * policy + (1 - mix) * ref at a refresh
      value_head="none",  # "shared" (head on the policy) or "separate" (own critic model)
      value_coef=0.5, value_clip_eps=0.5,  # verl cliprange_value 0.5
      dynamic_sampling=False,  # DAPO: drop groups whose rewards are all equal, resample
      max_extra_rollouts=4,  # at most this many extra sampling rounds per step
      overlong_buffer=0,  # DAPO soft overlong punishment: buffer length in tokens; 0 = off
      overlong_penalty=1.0,  # ... and its maximum penalty
      mask_truncated=False,  # completions without <eos> contribute no loss
      num_iterations=1,  # mu: passes over each rollout batch
      num_minibatches=1,  # optimizer steps per pass
      num_micro_batches=1,  # gradient accumulation inside a minibatch (exact)
      # An optimizer step whose gradient is exactly zero (every group tied, no KL, entropy or
      # value term) leaves the params, the optimizer's moments and count as they were (counted
      # in no_signal_updates; train/learner/skips.py). False: AdamW steps on its momentum alone.
      skip_without_signal=True,
      # mu = 1 and one minibatch: the update's own log-probs (stop-gradient) are the old ones,
      # no separate forward pass (see experience.reuses_current_logprobs); False: recompute.
      reuse_old_logprobs=True,
      # Each prompt runs once through the teacher-forced passes (reference, old log-probs, the
      # update), its KV shared by its G completions: the prompt's FLOPs / G. Minibatches are
      # then whole groups. False: every row runs its own copy of the prompt (the same values
      # up to rounding).
      shared_prompt_forward=False,
      # Packed tokens (models/packing.py): the teacher-forced passes' per-token work
      # (projections, MLPs, vocabulary) runs only on the completion tokens that exist, packed
      # into a capacity the host picks per step from the rows' lengths, rounded up to one of
      # pack_tokens values (so at most pack_tokens compiled steps); attention still sees whole
      # rows. The same values up to rounding. 0 = off (every slot of every row). The host
      # experience source on one data x fsdp device.
      pack_tokens=0,
      # GFPO (arXiv 2508.09726): keep the gfpo_keep = k of each prompt's G' =
      # rollout.group_size samples with the best gfpo_metric ("length": shortest,
      # "token_efficiency": highest reward / length); advantages over the kept k. 0 = off.
      gfpo_keep=0, gfpo_metric="length",
      # A separate critic's start: "policy" (a copy of the policy, verl) or "reward_model"
      # (the backbone and score head of reward.models[0], OpenRLHF's default).
      critic_init="policy",
      # A mixture of experts (models/moe.py). routing_replay: "rollout" makes the update's
      # forward passes use the experts the sampler chose for every token (DeepSeek-V3.2's
      # "keep routing", R3), so the importance ratio compares the same experts; "off" lets
      # them route anew. Either way `routing_mismatch` reports the fraction of (completion
      # token, layer) pairs whose recomputed top-k differs from the rollout's.
      routing_replay="off",
      # transformers' load-balancing loss (router_aux_loss_coef) added to the RL loss; 0 = off.
      router_aux_coef=0.0,
  )
  entries = ([e.fn for _, e in ESTIMATORS.items()] + [fn for _, fn in POLICY_LOSSES.items()]
             + [e.build for _, e in OBJECTIVES.items()]
             + [fn for _, fn in IS_CORRECTIONS.items()])
  entries = [fn for fn in entries if fn.__module__.startswith("grpo_jax.")]  # built-in ones
  rl = ml_collections.ConfigDict(declared_defaults(entries, section))
  rl.update(overrides)
  return rl


def dpo_defaults() -> ml_collections.ConfigDict:
  """Every field of `config.dpo`: the section's own, then the hyperparameters the registered
  preference losses declare (beta, label_smoothing, rpo_alpha, simpo_gamma, desirable_weight,
  undesirable_weight)."""
  from grpo_jax.rl.dpo import PREFERENCE_LOSSES  # noqa: PLC0415
  section = dict(
      loss="dpo",  # a registered preference loss
      train_path="", test_path="", train_pairs=20_000, test_pairs=500,
      policy_fraction=0.5,  # made pairs: this share from the starting policy's wrong samples
      steps=300, batch_size=64, eval_every=100,
      # The reference's log-probs of the training pairs: "cached" (computed once, before the
      # first step, as TRL's precompute_ref_log_probs) or "on_the_fly" (each step).
      reference="cached",
      # Iterative RPO: rounds > 0 rounds of `steps` steps, each on pairs of the round's start
      # policy's own correct and wrong samples (rollout.group_size samples of round_prompts
      # prompts, up to pairs_per_prompt pairs each), its reference that start; 0 = offline.
      rounds=0, round_prompts=1024, pairs_per_prompt=1,
      # A pair of a file whose chosen and rejected completions are the same in the tokens
      # training reads (identical, both empty): "refuse" (one sentence: file, count, first
      # line) or "skip" (dropped, the count printed). docs/dpo.md
      on_degenerate_pair="refuse",
      export=True)  # write the policy to workdir/hf_export (a *ForCausalLM folder)
  entries = [fn for _, fn in PREFERENCE_LOSSES.items() if fn.__module__.startswith("grpo_jax.")]
  return ml_collections.ConfigDict(declared_defaults(entries, section))
