"""Process rewards: score every step of an episode, not only its outcome (docs/protocol.md#process-rewards).

Modules: ``step`` (the step context, the scorer interface, safe batched scoring, aggregation, the
record fields), ``gather`` (the async runner's batching of scorer calls), ``combine`` (outcome +
process -> ES fitness), ``judge`` (an LLM judge driven by a prompt file), ``vlm_prm`` (a
vision-language reward model with a LoRA adapter).  Nothing is imported here, so the rollout
layer can import ``step`` without the heavier scorers.
"""
