"""Federated LoRA on a cohort: fedmpi's batched adapters over one frozen base vs a per-client PEFT
loop (issue 42 item 8), measured in one run.

    python benchmarks/lora.py [--sizes tiny small] [--device cpu|cuda] [--repeat 2] [--memory-gib 24]
                              [--clients 32] [--threads 1] [--arch llama|gpt2] [--builtin] [--vmap] [--quick]

The same Hugging Face Llama (``transformers``' ``LlamaForCausalLM``, random weights from a seed,
saved to a temporary folder) with the same LoRA (r 8, alpha 16, no dropout, on ``q_proj`` and
``v_proj``), a cohort of ``--clients`` clients x 4 local steps x batch 4 of random token sequences
(vocabulary 259, fedmpi's byte tokenizer's), plain SGD at lr 0.01, at two sizes: ``tiny`` (2 layers,
width 64, 64-token sequences) and ``small`` (4 layers, width 256, 128 tokens); 4 heads, Llama-2's
MLP ratio (intermediate 2.6875 x width), tied embeddings. ``--arch gpt2``: a GPT-2 of the same
layers, width, heads and context instead (its MLP 4 x width, learned positions), LoRA on its
fused ``c_attn`` (PEFT with ``fan_in_fan_out``, GPT-2's Conv1D).

- **fedmpi**: the cohort as one batched program (``engine.local.LocalTrainer``: each block of
  clients over the one frozen base of the rank, ``engine.adapter_layers``), in the engine's own
  blocks on this device (``block``) and in one block of the whole cohort.
  The model is the Llama (or GPT-2) folder read by ``task.model: hf`` when this fedmpi has it,
  else the built-in transformer (``task.model: transformer``) at the same layers, width, heads and
  context (GPT-2's block: LayerNorm, GELU MLP of 4 x width, learned positions; also with
  ``--builtin``, against the Llama only): the line says which. ``hf`` trains through the stacked
  rules of its architecture (``engine.hf_layers``; ``vmap`` before them, ``models.hf``), the
  built-in transformer through its own (``engine.sequence_layers``).
- **peft loop**: one ``peft.PeftModel`` over the base, the clients one after another as FlowerTune
  and OpenFedLLM run them: load the global adapters (``set_peft_model_state_dict``), a fresh
  optimizer, 4 steps, read the adapters back.

Speed: clients per second of one round of the cohort (every client from the same global adapters,
no server step), each side timed in alternating rounds (best of ``--repeat``), so that a change of
machine load hits both alike; one process, ``torch.set_num_threads(--threads)`` for both.
``--vmap`` adds fedmpi through ``vmap`` on the same model (``LocalTrainer(stacked=False)``: the path
``hf`` took before the Llama's stacked rules) to the timed rounds and the memory measurements.

Memory, each number from a fresh child process (``--child``) so that one side's allocations do not
hide the other's: the peak during one round above the memory held before it (after a warm-up
round; on CPU Linux's VmHWM, reset through /proc/self/clear_refs, with glibc's mmap threshold fixed
so that freed tensors go back to the system; on CUDA ``max_memory_allocated``). fedmpi is measured
with blocks of 2 and of ``--clients`` clients: the difference over ``clients - 2`` is the memory of
each additional client (2, not 1: the vmap path, for architectures without stacked rules,
computes a block of one client as a pair). It is
compared with what a client needs: its adapters, their gradients, the optimizer state (0 for SGD)
and the activations its step keeps for the backward pass (the tensors autograd saves in the
model's own per-client forward of one batch, parameters excluded; printed for fedmpi's model and
for PEFT's). ``fit``: clients training at once in ``--memory-gib`` GiB, fedmpi's (one base, then
the per-client memory) against a whole model copy per concurrent client (how Flower packs a GPU:
every client a process with the base, its adapters and its step; a process's own runtime, 0.3-0.5
GiB on a GPU, not counted).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import interleaved, machine, sync  # noqa: E402

from fedmpi import config  # noqa: E402
from fedmpi.data.arrays import TextInfo  # noqa: E402
from fedmpi.engine.local import LocalTrainer  # noqa: E402
from fedmpi.models import build_model, loss_fn  # noqa: E402
from fedmpi.registry import MODELS  # noqa: E402
from fedmpi.task import Task  # noqa: E402

VOCAB, HEADS, STEPS, BATCH, RANK, ALPHA, LR = 259, 4, 4, 4, 8, 16, 0.01
#: the model's architecture (``--arch``): LoRA's target modules, PEFT's fan_in_fan_out (GPT-2's Conv1D)
ARCH = "llama"
TARGETS = {"llama": ["q_proj", "v_proj"], "gpt2": ["c_attn"]}


@dataclass(frozen=True)
class Size:
    layers: int
    width: int
    context: int

    @property
    def intermediate(self) -> int:  # Llama-2's MLP ratio (11008 / 4096)
        return self.width * 43 // 16


SIZES = {"tiny": Size(2, 64, 64), "small": Size(4, 256, 128)}


# ----------------------------------------------------------------------------- the shared pieces
def model_folder(size: Size, path: str) -> str:
    """A model of ``size`` (a Llama, or with ``--arch gpt2`` a GPT-2) with random weights from seed
    0, saved as a Hugging Face folder."""
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    from transformers.utils import logging

    logging.disable_progress_bar()

    if ARCH == "gpt2":  # GPT-2's MLP of 4 x width, learned positions
        cfg, cls = GPT2Config(vocab_size=VOCAB, n_embd=size.width, n_layer=size.layers, n_head=HEADS,
                              n_positions=size.context, bos_token_id=257, eos_token_id=258), GPT2LMHeadModel
    else:
        cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=size.width, intermediate_size=size.intermediate,
                          num_hidden_layers=size.layers, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                          max_position_embeddings=size.context, tie_word_embeddings=True, pad_token_id=256,
                          bos_token_id=257, eos_token_id=258)
        cls = LlamaForCausalLM
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cls(cfg).save_pretrained(path)
    return path


def tokens(size: Size, clients: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Random sequences, ``STEPS * BATCH`` per client, and their next tokens (every position a target)."""
    g = torch.Generator().manual_seed(1)
    seq = torch.randint(0, 256, (clients * STEPS * BATCH, size.context + 1), generator=g)
    return seq[:, :-1].contiguous().to(device), seq[:, 1:].contiguous().to(device)


