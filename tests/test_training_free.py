"""Training-Free GRPO (grpo_jax/training_free): the library's operations exactly, one update driven
by a scripted summariser, and the loop on a tiny checkpoint resuming to the same library."""

import ast
import json
from types import SimpleNamespace

import numpy as np
import pytest

from configs import training_free_grpo_smollm2 as recipe
from grpo_jax.data.chat_arithmetic import ChatArithmeticTask
from grpo_jax.errors import ConfigError, RewardError, RunStopped
from grpo_jax.training_free import library as lib
from grpo_jax.training_free import loop
from grpo_jax.training_free.loop import train_training_free, update_library
from tests.hf_fixtures import save_tiny_qwen2

PROMPTS = recipe.get_config().tfgrpo.prompts


def test_render_and_problem_prompt():
  assert lib.render({}) == "None"
  assert lib.problem_prompt(PROMPTS.problem, "What is 2 + 2?", {}) == "What is 2 + 2?"
  text = lib.problem_prompt(PROMPTS.problem, "What is 2 + 2?", {"G0": "a", "G1": "b"})
  assert text == ("Please solve the problem:\nWhat is 2 + 2?\n\nWhen solving problems, you MUST "
                  "first carefully read and understand the helpful instructions and "
                  "experiences:\n[G0]. a\n[G1]. b")


@pytest.mark.parametrize("text, expected", [
    ('reasoning\n```json\n[{"option": "add", "experience": "x"}]\n```', [
        {"option": "add", "experience": "x"}]),
    ('```json\n[1]\n```\nthen\n```json\n[2]\n```', [2]),  # the last block
    ('[{"option": "add"}]', [{"option": "add"}]),  # no fence: the whole text
    ('```json\n{"option": "add"}\n```', None),  # not a list
    ('```json\n[{"option": "add",]\n```', None),  # does not parse
    ("```json\n" + "[" * 5000, None),  # nested past the parser's depth (RecursionError)
    ("", None),
])
def test_last_json_list(text, expected):
  assert lib.last_json_list(text) == expected


def test_collect_revise_renumber_by_hand():
  library = {"G0": "zero", "G1": "one"}
  ops = [{"option": "add", "experience": "new a"},
         {"option": "modify", "experience": "one'", "modified_from": "G1"},
         {"option": "modify", "experience": "lost", "modified_from": "G9"},  # unknown id
         {"option": "add", "experience": "new b"},
         {"option": "delete", "experience": "?"},  # unknown option
         "not a dict",
         {"option": "add"},  # no experience
         {"option": "modify", "experience": "y", "modified_from": ["G0"]}]  # not an id
  candidates, waiting, next_id, counts = lib.collect_candidates(library, ops)
  assert candidates == {"G0": "zero", "G1": "one", "C0": "new a", "C1": "new b"}
  assert waiting == [ops[1]] and next_id == 2
  assert counts == lib.OperationCounts(added=2, skipped=5)
  plan = [{"option": "modify", "experience": "one'", "modified_from": "G1"},
          {"option": "merge", "experience": "lost", "merged_from": ["C0", "C7"]},  # C7 unknown
          {"option": "merge", "experience": "a+b", "merged_from": ["C0", "C1"]},
          {"option": "modify", "experience": "x", "modified_from": "C5"},  # unknown: skipped
          {"option": "merge", "experience": "y", "merged_from": "C0"},  # not a list
          {"option": "modify", "experience": "z", "modified_from": {"id": "G0"}}]  # not an id
  revised, more = lib.apply_revision(candidates, plan, next_id)
  assert revised == {"G0": "zero", "G1": "one'", "C2": "a+b"}
  assert more == lib.OperationCounts(modified=1, merged=1, skipped=4)
  assert lib.renumber(revised) == {"G0": "zero", "G1": "one'", "G2": "a+b"}
  assert lib.kept_groups([[1, 0, 1], [0, 0, 0], [1, 1, 1], [0, 1, 0]]) == [
      True, False, False, True]


