import numpy as np
import pytest

from grpo_jax.data.arithmetic import AdditionTask, drop_carries
from grpo_jax.rewards.exact_match import exact_match_reward


def _drop_carries_by_strings(a: int, b: int) -> int:
  width = max(len(str(a)), len(str(b)))
  sa, sb = str(a).zfill(width), str(b).zfill(width)
  return int("".join(str((int(x) + int(y)) % 10) for x, y in zip(sa, sb)))


def test_drop_carries_matches_digit_strings():
  rng = np.random.default_rng(0)
  a, b = rng.integers(0, 1000, 200), rng.integers(0, 1000, 200)
  expected = [_drop_carries_by_strings(x, y) for x, y in zip(a, b)]
  assert drop_carries(a, b).tolist() == expected
  assert drop_carries(np.array([57]), np.array([68])).tolist() == [15]


@pytest.mark.parametrize("fixed_width", [False, True])
def test_test_split_never_overlaps_training(fixed_width):
  task = AdditionTask(2, 300, 4, fixed_width)
  test = {tuple(sorted(p)) for p in task.test_pairs.tolist()}
  train = {tuple(sorted(p)) for p in task.train_pairs.tolist()}
  assert len(test) == 300 and not test & train
  assert len(test) + len(train) == 100 * 101 // 2  # every unordered pair is in one split
  assert len(task.train_pairs) == len(set(map(tuple, task.train_pairs.tolist())))


@pytest.mark.parametrize("fixed_width,reverse", [(False, False), (True, False), (True, True)])
def test_rendering_round_trips(fixed_width, reverse):
  task = AdditionTask(2, 300, 4, fixed_width, reverse)
  batch = task.train_batch(0, 50, seed=3)
  tok = task.tokenizer
  for row in range(50):
    a, b = batch.operands[row]
    prompt = tok.decode(batch.prompt_tokens[row][batch.prompt_mask[row]])
    answer = tok.decode(batch.target_tokens[row])
    assert prompt.replace("+", " ").replace("=", "").split() == [
        f"{a:02d}" if fixed_width else str(a), f"{b:02d}" if fixed_width else str(b)]
    assert int(answer[::-1] if reverse else answer) == a + b
    assert len(answer) == (3 if fixed_width else len(str(a + b)))
    assert batch.target_tokens[row][batch.target_mask[row]][-1] == tok.eos_id


def test_stream_is_reproducible_and_covers_an_epoch():
  task = AdditionTask(1, 10, 3)
  n = len(task.train_pairs)
  whole = task.train_operands(0, 2 * n, seed=5)
  pieces = np.concatenate([task.train_operands(p, 7, seed=5) for p in range(0, 2 * n, 7)])
  np.testing.assert_array_equal(whole, pieces[:2 * n])
  assert sorted(map(tuple, whole[:n].tolist())) == sorted(map(tuple, task.train_pairs.tolist()))
  assert not np.array_equal(whole[:n], task.train_operands(0, n, seed=6))


def test_exact_match_reward_cases():
  target = np.array([[5, 6, 2, 0]])  # "xy<eos>"
  tmask = np.array([[1, 1, 1, 0]], bool)
  cases = {  # completion tokens, completion mask -> reward
      ((5, 6, 2, 0), (1, 1, 1, 0)): 1.0,
      ((5, 7, 2, 0), (1, 1, 1, 0)): 0.0,  # wrong digit
      ((5, 2, 0, 0), (1, 1, 0, 0)): 0.0,  # stops early
      ((5, 6, 6, 2), (1, 1, 1, 1)): 0.0,  # runs on
      ((5, 6, 6, 6), (1, 1, 1, 1)): 0.0,  # truncated without <eos>
  }
  for (tokens, mask), expected in cases.items():
    got = exact_match_reward(np.array([tokens]), np.array([mask], bool), target, tmask)
    assert float(got[0]) == expected, (tokens, mask)


def test_warmup_answers_drop_carries_at_the_configured_rate():
  task = AdditionTask(2, 300, 4)
  batch = task.warmup_batch(step=0, count=4000, seed=0, carry_drop_fraction=0.75)
  a, b = batch.operands[:, 0], batch.operands[:, 1]
  answers = np.array([int(task.tokenizer.decode(t)) for t in batch.target_tokens])
  has_carry = drop_carries(a, b) != a + b
  assert np.all((answers == a + b) | (answers == drop_carries(a, b)))
  wrong_rate = np.mean(answers[has_carry] != (a + b)[has_carry])
  assert wrong_rate == pytest.approx(0.75, abs=0.03)


def test_capabilities_are_declared_at_registration_and_checked_by_validation():
  """A task's optional capabilities are named where it registers: a missing method is a
  TypeError at import, and a config asking for a capability its task lacks is one sentence."""
  import ml_collections

  from grpo_jax.config import validate
  from grpo_jax.data.task import TASKS, register_task
  from grpo_jax.defaults import get_defaults
  from grpo_jax.errors import ConfigError

  class NoDevice(AdditionTask):
    device_task = None  # hasattr true, but the class is not registered with "device"
  with pytest.raises(TypeError, match=r"task 'broken' \(.*Broken\) lacks warmup_batch"):
    @register_task("broken", capabilities=("warmup",))
    class Broken:  # noqa: F841
      check_config = from_config = train_batch = test_batch = score = eval_scores = None
      prompt_texts = labels = decode = eos_id = pad_id = None
  with pytest.raises(TypeError, match="unknown capabilities \\['fast'\\]"):
    register_task("broken", capabilities=("fast",))(AdditionTask)
  assert "broken" not in dict(TASKS.items())
  register_task("addition_on_host", capabilities=("warmup",), replace=True)(NoDevice)
  config = get_defaults()
  config.task.name = "addition_on_host"
  config.train.update(dict(fused_steps=2, steps=4, eval_every=2, checkpoint_every=2))
  with pytest.raises(ConfigError, match=r"^train.fused_steps=2 \(data stream and reward as JAX "
                     r"functions\) needs a task with the 'device' capability \(device_task\), "
                     r"which task 'addition_on_host' does not declare \(it declares: warmup\); "
                     r"set train.fused_steps=0\.$"):
    validate(config)
  config = ml_collections.ConfigDict(get_defaults().to_dict())
  config.task.name = "table"
  with pytest.raises(ConfigError, match=r"^warmup.steps=1000 \(a supervised warm-up on the "
                     r"task's own data\) needs a task with the 'warmup' capability"):
    validate(config)
  from grpo_jax.train.stages.supervised import check_pair_sources
  with pytest.raises(ConfigError, match=r"^rm.train_path='' \(pairs made by the task\) needs a "
                     r"task with the 'preference_pairs' capability \(train_operands\), which "
                     r"task 'table' does not declare \(it declares: none\); give a jsonl"):
    check_pair_sources(config)
  config.task.name = "addition"
  check_pair_sources(config)
  assert TASKS.get("addition").capabilities == {"step_rewards", "device", "warmup", "supervised",
                                                "preference_pairs"}
