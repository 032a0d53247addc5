"""Seeded evolution strategies over vLLM weights (docs/protocol.md#es-maths).

Modules: ``schedule`` (sigma), ``seeds`` (population seeds, trajectory seeds, case batches),
``normalize`` (reward -> update weights), ``perturb`` (in-place seeded noise on torch tensors),
``worker`` (vLLM worker extension + driver-side backend), ``history`` (history.json, replay,
resume), ``population`` (member evaluation and the generation loop).  Nothing is imported here,
so the vLLM worker can load ``agent_envs.es.worker`` without the rollout stack.
"""
