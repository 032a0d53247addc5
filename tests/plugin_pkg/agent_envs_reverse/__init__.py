"""``Reverse-Bash-v0``: a plug-in environment from outside agent-envs (reverse a word with bash).

Registered through its package's entry point (``agent_envs.environments``), built only from
agent-envs' public pieces: an ``EnvSpec``, the ``ReActEnv`` base class, the bash tool.
"""
