"""Many engines at once: a pool of policy engines as Ray actors, ES populations and evaluations
spread over it (docs/scaling.md).

Modules: ``engines`` (what one actor holds: a vLLM engine, or any policy), ``toy`` (a deterministic
weight-dependent policy on a tiny torch model, for CPU tests), ``pool`` (actors, placement groups,
dynamic hand-out, failure handling), ``es`` (ES generations over the pool), ``rollout`` (evaluation
over the pool).  Ray is imported only by ``pool``.
"""
