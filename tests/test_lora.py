"""LoRA (models.adapters, engine.adapter_layers) and the small transformer (models.transformer,
engine.sequence_layers): the stacked rules against each client's own module, LoRA's forward
against PEFT's on the same weights, PEFT's initialisation and names, gradients through the
adapters only, keyed LoRA dropout, a client's bits alone and in blocks of any size, full
fine-tuning, and the one-line refusals."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from helpers.text import text_config
from fedmpi import config, rng
from fedmpi.build import build_task
from fedmpi.engine.layers import StackedNet
from fedmpi.engine.local import LocalTrainer
from fedmpi.engine.params import ParamSpec, frozen
from fedmpi.errors import InputError
from fedmpi.models import build_model
from fedmpi.models.adapters import LoRALinear, LoRAParams
from fedmpi.models.losses import IGNORE, token_cross_entropy
from fedmpi.models.transformer import TransformerParams

CPU = torch.device("cpu")
VOCAB, T = 20, 10
ALL = ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]


def lm(seed: int = 0, lora: dict | None = None, **keys) -> nn.Module:
    p = TransformerParams(**{"width": 16, "heads": 2, "layers": 2, **keys})
    if lora is not None:
        p.adapter = LoRAParams(**{"kind": "lora", **lora})
    return build_model("transformer", (T,), VOCAB, seed=seed, params=p)


def clients(n: int, lora: dict | None, dropout: float = 0.0) -> list[nn.Module]:
    """n clients' models over one base, their LoRA B drawn (non-zero) so that the adapters act."""
    models = [lm(0, lora)] + [copy.deepcopy(lm(0, lora)) for _ in range(n - 1)]
    gen = torch.Generator().manual_seed(5)
    for m in models:
        for p in m.parameters():
            if p.requires_grad:
                p.data += 0.05 * torch.randn(p.shape, generator=gen)  # each client its own trained part
    return models


