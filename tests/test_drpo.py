"""DRPO (grpo_jax/rl/drpo.py) against two independent references on identical inputs:

* a float64 NumPy transcription of the paper's formulas (arXiv 2510.04474 section 4: the
  DisCO score, the length reward, the closed-form positive weights, the objective with its
  tau log-mean-exp over the wrong completions, the trust-region penalty): the loss value;
* the authors' loss (github.com/Optimization-AI/DRPO, core_algos.compute_policy_loss_drpo),
  restated in torch step by step as it computes (sort by prompt id, surrogate S / sg(S) for the
  log-mean-exp, weights normalised over the correct rows, divided by every prompt): the gradient
  with respect to the token log-probs (its value is a surrogate by design).
"""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from grpo_jax.defaults import rl_defaults
from grpo_jax.errors import ConfigError
from grpo_jax.rl.drpo import drpo_loss
from grpo_jax.rl.objective import make_objective

torch = pytest.importorskip("torch")

G, N = 4, 6
HYPER = dict(drpo_lambda=0.5, drpo_tau=2.0, drpo_delta=1e-3, drpo_beta=50.0)


def _inputs(seed=0):
  """5 prompts x 4 rows: mixed groups, one all correct, one all wrong, a reward of 0.5 (no
  part) and an empty row; ragged lengths; old log-probs off the current ones (KL > delta)."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, N + 1, size=5 * G)
  lengths[7] = 0  # an empty completion (e.g. a truncated row under rl.mask_truncated)
  mask = np.arange(N)[None] < lengths[:, None]
  rewards = np.array([1, 0, 1, 0,  1, 1, 0, 0,  1, 1, 1, 1,  0, 0, 0, 0,  1, 0.5, 0, 1],
                     np.float64)
  logp = -rng.random((5 * G, N)) * 3
  old = logp + np.abs(rng.normal(0, 0.05, logp.shape))  # k1 and k3 both > delta
  return logp, old, rewards, mask


def _paper_numpy(logp, old, rewards, mask, *, drpo_lambda, drpo_tau, drpo_delta, drpo_beta,
                 kl="k1"):
  """The loss of the module docstring, one prompt at a time, float64."""
  lengths = mask.sum(1)
  total = 0.0
  prompts = len(rewards) // G
  for q in range(prompts):
    rows = range(q * G, (q + 1) * G)
    score = {i: (logp[i] * mask[i]).sum() / lengths[i] for i in rows if lengths[i] > 0}
    pos = [i for i in score if rewards[i] == 1]
    neg = [i for i in score if rewards[i] == 0]
    if not pos or not neg:
      continue
    expo = {i: math.exp((1 - lengths[i] / N) / drpo_lambda) for i in pos}
    positive = sum(expo[i] * score[i] for i in pos) / sum(expo.values())
    negative = drpo_tau * math.log(sum(math.exp(score[j] / drpo_tau) for j in neg) / len(neg))
    total += positive - negative
  objective = total / prompts
  d = (old - logp)[mask]
  kl_value = d.mean() if kl == "k1" else (np.exp(-d) + d - 1).mean()
  return -objective + max(drpo_beta * (kl_value - drpo_delta), 0.0) * kl_value, kl_value


def _authors_torch(logp, old, rewards, mask, uid, *, drpo_lambda, drpo_tau, drpo_delta,
                   drpo_beta):
  """The authors' loss as their function computes it (kl_type 'kl', their recipe's), in
  torch float64 on a single process. Returns (loss, d loss / d logp)."""
  log_prob = torch.tensor(logp, requires_grad=True)
  old_t, m = torch.tensor(old), torch.tensor(mask, dtype=torch.float64)
  r, ids = torch.tensor(rewards), torch.tensor(uid)
  kl = ((old_t - log_prob) * m).sum() / m.sum()
  scores = (log_prob * m).sum(1) / m.sum(1)
  ratio_len = m.sum(1) / m.shape[1]
  order = ids.sort().indices
  questions = ids.unique().numel()
  s, rr, lr = (x[order].view(questions, -1) for x in (scores, r, ratio_len))
  pos, neg = rr == 1, rr == 0
  keep = (pos.sum(1) != 0) & (neg.sum(1) != 0)
  s, lr, pos, neg = s[keep], lr[keep], pos[keep], neg[keep]
  top = (s / drpo_tau).masked_fill(~neg, float("-inf")).max(1, keepdim=True).values
  top = torch.where(top == float("-inf"), torch.zeros_like(top), top)
  sum_exp = (torch.exp((s / drpo_tau - top.detach()) * neg) * neg).sum(1, keepdim=True)
  surrogate = sum_exp / (sum_exp.detach() + torch.finfo(sum_exp.dtype).eps)
  w = torch.exp((1 - lr) / drpo_lambda)
  per_q = (w * (s - drpo_tau * surrogate) * pos).sum(1, keepdim=True) / (w * pos).sum(1,
                                                                                 keepdim=True)
  pg = per_q.sum() / questions
  loss = -pg + torch.clamp(drpo_beta * (kl - drpo_delta), min=0).detach() * kl
  loss.backward()
  return loss.item(), log_prob.grad.numpy()


def _ours(logp, old, rewards, mask, **hyper):
  args = [jnp.asarray(x, jnp.float32) for x in (logp, old, rewards)] + [jnp.asarray(mask)]
  return jax.value_and_grad(lambda lp: drpo_loss(lp, *args[1:], G, **hyper)[0])(args[0])


def test_value_equals_the_papers_formulas():
  for seed in range(3):
    logp, old, rewards, mask = _inputs(seed)
    for kl in ("k1", "k3"):
      want, kl_value = _paper_numpy(logp, old, rewards, mask, kl=kl, **HYPER)
      args = [jnp.asarray(x, jnp.float32) for x in (logp, old, rewards)]
      got, metrics = drpo_loss(*args, jnp.asarray(mask), G, drpo_kl=kl, **HYPER)
      assert kl_value > HYPER["drpo_delta"]  # the penalty takes part
      np.testing.assert_allclose(float(got), want, atol=1e-6, rtol=0)
      np.testing.assert_allclose(float(metrics["kl"]), kl_value, atol=1e-7, rtol=0)
      assert float(metrics["groups"]) == 3  # groups 0, 1 and 4 hold a correct and a wrong row


def test_gradient_equals_the_authors_loss():
  for seed in range(3):
    logp, old, rewards, mask = _inputs(seed)
    # The authors' code divides by each row's length: no empty row there (the value test has
    # one); a 1-token row with reward 0.5 instead, present but taking no part.
    mask[7, 0], rewards[7] = True, 0.5
    _, want = _authors_torch(logp, old, rewards, mask, np.repeat(np.arange(5), G), **HYPER)
    _, got = _ours(logp, old, rewards, mask, **HYPER)
    np.testing.assert_allclose(np.asarray(got), want, atol=1e-6, rtol=0)
    assert np.abs(want).max() > 1e-2  # a real gradient, not zeros


def test_shuffled_prompt_ids_and_tau_to_infinity():
  """The authors' grouping by sorted id equals ours by consecutive rows; with tau -> infinity
  the wrong rows' weights become uniform (DisCO with the mean score, the paper's limit)."""
  logp, old, rewards, mask = _inputs(1)
  mask[7, 0] = True
  rewards[7] = 0.5
  uid = np.repeat(np.array([3, 0, 4, 1, 2]), G)  # any ids: only grouping matters
  _, want = _authors_torch(logp, old, rewards, mask, uid, **HYPER)
  _, got = _ours(logp, old, rewards, mask, **HYPER)
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-6, rtol=0)
  big = dict(HYPER, drpo_tau=1e6, drpo_beta=0.0)
  _, g = _ours(logp, old, rewards, mask, **big)
  g = np.asarray(g)
  lengths = mask.sum(1)
  for j in (1, 3):  # group 0's wrong rows: each d/d logp_t = (1 / Q) (1 / n_wrong) / |o_j|
    np.testing.assert_allclose(g[j][mask[j]], 1 / 5 / 2 / lengths[j], rtol=1e-4)


def test_objective_adds_reference_kl_and_checks_settings():
  logp, old, rewards, mask = _inputs(2)
  ref = logp - 0.1
  rl = rl_defaults(objective="drpo", kl_coef=0.3, **HYPER)
  objective = make_objective(rl, G)
  args = [jnp.asarray(x, jnp.float32) for x in (logp, old)]
  loss, sums = objective(*args, jnp.zeros_like(args[0]), jnp.asarray(mask),
                         jnp.zeros_like(args[0]), kl_coef=jnp.float32(0.3),
                         rewards=jnp.asarray(rewards, jnp.float32),
                         ref_logp=jnp.asarray(ref, jnp.float32))
  plain, _ = _paper_numpy(logp, old, rewards, mask, **HYPER)
  d = (ref - logp)[mask]
  k3 = (np.exp(d) - d - 1).mean()  # rl.kl_estimator k3 of pi against the reference
  np.testing.assert_allclose(float(loss), plain + 0.3 * k3, atol=1e-6, rtol=0)
  assert float(sums["clip_frac"]) == float(sums["tokens"])  # the penalty was on
  for bad, words in ((dict(num_micro_batches=2), "num_micro_batches=2"),
                     (dict(drpo_kl="k2"), "drpo_kl='k2'"),
                     (dict(value_head="shared"), "value_head")):
    with pytest.raises(ConfigError, match=words):
      make_objective(rl_defaults(objective="drpo", **bad), G)
  with pytest.raises(ConfigError, match="group_size=1"):
    make_objective(rl_defaults(objective="drpo"), 1)


def test_the_update_applies_the_drpo_objective():
  """One SGD step (rate 1) of the update with rl.objective = "drpo" moves the params by the
  gradient of forward + drpo_loss on the batch's 0/1 rewards, groups of 4 consecutive rows."""
  import optax

  from grpo_jax.train.learner.forward import policy_and_values
  from grpo_jax.train.learner.update import make_update_step
  from tests.test_update import CFG, _batch_and_state

  rl = rl_defaults(objective="drpo", kl_coef=0.0, **HYPER)
  state, batch, _ = _batch_and_state(rl)
  rows = batch.completion_tokens.shape[0]
  rewards = jnp.asarray(np.resize([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0, 1.0], rows), jnp.float32)
  batch = batch._replace(outcome_rewards=rewards)
  sgd = optax.sgd(1.0)
  state = state.replace(opt_state=sgd.init((state.params, state.value_params)))
  new_state, metrics = make_update_step(CFG, rl, sgd, 1.0, group_size=4)(state, batch)
  moved = jax.tree.map(lambda a, b: a - b, state.params, new_state.params)

  def loss(params):
    logp = policy_and_values(params, None, batch, CFG, "none", 1.0)[0]
    return drpo_loss(logp, jax.lax.stop_gradient(logp), rewards, batch.loss_mask, 4,
                     **HYPER)[0]

  value, grads = jax.jit(jax.value_and_grad(loss))(state.params)
  assert float(value) == pytest.approx(float(metrics["loss"]), rel=1e-6, abs=1e-7)
  largest = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads))
  assert largest > 1e-3
  for g, u in zip(jax.tree.leaves(grads), jax.tree.leaves(moved)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(u), rtol=1e-5, atol=1e-6 * largest)