def scripted_chat(log):
  """Replies by the template a prompt comes from: a summary names its trajectory, a critique
  adds a lesson naming its problem (or, once the library has G0, modifies it), the revision
  applies the suggested modifies, or else merges C0 and C1."""
  def chat(messages):
    log.append(list(messages))
    out = []
    for m in messages:
      if m.startswith("An agent system may be provided"):
        out.append("summary of " + m.split("<trajectory>\n")[1].split("\n</trajectory>")[0])
      elif "<trajectories>" in m:
        problem = m.split("<problem> \n")[1].split("\n</problem>")[0]
        if "[G0]." in m:
          out.append('```json\n[{"option": "modify", "experience": "revised for %s", '
                     '"modified_from": "G0"}, {"option": "add", "experience": "dropped"}]\n```'
                     % problem)
        else:
          out.append('```json\n[{"option": "add", "experience": "lesson for %s"}]\n```'
                     % problem)
      else:  # the revision: the suggested modifies as they are, else merge C0 and C1
        plan = ast.literal_eval(m.split("<suggested_updates>\n")[1].split("\n</sugg")[0])
        if not plan and "'C0'" in m and "'C1'" in m:
          plan = [{"option": "merge", "experience": "merged", "merged_from": ["C0", "C1"]}]
        out.append("ok\n```json\n" + json.dumps(plan) + "\n```")
    return out
  return chat


def test_update_library_with_a_scripted_summariser():
  calls = []
  problems, golds = ["p0", "p1", "p2"], ["1", "2", "3"]
  completions = [["a", "b"], ["c", "d"], ["e", "f"]]
  correct = [[True, False], [True, True], [False, True]]  # p1 is all correct: not kept
  new, record = update_library({}, problems, golds, completions, correct,
                               scripted_chat(calls), PROMPTS)
  summaries, critiques, revision = calls
  assert [s.split("<trajectory>\n")[1][0] for s in summaries] == ["a", "b", "e", "f"]
  assert "This trajectory delivers **correct** answer" in summaries[0]
  assert "This trajectory delivers **wrong** answer" in summaries[1]
  assert "<groundtruth>\n3\n</groundtruth>" in summaries[3]
  assert len(critiques) == 2 and "Trajectory 2 (Answer wrong):\nsummary of b" in critiques[0]
  assert "<experience>\nNone\n</experience>" in critiques[0]
  assert "'C0': 'lesson for p0', 'C1': 'lesson for p2'" in revision[0]
  assert new == {"G0": "merged"}
  assert record == {"tfgrpo_kept_groups": 2, "tfgrpo_train_accuracy": 4 / 6,
                    "tfgrpo_critiques_parsed": 2, "tfgrpo_revision_parsed": True,
                    "tfgrpo_added": 2, "tfgrpo_modified": 0, "tfgrpo_merged": 1,
                    "tfgrpo_skipped": 0, "tfgrpo_library_size": 1}
  # The next step's critiques see G0 and modify it; only each group's first operation counts.
  calls.clear()
  again, record = update_library(new, problems, golds, completions, correct,
                                 scripted_chat(calls), PROMPTS)
  assert "<experience>\n[G0]. merged\n</experience>" in calls[1][0]
  assert "'modified_from': 'G0'" in calls[2][0] and "dropped" not in calls[2][0]
  assert again == {"G0": "revised for p2"}  # the later modify of G0 wins
  assert (record["tfgrpo_added"], record["tfgrpo_modified"]) == (0, 2)


def test_nothing_kept_leaves_the_library_and_calls_nobody():
  calls = []
  new, record = update_library({"G0": "x"}, ["p"], ["1"], [["a", "b"]], [[False, False]],
                               scripted_chat(calls), PROMPTS)
  assert new == {"G0": "x"} and record["tfgrpo_kept_groups"] == 0
  # Only the revision is asked (the authors ask it every step); it changes nothing.
  assert len(calls) == 1 and "<existing_experiences> \n{'G0': 'x'}" in calls[0][0]


