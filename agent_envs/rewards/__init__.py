"""Process rewards: score every step of an episode, not only its outcome (docs/protocol.md#process-rewards).

The scorer contract (step context, scorer interface, safe batched scoring) is
:mod:`agent_envs.core.steps`, below the environments that call it; aggregation and the record
fields are :mod:`agent_envs.scoring.process`; the async runner's batching of scorer calls is
:mod:`agent_envs.rollout.gather`.  Here: ``combine`` (outcome + process -> ES fitness), ``judge``
(an LLM judge driven by a prompt file), ``vlm_prm`` (a vision-language reward model with a LoRA
adapter) and ``options`` (their command-line flags).  Nothing is imported here, so importing one
scorer does not load the others.
"""