#: the fedmpi side on the built-in transformer even where fedmpi has ``task.model: hf`` (--builtin)
BUILTIN = False


def hf_model_key() -> str | None:
    """The name of fedmpi's Hugging Face model when this fedmpi has one (``task.model``) and
    ``--builtin`` is not given."""
    return "hf" if "hf" in MODELS and not BUILTIN else None


class Fedmpi:
    """The cohort through fedmpi's engine: one round = ``LocalTrainer.train`` of every client."""

    def __init__(self, size: Size, folder: str, clients: int, device: torch.device, block: int | None = None,
                 stacked: bool = True):
        key = hf_model_key()
        shape = {"path": folder} if key else {"layers": size.layers, "width": size.width, "heads": HEADS,
                                              "context": size.context}
        self.model_name = key or "transformer"
        cfg = config.from_dict({
            "task": {"dataset": "synthetic_text", "model": self.model_name, **shape,
                     "adapter": {"kind": "lora", "r": RANK, "alpha": ALPHA, "dropout": 0.0,
                                 "target_modules": TARGETS[ARCH]}},
            "train": {"local_steps": STEPS, "batch_size": BATCH, "lr": LR}})
        x, y = tokens(size, clients, device)
        model = build_model(self.model_name, (size.context,), VOCAB, seed=0, params=cfg.task).to(device)
        per = STEPS * BATCH
        self.task = Task(model=model, loss=loss_fn(self.model_name), train_x=x, train_y=y, test_x=x[:per],
                         test_y=y[:per], order=torch.arange(len(x), device=device),
                         offsets=np.arange(clients + 1) * per, classes=VOCAB, label_hist=None, groups=None,
                         text=TextInfo(VOCAB, 256, "bytes", 257, 258))
        self.trainer = LocalTrainer(self.task, cfg.train, seed=0, stacked=stacked)  # False: vmap
        self.block = self.trainer.chunk_size()
        if block is not None:
            self.trainer.chunk_size = lambda: block
            self.block = block
        self.x0 = self.trainer.spec.flatten(model).to(device)
        self.clients = np.arange(clients)
        self.t = 0

    def round(self, clients: int | None = None) -> torch.Tensor:
        ids = self.clients[:clients]
        self.t += 1
        return self.trainer.train(self.x0.expand(len(ids), -1), ids, t=self.t)

    def base_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.task.model.parameters() if not p.requires_grad)


class PeftLoop:
    """The cohort as FlowerTune and OpenFedLLM train it: one PeftModel, the clients one by one."""

    def __init__(self, size: Size, folder: str, clients: int, device: torch.device):
        from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
        from transformers import AutoModelForCausalLM

        base = AutoModelForCausalLM.from_pretrained(folder, attn_implementation="sdpa").to(device)
        self.model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=ALPHA, lora_dropout=0.0,
                                                     target_modules=TARGETS[ARCH], fan_in_fan_out=ARCH == "gpt2"))
        self.global_ = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        self.x, self.y = tokens(size, clients, device)
        self.n = clients

    def client(self, i: int) -> dict:
        from peft import get_peft_model_state_dict, set_peft_model_state_dict

        set_peft_model_state_dict(self.model, self.global_)
        opt = torch.optim.SGD([p for p in self.model.parameters() if p.requires_grad], lr=LR)
        for j in range(STEPS):
            k = (i * STEPS + j) * BATCH
            loss = self.loss(self.x[k:k + BATCH], self.y[k:k + BATCH])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        return {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return logits_loss(self.model, x, y)

    def round(self, clients: int | None = None) -> list[dict]:
        return [self.client(i) for i in range(clients or self.n)]

    def base_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if not p.requires_grad)