def _config(ckpt, steps):
  c = recipe.get_config()
  c.model.path = ckpt
  c.model.update(dict(compute_dtype="float32", remat="none", logits_chunk=0))
  c.task.update(dict(max_operand=10, test_size=20))
  c.data.max_prompt_tokens = 64
  c.rollout.update(dict(group_size=3, max_new_tokens=4, temperature=1.0))
  c.train.update(dict(eval_every=2, eval_size=4, eval_batch_size=4))
  c.tfgrpo.update(dict(steps=steps, batch_size=2))
  return c


def test_loop_resumes_to_the_same_library(tmp_path, monkeypatch):
  # The random model is never right: a completion counts as correct when its first token is
  # even, so groups are kept and the scripted summariser grows the library.
  def eval_scores(self, batch, tokens, mask):
    assert len(batch.gold) == len(tokens)
    return {"eval_accuracy": (np.asarray(tokens)[:, 0] % 2 == 0).astype(np.float32)}
  monkeypatch.setattr(ChatArithmeticTask, "eval_scores", eval_scores)
  ckpt = save_tiny_qwen2(str(tmp_path / "ckpt"))
  whole = train_training_free(_config(ckpt, 3), str(tmp_path / "whole"), scripted_chat([]),
                              log=lambda *a: None)
  train_training_free(_config(ckpt, 2), str(tmp_path / "parts"), scripted_chat([]),
                      log=lambda *a: None)
  resumed = train_training_free(_config(ckpt, 3), str(tmp_path / "parts"), scripted_chat([]),
                                log=lambda *a: None)
  assert whole == resumed and whole  # a non-empty library, the same after the resume
  records = {}
  for run in ("whole", "parts"):
    lines = (tmp_path / run / "metrics.jsonl").read_text().splitlines()
    records[run] = [{k: v for k, v in json.loads(x).items() if k != "time_step_s"}
                    for x in lines]
  assert records["whole"] == records["parts"]
  # Its resume is checked like every stage's: another config is refused before anything runs.
  changed = _config(ckpt, 3)
  changed.rollout.temperature = 0.5
  with pytest.raises(ConfigError, match="under a config that differs from its config.json "
                                        r"\(rollout.temperature 1.0 -> 0.5\)"):
    train_training_free(changed, str(tmp_path / "parts"), scripted_chat([]), log=lambda *a: None)
  assert [r["step"] for r in records["whole"]] == [0, 1, 2, 3]
  assert "eval_accuracy" in records["whole"][0] and "eval_accuracy" in records["whole"][3]
  assert sum(r.get("tfgrpo_kept_groups", 0) for r in records["whole"]) > 0
  saved = json.loads((tmp_path / "whole" / "library" / "step_3.json").read_text())
  assert saved == {"step": 3, "library": whole}
  calls = [json.loads((tmp_path / "whole" / "library" / f"calls_{k}.json").read_text())
           for k in (1, 2, 3)]
  kept = [r.get("tfgrpo_kept_groups", 0) for r in records["whole"][1:]]
  for k, step_calls in zip(kept, calls):  # summaries (G each) + critiques (1 each) + revision
    assert len(step_calls) >= k * (3 + 1)
    assert all(set(c) == {"prompt", "reply"} for c in step_calls)


