"""The deliberate defects of benchmarks/mutation_check.py: each an id, one line saying what is
wrong, the exact edits under grpo_jax/ (each `old` string occurs once in its file) and the
candidate tests that should catch it."""

import dataclasses

@dataclasses.dataclass(frozen=True)
class Defect:
  """One deliberate defect: replace `old` (exactly once in `file`) by `new`, and any further
  (file, old, new) edits in `more`; `tests` are pytest selections that should fail."""
  id: str
  description: str
  file: str
  old: str
  new: str
  tests: tuple
  more: tuple = ()

  @property
  def edits(self) -> tuple:
    return ((self.file, self.old, self.new),) + tuple(self.more)


DEFECTS = (
    Defect(
        "kl_sign",
        "the per-token KL penalty in the GRPO/PPO loss is subtracted instead of added, so the "
        "policy is rewarded for moving away from the reference",
        "grpo_jax/rl/objective.py",
        "per_token = per_token + kl_coef * kl",
        "per_token = per_token - kl_coef * kl",
        ("tests/test_objective.py::test_objective_matches_a_loop_reference",)),
    Defect(
        "ppo_clip_removed",
        "PPO's clipped surrogate loses its clip: the loss is -ratio * A for any ratio",
        "grpo_jax/rl/losses.py",
        "  loss = jnp.maximum(unclipped, clipped_loss)\n",
        "  loss = unclipped\n",
        ("tests/test_rl.py::test_clipped_surrogate_matches_loop",
         "tests/test_rl_suite.py::test_ppo_clip_loss_with_dual_clip_matches_loop")),
    Defect(
        "gae_gamma_lambda_swapped",
        "GAE's recursion uses lambda where the discount gamma belongs (delta_t = r_t + "
        "lam V_next - V_t): gamma and lambda swapped",
        "grpo_jax/rl/token_advantages.py",
        "adv = r + gamma * next_value - v + gamma * lam * next_adv",
        "adv = r + lam * next_value - v + lam * gamma * next_adv",
        ("tests/test_rl_suite.py::test_gae_matches_loop",)),
    Defect(
        "completion_mask_drops_eos",
        "off by one in the sampler's completion mask: a row's EOS token is left out, so the "
        "loss never trains the model to stop (and every row reads as truncated)",
        "grpo_jax/rollout/static.py",
        "state.kept, s.pad_id)\n    done =",
        "state.kept, s.pad_id)\n    recorded = recorded._replace(mask=recorded.mask.at[\n"
        "        :, state.t].set(live & (token != s.eos_id)))\n    done =",
        ("tests/test_sampler.py::test_eos_ends_each_row_and_masks_follow",
         "tests/test_sampler.py::test_greedy_equals_stepwise_argmax_of_full_forward")),
    Defect(
        "tool_tokens_in_loss",
        "a multi-turn episode's environment/tool tokens stay in the loss mask (the action mask "
        "is ignored when the batch is prepared)",
        "grpo_jax/train/learner/experience.py",
        "actions = rollout.action_mask.astype(bool) & mask",
        "actions = mask",
        ("tests/test_prepare.py",
         "tests/test_update.py::test_the_loss_mask_is_the_action_mask")),
    Defect(
        "sampler_ignores_temperature",
        "the sampler draws from softmax(logits) whatever rollout.temperature says (greedy still "
        "works), while the trainer scores softmax(logits / T)",
        "grpo_jax/rollout/sampling.py",
        "scaled = logits if temperature in (0.0, 1.0) else logits / temperature",
        "scaled = logits",
        ("tests/test_sampler.py::test_sampler_logprobs_equal_full_forward_recomputation",
         "tests/test_sampler.py::test_sampled_token_frequencies_follow_the_softmax")),
    Defect(
        "resume_data_position_zero",
        "a resumed run restores the source's data position of step 0, so it trains on the "
        "first prompts again",
        "grpo_jax/train/run/checkpoint.py",
        "tree.source.replace(key=jax.random.wrap_key_data(tree.source.key)))",
        "tree.source.replace(key=jax.random.wrap_key_data(tree.source.key),\n"
        "                                        data_position=jnp.zeros_like("
        "tree.source.data_position)))",
        ("tests/test_checkpoint.py::"
         "test_sigterm_saves_the_current_step_and_a_damaged_latest_falls_back",
         "tests/test_seeds.py::test_stacked_seeds_resume_from_their_checkpoint")),
    Defect(
        "max_staleness_not_enforced",
        "the learner no longer refuses experience older than its source's max_staleness "
        "(only rows from the future are refused)",
        "grpo_jax/train/stages/rl_advance.py",
        "if step - version > max_staleness or version > step:",
        "if version > step:",
        ("tests/test_experience_source.py::test_rows_staler_than_declared_are_refused",)),
    Defect(
        "vlm_update_without_image",
        "a vision-language policy's update (and reference) pass scores the completions against "
        "a blank image instead of the row's image: the image never reaches the update",
        "grpo_jax/train/learner/forward.py",
        'seqs.prompt_mask.astype(bool), seqs.images, model_cfg)',
        'seqs.prompt_mask.astype(bool), jnp.zeros_like(seqs.images), model_cfg)',
        ("tests/test_vlm_policy.py::"
         "test_sampler_logprobs_equal_the_updates_and_the_image_matters",)),
    Defect(
        "gemma3_local_rope_theta",
        "Gemma 3's sliding-window layers rotate with the global layers' RoPE theta instead of "
        "their own (rope_local_base_freq / rope_parameters['sliding_attention'])",
        "grpo_jax/models/families/gemma.py",
        'rope_local_theta=float(local["rope_theta"])',
        'rope_local_theta=float(_gemma3_ropes(hf_config)[0]["rope_theta"])',
        ("tests/test_gemma.py::test_logits_equal_transformers_on_a_left_padded_batch"
         "[gemma3_text]",
         "tests/test_gemma.py::test_greedy_tokens_past_the_window_equal_generate"
         "[gemma3_text]")),
    Defect(
        "reference_follows_policy",
        "the KL reference is overwritten with the policy after every step (whatever "
        "rl.ref_update_every and rl.ref_mix say), so the KL measures nothing",
        "grpo_jax/train/learner/state.py",
        "  if rl.ref_update_every > 0 and state.ref_params is not None:  # (none under LoRA)\n"
        "    refresh = state.step % rl.ref_update_every == 0\n"
        "    mix = rl.ref_mix\n",
        "  if state.ref_params is not None:  # (none under LoRA)\n"
        "    refresh = True\n"
        "    mix = 1.0\n",
        ("tests/test_update.py::test_adaptive_kl_and_reference_refresh",)),
    Defect(
        "reward_fn_weights_ignored",
        "reward.fn_weights is read and checked but every reward function gets weight 1.0",
        "grpo_jax/rewards/functions.py",
        "out.append(RewardFunction(spec, fn, weight, timeout_s))",
        "out.append(RewardFunction(spec, fn, 1.0, timeout_s))",
        ("tests/test_visual_data.py::"
         "test_reward_fn_weights_reach_each_function_and_the_weighted_sum",
         "tests/test_table.py::"
         "test_the_readmes_own_data_and_reward_learn_from_outside_the_repository")),
    Defect(
        "lora_merge_wrong_scale",
        "merging LoRA adapters into the weights (export, VLM policy, DPO export) scales A B by "
        "rank / alpha instead of alpha / rank",
        "grpo_jax/models/lora.py",
        "merged = kernel.astype(jnp.float32) + scale * delta",
        "merged = kernel.astype(jnp.float32) + delta / scale",
        ("tests/test_lora.py::test_adapter_gradients_are_the_weight_gradient_projected",
         "tests/test_lora.py::test_peft_loads_our_adapter_and_the_merged_export_matches")),
    Defect(
        "dpo_beta_twice",
        "DPO's sigmoid loss multiplies the log-ratio margin by beta twice (-log sigma(beta^2 "
        "Delta)); rpo, built on it, too",
        "grpo_jax/rl/dpo.py",
        "return jnp.mean(-jax.nn.log_sigmoid(beta * (c - r)))",
        "return jnp.mean(-jax.nn.log_sigmoid(beta * beta * (c - r)))",
        ("tests/test_online_dpo.py::test_loss_is_offline_dpo_on_the_selected_pairs",
         "tests/test_dpo_losses.py::test_dpo_equals_trl_sigmoid")),
    Defect(
        "value_clip_ignored",
        "PPO's value loss is the plain squared error even when rl.value_clip_eps is set (the "
        "clipped term never enters the max)",
        "grpo_jax/rl/losses.py",
        "loss = jnp.where(mask, 0.5 * jnp.maximum(unclipped, clipped_sq), 0.0)",
        "loss = jnp.where(mask, 0.5 * unclipped, 0.0)",
        ("tests/test_rl_suite.py::test_truncated_is_weights_value_loss_entropy",)),
    Defect(
        "group_std_not_divided",
        "GRPO's group-normalised advantages are only centred: the group's standard deviation "
        "is never divided out",
        "grpo_jax/rl/advantages.py",
        "centred = centred / (groups.std(axis=1, ddof=1, keepdims=True) + eps)",
        "centred = centred / (1.0 + eps)",
        ("tests/test_rl.py::test_group_normalized_advantages_match_loop",
         "tests/test_prepare.py")),
    Defect(
        "loss_aggregation_ignored",
        "the loss is always aggregated as seq-mean-token-mean (over these rows), whatever "
        "rl.loss_aggregation says (token-mean by default)",
        "grpo_jax/rl/objective.py",
        "loss = aggregate(per_token, mask, mode, normalizer)",
        'loss = aggregate(per_token, mask, "seq-mean-token-mean")',
        ("tests/test_objective.py::test_objective_matches_a_loop_reference",
         "tests/test_update.py::test_micro_batches_give_the_full_batch_update")),
    Defect(
        "restore_resets_optimizer",
        "restoring a checkpoint zeroes the optimizer state (AdamW moments and step count), as "
        "if the run started afresh at the restored params",
        "grpo_jax/train/run/checkpoint.py",
        "return tree.replace(key=jax.random.wrap_key_data(tree.key))",
        "return tree.replace(key=jax.random.wrap_key_data(tree.key),\n"
        "                      opt_state=jax.tree.map(jnp.zeros_like, tree.opt_state))",
        ("tests/test_stages.py::test_sft_stage_resumes_exactly",
         "tests/test_checkpoint.py::test_sigkill_then_resume_reproduces_the_uninterrupted_run")),
    # Further defects a reviewer would fear.
    Defect(
        "tis_cap_ignored",
        "truncated importance sampling (rl.tis_cap) forgets its cap: the weights are the raw "
        "trainer / sampler ratios",
        "grpo_jax/rl/losses.py",
        "weights = jnp.minimum(jnp.exp(trainer_old - rollout), cap)",
        "weights = jnp.exp(trainer_old - rollout)",
        ("tests/test_rl_suite.py::test_truncated_is_weights_value_loss_entropy",)),
    Defect(
        "top_p_drops_crossing_token",
        "the nucleus (top-p) filter drops the token whose probability carries the mass past p "
        "(and keeps everything when the top token alone exceeds p)",
        "grpo_jax/rollout/sampling.py",
        "mass_before = jnp.cumsum(probs, axis=-1) - probs",
        "mass_before = jnp.cumsum(probs, axis=-1)",
        ("tests/test_sampler.py::test_top_k_and_top_p_filters_match_numpy",)),
    Defect(
        "logprobs_shifted_one_position",
        "the teacher-forced pass reads the logits one position late: completion token t is "
        "scored with the logits that predict token t + 1",
        "grpo_jax/models/scoring.py",
        "logits_window=(prompt_len - 1, num_new)",
        "logits_window=(prompt_len, num_new)",
        ("tests/test_sampler.py::test_sampler_logprobs_equal_full_forward_recomputation",
         "tests/test_episodes.py::"
         "test_the_updates_logprobs_of_the_policys_tokens_equal_the_samplers")),
    Defect(
        "kv_cache_replicated",
        "the sampler's KV cache is replicated on every device of a mesh (its rows not split over "
        "data x fsdp, its kv heads not over tensor): the memory of a sharded rollout",
        "grpo_jax/rollout/prefill.py",
        'axes = ("batch", "kv_heads", None, None)',
        "axes = (None, None, None, None)",
        ("tests/test_mesh.py",)),
    Defect(
        "split_sampler_keeps_first_weights",
        "split placement (mesh.rollout_devices): the sampler's devices get the learner's weights "
        "once, at the first step, and sample with them ever after",
        "grpo_jax/train/sources/host.py",
        "  def next_experience(train_state, source):\n"
        "    version = step_of(train_state)\n"
        "    params, sync = run.sync_weights_timed(policy_params(train_state))\n",
        "  first_sync = []\n\n"
        "  def next_experience(train_state, source):\n"
        "    version = step_of(train_state)\n"
        "    if not first_sync:\n"
        "      first_sync.append(run.sync_weights_timed(policy_params(train_state)))\n"
        "    params, sync = (first_sync[0] if split\n"
        "                    else run.sync_weights_timed(policy_params(train_state)))\n",
        ("tests/test_split_placement.py",)),
    Defect(
        "seeds_all_seed_zero",
        "S seeds in one program: every seed's outputs are read from seed 0's slice (SeedAxis."
        "unstack), so the seeds' records and checkpoints are all the first seed's",
        "grpo_jax/train/run/seed_axis.py",
        "return [jax.tree.map(lambda x: x[i], tree) for i in range(len(self.seeds))]",
        "return [jax.tree.map(lambda x: x[0], tree) for i in range(len(self.seeds))]",
        ("tests/test_seeds.py",)),
    Defect(
        "gae_arguments_swapped",
        "the GAE estimator passes rl.lam as the discount and rl.gamma as lambda (numbers "
        "change only when rl.gamma != rl.lam; both default to 1.0)",
        "grpo_jax/rl/estimators.py",
        "x.mask, gamma, lam,",
        "x.mask, lam, gamma,",
        ("tests/test_rl_suite.py::test_the_gae_estimator_binds_rl_gamma_and_lam_by_name",
         "tests/test_objective.py::test_objective_gives_the_updates_loss_and_gradients",
         "tests/test_update.py")),
)
