"""grpo_jax: RL post-training of language models in JAX (README.md)."""

import os as _os

# transformers, imported for tokenizers, configs and files only (our models are Flax), says
# "PyTorch was not found. Models won't be available ..." on import where torch is absent: true
# and harmless here, but it reads like an error on every real-model command. It is one of
# transformers' advisory warnings, which this variable turns off; a user's own setting wins.
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