def test_addition_with_work_scores_the_final_answer():
  from grpo_jax.data.addition_work import AdditionWorkTask, column_work

  assert column_work(7, 68, 2) == "1507" and column_work(7, 68, 2, carries=False) == "1506"
  task = AdditionWorkTask(2, 50, 10, work_fraction=0.5, length_penalty=0.5)
  batch = task.encode(np.array([[7, 68]]))
  tok = task.tokenizer
  texts = ["570", "1507=570", "1506=470", "57", "=570"]
  rows = [tok.encode(t, eos=True) for t in texts] + [tok.encode("570")]  # the last: no <eos>
  tokens = np.zeros((len(rows), 10), np.int32)
  mask = np.zeros((len(rows), 10), bool)
  for i, r in enumerate(rows):
    tokens[i, :len(r)], mask[i, :len(r)] = r, True
  rewards = task.score(batch, tokens, mask, len(rows))
  np.testing.assert_allclose(rewards, [1 - 0.5 * 4 / 10, 1 - 0.5 * 9 / 10, 0, 0,
                                       1 - 0.5 * 5 / 10, 0], atol=1e-7)
  scores = task.eval_scores(task.encode(np.repeat([[7, 68]], 6, 0)), tokens, mask)
  np.testing.assert_array_equal(scores["eval_accuracy"], [1, 1, 0, 0, 1, 0])
  warm = task.warmup_batch(0, 64, 0, carry_drop_fraction=0.5)
  shown = [tok.decode(t[m].tolist()) for t, m in zip(warm.target_tokens, warm.target_mask)]
  with_work = [s for s in shown if "=" in s]
  assert 16 < len(with_work) < 48  # about half show their work
  for (a, b), s in zip(warm.operands, shown):  # the work agrees with the answer shown
    if "=" in s:
      work, answer = s.split("=")
      carried = answer[::-1].lstrip("0") == str(a + b).lstrip("0")
      assert work == column_work(int(a), int(b), 2, carries=carried)


def test_minibatches_must_hold_whole_groups():
  from grpo_jax.config import validate
  from grpo_jax.defaults import get_defaults

  c = get_defaults()
  c.rl.objective, c.rl.num_minibatches = "drpo", 16  # 16 prompts x 8: one prompt a minibatch
  validate(c)
  c.rl.num_minibatches = 32  # half a group each
  with pytest.raises(ConfigError, match="not whole groups of 8"):
    validate(c)
