"""A Hugging Face causal LM from a local folder (models.hf, the extra [llm]): tiny random Llama,
Mistral, Qwen2 and GPT-2 folders built here (no download). Its forward is the transformers model's; LoRA on it is
PEFT's LoRA on the same weights; a block of clients trains as batched ops over the stacked
adapters and the expanded base (the stacked rules of the Llama family and GPT-2,
``engine.hf_layers``; the vmap path as their reference), a client's bits independent of its
block, the base never changing; a run from the command line; the one-line refusals."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import h5py
import numpy as np
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("safetensors")

from conftest import cli, fedmpi, write_config  # noqa: E402
from helpers.hf import TARGETS, hf_config, tiny_folder  # noqa: E402
from fedmpi import config  # noqa: E402
from fedmpi.build import build_task  # noqa: E402
from fedmpi.engine.local import LocalTrainer  # noqa: E402
from fedmpi.engine.params import frozen  # noqa: E402
from fedmpi.errors import InputError  # noqa: E402

CPU = torch.device("cpu")
ARCHS = ["llama", "gpt2"]
LLAMAS = ["llama", "mistral", "qwen2"]  # the Llama family (engine.llama_layers)


def _trainer(path: str, arch: str, lora: bool = True, stacked: bool = True, **over) -> LocalTrainer:
    cfg = config.from_dict(hf_config(path, arch, lora, **over))
    task = build_task(cfg, CPU)
    return LocalTrainer(task, cfg.train, cfg.seed, stacked=stacked)


@pytest.mark.parametrize("arch", ARCHS + LLAMAS[1:])
def test_the_model_is_the_folders(tmp_path, arch):
    """Logits of the wrapped model equal transformers' own model loaded from the folder (GPT-2's
    Conv1D layers as Linear: to float tolerance); the adapter starts as its base (B zero)."""
    import transformers

    path = tiny_folder(tmp_path, arch)
    tr = _trainer(path, arch)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(path).eval()
    x = torch.randint(0, 20, (3, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = theirs(input_ids=x).logits
        got = tr.task.model.eval()(x)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert tr.path == "batched" and tr.net is not None  # stacked rules (engine.hf_layers), not vmap
    assert all(".lora_" in n for n in tr.spec.names) and frozen(tr.task.model)
    assert {n.split(".")[-3] for n in tr.spec.names} == set(TARGETS[arch])


@pytest.mark.parametrize("arch", ARCHS)
def test_lora_on_the_folder_is_peft_lora(tmp_path, arch):
    """PEFT's LoRA injected into transformers' model with the same A and B gives the same logits."""
    peft = pytest.importorskip("peft")
    import transformers

    path = tiny_folder(tmp_path, arch)
    tr = _trainer(path, arch)
    model = tr.task.model.eval()
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for p in model.parameters():
            if p.requires_grad:
                p += 0.1 * torch.randn(p.shape, generator=gen)
    base = transformers.AutoModelForCausalLM.from_pretrained(path)
    theirs = peft.get_peft_model(base, peft.LoraConfig(r=2, lora_alpha=4.0, target_modules=TARGETS[arch],
                                                       fan_in_fan_out=arch == "gpt2")).eval()
    mine = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            if "lora_" in name:
                p.copy_(mine["lm." + name.removeprefix("base_model.model.").replace(".default", "")])
    x = torch.randint(0, 20, (2, 12), generator=gen)
    with torch.no_grad():
        torch.testing.assert_close(model(x), theirs(input_ids=x).logits, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("arch", ARCHS + ["qwen2"])
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_a_clients_bits_do_not_depend_on_its_block(tmp_path, arch, lora):
    """A client trained alone and in blocks of 2, 3, 5 and 8 (LoRA with keyed dropout; or every
    weight, GPT-2's tied head included) ends with the same bits; the frozen base never changes."""
    tr = _trainer(tiny_folder(tmp_path, arch), arch, lora, train__local_steps=3)
    base = {k: v.clone() for k, v in frozen(tr.task.model).items()}
    x0 = tr.spec.flatten(tr.task.model)
    together = tr.train(x0.expand(8, -1), np.arange(8), t=1)
    assert (together - x0).abs().max() > 1e-4
    for block in ([5], [5, 0], [2, 5, 7], [7, 6, 5, 4, 3]):
        got = tr.train(x0.expand(len(block), -1), np.array(block), t=1)
        for j, c in enumerate(block):
            assert torch.equal(got[j], together[c]), (block, c)
    assert all(torch.equal(v, base[k]) for k, v in frozen(tr.task.model).items())


@pytest.mark.parametrize("arch", LLAMAS + ["gpt2"])
@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_the_stacked_rules_are_the_models_forward_and_vmaps_gradients(tmp_path, arch, lora):
    """The stacked rules of the Llama family (``engine.llama_layers``; grouped-query heads, a
    padding id; Mistral's sliding window and Qwen2's on one layer, shorter than the sequences, and
    its biased projections; a Llama's config with a ``sliding_window`` key its model ignores) and
    of GPT-2 (``engine.gpt2_layers``; the fused q/k/v projection, learned positions, LayerNorm)
    give each client the logits of the model's own forward at its
    parameters, bit for bit (GPT-2 with every weight trained: to float tolerance, its LayerNorms'
    weights being each client's own, applied after the normalisation rather than fused into it),
    and the gradients of the vmap path (to float tolerance)."""
    from torch.func import functional_call

    from fedmpi.engine.threads import one_thread

    path = tiny_folder(tmp_path, arch)
    if arch != "gpt2":  # (GPT-2's model, under vmap, checks its inputs for a padding id: data-dependent)
        cfg = json.loads((tmp_path / arch / "config.json").read_text())
        stray = {"sliding_window": 4} if arch == "llama" else {}  # kept by LlamaConfig, ignored by the Llama
        (tmp_path / arch / "config.json").write_text(json.dumps({**cfg, "pad_token_id": 3, **stray}))
    tr = _trainer(path, arch, lora, task__adapter__dropout=0.0)
    ref = LocalTrainer(tr.task, tr.cfg, tr.seed, stacked=False)
    assert tr.net is not None and ref.net is None
    gen = torch.Generator().manual_seed(5)
    x0 = tr.spec.flatten(tr.task.model)
    x = x0 + 0.05 * torch.randn(3, x0.shape[0], generator=gen)
    xb = torch.randint(0, 40, (3, 2, 12), generator=gen)
    xb[:, :, -3:] = 3  # right-padded
    yb = torch.randint(0, 40, (3, 2, 12), generator=gen)
    with one_thread(CPU), torch.no_grad():
        out = tr.net.forward(tr.spec.views(x), xb)
        for i in range(3):
            want = functional_call(tr.task.model.eval(), tr.spec.views(x[i]), (xb[i],))
            if lora or arch != "gpt2":
                assert torch.equal(out[i], want)
            else:
                torch.testing.assert_close(out[i], want, rtol=1e-5, atol=1e-6)
    loss, got = tr.value_and_gradients(x, xb, yb, None, {})
    want_loss, want = ref.value_and_gradients(x, xb, yb, None, {})
    torch.testing.assert_close(loss, want_loss, rtol=1e-6, atol=1e-7)
    assert set(got) == set(want) and any(v.abs().max() > 0 for v in got.values())
    for name in want:
        torch.testing.assert_close(got[name], want[name], rtol=1e-5, atol=1e-7)
    if not lora and arch != "gpt2":  # the padding id's row gets no gradient, as nn.Embedding's padding_idx gives
        assert not got["lm.model.embed_tokens.weight"][:, 3].any()


def test_the_sequential_reference_trains_alike(tmp_path):
    path = tiny_folder(tmp_path, "llama")
    tr = _trainer(path, "llama")
    other = LocalTrainer(tr.task, tr.cfg, tr.seed, path="sequential")
    x0 = tr.spec.flatten(tr.task.model).expand(4, -1)
    torch.testing.assert_close(other.train(x0, np.arange(4), t=0), tr.train(x0, np.arange(4), t=0), rtol=0, atol=2e-5)


def test_a_run_from_the_command_line(tmp_path):
    """``fedmpi run`` over a Llama folder: LoRA rounds, the perplexity, the adapters as the final
    parameters; the memory line counts the base once."""
    path = tiny_folder(tmp_path, "llama")
    cfg = write_config(tmp_path / "hf.yaml", hf_config(path, "llama", rounds=2, eval_every=2))
    out = str(tmp_path / "r.h5")
    p = fedmpi(["run", cfg, "--out", out])
    assert "frozen base" in p.stderr
    tr = _trainer(path, "llama")
    with h5py.File(out, "r") as f:
        assert f.attrs["status"] == "completed" and np.isfinite(f["metrics/test_ppl"][:]).all()
        assert f["final/params"].shape == (tr.spec.dim,)


def _refused(tmp_path, cfg: dict, message: str) -> None:
    p = cli(["run", write_config(tmp_path / "bad.yaml", cfg), "--out", str(tmp_path / "bad.h5")])
    assert p.returncode == 2, p.stderr
    lines = [line for line in p.stderr.strip().splitlines() if not line.startswith("notice:")]
    assert len(lines) == 1 and message in lines[0], p.stderr


def test_refusals_name_the_folder_or_the_key(tmp_path):
    path = tiny_folder(tmp_path, "llama")
    _refused(tmp_path, hf_config(str(tmp_path / "nowhere"), "llama"), "task.path: ")
    _refused(tmp_path, hf_config(str(tmp_path / "nowhere"), "llama"), "nowhere: no such folder")
    cfg = hf_config(path, "llama")
    del cfg["task"]["path"]
    _refused(tmp_path, cfg, "task.path: task.model hf needs the model folder")
    empty = tmp_path / "empty"
    empty.mkdir()
    _refused(tmp_path, hf_config(str(empty), "llama"), f"task.path: {empty}: no config.json")
    (empty / "config.json").write_text((tmp_path / "llama" / "config.json").read_text())
    (empty / "pytorch_model.bin").write_bytes(b"pickle")
    _refused(tmp_path, hf_config(str(empty), "llama"), "no safetensors weights (model.safetensors); "
                                                       "pytorch_model.bin is pickled")
    bert = tmp_path / "bert"
    bert.mkdir()
    (bert / "config.json").write_text(json.dumps({"model_type": "bert", "architectures": ["BertForMaskedLM"],
                                                  "vocab_size": 40, "hidden_size": 16, "num_hidden_layers": 1,
                                                  "num_attention_heads": 2, "intermediate_size": 32}))
    (bert / "model.safetensors").write_bytes(b"")
    _refused(tmp_path, hf_config(str(bert), "llama"), "config.json describes BertForMaskedLM, not a causal "
                                                      "language model")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    (broken / "model.safetensors").write_bytes(b"")
    _refused(tmp_path, hf_config(str(broken), "llama"), f"task.path: {broken}/config.json: not a usable model config")
    _refused(tmp_path, hf_config(path, "llama", task__adapter__target_modules=["nothing"]),
             "task.adapter.target_modules: 'nothing' names no module")
    _refused(tmp_path, hf_config(path, "llama", task__synthetic_text__vocab=41),
             "task.text.tokenizer: the dataset's vocabulary has 41 ids, more than the 40 of")
    _refused(tmp_path, hf_config(path, "llama", task__synthetic_text__length=40),
             "task.text.context: 40 tokens per sequence, more than the 32 positions")


def test_without_the_llm_extra_the_refusal_names_it(tmp_path, monkeypatch):
    path = tiny_folder(tmp_path, "llama")
    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers -> ImportError
    with pytest.raises(InputError, match=r"^task\.model: hf needs the transformers package: "
                                         r"pip install 'fedmpi\[llm\]'$"):
        build_task(config.from_dict(hf_config(path, "llama")), CPU)


def test_the_folders_tokenizer_tokenizes_text(tmp_path):
    """Under task.model hf, the text data's default tokenizer is the folder's tokenizer.json."""
    path = tiny_folder(tmp_path, "llama", tokenizer=True)
    cfg = hf_config(path, "llama", task__dataset="shakespeare", task__clients=4,
                    task__shakespeare={"plays": ["hamlet"]}, task__text={"context": 12})
    del cfg["task"]["synthetic_text"]
    task = build_task(config.from_dict(cfg), CPU)
    assert task.text.tokenizer.startswith(os.path.join(path, "tokenizer.json") + " sha256:")
    assert task.text.vocab_size == 29 and int(task.train_x.max()) < 29


@pytest.mark.slow
@pytest.mark.mpi
@pytest.mark.parametrize("arch", ARCHS)
def test_runs_give_the_same_bits_on_1_and_2_ranks_and_after_a_kill(tmp_path, arch):
    """LoRA with keyed dropout under SCAFFOLD over a cohort: the same metrics, per-client arrays
    and final adapters on 1 and 2 ranks, and after a kill -9 resumed on 2 ranks; checkpoints
    hold the adapters' rows, not the base."""
    import glob

    import fault_plugin
    from test_lora_runs import _same

    path = tiny_folder(tmp_path, arch)
    cfg = write_config(tmp_path / "hf.yaml", hf_config(
        path, arch, rounds=4, eval_every=2, algorithm={"name": "scaffold"}, availability={"kind": "cohort", "size": 5},
        evaluation={"clients": {"arrays": True}}, runtime={"progress": False, "checkpoint_every": 2}))
    one, two, cut = (str(tmp_path / f"{n}.h5") for n in ("one", "two", "cut"))
    fedmpi(["run", cfg, "--out", one, "--quiet"])
    fedmpi(["run", cfg, "--out", two, "--quiet"], ranks=2)
    killed = fedmpi(["run", cfg, "--out", cut, "--quiet"], check=False, env=fault_plugin.env("0:3:kill"))
    assert killed.returncode != 0
    shards = glob.glob(cut + ".ckpt/round-*/shard-*.pt")
    assert shards
    with h5py.File(one, "r") as f:
        d = f["final/params"].shape[0]
    for shard in shards:
        for k, v in torch.load(shard, weights_only=True).items():
            assert v.dim() == 0 or v.shape[-1] == d or v.numel() < d, (k, tuple(v.shape))
    fedmpi(["run", cfg, "--out", cut, "--quiet"], ranks=2)
    for other in (two, cut):
        _same(one, other)


@pytest.mark.parametrize("stacked", [True, False], ids=["stacked", "vmap"])
def test_the_memory_check_counts_a_clients_activations(tmp_path, stacked):
    """A client's activations: what autograd keeps for one sample's forward pass and loss
    (``fedmpi.saved``, counted once) times the minibatch, so the per-client bytes and the block
    size follow the model and batch, not its trainable parameters alone; the base is counted once
    per rank. CPU blocks take about 64 MB of what a step touches (``client_bytes``), CUDA blocks
    512 MB of what it holds (``memory``)."""
    path = tiny_folder(tmp_path, "llama")
    small, large = (_trainer(path, "llama", stacked=stacked, train__batch_size=b) for b in (2, 8))
    a, b = small.memory(), large.memory()
    assert a.activations >= 4 * 2 * (2 * 12 * 40) and b.activations == 4 * a.activations  # the logits, their softmax
    assert a.parameters == b.parameters == 4 * small.spec.dim
    assert large.chunk_size() == max(1, (64 << 20) // large.client_bytes())
    assert (large.net is not None) == stacked and (large.client_bytes() == b.total) == (not stacked)
    large.device = torch.device("cuda")  # the rule only; nothing runs on a GPU here
    assert large.chunk_size() == max(1, min(256, large.task.m, (512 << 20) // b.total))
    held = dataclasses.replace(b, activations=100 << 20)  # a client holding 100 MiB at its peak: 5 a block
    large.memory = lambda: held
    assert large.chunk_size() == 5 < large.task.m


@pytest.mark.parametrize("arch", ARCHS)
def test_the_memory_estimate_is_what_a_clients_step_keeps(tmp_path, arch):
    """The stacked rules' estimate of a client's activations against what autograd keeps in the
    model's own forward pass and loss on a whole minibatch (the measure of benchmarks/lora.py,
    which found the memory per additional client 1-6% above the estimate): about as much (the
    count of one sample times the minibatch), and at most the gradient in flight more. Their count
    of layer outputs and their gradients (the CPU blocks' measure) was 4x the memory at the
    benchmark's small size. (The vmap path's factor over the model's own count is a measurement
    of benchmarks/lora.py, not checked here.)"""
    from fedmpi.saved import kept

    path = tiny_folder(tmp_path, arch)
    tr = _trainer(path, arch, train__batch_size=8, task__adapter__dropout=0.0)
    model, x, y = tr.task.model, tr.task.inputs(tr.task.train_x[:8]), tr.task.train_y[:8]
    own = kept(lambda: tr.task.loss(model(x), y), list(model.parameters())).total
    assert tr.net is not None and 0.95 * own <= tr.memory().activations <= 1.5 * own


def test_a_cached_text_dataset_keys_on_the_folders_tokenizer_not_its_weights(tmp_path, monkeypatch):
    """The data cache of a text dataset tokenized by the model folder's tokenizer.json: other
    weights in the folder are a hit (the weights are not hashed into the data's key; they are
    still inputs of the run), another tokenizer.json a miss with other ids."""
    import shutil

    from fedmpi import provenance
    from fedmpi.data import jsonl
    from fedmpi.data.datasets import dataset_arrays
    from fedmpi.models.hf import load

    path = tiny_folder(tmp_path, "llama", tokenizer=True)
    lines = [json.dumps({"user_id": f"u{i % 3}", "text": "abcdefghij"[i % 7:] + "cab" * 4}) for i in range(12)]
    (tmp_path / "d.jsonl").write_text("\n".join(lines) + "\n")
    cache = tmp_path / "cache"
    cfg = hf_config(path, "llama", task__dataset="jsonl", task__jsonl={"train": str(tmp_path / "d.jsonl")},
                    task__cache_dir=str(cache), task__text={"context": 12})
    del cfg["task"]["synthetic_text"]
    first = dataset_arrays(config.from_dict(cfg))
    assert len(os.listdir(cache)) == 1
    shutil.copy(tiny_folder(tmp_path / "other", "llama", seed=1) + "/model.safetensors", path)
    read = jsonl.read
    monkeypatch.setattr(jsonl, "read", lambda *a, **k: pytest.fail("read again despite the cache"))
    again = dataset_arrays(config.from_dict(cfg))
    assert np.array_equal(again.x_train, first.x_train) and len(os.listdir(cache)) == 1
    monkeypatch.setattr(jsonl, "read", read)
    doc = json.loads((tmp_path / "llama" / "tokenizer.json").read_text())
    vocab = doc["model"]["vocab"]
    vocab["a"], vocab["b"] = vocab["b"], vocab["a"]
    (tmp_path / "llama" / "tokenizer.json").write_text(json.dumps(doc))
    other = dataset_arrays(config.from_dict(cfg))
    assert len(os.listdir(cache)) == 2 and not np.array_equal(other.x_train, first.x_train)
    provenance.reset_inputs()
    load(path)
    assert os.path.join(path, "model.safetensors") in provenance.record({})["inputs"]
