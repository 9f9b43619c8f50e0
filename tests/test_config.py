"""Bad input fails with one sentence naming the value, before any compute."""

import os
import subprocess
import sys

import pytest

from configs import grpo_tiny
from grpo_jax.config import ConfigError, validate
from grpo_jax.train.stages.rl import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _main(*args):
  return subprocess.run([sys.executable, "-m", "grpo_jax.main", "--config=configs/grpo_tiny.py",
                         *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_unknown_config_field_is_one_clear_sentence(tmp_path):
  out = _main(f"--workdir={tmp_path}/w", "--config.rl.kl_coeff=0.1")
  assert out.returncode == 2
  assert out.stderr.strip().splitlines() == [
      "error: --config.rl.kl_coeff is not a field of configs/grpo_tiny.py: rl has no field "
      "'kl_coeff'; valid fields there: " + ", ".join(sorted(grpo_tiny.get_config().rl)) + "."]
  assert "kl_coef, kl_estimator" in out.stderr
  assert not os.path.exists(f"{tmp_path}/w")


def test_config_error_from_main_is_one_line(tmp_path):
  out = _main(f"--workdir={tmp_path}/w", "--config.rollout.group_size=1")
  assert out.returncode == 2
  assert out.stderr.strip().splitlines()[-1].startswith("error: rollout.group_size=1 ")
  assert "Traceback" not in out.stderr
  assert not os.path.exists(f"{tmp_path}/w")


@pytest.mark.parametrize("section,field,value,expected", [
    ("rollout", "group_size", 1, "rollout.group_size=1 with rl.advantage='grpo'"),
    ("rl", "num_minibatches", 5, "rollout batch of 128 completions (rollout.num_prompts=16 x "
                                 "rollout.group_size=8) does not split into "
                                 "rl.num_minibatches=5"),
    # Registries list their names sorted (grpo_jax/registry.py).
    ("rl", "advantage", "gae2", "rl.advantage='gae2' is unknown; valid: dr_grpo, gae, grpo, "
                                "grpo_batch_std, process, reinforce_pp, "
                                "reinforce_pp_baseline, remax, rloo."),
    ("rl", "advantage", "gae", "rl.advantage='gae' needs a critic, but rl.value_head='none'"),
    ("rl", "loss", "ppo2", "rl.loss='ppo2' is unknown; valid: cispo, gspo, ppo_clip."),
    ("rl", "kl_estimator", "k4", "rl.kl_estimator='k4' is unknown; valid: k1, k2, k3."),
    ("rl", "num_micro_batches", 3, "a minibatch of 128 completions does not split into "
                                   "rl.num_micro_batches=3"),
    ("rl", "loss_aggregation", "sum", "rl.loss_aggregation='sum' is unknown"),
    ("optim", "learning_rate", float("inf"), "optim.learning_rate=inf; use a finite value > 0"),
    ("optim", "learning_rate", 0.0, "optim.learning_rate=0.0; use a finite value > 0"),
    ("warmup", "learning_rate", float("nan"), "warmup.learning_rate=nan; use a finite value"),
    ("optim", "max_grad_norm", 0.0, "optim.max_grad_norm=0.0; use a finite value > 0"),
    ("optim", "b2", 1.0, "optim.b2=1.0; AdamW's decay rates must be below 1"),
    # round 5's X01: a teacher without its coefficient was ignored
    ("rl", "distill_teacher", "http://127.0.0.1:9", "rl.distill_teacher='http://127.0.0.1:9' "
                                                    "is set, but rl.distill_coef=0"),
    ("optim", "schedule", "cosin", "optim.schedule='cosin' is unknown; valid: constant, "
                                   "cosine, linear"),
    ("optim", "final_lr_fraction", 1.5, "optim.final_lr_fraction=1.5; use a fraction of the "
                                        "peak rate in [0, 1]"),
    ("rollout", "max_new_tokens", 0, "rollout.max_new_tokens=0; use at least 1"),
    ("train", "eval_pass_k", -2, "train.eval_pass_k=-2; use 0 (off)"),
    # an infinite KL coefficient made the loss inf or NaN; a negative count silently meant 0
    ("rl", "kl_coef", float("inf"), "rl.kl_coef=inf; use a finite value >= 0 (0 turns KL off)."),
    ("train", "no_signal_steps", -1, "train.no_signal_steps=-1; use a number of steps in a row "
                                     "without signal >= 0 (0: no such line)."),
    ("model", "compute_dtype", "float8", "model.compute_dtype='float8' is unknown; valid: "
                                         "bfloat16, float16, float32, auto."),
    ("rollout", "decode_slots", -2, "rollout.decode_slots=-2; use a whole number of decode "
                                    "slots >= 0"),
    ("rollout", "weight_dtype", "int4", "rollout.weight_dtype='int4'; use '' (full precision) "
                                        "or one of ['float8_e4m3fn', 'int8']."),
    ("rl", "routing_replay", "update", "rl.routing_replay='update'; use 'off' or 'rollout'."),
    ("rl", "routing_replay", "rollout", "rl.routing_replay='rollout' / rl.router_aux_coef=0.0 "
                                        "need a mixture of experts (model.num_experts > 0)"),
    # an odd head died inside RoPE's split; a zero base or a negative epsilon gave NaN logits
    ("model", "head_dim", 7, "model.head_dim=7 is odd; RoPE rotates pairs"),
    ("model", "rope_theta", 0.0, "model.rope_theta=0.0; use a finite number > 0"),
    ("model", "rms_norm_eps", -1e-6, "model.rms_norm_eps=-1e-06; use a finite number >= 0"),
    # rm.policy_fraction=2 made a negative count of pairs (an IndexError); the others acted as
    # 0 or 1; 5 digits listed 5e9 pairs (9.3 GiB) before a MemoryError
    ("rm", "policy_fraction", 2.0, "rm.policy_fraction=2.0; use a fraction in [0, 1]."),
    ("dpo", "policy_fraction", -3.0, "dpo.policy_fraction=-3.0; use a fraction in [0, 1]."),
    ("warmup", "carry_drop_fraction", float("nan"), "warmup.carry_drop_fraction=nan; use a"),
    ("task", "num_digits", 5, "task.num_digits=5; use 1 to 4 (the task lists every pair"),
])

def test_invalid_values_fail_before_any_compute(tmp_path, section, field, value, expected):
  config = grpo_tiny.get_config()
  config[section][field] = value
  with pytest.raises(ConfigError) as err:
    validate(config)
  assert expected in str(err.value)
  assert str(err.value).count(". ") == 0 and str(err.value).endswith(".")  # one sentence
  with pytest.raises(ConfigError):
    train(config, str(tmp_path / "w"))
  assert not (tmp_path / "w").exists()  # nothing was started


def test_the_shipped_configs_are_valid(tmp_path):
  """Every recipe under configs/ passes validation as shipped (the GSM8K one given the
  checkpoint folder and data it needs)."""
  import importlib  # noqa: PLC0415
  import pkgutil  # noqa: PLC0415

  import configs  # noqa: PLC0415
  from tests.hf_fixtures import save_tiny_qwen2  # noqa: PLC0415
  names = [m.name for m in pkgutil.iter_modules(configs.__path__) if not m.ispkg]
  assert {"grpo_tiny", "ppo_tiny", "dapo_tiny", "grpo_gsm8k"} <= set(names)
  for name in names:
    config = importlib.import_module(f"configs.{name}").get_config()
    if config.task.name in ("gsm8k", "chat_arithmetic", "table"):
      config.model.path = save_tiny_qwen2(str(tmp_path / "ckpt"))
      config.data.path = os.path.join(ROOT, "tests", "data", "gsm8k")
    if config.task.name == "table":  # the user's data and reward, by the command line
      config.data.source = os.path.join(ROOT, "tests", "data", "gsm8k")
      config.reward.fns = "answer_number"
    if config.task.name == "table" and config.model.get("vision") is not None:
      # a Qwen2.5-VL folder (tokenizer with the vision tokens) and a table of image rows
      from grpo_jax.data.visual_count import write_table  # noqa: PLC0415
      from tests.test_table_images import save_tiny_vl, save_tokenizer  # noqa: PLC0415
      config.model.path = str(tmp_path / f"vl_{name}")
      save_tiny_vl(config.model.path, save_tokenizer(config.model.path))
      config.data.source = str(tmp_path / f"rows_{name}")
      write_table(config.data.source, train=4, test=2, variant="count")
    if config.rl.distill_coef > 0:  # the teacher's folder (validation reads its config.json)
      os.makedirs(tmp_path / "teacher", exist_ok=True)
      (tmp_path / "teacher" / "config.json").write_text("{}")
      config.rl.distill_teacher = str(tmp_path / "teacher")
    validate(config)


def test_an_moe_model_refuses_what_cannot_record_its_routing():
  config = grpo_tiny.get_config()
  config.model.update(dict(family="qwen3_moe", num_experts=4, experts_per_token=2,
                           moe_intermediate_size=16))
  config.rollout.decode_slots = 4  # both engines record the routing
  validate(config)
  config.rl.pack_tokens = 4
  with pytest.raises(ConfigError, match=r"an MoE model \(model.num_experts=4\) records its "
                                        r"routing on the per-row passes; set rl.pack_tokens=0"):
    validate(config)


def test_a_negative_window_and_a_yarn_without_its_factor_are_refused():
  """A window < 0 masked every key (the softmax went uniform, future tokens leaked); YaRN with
  neither a factor nor max_position_embeddings gave a factor of 0 and NaN logits."""
  from grpo_jax.models.config import ModelConfig  # noqa: PLC0415
  base = dict(vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=1, num_heads=2,
              num_kv_heads=1, head_dim=4)
  with pytest.raises(ValueError, match=r"model.sliding_window=-1; use a finite number >= 0"):
    ModelConfig(**base, sliding_window=-1)
  with pytest.raises(ValueError, match="rope_type='yarn' without a factor"):
    ModelConfig(**base, rope_type="yarn", rope_scaling=(("original_max_position_embeddings", 32),))
  ModelConfig(**base, rope_type="yarn", rope_scaling=(("original_max_position_embeddings", 32),),
              max_position_embeddings=64)


def test_packed_tokens_need_a_completion_longer_than_one_token():
  """rl.pack_tokens packs the tokens after each completion's first: with one-token completions
  (a classification-style reward) the packed capacity's unit was 0 and the first step died of
  a ZeroDivisionError after the first rollout."""
  config = grpo_tiny.get_config()
  config.rl.pack_tokens, config.rollout.max_new_tokens = 4, 1
  with pytest.raises(ConfigError, match=r"rl.pack_tokens=4 packs each completion's tokens after "
                                        r"its first, and rollout.max_new_tokens=1 leaves none"):
    validate(config)


def test_the_engine_table_refuses_what_an_episode_engine_cannot_record():
  """rollout/engine.py's ENGINES: the turn players (and the continuation engines under them)
  keep no truncation record; a quantised rollout runs under every engine."""
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  from grpo_jax.rollout.engine import refuse  # noqa: PLC0415
  config = grpo_calculator_tiny.get_config()
  config.rollout.update(top_p=0.9, weight_dtype="int8")
  config.env.kv_continuation = True
  validate(config)
  config.rl.keep_sampling_mask = True
  with pytest.raises(ConfigError, match=r"rl.keep_sampling_mask=True asks the 'episodes' engine "
                                        r"for what it cannot give: an episode's rows are "
                                        r"stitched"):
    validate(config)
  with pytest.raises(ConfigError, match="the 'continuation' engine"):
    refuse(["continuation"], ["keep_mask"])


# Round 5's environment fields that ran on nothing (E08, E14) or ended in a traceback that
# named no field (E15, E16): one sentence from the config's checks or the environment's own.
@pytest.mark.parametrize("field,value,expected", [
    ("max_turns", 0, "env.max_turns=0; use a whole number >= 1"),
    ("max_concurrency", 0, "env.max_concurrency=0; use a whole number >= 1"),
    ("max_completion_tokens", 0, "env.max_completion_tokens=0; use a whole number >= 1"),
    ("digits", 0, "env.digits=0; use a whole number from 1 to 18"),
    ("question", "{c}-{a}", "env.question='{c}-{a}' cannot be filled (KeyError: 'c'); its "
                            "placeholders are {a} and {b}, the two factors."),
])
def test_a_bad_environment_field_is_one_sentence(field, value, expected):
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  from grpo_jax.envs import ENVIRONMENTS  # noqa: PLC0415
  config = grpo_calculator_tiny.get_config()
  config.env[field] = value
  with pytest.raises(ConfigError) as err:
    validate(config)
    ENVIRONMENTS.bind(config.env.name, config.env)()
  assert str(err.value).startswith(expected), str(err.value)


def test_pass_at_k_on_a_task_of_episodes_is_refused():
  """The episode evaluator plays one greedy episode per problem: train.eval_pass_k was accepted
  and no eval_pass_at_k was ever written."""
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  config = grpo_calculator_tiny.get_config()
  config.train.eval_pass_k = 2
  with pytest.raises(ConfigError, match=r"^train.eval_pass_k=2: a task of episodes is evaluated "
                                        r"on one greedy episode per problem"):
    validate(config)


def test_round_5s_unclear_sentences_now_say_the_cause():
  """VR5: a vision policy's warm-up was refused with a fix that could not work; it now runs
  (the decoder on the visual task's own text: tests/test_vlm_features.py). X09: a training
  run's workdir given as the model was called an unsupported model_type."""
  from configs import grpo_vision_tiny  # noqa: PLC0415
  from grpo_jax.models.hf import model_config_from_hf  # noqa: PLC0415
  config = grpo_vision_tiny.get_config()
  config.warmup.steps = 5
  validate(config)
  with pytest.raises(ValueError, match=r"^config.json is a grpo_jax run's config, not a "
                     r"model's: this folder is a training run's workdir; give its hf_export"):
    model_config_from_hf({"train": {}, "rl": {}, "model": {}})


@pytest.mark.parametrize("fields,expected", [
    # rl.gfpo_keep=1 left the update groups of one (grpo failed at step time, dr_grpo's
    # advantages were all 0, online_dpo's sentence named rollout.group_size)
    (dict(gfpo_keep=1), "rl.gfpo_keep=1 keeps 1 of a prompt's completions for the update, but "
                        "rl.advantage='grpo' compares the completions of a prompt; keep 2 to "
                        "rollout.group_size=8, or set rl.gfpo_keep=0."),
    (dict(gfpo_keep=1, advantage="dr_grpo"), "but rl.advantage='dr_grpo' compares"),
    (dict(gfpo_keep=1, objective="online_dpo", kl_coef=0.1), "but rl.objective='online_dpo' "),
    # values that crossed a clip's bounds or left their range and gave wrong numbers
    (dict(kl_clamp=-5.0), "rl.kl_clamp=-5.0; use 0 (off) or a bound > 0"),
    (dict(advantage_eps=-1e-6), "rl.advantage_eps=-1e-06; use a value >= 0"),
    (dict(lam=2.0), "rl.lam=2.0; use a GAE lambda in [0, 1]"),
    (dict(advantage="gae", value_head="shared", value_clip_eps=-0.5),
     "rl.value_clip_eps=-0.5, rl.value_coef=0.5; use values >= 0"),
    (dict(advantage="gae", value_head="shared", value_coef=-1.0), "rl.value_coef=-1.0; use"),
    (dict(gamma=-1.0), "rl.gamma=-1.0; use a discount in [0, 1]"),
    (dict(gamma=float("nan")), "rl.gamma=nan; use a discount in [0, 1]"),
    (dict(overlong_buffer=2, overlong_penalty=-1.0), "rl.overlong_penalty=-1.0; use a value"),
    # settings the chosen loss, objective or estimator does not read, which were ignored
    (dict(loss="gspo", dual_clip_c=3.0), "rl.dual_clip_c=3.0 is a hyperparameter of "
                                         "rl.loss='ppo_clip', which rl.loss='gspo' does not take"),
    (dict(loss="ppo_clip", cispo_eps_high=0.3), "rl.cispo_eps_high=0.3 is a hyperparameter of "
                                                "rl.loss='cispo'"),
    (dict(objective="drpo", overlong_buffer=2), "rl.objective='drpo' reads each completion's "
                                                "reward as scored"),
    (dict(objective="drpo", kl_in="reward"), "rl.kl_in='reward' would not reach"),
    (dict(objective="online_dpo", kl_coef=0.1, overlong_buffer=2),
     "rl.objective='online_dpo' reads each completion's reward as scored"),
    (dict(advantage="process", kl_in="reward"), "rl.advantage='process' reads the step "
                                                "rewards"),
])
def test_rl_values_that_gave_wrong_numbers_are_one_sentence(fields, expected):
  config = grpo_tiny.get_config()
  config.rl.update(fields)
  with pytest.raises(ConfigError) as err:
    validate(config)
  assert expected in str(err.value) and str(err.value).count(". ") == 0
  config = grpo_tiny.get_config()  # the edges are valid
  config.rl.update(gfpo_keep=2, kl_clamp=0.0, advantage_eps=0.0, lam=0.0, value_clip_eps=-1.0)
  validate(config)  # (value_clip_eps unread without a critic)


def test_the_overlong_buffer_of_an_episode_counts_to_the_episodes_cap():
  """An episode's completion (every id after its prompt) runs to env.max_completion_tokens,
  not to one turn's rollout.max_new_tokens: rl.overlong_buffer is checked against that cap,
  and the update's overlong penalty counts to it (config.completion_cap, stages/rl.py)."""
  from configs import grpo_calculator_tiny  # noqa: PLC0415
  from grpo_jax.config import completion_cap  # noqa: PLC0415
  config = grpo_calculator_tiny.get_config()
  config.rollout.max_new_tokens, config.env.max_completion_tokens = 32, 256
  config.rl.overlong_buffer = 64  # more than a turn, less than an episode: refused before
  validate(config)
  assert completion_cap(config) == ("env.max_completion_tokens", 256)
  config.rl.overlong_buffer = 256
  with pytest.raises(ConfigError, match=r"^rl.overlong_buffer=256 must be in \[0, "
                                        r"env.max_completion_tokens=256\).$"):
    validate(config)
  assert completion_cap(grpo_tiny.get_config()) == (
      "rollout.max_new_tokens", grpo_tiny.get_config().rollout.max_new_tokens)