def tokens(*shape: int, seed: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(1, VOCAB, shape, generator=gen)
    y = torch.roll(x, -1, -1)
    y[..., -1] = IGNORE
    y[..., -3:][x[..., -3:] % 3 == 0] = IGNORE  # some padding-like positions
    return x, y


def stacked(models: list[nn.Module]) -> dict[str, torch.Tensor]:
    spec = ParamSpec.of(models[0])
    return {k: torch.stack([dict(m.named_parameters())[k].detach() for m in models]) for k in spec.names}


@pytest.mark.parametrize("lora", [None, {"r": 3, "target_modules": ALL}], ids=["full", "lora"])
def test_stacked_rules_equal_each_clients_module(lora):
    """Embeddings, LayerNorm, attention, the blocks, the tied head (and LoRA): the stacked
    forward and every client's gradients equal its own module's, to float tolerance."""
    models = clients(3, lora)
    net = StackedNet.compile(models[0])
    assert net is not None and bool(net.frozen) == (lora is not None)
    x, y = tokens(3, 4, T)
    params = stacked(models)
    loss, grads = net.value_and_gradients(token_cross_entropy, params, x, y, None, None)
    assert set(grads) == set(params)
    for i, m in enumerate(models):
        m.train().zero_grad()
        out = m(x[i])
        torch.testing.assert_close(net.forward(params, x)[i], out, rtol=1e-5, atol=1e-5)
        ref = token_cross_entropy(out, y[i])
        torch.testing.assert_close(loss[i], ref, rtol=1e-5, atol=1e-6)
        ref.backward()
        for name, p in m.named_parameters():
            if p.requires_grad:
                torch.testing.assert_close(grads[name][i], p.grad, rtol=1e-4, atol=1e-6)
            else:
                assert p.grad is None


def test_the_tied_head_is_the_token_embedding():
    model = lm()
    names = [n for n, _ in model.named_parameters()]
    assert "embed.tok.weight" in names and not any(n.startswith("head") for n in names)
    assert set(model.state_dict()) == set(names)  # the head saves nothing of its own
    h = torch.randn(2, T, 16)
    torch.testing.assert_close(model.head(h), h @ model.embed.tok.weight.T)


def test_lora_names_and_initialisation_follow_peft():
    """A: r x in, kaiming-uniform (a = sqrt 5) from fedmpi's generator keyed by (seed, "adapter");
    B: out x r, zero, so the adapted model is its base bit for bit at the start; the base is
    the model built without LoRA, frozen; the trained names are PEFT's (without 'default')."""
    plain, model = lm(4), lm(4, {"r": 3, "alpha": 6.0})
    spec = ParamSpec.of(model)
    assert spec.names == tuple(f"h{i}.attn.{p}.lora_{ab}.weight" for i in range(2) for p in ("q_proj", "v_proj")
                               for ab in "AB")
    assert set(frozen(model)) == {n.replace("q_proj.", "q_proj.base_layer.").replace("v_proj.", "v_proj.base_layer.")
                                  for n, _ in plain.named_parameters()}
    q = model.h0.attn.q_proj
    assert isinstance(q, LoRALinear) and q.scaling == 2.0 and q.lora_A.weight.shape == (3, 16)
    assert q.lora_B.weight.shape == (16, 3) and not q.lora_B.weight.any()
    gen = torch.Generator().manual_seed(int(rng.key(4, "adapter")))
    first = nn.init.kaiming_uniform_(torch.empty(3, 16), a=math.sqrt(5), generator=gen)
    assert torch.equal(q.lora_A.weight, first)
    assert q.lora_A.weight.abs().max() <= 1 / math.sqrt(16)
    for (n, p), (_, b) in zip(plain.named_parameters(), ((k, v) for k, v in model.named_parameters()
                                                          if not v.requires_grad)):
        assert torch.equal(p, b), n
    x, _ = tokens(2, T)
    assert torch.equal(model(x), plain(x))


def test_lora_forward_equals_peft():
    """PEFT's own LoRA, injected into the same base with the same A and B: the same outputs
    (module forward and stacked rule)."""
    peft = pytest.importorskip("peft")
    model = clients(1, {"r": 4, "alpha": 8.0, "target_modules": ["q_proj", "v_proj", "down_proj"]})[0]
    base = lm(0)
    config_ = peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.0, target_modules=["q_proj", "v_proj", "down_proj"])
    theirs = peft.inject_adapter_in_model(config_, base)
    mine = dict(model.named_parameters())
    with torch.no_grad():
        for name, p in theirs.named_parameters():
            key = name.replace(".default", "")
            p.copy_(mine[key])
    x, _ = tokens(3, T)
    want = theirs.eval()(x)
    torch.testing.assert_close(model.eval()(x), want, rtol=1e-5, atol=1e-6)
    net = StackedNet.compile(model)
    torch.testing.assert_close(net.forward(stacked([model]), x[None])[0], want, rtol=1e-5, atol=1e-6)


def _trainer(lora: bool = True, **over) -> LocalTrainer:
    cfg = config.from_dict(text_config(lora, **over))
    task = build_task(cfg, CPU)
    return LocalTrainer(task, cfg.train, cfg.seed)


@pytest.mark.parametrize("lora", [True, False], ids=["lora", "full"])
def test_a_clients_bits_do_not_depend_on_its_block(lora):
    """A client trained alone, in blocks of 2, 3 and 8 (with LoRA dropout: its keyed masks), and in
    padded fixed-shape blocks, ends with the same bits; the base never changes."""
    tr = _trainer(lora, train__local_steps=3)
    assert tr.net is not None and tr.path == "batched"
    base = {k: v.clone() for k, v in frozen(tr.task.model).items()}
    x0 = tr.spec.flatten(tr.task.model)
    ids = np.arange(8)
    together = tr.train(x0.expand(8, -1), ids, t=1)
    assert (together - x0).abs().max() > 1e-4
    for block in ([5], [5, 0], [2, 5, 7], [7, 6, 5, 4, 3]):
        got = tr.train(x0.expand(len(block), -1), np.array(block), t=1)
        for j, c in enumerate(block):
            assert torch.equal(got[j], together[c]), (block, c)
    padded = LocalTrainer(tr.task, tr.cfg, tr.seed, fixed_shape=True)
    assert torch.equal(padded.train(x0.expand(3, -1), np.array([1, 5, 6]), t=1)[1], together[5])
    assert all(torch.equal(v, base[k]) for k, v in frozen(tr.task.model).items())


