"""Our GRPO recipe on a real pretrained model against TRL's GRPOTrainer doing the same thing.

Row "chat_arithmetic" (default): configs/grpo_smollm2.py on SmolLM2-135M-Instruct (the folder
`python -m grpo_jax.fetch_model smollm2-135m-instruct` writes). Both sides train the same
checkpoint on the same prompts: our task's training stream (task.train_batch(8 k, 8, seed) at
step k); TRL gets each prompt as a conversational prompt [{"role": "user", "content": the
user's text}], so it applies the same chat template (checked: the token ids are compared), the
gold answer as a dataset column, and our reward function (number_shaped, format_score 0.1) on
each decoded completion. Matched, value for value from the recipe's config: G = 8, 8 prompts
per step (one generation batch = one optimizer step = 64 completions: TRL
per_device_train_batch_size = 64, steps_per_generation = 1), 16 new tokens, temperature 0.7,
top-k / top-p off, beta = 0 (no reference model on either side), PPO clip 0.2, token-mean loss
(TRL loss_type="dapo"), group-std advantages (scale_rewards="group"), mu = 1, AdamW (0.9,
0.999, eps 1e-8), weight decay 0, clip 1.0, learning rate 2e-5 warmed up linearly from 0 over 5
steps then constant (optax's join of linear + constant schedules and transformers'
constant_with_warmup give the same rate at every step, 0 at the first), float32,
rematerialisation (ours remat="full"; TRL gradient_checkpointing=True), dropout off, no vLLM.
What differs: the advantage epsilon (ours 1e-6, TRL 1e-4); ours runs each prompt once for its
G completions in the update (rl.shared_prompt_forward) and scans its layers; TRL decodes on
the dataloader's prompts tokenized by its own call.

Row "gsm8k" (--recipe gsm8k): configs/grpo_gsm8k.py scaled down to 4 prompts x G = 4, one
minibatch and one micro-batch (the recipe's 4 x 4 split is for 128 prompts), compute in
float32 (the recipe's bfloat16 is for accelerators), prompts padded to one width of 192 tokens
(data.prompt_bucket 192), the teacher-forced passes on the real completion tokens only
(rl.pack_tokens 8, a single-device option: each step's capacity is one of 8, so a step may
compile the RL step for a new capacity, as a long run does at most 8 times; TRL pads each batch
to its longest completion), with GSM8K's own lengths (512 prompt
tokens at most, 512 new tokens), temperature 1, lr 1e-6 after 10 warm-up steps, weight decay
0.01 (TRL's AdamW skips biases and norm weights; ours decays every weight), k3 KL in the loss
with beta 0.001 (a reference model on both sides) and the gsm8k_strict reward. Data:
--gsm8k-path (default ../shared/data/gsm8k; skipped with a message when absent). No held-out
accuracy in this row: a 135M model scores ~0 on GSM8K.

Each side runs in its own process, ours first: ours is `python -m grpo_jax.main` in a temporary
workdir (evaluation at step 0 and at the end only, no checkpoints but the final one), read back
from its metrics.jsonl; TRL's is GRPOTrainer.train() with its generation and reward calls timed.
Per side: seconds per step (median over the steps after the first, which compiles / warms up;
the GSM8K row runs 4 steps, so that a later step compiling a new packed capacity is one of
three in the median; every step's seconds are in the JSON's steps_s;
the first reported apart), split into rollout (ours: the sampler; TRL: `_generate`, tokenizing,
sampling and decoding), reward (ours: decoding and scoring; TRL: `_calculate_rewards`) and
update (the rest: reference / old log-probs where needed, loss, backward, optimizer); the
process's peak RSS (ours: the training process, as a child); held-out accuracy on
train.eval_size prompts, greedy, the rollout's new tokens, at step 0 and at the end: ours from
its own evaluation, TRL's with transformers generate (left padding, our prompt ids) scored by
the task's own eval_scores, the keys ours reports (chat_arithmetic: eval_accuracy,
eval_format, eval_strict). torch: --torch-threads threads, OMP_WAIT_POLICY=PASSIVE (as in
vs_trl.py).

    python benchmarks/vs_trl_real.py                       # 10 steps, 200 held-out prompts
    python benchmarks/vs_trl_real.py --recipe gsm8k        # 4 steps of the GSM8K row
    python benchmarks/vs_trl_real.py --seed 1              # another seed (data order, sampling)
    XLA_PYTHON_CLIENT_PREALLOCATE=false python benchmarks/vs_trl_real.py --trl-device cuda
                                                           # on a GPU: ours on JAX's GPU, TRL on
                                                           # CUDA (float32, TF32 matmuls on both)

A table and one JSON line end the output.
"""

