"""Every config field, with its default: the one place where a section's defaults live (the
`rl` and `dpo` sections' in grpo_jax/objective_defaults.py, which get_defaults calls).

Recipes in configs/ start from `get_defaults()` (or from another recipe) and set only what
differs. The generic sections are those of configs/grpo_tiny.py (a run that needs no download),
`data` is configs/grpo_gsm8k.py's (without its path and instruction), `rl` is rl_defaults().
Print everything with

    python -c "from grpo_jax.defaults import get_defaults; print(get_defaults())"
"""

from __future__ import annotations

import ml_collections

from grpo_jax.data import addition_work, arithmetic, chat_arithmetic  # noqa: F401  built-in tasks
from grpo_jax.data import env_task  # noqa: F401  task "env"
from grpo_jax.envs import calculator  # noqa: F401  its built-in environment
from grpo_jax.envs.adapters import openenv  # noqa: F401  env.name="openenv" (lazy import)
from grpo_jax.data.task import TASKS
from grpo_jax.registry import declared_defaults
from grpo_jax.objective_defaults import dpo_defaults, rl_defaults  # config.rl, config.dpo


def get_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0  # the experiment's seed (initialisation, sampling, data order)
  # Comma-separated Python modules or .py files imported before validation, so that a user's
  # registered estimators, rewards and tasks exist; "" = none.
  c.imports = ""

  # A random model of these sizes, or a checkpoint whose config.json replaces them (model.path).
  c.model = ml_collections.ConfigDict(dict(
      path="",  # a local HF checkpoint folder (config.json, safetensors, tokenizer); "" = random
      vocab_size=16, hidden_size=128, intermediate_size=384,  # HF config.json names
      num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32,  # kv heads < heads: GQA
      rope_theta=10_000.0, rms_norm_eps=1e-6,
      tie_embeddings=True,  # output projection = the embedding's transpose
      # The family's blocks (grpo_jax/models/families/): llama (Llama, Mistral, Qwen2/3),
      # gemma, qwen3_moe, or one a config.imports module registers.
      family="llama",
      qkv_bias=False,  # Qwen2 has biases on q/k/v
      qk_norm=False,  # Qwen3 RMS-normalises q and k per head
      param_dtype="float32", compute_dtype="float32",  # weights / activations and matmuls
      # Memory only (the same maths): what each layer recomputes in the backward pass
      # (none, full, save_dots, save_dots_no_batch), and completion positions projected onto
      # the vocabulary at a time when scoring (0 = all at once; e.g. 64 at a 150k vocabulary).
      remat="none", logits_chunk=0,
      # The teacher-forced passes' and the prefill's attention: xla (ours), jax or cudnn
      # (jax.nn.dot_product_attention), pallas (jax's Pallas TPU flash kernel; TPU only);
      # auto = the platform table (grpo_jax/parallel/choices.py).
      attention_impl="auto",
      # The order of a row's tokens over the mesh's context devices (mesh.context > 1):
      # contiguous, or zigzag (causal load balance: each device 2 of 2C chunks, first and last
      # paired); auto = the platform table (grpo_jax/models/context.py).
      context_layout="auto",
      # A mixture of experts in every layer's MLP (family qwen3_moe, grpo_jax/models/moe.py;
      # Qwen3-MoE's fields): num_experts > 0 experts of moe_intermediate_size, experts_per_token per token
      # (their router weights renormalised when norm_topk_prob). A checkpoint sets them itself.
      num_experts=0, experts_per_token=0, moe_intermediate_size=0, norm_topk_prob=False))

  # "addition" (procedural, no files), "chat_arithmetic" or "gsm8k" (need model.path), then
  # the fields the built-in tasks declare with their defaults (each task's from_config:
  # addition num_digits, test_size, fixed_width, reverse_answer; addition_work work_fraction,
  # length_penalty; chat_arithmetic max_operand, operations, test_size).
  c.task = ml_collections.ConfigDict(declared_defaults(
      [e.cls.from_config for _, e in TASKS.items() if e.cls.__module__.startswith("grpo_jax.")],
      dict(name="addition")))

  # The environment of task.name="env" (multi-turn episodes, grpo_jax/envs/): env.name (a
  # registered environment), max_completion_tokens (an episode's ids after the prompt, the
  # policy's and the environment's; rollout.max_new_tokens caps each turn), then the fields
  # the built-in environments declare (calculator: digits, max_turns, tool_parser, tools,
  # max_concurrency, question; openenv, grpo_jax/envs/adapters/openenv.py: environment,
  # action_field, observation_field, system_prompt).
  # kv_continuation: the host episodes (experience source "episodes", the evaluation) continue
  # each episode's KV cache with a turn's new ids instead of prefilling the episode so far again
  # every turn (rollout/continuation.py; docs/environments.md): the same tokens, log-probs equal
  # to float rounding (not to the bit, hence off by default). async_slots: S > 0 plays the host
  # episodes' turns asynchronously (rollout/episodes/async_turns.py): an episode is sampled again as soon
  # as its own tool returns, up to S episodes a sampler call, each continuing its KV cache; 0 is
  # lock-step (every live episode's turn k in one call, after every tool of turn k - 1).
  from grpo_jax.envs import ENVIRONMENTS  # noqa: PLC0415  (filled by the imports above)
  c.env = ml_collections.ConfigDict(declared_defaults(
      [cls for _, cls in ENVIRONMENTS.items() if cls.__module__.startswith("grpo_jax.")],
      dict(name="calculator", max_completion_tokens=256, kv_continuation=False,
           async_slots=0)))

  # Data of file-backed tasks: gsm8k, and a researcher's own (task.name="table";
  # grpo_jax/data/table.py, README "Bring your own data and reward", docs/own_data.md).
  c.data = ml_collections.ConfigDict(dict(
      # gsm8k: "jsonl" (data.path/{train,test}.jsonl) or "tfds" (prepared gsm8k); table: a
      # .jsonl/.json/.parquet/.csv file, a folder of them or of save_to_disk, or a hub id
      source="jsonl",
      path="",  # gsm8k: the folder holding train.jsonl and test.jsonl
      tfds_dir="",  # tensorflow-datasets data_dir; "" = its default
      subset="",  # table, hub id: the dataset's configuration (e.g. "main")
      train_split="train", test_split="test",  # table: split (file) names
      # table: held out when the source has no test split (fixed seed)
      test_fraction=0.1,
      prompt_field="prompt",  # table: a string, or a list of {role, content} ("messages")
      answer_field="answer",  # table: the gold answer column (built-in rewards read it)
      system_prompt="",  # table: a system message before each prompt; "" = none
      on_bad_row="raise",  # table: "raise" (one sentence, file and line) or "skip" (counted)
      # table: fewer held-out rows than train.eval_size evaluates them all (a printed line)
      # instead of stopping (configs/grpo_table.py turns it on)
      fit_eval_size=False,
      instruction="",  # appended to the question, after a space (gsm8k recipe: verl's)
      use_chat_template=True,  # wrap the prompt in the tokenizer's chat template, if it has one
      max_prompt_tokens=512,  # the longest prompt a file-backed task keeps
      # table with model.vision: each row's one image resized to this many pixels square (a
      # multiple of patch_size * spatial_merge_size; 448 = Qwen2.5-VL's 16 x 16 image tokens)
      image_size=448,
      # Each batch of prompts is cut to its longest prompt rounded up to a multiple of this
      # many tokens (left padding removed), so a step computes no padding beyond it and a run
      # compiles at most max_prompt_tokens / prompt_bucket prompt shapes; 0 = every batch
      # padded to max_prompt_tokens.
      prompt_bucket=32))

  # The rewards (docs/rewards.md): the task's rule reward (weight
  # rule_weight; 0 = off), outcome reward models and remote servers, combined by `combine`:
  # "sum" (weighted sum, then the estimator normalises) or "normalise_then_sum" (GDPO: each
  # reward normalised within its group first). Each is logged as reward/<name>_mean.
  c.reward = ml_collections.ConfigDict(dict(
      # "" = the task's own default reward (addition: exact_match, gsm8k: gsm8k_strict)
      name="",
      # table: reward functions, comma-separated module:function (or file.py:function) or
      # built-ins math_verify, format_regex, answer_number (grpo_jax/rewards/functions.py), and
      # their weights ("" = all 1.0); format_regex's pattern
      fns="", fn_weights="", format_regex="",
      # the longest one call of a reward function may take, in seconds (it runs in a thread;
      # past this the run stops, saving its last step); 0 = no limit
      timeout_s=300.0,
      format_score=0.0,  # gsm8k: the score of a well-formatted but wrong answer
      rule_weight=1.0,
      # [{path: a *ForSequenceClassification folder, weight: 1.0, name: "rm0", tokenizer:
      #   "auto" | "policy" | "own", max_tokens: 1024}, ...]
      models=[],
      # [{url, weight: 1.0, name: "remote0", timeout_s: 30, max_retries: 3, backoff_s: 0.5,
      #   max_concurrency: 4, batch_size: 64}, ...] (grpo_jax/rewards/remote.py's schema)
      remote=[],
      combine="sum",
      # A process reward model (Math-Shepherd style; grpo_jax/models/process_reward_model.py)
      # giving rl.advantage="process" its step rewards instead of the task: a causal LM folder
      # sharing the policy's tokenizer; a step ends at each separator token (and at the last
      # token with score_last), scored P(good) / (P(good) + P(bad)). path "" = off.
      process_model=ml_collections.ConfigDict(dict(
          path="", separator_id=-1, good_id=-1, bad_id=-1, max_steps=16, score_last=True))))

  # Supervised warm-up (off for real checkpoints: steps=0).
  c.warmup = ml_collections.ConfigDict(dict(
      steps=1000, batch_size=128, learning_rate=1e-3,
      carry_drop_fraction=0.9,  # addition: share of targets shown with their carries dropped
      # a jsonl file of {prompt, response} to train on instead of the task's own warm-up data
      # (grpo_jax/data/supervised.py); "" = the task's
      data_path=""))

  # Reward-model training (python -m grpo_jax.train_rm; grpo_jax/train/stages/supervised.py): Bradley-Terry
  # on {prompt, chosen, rejected} jsonl pairs ("" = pairs made from the task: addition), with
  # this config's optim section, train.checkpoint_every and train.keep_checkpoints.
  c.rm = ml_collections.ConfigDict(dict(
      train_path="", test_path="", train_pairs=20_000, test_pairs=500,
      policy_fraction=0.5,  # made pairs: this share from the starting policy's wrong samples
      steps=600, batch_size=64, margin=0.0, eval_every=100,
      export=True))  # write workdir/hf_export (a *ForSequenceClassification folder)

  # Preference optimisation (python -m grpo_jax.train_dpo; grpo_jax/train/stages/preference.py): a
  # loss of the DPO family (grpo_jax/rl/dpo.py: dpo, cdpo, rdpo, ipo, kto, simpo, orpo, rpo) on
  # {prompt, chosen, rejected} pairs, made as the reward model's are when the paths are "",
  # from the warm-up's SFT policy (warmup.steps > 0) or model.path, which is also the frozen
  # reference; this config's optim section, train.checkpoint_every / keep_checkpoints.
  c.dpo = dpo_defaults()

  c.rollout = ml_collections.ConfigDict(dict(
      num_prompts=16,  # prompts per step
      group_size=8,  # G completions per prompt
      max_new_tokens=4,  # completion length limit
      temperature=1.0,  # 0 = greedy
      top_k=0,  # 0 = off
      top_p=1.0,  # 1.0 = off
      # Decode steps per segment: a segment's attention reads only the cache slots filled by
      # its end (P + e), not all P + N; 0 = one segment. Each segment is its own compiled loop.
      decode_block=128,
      # The static engine's decode loop: "segments" (one compiled decode step per segment, the
      # cache grown between them) or "bounded" (one decode step, reading the filled blocks up
      # to a traced bound); "auto" = the platform table (grpo_jax/parallel/choices.py).
      decode_loop="auto",
      # The training rollouts read the layers' kernels quantised to this dtype ("int8" or
      # "float8_e4m3fn", by qwix; models/quantized.py), a copy made from the policy at each
      # step; training, evaluation and exports stay in full precision. The sampler's log-probs
      # are the quantised policy's: rl.tis_cap corrects the difference. "" = full precision.
      weight_dtype="",
      # Decode slots of the slot-refill engine (continuous batching): when a row ends, its slot
      # takes the next pending row. 0 = one slot per row (the static engine: every row decodes
      # until the longest one ends). The drawn tokens do not depend on it.
      decode_slots=0))

  # Low-rank adapters on the policy (grpo_jax/models/lora.py; docs/fitting.md#lora-configlora):
  # rank 0 = off (full fine-tuning). With rank r > 0 only the adapters train; the reference
  # policy is the base with the adapters off. alpha: scale s = alpha / r (alpha / sqrt(r) with
  # use_rslora); targets: comma-separated projections or "all-linear" (PEFT's names); dropout:
  # only 0.0 (why: the same page, "No dropout"); export_adapter: with model.path, also write
  # workdir/peft_adapter (PEFT's format) at the end (train.export writes the merged full
  # checkpoint).
  c.lora = ml_collections.ConfigDict(dict(
      rank=0, alpha=32.0, dropout=0.0, targets="all-linear", use_rslora=False,
      export_adapter=True))

  # Every field and its source: rl_defaults (grpo_jax/objective_defaults.py).
  c.rl = rl_defaults()

  # AdamW after a linear learning-rate warm-up, with global-norm gradient clipping; then the
  # rate stays (schedule "constant") or falls toward final_lr_fraction x its peak, reached one
  # update after the last as in transformers' schedulers ("linear", "cosine";
  # grpo_jax/rl/lr_schedules.py).
  c.optim = ml_collections.ConfigDict(dict(
      learning_rate=2e-4, warmup_steps=30, weight_decay=0.0, b1=0.9, b2=0.99,
      max_grad_norm=1.0, schedule="constant", final_lr_fraction=0.0))

  c.train = ml_collections.ConfigDict(dict(
      steps=300,  # RL steps (one rollout batch each)
      eval_every=30,  # evaluate every N steps
      eval_size=500, eval_batch_size=250,  # test problems per evaluation, and per batch
      eval_pass_k=0,  # k > 0: also pass@k over k samples per prompt
      # Sample completions as text in workdir/samples.jsonl (a few printed): num_samples
      # training and evaluation samples every samples_every steps (0 = at every evaluation).
      num_samples=4, samples_every=0,
      export=False,  # write the policy as a HF checkpoint to workdir/hf_export
      # ... in this dtype (float32, bfloat16, float16), in files of at most this many MiB
      # (model-0000i-of-0000n.safetensors + index, as transformers writes them; 0 = one file)
      export_dtype="float32", export_max_shard_mb=0.0,
      checkpoint_every=50,  # also at step 0, at the end and on SIGTERM; 0 = only those last two
      keep_checkpoints=3,  # the newest K (a damaged newest one falls back to the one before)
      max_consecutive_skips=20,  # stop after this many non-finite updates in a row
      # One console line (the likely cause, the remedies) when this many steps in a row have
      # every group tied, so no signal (grpo_jax/train/run/no_signal.py); 0 = never.
      no_signal_steps=10,
      on_reward_error="raise",  # a reward that raises / is not finite: "raise" or "zero"
      # With "zero": stop when more than this fraction of a step's completions fail to score.
      max_reward_error_fraction=0.5,
      # K > 0: K RL iterations per host call in one jitted lax.scan; needs a task whose reward
      # is a JAX function
      fused_steps=0,
      # Where experience comes from (grpo_jax/train/sources/experience_source.py): "host", "fused" or
      # a registered source ("episodes", "fused_episodes": an env's episodes on the host or in
      # one jit); "" = "fused" when fused_steps > 0, else "host".
      experience_source="",
      # Resuming a workdir under a config that differs from its config.json (beyond run
      # length, under optim.schedule "constant", and bookkeeping: workdir.FREE_TO_CHANGE) is
      # refused unless this is True; every start's changes are recorded in run_info.json.
      allow_config_change=False,
      # Weights & Biases logging besides metrics.jsonl and TensorBoard: a project name ("" =
      # off; needs pip install -e '.[wandb]') and its mode: "online", "offline" (no network:
      # written under workdir/wandb, uploaded later with `wandb sync`) or "disabled".
      wandb_project="", wandb_mode="online",
      # JAX's persistent compilation cache: "auto" = ~/.cache/grpo_jax/xla (or
      # $GRPO_JAX_COMPILATION_CACHE) on a GPU or TPU, off on the CPU; "" = off; or a folder.
      # A second run of the same program starts from it (one H200: a first step of 140 s -> 6 s).
      compilation_cache="auto"))

  # Devices: (data, fsdp, tensor, expert, context) sizes, -1 = the rest; multi-host start-up
  # (see docs/meshes.md). expert splits a mixture's experts (and, like data, the rows);
  # context splits each row's tokens in the teacher-forced passes and the prefill
  # (docs/meshes.md#context-parallelism).
  # rollout_devices (split placement, docs/meshes.md): 0 = the sampler shares the learner's
  # mesh; n > 0 = the last n devices form the sampler's mesh and the first (total - n) the
  # learner's, each laid out by the sizes above (weights synced to the sampler every step).
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1,
                                          context=1, rollout_devices=0))
  c.distributed = ml_collections.ConfigDict(dict(
      mode="none",  # "none", "auto" (jax.distributed.initialize()) or "explicit" (below)
      coordinator_address="",  # "host:port"; "" = $JAX_COORDINATOR_ADDRESS
      num_processes=0,  # 0 = $JAX_NUM_PROCESSES
      process_id=-1))  # -1 = $JAX_PROCESS_ID
  return c
