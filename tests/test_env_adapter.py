"""The OpenEnv adapter (env.name="openenv", grpo_jax/envs/adapters/openenv.py): without the
package, one ConfigError sentence with the pip command; with it, the wrapped guessing game's
messages, rewards and ends on a fixed transcript, an invalid action, an episode cut at
max_turns, and one sample_episodes call with a tiny random model and the char tokenizer."""

import importlib
import sys
import types

import jax
import pytest

from grpo_jax.envs import ENVIRONMENTS
from grpo_jax.envs.adapters import openenv as adapter
from grpo_jax.errors import ConfigError

GUESS = "grpo_jax.envs.adapters.openenv_guess:GuessNumberEnvironment"


def test_without_the_package_the_error_is_one_sentence_with_the_pip_command(monkeypatch):
  for name in [m for m in sys.modules if m == "openenv" or m.startswith("openenv.")]:
    monkeypatch.delitem(sys.modules, name)
  monkeypatch.setitem(sys.modules, "openenv", None)  # import openenv -> ModuleNotFoundError
  with pytest.raises(ConfigError) as e:
    ENVIRONMENTS.get("openenv")(environment=GUESS)
  message = str(e.value)
  assert "pip install 'grpo_jax[openenv]'" in message and "openenv-core==0.3.0" in message
  assert message.count(". ") == 0 and message.endswith(".")


@pytest.fixture(scope="module")
def server():
  return pytest.importorskip("openenv.core.env_server", reason="openenv-core is not installed")


def _transcript(env, row, turns):
  state, first = env.reset(row, seed=123)
  out = []
  for turn in turns:
    result = env.step(state, turn)
    state = result.state
    out.append((result.messages, result.reward, result.done))
  return first, out


def test_a_fixed_transcript_of_the_guessing_game(server):
  env = adapter.OpenEnvAdapter(environment=GUESS, system_prompt="Play.", max_turns=4)
  assert env.rows("train", 2) == [{"seed": 0}, {"seed": 1}]
  assert env.rows("test", 1) == [{"seed": adapter.TEST_SEED_BASE}]
  first, out = _transcript(env, {"seed": 0}, ["hi", "3", "9", "6"])  # seed 0's secret is 6
  assert first == [{"role": "system", "content": "Play."},
                   {"role": "user", "content": "Guess 0-9"}]
  user = lambda text: [{"role": "user", "content": text}]  # noqa: E731
  assert out == [(user("Reply with a digit."), 0.0, False), (user("higher"), 0.0, False),
                 (user("lower"), 0.0, False), ([], 1.0, True)]


def test_the_episode_is_the_rows_and_episodes_do_not_share_state(server):
  env = adapter.OpenEnvAdapter(environment=GUESS)
  a, _ = env.reset({"seed": 0}, seed=1)
  b, _ = env.reset({"seed": 0}, seed=2)
  assert env.step(a, "6").done and not env.step(b, "5").done  # same secret, own games


CountEnvironment = None  # set by the test below (its classes need openenv)


def _count_environment(server):
  """A game whose Action takes an int: each step's reward is the number sent; done at a total
  of 10 or more."""
  class CountAction(server.Action):
    n: int

  class CountObservation(server.Observation):
    total: int = 0
    note: str = ""

  class CountEnvironment(server.Environment):
    def reset(self):  # (no seed: the adapter calls reset())
      self.total = 0
      return CountObservation(total=0, note="start")

    def step(self, action: CountAction, timeout_s=None, **kwargs):
      self.total += action.n
      return CountObservation(total=self.total, note="ok", reward=action.n,
                              done=self.total >= 10)

    @property
    def state(self):
      return server.State()

  return CountEnvironment


def test_invalid_actions_per_step_rewards_and_the_max_turns_cut(server, monkeypatch):
  with pytest.raises(ConfigError, match="is not 'module:attr'"):
    adapter.OpenEnvAdapter(environment="no_colon")
  monkeypatch.setattr(sys.modules[__name__], "CountEnvironment", _count_environment(server))
  spec = f"{__name__}:CountEnvironment"
  with pytest.raises(ConfigError, match="env.action_field='message' is not a field"):
    adapter.OpenEnvAdapter(environment=spec)
  env = adapter.OpenEnvAdapter(environment=spec, action_field="n", max_turns=3)
  first, out = _transcript(env, {"seed": 0}, ["two", "2", "3"])
  assert first == [{"role": "user", "content": "total: 0\nnote: start"}]
  assert out[0][0][0]["content"].startswith("Invalid action: ")
  assert [(r, d) for _, r, d in out] == [(0.0, False), (2.0, False), (5.0, False)]  # the return
  _, out = _transcript(env, {"seed": 0}, ["4", "6"])
  assert out[-1] == ([], 10.0, True)