import argparse
import json
import os
import resource
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from benchmarks import common  # noqa: E402

ROOT = common.ROOT
MODEL = "smollm2-135m-instruct"
RECIPES = {  # recipe -> (config file, default steps)
    "chat_arithmetic": ("configs/grpo_smollm2.py", 10),
    "gsm8k": ("configs/grpo_gsm8k.py", 4),
}


def overrides(args) -> dict:
  """The --config.* values both sides run with (dotted name -> value)."""
  out = {"model.path": args.model_path, "train.steps": args.steps,
         "train.eval_every": 10**9,  # evaluations at step 0 and at the last step only
         "train.checkpoint_every": 0, "train.num_samples": 0, "train.export": False}
  if args.recipe == "gsm8k":
    out.update({"data.path": os.path.abspath(args.gsm8k_path), "rollout.num_prompts": 4,
                "rollout.group_size": 4, "rl.num_minibatches": 1, "rl.num_micro_batches": 1,
                "model.compute_dtype": "float32", "train.eval_size": 1,
                "train.eval_batch_size": 1,
                # One compiled prompt width (GSM8K prompts in SmolLM2's chat template are
                # 70-189 tokens), so that the steps after the first compile nothing; TRL pads
                # each batch to its longest prompt.
                "data.prompt_bucket": 192,
                # Per-token work on the real completion tokens only (a single-device option).
                "rl.pack_tokens": 8})
  else:
    out.update({"train.eval_size": args.eval_size, "train.eval_batch_size": args.eval_size})
  if args.new_tokens:
    out["rollout.max_new_tokens"] = args.new_tokens
  if args.seed is not None:  # the config seed: data order and sampling on both sides
    out["seed"] = args.seed
  return out


def timing_summary(rollout: list, reward: list, update: list) -> dict:
  """Per-step seconds -> the first step's total and medians over the steps after it."""
  totals = [a + b + c for a, b, c in zip(rollout, reward, update)]
  rest = lambda xs: statistics.median(xs[1:]) if len(xs) > 1 else float("nan")  # noqa: E731
  return dict(first_step_s=totals[0], s_per_step=rest(totals), rollout_s=rest(rollout),
              reward_s=rest(reward), update_s=rest(update), steps_s=totals)


def peak_rss_gib(who=resource.RUSAGE_SELF) -> float:
  """Peak resident memory of this process or of its largest child (ru_maxrss: KiB)."""
  return round(resource.getrusage(who).ru_maxrss / 2**20, 2)


