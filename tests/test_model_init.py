"""task.init: a run starting from a pretrained model -- a result file's final model (LoRA merged
into its base) or a folder of safetensors weights (a Hugging Face folder for hf). The built
model holds those weights (the adapter on top starts at them: the first evaluation is the
pretrained model's), the key defines the result (resume digest), and a file of another model is
refused naming the file and the parameter."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch

from conftest import cli, fedmpi, write_config
from helpers.text import text_config
from fedmpi import config
from fedmpi.build import build_task
from fedmpi.engine.params import frozen
from fedmpi.errors import InputError
from fedmpi.models.pretrained import final_model, merged_state

CPU = torch.device("cpu")


def _run(tmp_path, cfg: dict, name: str) -> str:
    out = str(tmp_path / f"{name}.h5")
    fedmpi(["run", write_config(tmp_path / f"{name}.yaml", cfg), "--out", out, "--quiet"])
    return out


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> str:
    """The small transformer trained on every parameter (central pretraining stands in: 2 rounds)."""
    tmp = tmp_path_factory.mktemp("pre")
    return _run(tmp, text_config(False, rounds=2, eval_every=2, train__lr=1.0), "pre")


def test_a_lora_run_starts_from_the_pretrained_model(tmp_path, pretrained):
    """LoRA over the pretrained transformer: its frozen base is the pretrained model's weights, so
    the first evaluation (B = 0) is the pretrained run's last; training then moves only the adapters."""
    _, pre = final_model(pretrained, "test", build_task)
    cfg = text_config(True, rounds=1, eval_every=1, task__init=pretrained, task__adapter__dropout=0.0)
    task = build_task(config.from_dict(cfg), CPU)
    base = frozen(task.model)
    for name, p in pre.named_parameters():
        there = name.replace("_proj.", "_proj.base_layer.") if name.replace("_proj.", "_proj.base_layer.") in base \
            else name
        assert torch.equal(base[there], p.detach()), name
    out = _run(tmp_path, cfg, "lora")
    with h5py.File(pretrained, "r") as a, h5py.File(out, "r") as b:
        np.testing.assert_allclose(b["metrics/test_loss"][0], a["metrics/test_loss"][-1], rtol=1e-6)
        assert b["metrics/test_loss"][-1] != b["metrics/test_loss"][0]


def test_a_lora_runs_final_model_is_merged_into_the_next_base(tmp_path, pretrained):
    lora = _run(tmp_path, text_config(True, rounds=1, eval_every=1, task__init=pretrained, train__lr=1.0), "lora")
    _, model = final_model(lora, "test", build_task)
    merged = merged_state(model)
    task = build_task(config.from_dict(text_config(False, task__init=lora)), CPU)
    x = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    assert set(merged) == {n for n, _ in task.model.named_parameters()}
    with torch.no_grad():
        torch.testing.assert_close(task.model.eval()(x), model.eval()(x), rtol=1e-5, atol=1e-5)


def test_the_init_defines_the_result(pretrained):
    plain = config.from_dict(text_config(True))
    assert "task.init" not in plain.resume_keys()  # without it, digests of earlier runs stay valid
    with_init = config.from_dict(text_config(True, task__init=pretrained))
    assert with_init.resume_differences(plain) == ["task.init"]
    assert with_init.resume_digest() != plain.resume_digest()


