"""Tools a model calls from inside an episode, each over a sandbox backend (apart from envs)."""