@pytest.mark.parametrize("path,stacked", [("batched", False), ("sequential", True)], ids=["vmap", "sequential"])
def test_every_path_trains_lora_alike(path, stacked):
    tr = _trainer(True)
    other = LocalTrainer(tr.task, tr.cfg, tr.seed, path=path, stacked=stacked)
    x0 = tr.spec.flatten(tr.task.model).expand(4, -1)
    ids = np.arange(4)
    torch.testing.assert_close(other.train(x0, ids, t=0), tr.train(x0, ids, t=0), rtol=0, atol=2e-5)


def test_lora_dropout_is_keyed_and_leaves_torchs_generator():
    """The masks differ between clients and steps, come from the engine's streams (the same with
    dropout keys fixed), and training draws nothing from torch's global generator."""
    tr = _trainer(True, task__adapter__dropout=0.5)
    assert any(k.endswith("lora_dropout.key") for k in tr._key_names)
    x0 = tr.spec.flatten(tr.task.model).expand(2, -1)
    state = torch.random.get_rng_state()
    a = tr.train(x0, np.array([3, 3]), t=2)
    assert torch.equal(torch.random.get_rng_state(), state)
    assert torch.equal(a[0], a[1])  # the same client, the same masks
    b = tr.train(x0, np.array([3, 4]), t=2)
    assert torch.equal(b[0], a[0]) and not torch.equal(b[1], a[1])
    no_drop = _trainer(True, task__adapter__dropout=0.0)
    assert not torch.equal(no_drop.train(x0[:1], np.array([3]), t=2)[0], a[0])


def test_full_fine_tuning_trains_every_parameter():
    tr = _trainer(False)
    assert tr.spec.names == tuple(n for n, _ in tr.task.model.named_parameters()) and not frozen(tr.task.model)
    x0 = tr.spec.flatten(tr.task.model)
    moved = (tr.train(x0[None], np.array([0]), t=0)[0] - x0).abs()
    views = tr.spec.views(moved)
    assert all(float(v.max()) > 0 for k, v in views.items() if k != "embed.pos.weight"), \
        [k for k, v in views.items() if float(v.max()) == 0]


def test_the_token_loss_is_the_mean_over_target_tokens():
    gen = torch.Generator().manual_seed(0)
    out = torch.randn(3, 4, T, VOCAB, generator=gen)
    x, y = tokens(3, 4, T)
    y[1] = IGNORE  # a client without targets: 0, no NaN
    loss = token_cross_entropy(out, y)
    for i in (0, 2):
        want = nn.functional.cross_entropy(out[i].reshape(-1, VOCAB), y[i].reshape(-1), ignore_index=IGNORE)
        torch.testing.assert_close(loss[i], want)
    assert loss[1] == 0
    each = token_cross_entropy.per_sample(out, y)
    assert each.shape == (3, 4)
    torch.testing.assert_close(each[0, 2], nn.functional.cross_entropy(out[0, 2], y[0, 2], ignore_index=IGNORE))
    same = out[:1, :1].expand(3, 1, T, VOCAB)  # three models' equal outputs on one sequence
    total, hits, units = token_cross_entropy.eval_totals(same, y[:1, :1].expand(3, 1, T))
    assert units == int((y[0, 0] != IGNORE).sum()) and hits.shape == (3,) and torch.equal(total[0], total[2])
    torch.testing.assert_close(total[0] / units, loss[0].new_tensor(float(token_cross_entropy(out[:1, :1], y[:1, :1])),
                                                                   dtype=torch.float64))


def test_a_training_step_reports_the_token_loss():
    """The minibatch loss the trainer records (LocalStats) is the mean over the minibatch's target
    tokens at the start model."""
    from fedmpi.engine.local import LocalStats

    tr = _trainer(True, train__local_steps=1)
    x0 = tr.spec.flatten(tr.task.model)
    stats = LocalStats()
    tr.train(x0[None], np.array([2]), t=0, stats=stats)
    xb, yb, _ = tr.batch(np.array([2]), 0, 0)
    with torch.no_grad():
        want = token_cross_entropy(tr.task.model(xb[0]), yb[0])
    assert abs(stats.first_loss[0] - float(want)) < 1e-6


