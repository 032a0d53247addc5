"""``agent-envs es``: an ES run's settings (:mod:`.settings`), the run assembled from them
(:mod:`.run`) and the command's modes (:mod:`.command`).  It sits above ``agent_envs.scale``
because a run with ``--engines N`` is an engine pool; the ES algorithm itself is ``agent_envs.es``."""
