"""Policy-gradient trainers on these environments (docs/rl.md): TRL's GRPO through its public
``rollout_func``; verl and SkyRL through the exported token trajectories."""