@pytest.mark.parametrize("over,message", [
    ({"task__adapter__target_modules": ["nothing"]}, r"^task\.adapter\.target_modules: 'nothing' names no module"),
    ({"task__adapter__target_modules": ["ln1"]}, r"^task\.adapter\.target_modules: 'ln1' names h0\.ln1, a LayerNorm"),
    ({"task__adapter__target_modules": []}, r"^task\.adapter\.target_modules: must be a non-empty list"),
    ({"task__context": 5}, r"^task\.context: 5 positions, but the dataset's sequences are 12 tokens"),
    ({"task__width": 15}, r"^task\.width: 15 is not a multiple of task\.heads \(2\)"),
    ({"task__partition__kind": "dirichlet"}, r"^task\.partition\.kind: dirichlet splits by class labels; a text"),
    ({"task__dataset": "synthetic", "task__partition__kind": "iid"},
     r"^task\.model: transformer reads token sequences, but task\.dataset synthetic"),
    ({"task__model": "mlp", "task__adapter__target_modules": None}, r"^task\.model: mlp does not read token sequences"),
])
def test_refusals_name_the_key(over, message):
    with pytest.raises(InputError, match=message):
        cfg = config.from_dict(text_config(True, **over))
        build_task(cfg, CPU)


def test_full_gradient_is_refused_for_the_token_loss():
    with pytest.raises(InputError, match=r"^train\.full_gradient: task\.model transformer's loss"):
        config.from_dict(text_config(True, train__full_gradient=True))


def test_lora_on_a_model_without_default_targets():
    """mlp has no default targets: null target_modules is refused naming its Linear layers; named
    ones are adapted (any Linear layer, the output layer too)."""
    from conftest import synthetic_config

    cfg = config.from_dict(synthetic_config(task__model="mlp", task__hidden=8, task__adapter={"kind": "lora"}))
    with pytest.raises(InputError, match=r"^task\.adapter\.target_modules: this model has no default targets; "
                                         r"name its Linear layers \(fc1, fc2, out\)"):
        build_task(cfg, CPU)
    cfg = config.from_dict(synthetic_config(task__model="mlp", task__hidden=8,
                                            task__adapter={"kind": "lora", "target_modules": ["fc2", "out"]}))
    task = build_task(cfg, CPU)
    assert ParamSpec.of(task.model).names == ("fc2.lora_A.weight", "fc2.lora_B.weight", "out.lora_A.weight",
                                              "out.lora_B.weight")
    tr = LocalTrainer(task, cfg.train, cfg.seed)
    assert tr.net is not None
    x0 = tr.spec.flatten(task.model).expand(3, -1)
    assert (tr.train(x0, np.arange(3), t=0) - x0).abs().max() > 0


def test_the_memory_check_and_line_count_the_base_once_and_adapters_per_client(monkeypatch):
    """LocalTrainer.memory: a LoRA client holds its adapters (4 d bytes), their gradient and update,
    the momentum buffer, its minibatch and activations; the base is counted once per rank. The
    run log's line says it, with the block size and how many clients fit; a rank whose memory
    cannot hold a block's local step is refused naming train.batch_size."""
    from fedmpi.build import build_components, memory_line
    from fedmpi.engine.params import frozen_bytes
    from fedmpi.runtime import World

    cfg = config.from_dict(text_config(True, train__momentum=0.5))
    run = build_components(cfg, World())
    mem, d = run.trainer.memory(), run.trainer.spec.dim
    assert (mem.parameters, mem.gradients, mem.optimizer) == (4 * d, 8 * d, 4 * d) and mem.activations > 0
    base = frozen_bytes(run.task.model)
    assert base > 5 * mem.parameters
    monkeypatch.setattr(World, "free_memory", lambda self: (100 * 2**20, "host memory per rank"))
    line = memory_line(run.trainer, World(), base)
    assert line.startswith(f"memory: {mem.total / 2**10:.1f} KiB per client ({d} trainable parameters")
    fit = int((0.9 * 100 * 2**20 - base) // mem.total)
    assert f"frozen base {base / 2**10:.1f} KiB once per rank; blocks of {run.trainer.chunk_size()} clients; " \
           f"{fit} clients fit at once in the 100.0 MiB host memory per rank available" in line
    monkeypatch.setattr(World, "free_memory", lambda self: (base + mem.total, "host memory per rank"))
    with pytest.raises(InputError, match=r"^train\.batch_size: a local step of 8 clients x 4 samples needs"):
        build_components(cfg, World())