def test_a_folder_of_safetensors_weights(tmp_path):
    """A Hugging Face folder as task.init of an hf run: its weights replace task.path's (GPT-2: its
    Conv1D layouts and tied head as saved)."""
    pytest.importorskip("transformers")
    import transformers
    from helpers.hf import hf_config, tiny_folder

    path = tiny_folder(tmp_path / "a", "gpt2", seed=0)
    other = tiny_folder(tmp_path / "b", "gpt2", seed=1)
    task = build_task(config.from_dict(hf_config(path, "gpt2", task__init=other)), CPU)
    want = transformers.AutoModelForCausalLM.from_pretrained(other).eval()
    x = torch.randint(0, 20, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        torch.testing.assert_close(task.model.eval()(x), want(input_ids=x).logits, rtol=1e-5, atol=1e-5)


def test_a_mismatch_names_the_file_and_the_parameter(tmp_path, pretrained):
    with pytest.raises(InputError, match=r"^task\.init: .*pre\.h5: parameter 'embed\.tok\.weight' is 20 x 16 there, "
                                         r"20 x 8 in task\.model transformer$"):
        build_task(config.from_dict(text_config(True, task__width=8, task__init=pretrained)), CPU)
    with pytest.raises(InputError, match=r"^task\.init: .*nothing\.h5: no such result file$"):
        build_task(config.from_dict(text_config(True, task__init=str(tmp_path / "nothing.h5"))), CPU)
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(InputError, match=r"^task\.init: .*empty: no safetensors weights"):
        build_task(config.from_dict(text_config(True, task__init=str(empty))), CPU)
    from safetensors.torch import save_file

    state = merged_state(final_model(pretrained, "test", build_task)[1])
    del state["h1.ln2.bias"]
    save_file({k: v.contiguous() for k, v in state.items()}, str(empty / "model.safetensors"))
    with pytest.raises(InputError, match=r"^task\.init: .*empty: has no parameter 'h1\.ln2\.bias' of task\.model "
                                         r"transformer$"):
        build_task(config.from_dict(text_config(True, task__init=str(empty))), CPU)
    cfg = write_config(tmp_path / "bad.yaml", text_config(True, task__width=8, task__init=pretrained))
    p = cli(["run", cfg, "--out", str(tmp_path / "bad.h5")])
    errors = [line for line in p.stderr.strip().splitlines() if not line.startswith("notice:")]
    assert p.returncode == 2 and len(errors) == 1 and "parameter 'embed.tok.weight'" in errors[0], p.stderr


def test_a_chain_of_inits_that_comes_back_is_refused(tmp_path, pretrained):
    """Result files whose task.init lead back to themselves (a -> b -> a): one line naming the
    chain, where building each model from the other's would recurse without end."""
    import shutil

    import yaml

    a, b = str(tmp_path / "a.h5"), str(tmp_path / "b.h5")
    for this, other in ((a, b), (b, a)):
        shutil.copy(pretrained, this)
        with h5py.File(this, "r+") as f:
            stored = yaml.safe_load(f.attrs["config"])
            stored["task"]["init"] = other
            f.attrs["config"] = yaml.safe_dump(stored)
    with pytest.raises(InputError, match=rf"^task\.init: {a}: its chain of task\.init leads back to it "
                                         rf"\({a} -> {b} -> {a}\)$"):
        build_task(config.from_dict(text_config(True, task__init=a)), CPU)
    p = cli(["run", write_config(tmp_path / "loop.yaml", text_config(True, task__init=b)), "--out",
             str(tmp_path / "loop.h5")])
    errors = [line for line in p.stderr.strip().splitlines() if not line.startswith("notice:")]
    assert p.returncode == 2 and len(errors) == 1 and "leads back to it" in errors[0], p.stderr


def test_a_resume_after_the_init_file_changed_is_refused(tmp_path, pretrained):
    """The resume digest holds task.init's path; its content is a recorded input of the run
    (``provenance``): the same path holding another model refuses to continue, naming the key."""
    import shutil

    import fault_plugin
    from fedmpi.errors import Interrupted
    from fedmpi.runner import Runner
    from fedmpi.runtime import World

    init, out = str(tmp_path / "init.h5"), str(tmp_path / "r.h5")
    shutil.copy(pretrained, init)
    cfg = config.from_dict(text_config(True, rounds=4, eval_every=2, task__init=init,
                                       runtime={"checkpoint_every": 1, "progress": False}))
    with pytest.raises(Interrupted):
        Runner(cfg, World(), out, quiet=True, callbacks=[fault_plugin.inject("0:1:usr1")]).run()
    with h5py.File(init, "r+") as f:
        f["final/params"][0] += 1.0  # another pretrained model at the same path
    with pytest.raises(InputError, match=rf"^task\.init: {init}: changed since this run started"):
        Runner(cfg, World(), out, quiet=True)
