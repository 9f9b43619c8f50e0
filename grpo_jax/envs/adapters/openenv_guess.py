"""A number-guessing game written with OpenEnv's public API (`Environment`, `Action`,
`Observation`, `State` and a `Rubric` for the reward), the pure-Python environment that
configs/grpo_openenv_tiny.py trains on through the adapter (env.name="openenv",
env.environment="grpo_jax.envs.adapters.openenv_guess:GuessNumberEnvironment").

reset(seed) draws a secret digit 0-9 from the seed and asks "Guess 0-9". Each step reads the
first digit of the action's message: "higher" or "lower" (not done, reward 0), "correct"
(done, reward 1 from the rubric), or "Reply with a digit." when there is none. The game ends
itself after MAX_GUESSES guesses (done, reward 0). Imports openenv at the top: only the
adapter loads it, and only when env.environment names it.
"""

from __future__ import annotations

import random
import re
import uuid

from openenv.core.env_server import Action, Environment, Observation, State
from openenv.core.rubrics import Rubric
from pydantic import Field

MAX_GUESSES = 4


class GuessAction(Action):
  message: str = Field(..., description="The guess, a digit")


class GuessObservation(Observation):
  text: str = Field(default="", description="The game's reply")


class CorrectGuessRubric(Rubric):
  """Reward 1 when the observation says the guess is right, else 0."""

  def forward(self, action, observation) -> float:
    return float(observation.text == "correct")


class GuessNumberEnvironment(Environment[GuessAction, GuessObservation, State]):
  SUPPORTS_CONCURRENT_SESSIONS = True

  def __init__(self):
    super().__init__(rubric=CorrectGuessRubric())
    self._state, self._secret = State(episode_id=str(uuid.uuid4()), step_count=0), 0

  def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
    self._reset_rubric()
    self._secret = random.Random(seed).randrange(10)
    self._state = State(episode_id=episode_id or str(uuid.uuid4()), step_count=0)
    return GuessObservation(text="Guess 0-9")

  def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
    self._state.step_count += 1
    digit = re.search(r"\d", action.message)
    if digit is None:
      text = "Reply with a digit."
    else:
      guess = int(digit.group())
      text = ("correct" if guess == self._secret
              else "higher" if guess < self._secret else "lower")
    observation = GuessObservation(text=text)
    observation.reward = self._apply_rubric(action, observation)
    observation.done = text == "correct" or self._state.step_count >= MAX_GUESSES
    return observation

  @property
  def state(self) -> State:
    return self._state
