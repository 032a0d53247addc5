"""Task data: loaders for math and DocVQA tasks and the built-in offline synthetic sets."""

from agent_envs.data.docvqa import DocDataError, load_docvqa_tasks
from agent_envs.data.math import (
    MathDataError,
    load_math_tasks,
    sha256_file,
    verify_sha256sums,
)
from agent_envs.data.synth_docs import generate_docvqa_tasks
from agent_envs.data.synth_math import generate_math_tasks
from agent_envs.data.tasks import DocTask, MathTask

__all__ = [
    "DocDataError",
    "DocTask",
    "MathDataError",
    "MathTask",
    "generate_docvqa_tasks",
    "generate_math_tasks",
    "load_docvqa_tasks",
    "load_math_tasks",
    "sha256_file",
    "verify_sha256sums",
]