def _server_or_stand_in(monkeypatch):
  """openenv-core's env_server, or without the package a stand-in of what the adapter uses."""
  try:
    return importlib.import_module("openenv.core.env_server")
  except ModuleNotFoundError:
    import pydantic  # noqa: PLC0415
    server = types.ModuleType("openenv.core.env_server")
    server.Action, server.State = type("Action", (pydantic.BaseModel,), {}), object
    server.Observation = type("Observation", (pydantic.BaseModel,), {"__annotations__": {
        "done": bool, "reward": float | None}, "done": False, "reward": None})
    server.Environment = type("Environment", (), {"close": lambda self: None})
    monkeypatch.setitem(sys.modules, "openenv.core.env_server", server)
    return server


def test_an_episode_closes_its_environment_however_it_ends(monkeypatch):
  """By end_episode, which the players call for every episode: the step closed it only when
  done or at env.max_turns, so an episode the token budget cut (no step) kept it open."""
  server, open_now = _server_or_stand_in(monkeypatch), []

  class Say(server.Action):
    message: str

  class Heard(server.Observation):
    text: str = ""

  class Leaky(server.Environment):  # (e.g. a subprocess, a browser); never done by itself
    def __init__(self):
      super().__init__()
      open_now.append(self)

    def reset(self, seed=None):
      return Heard(text="go")

    def step(self, action: Say, timeout_s=None, **kwargs):
      return Heard(text="again")

    def close(self):
      open_now.remove(self)

    @property
    def state(self):
      return server.State()

  monkeypatch.setattr(sys.modules[__name__], "Leaky", Leaky, raising=False)
  env = adapter.OpenEnvAdapter(environment=f"{__name__}:Leaky", max_turns=2)
  state, _ = env.reset({"seed": 0}, seed=0)
  state = env.step(state, "a").state
  assert len(open_now) == 1  # still playing
  result = env.step(state, "b")
  assert not result.done and result.messages == [{"role": "user", "content": "again"}]
  assert len(open_now) == 1
  env.end_episode(result.state)
  assert open_now == []


def test_sample_episodes_plays_the_wrapped_game_with_a_tiny_random_model(server):
  from grpo_jax.envs.char_tokenizer import char_chat_tokenizer  # noqa: PLC0415
  from grpo_jax.rollout.episodes.host import sample_episodes  # noqa: PLC0415
  from grpo_jax.models.decoder import init_params  # noqa: PLC0415
  from grpo_jax.rollout.sampler import Sampling  # noqa: PLC0415
  from tests.fixtures import tiny_model_config  # noqa: PLC0415
  tok = char_chat_tokenizer()
  cfg = tiny_model_config(vocab_size=128)
  params = init_params(cfg, jax.random.key(0))
  sampling = Sampling(cfg, max_new_tokens=4, eos_id=tok.eos_token_id, pad_id=tok.pad_token_id)
  env = adapter.OpenEnvAdapter(environment=GUESS, max_turns=2)
  rows = env.rows("train", 4)
  rollout, infos = sample_episodes(sampling, params, env, tok, rows, [0] * 4,
                                   jax.random.key(1), 96, width_bucket=128)  # one compile
  assert rollout.completion_tokens.shape[0] == 4 and len(infos) == 4
  assert all(1 <= i["turns"] <= 2 and i["reward"] in (0.0, 1.0) for i in infos)
  for i, info in enumerate(infos):  # two-turn episodes hold the game's reply, not trained on
    ids = rollout.completion_tokens[i][rollout.completion_mask[i]]
    text = tok.decode(ids[~rollout.action_mask[i][rollout.completion_mask[i]]].tolist())
    if info["turns"] == 2:
      assert any(reply in text for reply in ("higher", "lower", "Reply with a digit."))


def test_a_misnamed_observation_field_is_refused_when_the_adapter_is_built(monkeypatch):
  """Checked on a probe environment's first observation (it raised AttributeError at the first
  episode, after the model was built); the probe is closed."""
  server, closed = _server_or_stand_in(monkeypatch), []

  class Say(server.Action):
    message: str

  class Heard(server.Observation):
    text: str = ""

  class Echo(server.Environment):
    def reset(self, seed=None):
      return Heard(text="go")

    def step(self, action: Say, timeout_s=None, **kwargs):
      return Heard(text=action.message)

    def close(self):
      closed.append(self)

    @property
    def state(self):
      return server.State()

  monkeypatch.setattr(sys.modules[__name__], "Echo", Echo, raising=False)
  with pytest.raises(ConfigError) as e:
    adapter.OpenEnvAdapter(environment=f"{__name__}:Echo", observation_field="txt")
  fields = ", ".join(Heard.model_fields)  # (done, reward[, metadata with openenv-core]), text
  assert str(e.value) == (f"env.observation_field='txt' is not a field of Heard (its fields: "
                          f"{fields}); name the one that holds the text for the model, or give "
                          f"'' for all of them.") and len(closed) == 1 and "text" in fields
  env = adapter.OpenEnvAdapter(environment=f"{__name__}:Echo", observation_field="text")
  assert env.reset({"seed": 0}, 0)[1] == [{"role": "user", "content": "go"}]
