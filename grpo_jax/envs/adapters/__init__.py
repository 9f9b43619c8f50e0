"""Adapters that wrap another ecosystem's environments in grpo_jax's environment protocol
(grpo_jax/envs/__init__.py). Each imports its external package only when an environment is
built, so grpo_jax imports without it: env.name="openenv" (openenv.py, OpenEnv's
`openenv-core`)."""
