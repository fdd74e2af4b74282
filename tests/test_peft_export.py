"""``fedmpi export-peft``: the final global LoRA adapter of a run in PEFT's format; PEFT's own
loader adapts the transformers model of the run's folder with it and gives fedmpi's final
model's logits (Llama and GPT-2, whose Conv1D layers PEFT adapts with fan_in_fan_out); the
built-in transformer's adapter loads into PEFT's LoRA injected into it; the refusals."""

from __future__ import annotations

import json
import os

import pytest
import torch

pytest.importorskip("transformers")
peft = pytest.importorskip("peft")

from conftest import cli, fedmpi, write_config  # noqa: E402
from helpers.hf import hf_config, tiny_folder  # noqa: E402
from helpers.text import text_config  # noqa: E402
from fedmpi.build import build_task  # noqa: E402
from fedmpi.models.pretrained import final_model  # noqa: E402


def _run(tmp_path, cfg: dict, name: str = "r") -> str:
    out = str(tmp_path / f"{name}.h5")
    fedmpi(["run", write_config(tmp_path / f"{name}.yaml", cfg), "--out", out, "--quiet"])
    return out


@pytest.mark.parametrize("arch", ["llama", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_peft_loads_the_exported_adapter_with_the_same_logits(tmp_path, arch):
    import transformers

    path = tiny_folder(tmp_path, arch)
    run = _run(tmp_path, hf_config(path, arch, rounds=2, eval_every=2, train__lr=1.0))
    folder = str(tmp_path / "adapter")
    p = cli(["export-peft", run, folder])
    assert p.returncode == 0, p.stderr
    assert sorted(os.listdir(folder)) == ["adapter_config.json", "adapter_model.safetensors"]
    conf = json.load(open(os.path.join(folder, "adapter_config.json")))
    assert conf["peft_type"] == "LORA" and conf["r"] == 2 and conf["lora_alpha"] == 4.0
    assert conf["fan_in_fan_out"] == (arch == "gpt2") and conf["base_model_name_or_path"] == path
    _, mine = final_model(run, "test", build_task)
    assert any(p.requires_grad and p.abs().max() > 0 for n, p in mine.named_parameters() if "lora_B" in n)
    theirs = peft.PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(path), folder).eval()
    x = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = mine.eval()(x)
        torch.testing.assert_close(theirs(input_ids=x).logits, want, rtol=1e-5, atol=1e-5)
        with theirs.disable_adapter():  # the adapter acts: without it, other logits
            assert (theirs(input_ids=x).logits - want).abs().max() > 1e-4


@pytest.mark.slow
def test_the_built_in_transformers_adapter_loads_into_peft(tmp_path):
    from fedmpi.models import build_model
    from fedmpi.models.transformer import TransformerParams

    run = _run(tmp_path, text_config(True, rounds=2, eval_every=2, task__adapter__dropout=0.0))
    folder = str(tmp_path / "adapter")
    assert cli(["export-peft", run, folder]).returncode == 0
    cfg, mine = final_model(run, "test", build_task)
    base = build_model("transformer", (12,), 20, seed=cfg.seed, params=TransformerParams(width=16, heads=2, layers=2))
    theirs = peft.PeftModel.from_pretrained(base, folder).eval()
    x = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(theirs(x), mine.eval()(x), rtol=1e-5, atol=1e-5)


def test_refusals(tmp_path):
    full = _run(tmp_path, text_config(False, rounds=1, eval_every=1), "full")
    p = cli(["export-peft", full, str(tmp_path / "a")])
    errors = [line for line in p.stderr.strip().splitlines() if not line.startswith("notice:")]
    assert p.returncode == 2 and len(errors) == 1 and errors[0].startswith(
        "fedmpi: error: task.adapter.kind: the run trained 'none'; export-peft exports LoRA adapters"), p.stderr
    assert not os.path.exists(tmp_path / "a")
    p = cli(["export-peft", str(tmp_path / "nothing.h5"), str(tmp_path / "a")])
    assert p.returncode == 2 and "export-peft: " in p.stderr and "nothing.h5: no such result file" in p.stderr
    lora = _run(tmp_path, text_config(True, rounds=1, eval_every=1), "lora")
    assert cli(["export-peft", lora, str(tmp_path / "a")]).returncode == 0
    p = cli(["export-peft", lora, str(tmp_path / "a")])
    assert p.returncode == 2 and "adapter_config.json already exists; use --overwrite" in p.stderr
    assert cli(["export-peft", lora, str(tmp_path / "a"), "--overwrite"]).returncode == 0
