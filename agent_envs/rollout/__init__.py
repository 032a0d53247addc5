"""Rollouts: run episodes (lockstep or async), write records, compute metrics, write trace logs."""

from agent_envs.scoring.metrics import max_at_k, pass_at_k

from .metrics import compare_means, diagnostics, es_summary, group_metrics, paired_bootstrap, summarize
from .records import EpisodeRecord, JsonlWriter, load_records
from .resume import prepare_resume
from .runner import make_jobs, run_episodes, strip_timings
from .tracelog import trace_filename, training_prefix, write_trace_log, write_trace_logs
from .trajectories import EpisodeTokens, episode_tokens, export_tokens, load_token_export

__all__ = [
    "EpisodeRecord",
    "JsonlWriter",
    "load_records",
    "prepare_resume",
    "make_jobs",
    "run_episodes",
    "strip_timings",
    "summarize",
    "es_summary",
    "pass_at_k",
    "max_at_k",
    "group_metrics",
    "diagnostics",
    "paired_bootstrap",
    "compare_means",
    "trace_filename",
    "training_prefix",
    "write_trace_log",
    "write_trace_logs",
    "EpisodeTokens",
    "episode_tokens",
    "export_tokens",
    "load_token_export",
]