def client_needs(model: torch.nn.Module, loss, x: torch.Tensor, y: torch.Tensor) -> dict[str, int]:
    """What one client's step needs beside the base: its adapters, their gradients, the optimizer's
    state after a step, and the activations the step keeps for backward (the tensors autograd saves
    in ``model``'s own forward of one batch ``x``, parameters excluded)."""
    params = list(model.parameters())
    held = {p.untyped_storage().data_ptr() for p in params}
    saved: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in held:
            saved[s.data_ptr()] = s.nbytes()
        return t

    trainable = [p for p in params if p.requires_grad]
    before = [p.detach().clone() for p in trainable]
    opt = torch.optim.SGD(trainable, lr=LR)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = loss(model, x, y)
    out.backward()
    opt.step()
    state = sum(v.numel() * v.element_size() for st in opt.state.values() for v in st.values() if torch.is_tensor(v))
    with torch.no_grad():  # leave the model as it was
        for p, b in zip(trainable, before):
            p.copy_(b)
            p.grad = None
    adapters = sum(p.numel() * p.element_size() for p in trainable)
    return {"adapters": adapters, "gradients": adapters, "optimizer": state, "activations": sum(saved.values())}


def logits_loss(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of a Hugging Face causal LM's logits or a plain module's output."""
    out = model(input_ids=x).logits if hasattr(model, "peft_config") else model(x)
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


# ----------------------------------------------------------------------------- memory (child processes)
def _status_kb(key: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{key}:\s+(\d+) kB", f.read(), re.M).group(1))


def round_peak(run, device: torch.device) -> int:
    """Bytes one round takes at its peak above what the process held before it (after a warm-up round)."""
    run()
    sync()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        run()
        sync()
        return torch.cuda.max_memory_allocated() - before
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident set
    before = _status_kb("VmRSS")
    run()
    return (_status_kb("VmHWM") - before) * 1024


def child(args: argparse.Namespace) -> None:
    """One memory measurement (``--child fedmpi:BLOCK`` or ``--child peft``); prints a JSON line."""
    torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    size = SIZES[args.sizes[0]]
    side, _, block = args.child.partition(":")
    block, _, path = block.partition(":")
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(size, tmp)
        if side == "fedmpi":
            k = int(block)
            run = Fedmpi(size, folder, k, dev, block=k, stacked=path != "vmap")
            peak = round_peak(run.round, dev)
            extra = {"engine_client_bytes": run.trainer.memory().total, "model": run.model_name}
        else:
            run = PeftLoop(size, folder, 2, dev)
            peak = round_peak(lambda: run.client(0), dev)
            extra = {}
    print(json.dumps({"peak": peak, "base": run.base_bytes(), **extra}))


def measure(args: argparse.Namespace, name: str, what: str) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", what, "--sizes", name, "--device", args.device,
           "--threads", str(args.threads), "--arch", args.arch] + (["--builtin"] if args.builtin else [])
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


# ----------------------------------------------------------------------------- speed (this process)
def mib(n: float) -> str:
    return f"{n / 2**20:.2f}"


def bench(args: argparse.Namespace, name: str) -> None:
    size, dev, n = SIZES[name], torch.device(args.device), args.clients
    with tempfile.TemporaryDirectory() as tmp:
        folder = model_folder(size, tmp)
        ours, loop = Fedmpi(size, folder, n, dev), PeftLoop(size, folder, n, dev)
        whole = Fedmpi(size, folder, n, dev, block=n)
        sides = {"fedmpi": ours.round, "whole": whole.round, "peft": loop.round}
        if args.vmap:  # the vmap path on the same model (before the Llama's stacked rules)
            sides["vmap"] = Fedmpi(size, folder, n, dev, block=n, stacked=False).round
        needs = client_needs(ours.task.model, logits_loss, ours.task.train_x[:BATCH], ours.task.train_y[:BATCH])
        peft_needs = client_needs(loop.model, logits_loss, loop.x[:BATCH], loop.y[:BATCH])
        for run in sides.values():
            run(2)  # warm-up: first calls, allocator
        sec = interleaved(sides, args.repeat, warmup=False)
    rate = {k: n / s for k, s in sec.items()}
    two, all_, peft = (measure(args, name, w) for w in ("fedmpi:2", f"fedmpi:{n}", "peft"))
    per_client = (all_["peak"] - two["peak"]) / (n - 2)
    need = sum(needs.values())
    budget = args.memory_gib * 2**30
    fit_ours = 2 + int((budget - two["base"] - two["peak"]) // per_client)
    fit_flower = int(budget // (peft["base"] + peft["peak"]))
    print(f"\n## {name}: {size.layers} layers, width {size.width}, {size.context} tokens, fedmpi model "
          f"{ours.model_name}{'' if hf_model_key() else ' (the built-in one at these shapes, not the Llama)'}; "
          f"{n} clients x {STEPS} steps x batch {BATCH}, LoRA r {RANK} on {'+'.join(TARGETS[ARCH])}, {ARCH}")
    print(f"{'side':<24} {'clients/s':>10} {'vs loop':>8} {'round peak MiB':>15}")
    print(f"{f'fedmpi (block {ours.block})':<24} {rate['fedmpi']:>10.2f} {rate['fedmpi'] / rate['peft']:>7.2f}x "
          f"{'':>15}")
    print(f"{f'fedmpi (block {n})':<24} {rate['whole']:>10.2f} {rate['whole'] / rate['peft']:>7.2f}x "
          f"{mib(all_['peak']):>15}")
    if args.vmap:
        v2, vall = (measure(args, name, w) for w in ("fedmpi:2:vmap", f"fedmpi:{n}:vmap"))
        print(f"{f'fedmpi vmap (block {n})':<24} {rate['vmap']:>10.2f} {rate['vmap'] / rate['peft']:>7.2f}x "
              f"{mib(vall['peak']):>15}")
    print(f"{'peft loop':<24} {rate['peft']:>10.2f} {1:>7.2f}x {mib(peft['peak']):>15}")
    print(f"base: fedmpi {mib(two['base'])} MiB, peft {mib(peft['base'])} MiB; a client of fedmpi's model needs "
          f"{mib(need)} MiB (adapters {mib(needs['adapters'])}, gradients {mib(needs['gradients'])}, optimizer "
          f"{mib(needs['optimizer'])}, activations {mib(needs['activations'])}; fedmpi's own estimate "
          f"{mib(two['engine_client_bytes'])}); of peft's {mib(sum(peft_needs.values()))} MiB")
    print(f"memory per additional client (fedmpi, blocks of 2 and {n}): {mib(per_client)} MiB = "
          f"{per_client / need:.2f}x what a client needs; block of 2: {mib(two['peak'])} MiB")
    if args.vmap:
        vper = (vall["peak"] - v2["peak"]) / (n - 2)
        print(f"the same through vmap: {mib(vper)} MiB = {vper / need:.2f}x; block of 2: {mib(v2['peak'])} MiB")
    print(f"clients at once in {args.memory_gib:g} GiB: fedmpi {fit_ours}, a whole model per client "
          f"{fit_flower} (base + the loop's round peak = {mib(peft['base'] + peft['peak'])} MiB each): "
          f"{fit_ours / max(fit_flower, 1):.1f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", nargs="+", choices=list(SIZES), default=list(SIZES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--clients", type=int, default=32, help="the cohort")
    ap.add_argument("--repeat", type=int, default=2, help="alternating timed rounds (best of)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads, both sides")
    ap.add_argument("--memory-gib", type=float, default=24.0, help="the memory the 'fit' line packs clients into")
    ap.add_argument("--arch", choices=list(TARGETS), default="llama", help="the Hugging Face model's architecture")
    ap.add_argument("--builtin", action="store_true", help="fedmpi's side on the built-in transformer")
    ap.add_argument("--vmap", action="store_true", help="also fedmpi through vmap (stacked=False) on the same model")
    ap.add_argument("--quick", action="store_true", help="8 clients, one timed round (smoke test)")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.builtin and args.arch != "llama":
        ap.error("--builtin: the built-in transformer is measured against the Llama only (--arch llama)")
    global BUILTIN, ARCH
    BUILTIN, ARCH = args.builtin, args.arch
    if ARCH != "llama" and hf_model_key() is None:
        ap.error(f"--arch {ARCH}: needs fedmpi's task.model hf (pip install 'fedmpi[llm]')")
    if args.child:
        return child(args)
    if args.quick:
        args.clients, args.repeat = 8, 1
    torch.set_num_threads(args.threads)
    print(f"# LoRA cohort benchmark on {machine()}, device {args.device}, threads {args.threads}, "
          f"load {os.getloadavg()[0]:.1f}")
    for name in args.sizes:
        bench(args, name)


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        main()
