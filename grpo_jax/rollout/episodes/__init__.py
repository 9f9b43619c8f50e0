"""The episode players: they drive the policy's sampler through the turns of multi-turn
episodes against the environments of grpo_jax/envs/ (which know nothing of the sampler).

    host.py        play_episodes: turns on the host, every episode a sampler call per turn
                   (re-prefilled, or continued from its KV cache: rollout/continuation.py)
    async_turns.py play_async: turns as episodes become ready, in decode slots
                   (rollout/slot_continuation.py)
    pure_jax.py    an environment's JAX form played inside one jitted loop
                   (train.experience_source="fused_episodes")
    state.py       an episode's ids, turns and result as the players keep them
"""