def test_a_failing_reward_goes_through_train_on_reward_error(tmp_path, monkeypatch):
  # A reward that raises on a completion whose first token is odd (scored alone, every other
  # completion is right): the batch call raises, the guard finds the rows at fault. The sampler
  # is replaced (nothing compiles): training completion r starts with token r, so 3 of the 6
  # fail, one in each group's mix; held-out ones start with eval_first.
  def eval_scores(self, batch, tokens, mask):
    if (np.asarray(tokens)[:, 0] % 2).any():
      raise ValueError("odd token")
    return {"eval_accuracy": np.ones(len(tokens), np.float32)}
  eval_first = [0, 1, 2, 3]

  def sample(params, tokens, mask, key, *, max_new_tokens, group_size=1, **kwargs):
    rows = len(tokens) * group_size
    first = np.arange(rows) if group_size > 1 else np.asarray(eval_first[:rows])
    return SimpleNamespace(completion_tokens=np.repeat(first[:, None], max_new_tokens, 1),
                           completion_mask=np.ones((rows, max_new_tokens), bool)), None
  monkeypatch.setattr(ChatArithmeticTask, "eval_scores", eval_scores)
  monkeypatch.setattr(loop, "sample", sample)
  c = _config(save_tiny_qwen2(str(tmp_path / "ckpt")), 1)
  c.train.update(dict(on_reward_error="zero", max_reward_error_fraction=1.0))
  train_training_free(c, str(tmp_path / "zero"), scripted_chat([]), log=lambda *a: None)
  step0, step1 = [json.loads(x) for x in
                  (tmp_path / "zero" / "metrics.jsonl").read_text().splitlines()]
  # The failed completions count as wrong, and are counted; held out as in every stage.
  assert (step1["tfgrpo_reward_errors"], step1["tfgrpo_train_accuracy"],
          step1["tfgrpo_kept_groups"]) == (3, 0.5, 2)
  for record in (step0, step1):
    assert (record["eval_accuracy"], record["eval_reward_errors"]) == (0.5, 2.0)
  c.train.max_reward_error_fraction = 0.4  # more than that failed: stopped before the library
  with pytest.raises(RunStopped, match=r"3 of step 1's 6 completions failed \(50%, above "
                                       r"train.max_reward_error_fraction=0.4\)"):
    train_training_free(c, str(tmp_path / "limit"), scripted_chat([]), log=lambda *a: None)
  assert not (tmp_path / "limit" / "library" / "step_1.json").exists()
  c.train.on_reward_error = "raise"  # one sentence showing the completion, not a traceback
  with pytest.raises(RewardError, match=r"^evaluation: the reward function raised ValueError: "
                                        r"odd token for the held-out prompt .*'zero'"):
    train_training_free(c, str(tmp_path / "raise_eval"), scripted_chat([]), log=lambda *a: None)
  eval_first[:] = [0, 2, 4, 6]  # the held-out completions score: step 1's training ones stop it
  with pytest.raises(RewardError, match=r"^the reward function raised ValueError: odd token "
                                        r"for the training prompt .*\(tfgrpo_reward_errors\)"):
    train_training_free(c, str(tmp_path / "raise"), scripted_chat([]), log=lambda *a: None)


def test_seed_library_is_the_prompt_of_step_0(tmp_path, monkeypatch):
  prompts = []
  monkeypatch.setattr(lib, "problem_prompt", lambda template, problem, library: (
      prompts.append(library) or problem))
  c = _config(save_tiny_qwen2(str(tmp_path / "ckpt")), 0)
  c.tfgrpo.seed_library = "Answer with the number only.\n\n  Check the sum twice. "
  library = train_training_free(c, str(tmp_path / "run"), scripted_chat([]), log=lambda *a: None)
  assert library == {"G0": "Answer with the number only.", "G1": "Check the sum twice."}
  assert prompts and all(p == library for p in prompts)


def test_summariser_from_another_folder(tmp_path, monkeypatch):
  """No scripted chat: the summariser is another HF folder answering through our sampler."""
  def eval_scores(self, batch, tokens, mask):
    return {"eval_accuracy": (np.asarray(tokens)[:, 0] % 2 == 0).astype(np.float32)}
  monkeypatch.setattr(ChatArithmeticTask, "eval_scores", eval_scores)
  c = _config(save_tiny_qwen2(str(tmp_path / "policy")), 1)
  c.tfgrpo.update(dict(summariser_path=save_tiny_qwen2(str(tmp_path / "other"), seed=1),
                       summary_max_new_tokens=8, chat_batch_size=4))
  train_training_free(c, str(tmp_path / "run"), log=lambda *a: None)
  record = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[1])
  calls = json.loads((tmp_path / "run" / "library" / "calls_1.json").read_text())
  kept = record["tfgrpo_kept_groups"]
  assert kept > 0
  # G summaries and one critique per kept group; a random model writes no JSON, so no
  # operation and no revision call.
  assert len(calls) == kept * (3 + 1) and record["tfgrpo_critiques_parsed"] == 0
  assert all(isinstance(c["reply"], str) for c in calls)
  assert any(c["reply"] for c in calls)  # the sampler answered
