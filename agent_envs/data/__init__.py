"""Data helpers every environment shares (JSONL reading, episode keys); loaders and task models
live in each environment's folder under ``agent_envs/envs/``."""