def ours(args, spec: dict) -> dict:
  """Runs grpo_jax.main with the recipe and the overrides; reads its metrics.jsonl."""
  workdir = tempfile.mkdtemp(prefix="vs_trl_real_ours_")
  try:
    command = [sys.executable, "-m", "grpo_jax.main", f"--config={spec['config_file']}",
               f"--workdir={workdir}"] + [f"--config.{k}={v}"
                                          for k, v in spec["overrides"].items()]
    log = os.path.join(workdir, "run.log")
    with open(log, "w") as f:
      done = subprocess.run(command, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if done.returncode != 0:
      with open(log) as f:
        raise RuntimeError(f"{' '.join(command)} failed:\n{f.read()[-4000:]}")
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
      records = sorted((json.loads(line) for line in f if line.strip()), key=lambda r: r["step"])
  finally:
    shutil.rmtree(workdir, ignore_errors=True)
  steps = [r for r in records if "time_rollout_s" in r]
  evals = [r for r in records if "eval_accuracy" in r] if args.recipe != "gsm8k" else []
  pick = lambda r: {k: v for k, v in r.items() if k.startswith("eval_")}  # noqa: E731
  from importlib.metadata import version  # noqa: PLC0415
  return dict(**timing_summary([r["time_rollout_s"] for r in steps],
                               [r["time_reward_s"] for r in steps],
                               [r["time_update_s"] for r in steps]),
              peak_rss_gib=peak_rss_gib(resource.RUSAGE_CHILDREN),
              eval_start=pick(evals[0]) if evals else {},
              eval_end=pick(evals[-1]) if len(evals) > 1 else {},
              reward_means=[r.get("reward_mean") for r in steps],
              mean_lengths=[r.get("response_len") for r in steps],
              settings=f"jax {version('jax')}, python -m grpo_jax.main")


def hf_greedy_eval(model, task, size: int, new_tokens: int, batch_size: int) -> dict:
  """Mean held-out scores (task.eval_scores) of greedy transformers generate on our prompt
  ids (left-padded to the longest), `new_tokens` new tokens, stopping at the task's EOS."""
  import numpy as np  # noqa: PLC0415
  import torch  # noqa: PLC0415
  batch = task.test_batch(size)
  width = int(np.asarray(batch.prompt_mask).sum(1).max())
  tokens = np.asarray(batch.prompt_tokens)[:, -width:].astype(np.int64)
  mask = np.asarray(batch.prompt_mask)[:, -width:].astype(np.int64)
  completions = np.full((size, new_tokens), task.pad_id, np.int64)
  model.eval()
  with torch.inference_mode():
    for i in range(0, size, batch_size):
      out = model.generate(input_ids=torch.from_numpy(tokens[i:i + batch_size]).to(model.device),
                           attention_mask=torch.from_numpy(mask[i:i + batch_size]).to(model.device),
                           do_sample=False, max_new_tokens=new_tokens, use_cache=True,
                           pad_token_id=task.pad_id, eos_token_id=task.eos_id)
      new = out[:, width:].cpu().numpy()
      completions[i:i + len(new), :new.shape[1]] = new
  eos = completions == task.eos_id
  first = np.where(eos.any(1), eos.argmax(1), new_tokens)
  completion_mask = np.arange(new_tokens)[None, :] <= first[:, None]
  per_prompt = task.eval_scores(batch, completions, completion_mask)
  return {k: float(np.mean(v)) for k, v in per_prompt.items()}


def timed(fn, sink: list):
  """fn, appending the wall seconds of each call to sink."""
  def wrapper(*a, **k):
    start = time.perf_counter()
    try:
      return fn(*a, **k)
    finally:
      sink.append(time.perf_counter() - start)
  return wrapper


def trl(args, spec: dict) -> dict:
  """TRL's GRPOTrainer on the same prompts, reward and settings (module docstring)."""
  import ml_collections  # noqa: PLC0415
  import numpy as np  # noqa: PLC0415
  import torch  # noqa: PLC0415
  import trl as trl_lib  # noqa: PLC0415
  from datasets import Dataset  # noqa: PLC0415
  from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: PLC0415
  from trl import GRPOConfig, GRPOTrainer  # noqa: PLC0415

  import grpo_jax.data.chat_arithmetic  # noqa: F401,PLC0415  registers the task (no jax)
  import grpo_jax.data.gsm8k  # noqa: F401,PLC0415
  from grpo_jax.data.task import TASKS  # noqa: PLC0415
  settings = common.torch_setup(args.torch_threads)
  cfg = ml_collections.ConfigDict(spec["config"])
  task = TASKS.get(cfg.task.name).cls.from_config(cfg, log=lambda *_: None)
  r, rl, o = cfg.rollout, cfg.rl, cfg.optim
  if rl.kl_coef > 0 and rl.kl_estimator != "k3":
    raise ValueError(f"TRL's KL term is k3; the recipe's is {rl.kl_estimator}.")
  minibatches = rl.num_minibatches
  prompts = task.train_batch(0, r.num_prompts * args.steps, cfg.seed)
  data = Dataset.from_dict({"prompt": [[{"role": "user", "content": u}]
                                       for u in prompts.user_text], "gold": list(prompts.gold)})
  tokenizer = AutoTokenizer.from_pretrained(cfg.model.path)
  theirs = tokenizer.apply_chat_template(data[0]["prompt"], add_generation_prompt=True,
                                         tokenize=True, return_dict=True)["input_ids"]
  theirs = theirs[0] if theirs and isinstance(theirs[0], list) else list(theirs)
  mine = np.asarray(prompts.prompt_tokens[0])[np.asarray(prompts.prompt_mask[0])].tolist()
  model = AutoModelForCausalLM.from_pretrained(cfg.model.path, dtype=torch.float32)
  if args.trl_device == "cuda":
    # float32 matrix products in TF32, as XLA does by default on this GPU for ours.
    torch.set_float32_matmul_precision("high")
    model.to("cuda")
    settings += f", {torch.cuda.get_device_name()}, float32 matmuls in TF32"
  evaluate = args.eval_size > 0 and cfg.task.name == "chat_arithmetic"
  eval_args = (task, cfg.train.eval_size, r.max_new_tokens, cfg.train.eval_batch_size)
  eval_start = hf_greedy_eval(model, *eval_args) if evaluate else {}

  def reward(completions, gold, **_):
    return [task.reward_fn(c[0]["content"], g, task.format_score)
            for c, g in zip(completions, gold)]
  reward.__name__ = cfg.reward.name

  class StepEnds(TrainerCallback):
    def __init__(self):
      self.marks = []

    def on_train_begin(self, *_, **__):
      self.marks.append(time.perf_counter())

    def on_step_end(self, *_, **__):
      self.marks.append(time.perf_counter())

  ends = StepEnds()
  config = GRPOConfig(
      output_dir=tempfile.mkdtemp(prefix="vs_trl_real_trl_"), num_generations=r.group_size,
      max_completion_length=r.max_new_tokens,
      per_device_train_batch_size=r.num_prompts * r.group_size // minibatches,
      gradient_accumulation_steps=1, steps_per_generation=minibatches,
      num_iterations=rl.num_iterations, beta=rl.kl_coef, epsilon=rl.clip_eps_low,
      epsilon_high=rl.clip_eps_high, loss_type="dapo", scale_rewards="group",
      temperature=r.temperature, top_p=r.top_p, top_k=r.top_k, learning_rate=o.learning_rate,
      lr_scheduler_type="constant_with_warmup", warmup_steps=o.warmup_steps, adam_beta1=o.b1,
      adam_beta2=o.b2, adam_epsilon=1e-8, weight_decay=o.weight_decay,
      max_grad_norm=o.max_grad_norm, optim="adamw_torch",
      gradient_checkpointing=cfg.model.remat != "none", disable_dropout=True, use_vllm=False,
      use_cpu=args.trl_device == "cpu", bf16=False, fp16=False,
      max_steps=args.steps * minibatches,
      logging_steps=1, save_strategy="no", report_to=[], disable_tqdm=True,
      shuffle_dataset=False, seed=cfg.seed, data_seed=cfg.seed, dataloader_num_workers=0)
  trainer = GRPOTrainer(model=model, reward_funcs=reward, args=config, train_dataset=data,
                        processing_class=tokenizer, callbacks=[ends])
  rollout, scoring = [], []
  trainer._generate = timed(trainer._generate, rollout)
  trainer._calculate_rewards = timed(trainer._calculate_rewards, scoring)
  trainer.train()
  shutil.rmtree(config.output_dir, ignore_errors=True)
  per_update = [b - a for a, b in zip(ends.marks, ends.marks[1:])]
  totals = [sum(per_update[i:i + minibatches]) for i in range(0, len(per_update), minibatches)]
  eval_end = hf_greedy_eval(trainer.model, *eval_args) if evaluate else {}
  return dict(**timing_summary(rollout, scoring, [t - a - b for t, a, b in
                                                  zip(totals, rollout, scoring)]),
              peak_rss_gib=peak_rss_gib(), eval_start=eval_start, eval_end=eval_end,
              reward_means=[h["reward"] for h in trainer.state.log_history if "reward" in h],
              mean_lengths=[h["completions/mean_length"] for h in trainer.state.log_history
                            if "completions/mean_length" in h],
              same_prompt_ids=theirs == mine,
              settings=f"trl {trl_lib.__version__}, {settings}")


def score_keys(*evals: dict) -> list:
  """The evaluation keys to show: eval_accuracy first, then the task's others."""
  keys = {k for e in evals for k in e}
  return sorted(keys, key=lambda k: (k != "eval_accuracy", k))


def scores(evals: dict, keys: list) -> str:
  """The values of `keys` joined by ' / ', or '-'."""
  return " / ".join(f"{evals.get(k, float('nan')):.3f}" for k in keys) if evals else "-"


def default_model_path() -> str | None:
  from grpo_jax.fetch_model import fetched_model_dir  # noqa: PLC0415
  folder = fetched_model_dir(MODEL)
  return str(folder) if folder else None


def main():
  parser = argparse.ArgumentParser()
  parser.add_argument("--recipe", choices=sorted(RECIPES), default="chat_arithmetic")
  parser.add_argument("--steps", type=int, help="RL steps (default 10; gsm8k: 4)")
  parser.add_argument("--model-path", help=f"a HF folder (default: the fetched {MODEL})")
  parser.add_argument("--new-tokens", type=int,
                      help="new tokens per completion (default: the recipe's, 16 / 512)")
  parser.add_argument("--eval-size", type=int, default=200,
                      help="held-out prompts evaluated at step 0 and at the end")
  parser.add_argument("--seed", type=int, help="config seed (default: the recipe's)")
  parser.add_argument("--gsm8k-path", default=os.path.join(ROOT, "..", "shared", "data", "gsm8k"))
  parser.add_argument("--torch-threads", type=int, default=os.cpu_count())
  parser.add_argument("--omp-wait-policy", default="PASSIVE")
  parser.add_argument("--peer-malloc", choices=["default", "tuned"], default="default",
                      help="TRL's process: glibc's default malloc, or ours (common.TUNED_GLIBC)")
  parser.add_argument("--trl-device", choices=["cpu", "cuda"], default="cpu",
                      help="where TRL runs (ours runs on JAX's default device)")
  parser.add_argument("--side", choices=["ours", "trl"], help=argparse.SUPPRESS)
  parser.add_argument("--spec", help=argparse.SUPPRESS)
  args = parser.parse_args()
  config_file, default_steps = RECIPES[args.recipe]
  args.steps = args.steps or default_steps
  if args.side:
    with open(args.spec) as f:
      spec = json.load(f)
    print(json.dumps((ours if args.side == "ours" else trl)(args, spec)))
    return
  args.model_path = args.model_path or default_model_path()
  if not args.model_path:
    sys.exit(f"no {MODEL} folder; run python -m grpo_jax.fetch_model {MODEL} first, or pass "
             f"--model-path.")
  if args.recipe == "gsm8k" and not all(os.path.isfile(os.path.join(args.gsm8k_path, f"{s}.jsonl"))
                                        for s in ("train", "test")):
    print(f"skipped: no GSM8K train.jsonl / test.jsonl under {args.gsm8k_path} (--gsm8k-path)")
    return
  if args.steps < 2:
    sys.exit("--steps must be at least 2: the first step compiles and is reported apart.")
  config = runpy.run_path(os.path.join(ROOT, config_file))["get_config"]()
  config.update_from_flattened_dict(overrides(args))
  spec = dict(config_file=config_file, overrides=overrides(args), config=config.to_dict())
  print(common.header())
  with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump(spec, f)
  side_args = ["--recipe", args.recipe, "--steps", str(args.steps), "--eval-size",
               str(args.eval_size), "--torch-threads", str(args.torch_threads), "--trl-device",
               args.trl_device, "--spec", f.name]
  try:
    a = common.run_side(__file__, ["--side", "ours", *side_args])
    b = common.run_side(__file__, ["--side", "trl", *side_args],
                        {"OMP_WAIT_POLICY": args.omp_wait_policy,
                         **common.peer_env(args.peer_malloc)})
  finally:
    os.unlink(f.name)
  r, rl, o = config.rollout, config.rl, config.optim
  print(f"ours: {a['settings']}; TRL: {b['settings']}")
  print(f"{args.recipe} ({config_file}), model {args.model_path}: {r.num_prompts} prompts x "
        f"G={r.group_size}, {r.max_new_tokens} new tokens, temperature {r.temperature}, lr "
        f"{o.learning_rate} (warm-up {o.warmup_steps}), beta {rl.kl_coef}, "
        f"{rl.num_minibatches} minibatch(es), {args.steps} steps; s/step = median of steps "
        f"2..{args.steps} (rollout + reward + update; evaluations excluded); TRL tokenizes the "
        f"prompts as ours: {b['same_prompt_ids']}")
  keys = score_keys(a["eval_start"], b["eval_start"])
  names = " / ".join(k.removeprefix("eval_") for k in keys) or "accuracy"
  mean = lambda xs: sum(xs) / len(xs) if xs else float("nan")  # noqa: E731
  rows = [[name, f"{s['s_per_step']:.2f}", f"{s['first_step_s']:.1f}", f"{s['rollout_s']:.2f}",
           f"{s['reward_s']:.3f}", f"{s['update_s']:.2f}", s["peak_rss_gib"],
           scores(s["eval_start"], keys), scores(s["eval_end"], keys),
           f"{mean(s['reward_means']):.3f}"]
          for name, s in (("ours", a), ("TRL", b))]
  print(common.table(["", "s/step", "first step s", "rollout s", "reward s", "update s",
                      "peak RSS GiB", f"held-out {names}, step 0",
                      f"... after {args.steps} steps", "mean train reward"], rows))
  print(json.dumps(dict(
      recipe=args.recipe, steps=args.steps, ours_s_per_step=round(a["s_per_step"], 3),
      trl_s_per_step=round(b["s_per_step"], 3),
      trl_over_ours=round(b["s_per_step"] / a["s_per_step"], 3),
      ours_first_step_s=round(a["first_step_s"], 2), trl_first_step_s=round(b["first_step_s"], 2),
      ours_rollout_s=round(a["rollout_s"], 3), ours_update_s=round(a["update_s"], 3),
      trl_rollout_s=round(b["rollout_s"], 3), trl_update_s=round(b["update_s"], 3),
      ours_peak_rss_gib=a["peak_rss_gib"], trl_peak_rss_gib=b["peak_rss_gib"],
      ours_eval_accuracy=a["eval_end"].get("eval_accuracy"),
      trl_eval_accuracy=b["eval_end"].get("eval_accuracy"),
      ours_eval_start=a["eval_start"] or None, trl_eval_start=b["eval_start"] or None,
      ours_eval_end=a["eval_end"] or None, trl_eval_end=b["eval_end"] or None,
      ours_reward_means=a["reward_means"], trl_reward_means=b["reward_means"],
      ours_mean_lengths=a["mean_lengths"], trl_mean_lengths=b["mean_lengths"],
      ours_steps_s=[round(x, 2) for x in a["steps_s"]],
      trl_steps_s=[round(x, 2) for x in b["steps_s"]])))


if __name__ == "__main__":
  main()
