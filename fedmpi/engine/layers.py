"""Stacked layers: n clients' copies of one model evaluated at once, with ordinary autograd.

A model built from the layers below -- nested ``nn.Sequential`` of ``Linear``, ``Conv2d``,
``MaxPool2d``, ``Flatten``, elementwise activations, ``KeyedDropout`` and the quadratic task's
``ScalarModel`` -- compiles into a ``StackedNet``. Its forward takes every parameter stacked
over clients, (n, *shape), and the clients' minibatches (n, b, *sample), and computes all the
outputs (n, b, *out) in a few large tensor ops: a Linear layer is one ``baddbmm``, a pool or
an activation one call on the n*b samples. Autograd on the sum of the clients' losses then
gives every client's gradient in one backward pass (client i's loss depends only on its own
parameters, so the gradient of the sum splits into the per-client gradients). This replaces
``vmap(grad(functional_call))``, whose transform overhead dominated small models (measured
in benchmarks/RESULTS.md); vmap stays the reference and the fallback for any other module
(``StackedNet.compile`` returns None).

Other module types join through ``stacked_rule`` (a registry of rules by type; a composite rule
compiles its children with ``Compiler.layer``): the transformer's layers
(``engine.sequence_layers``), a Hugging Face causal LM's (``engine.hf_layers``: the Llama family's
and GPT-2's chains) and LoRA (``engine.adapter_layers``). A model's frozen parameters
(``engine.params.frozen``: a base held once per rank) are given to every layer expanded over the
block's clients, a stride-0 view (``StackedNet.with_base``), so that one ``bmm`` against a base
weight is each client's own product and autograd computes no gradient for it.

A model whose only parametrised layer is its last one (logreg, linear SVM, the quadratic
task) skips autograd: its ``Loss`` gives the gradient with respect to the outputs in closed
form, and the layer turns it into parameter gradients with one ``bmm`` (``StackedNet.gradients``).

Bit-level contract, which makes a client's result independent of its batch-mates and of the
number of ranks: no stacked op may mix clients' rows in its arithmetic. Measured on CPU:
``bmm``/``baddbmm`` computes each client's product alone with one intra-op thread, but with
several threads MKL splits products differently for other batch sizes, so the engine does its
CPU arithmetic under ``threads.one_thread`` (CPU parallelism comes from ranks). Convolutions
have three implementations (``conv_impl``):

- ``loop``: one ``F.conv2d`` per client -- exactly the sequential engine's call, so the same
  bits; the CPU default (oneDNN's grouped convolution picks other kernels for other numbers of
  groups, measured: a client's results change with n; im2col + bmm is exact per client but made
  whole training steps 1.3-1.6x slower, benchmarks/RESULTS.md);
- ``grouped``: one convolution with groups = n (the CUDA default, 1.8-2.2x the others on an
  H200; cuDNN's kernel depends on n, so on CUDA every block has the same n, ``engine.shapes``);
- ``unfold``: im2col (``F.unfold``) + one batched matmul.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..models.nets import ScalarModel
from ..models.dropout import KeyedDropout
from ..models.losses import Loss, per_client, per_sample
from .params import frozen
from .threads import one_thread

Tensor = torch.Tensor
Params = dict[str, Tensor]
CONV_IMPLS = ("loop", "grouped", "unfold")

# modules that act on each element alone, whatever the shape: applied to the stacked tensor as they are
_ELEMENTWISE = (nn.ReLU, nn.ReLU6, nn.LeakyReLU, nn.ELU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Softplus,
                nn.Hardtanh, nn.Mish, nn.Identity)


def conv_impl(device: torch.device) -> str:
    """Default convolution implementation on ``device`` (see the module docstring)."""
    return "grouped" if device.type == "cuda" else "loop"


def _shift(dim: int) -> int:
    """A per-sample-batch dim index -> the same dim of the client-stacked tensor."""
    return dim + 1 if dim >= 0 else dim


class _Layer:
    """One stacked layer: ``forward(params, x, keys)`` on x (n, b, ...); ``keys`` None = eval mode.

    ``params``: the names of the parameters it uses (trainable or frozen; the net checks that
    every parameter of the model is used by exactly one layer); ``reads``: names of parameters
    another layer owns that it reads too (a tied output head)."""

    params: tuple[str, ...] = ()
    reads: tuple[str, ...] = ()
    reads_values = True  # False: the output depends on the input's shape only

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        raise NotImplementedError

    def grads(self, p: Params, x: Tensor, dout: Tensor) -> Params | None:
        """Parameter gradients from this layer's input ``x`` and d loss/d output (closed form),
        or None when the layer has none."""
        return None

    def activations(self, p: Params, x: Tensor) -> tuple[Tensor, int]:
        """The output of ``forward`` in eval mode and the number of elements of the outputs it keeps
        (a composite layer counts its inner ones too: ``StackedNet.activation_numel``)."""
        out = self.forward(p, x, None)
        return out, out.numel()


#: the public name of a stacked layer, for plug-ins' rules (``stacked_rule``)
Layer = _Layer


def _linear(h: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """h (n, B, in) @ w (n, out, in)^T + b (n, out)."""
    wt = w.transpose(1, 2)
    return torch.baddbmm(b.unsqueeze(1), h, wt) if b is not None else torch.bmm(h, wt)


class _LinearFn(torch.autograd.Function):
    """``_linear`` with a backward of explicit batched products, so that the weight gradient
    comes out in the weight's own (contiguous) layout: autograd through ``baddbmm`` returns it
    transposed, and the SGD update on a transposed gradient ran 2.5x slower (a 100-client MLP
    layer)."""

    @staticmethod
    def forward(ctx, h: Tensor, w: Tensor, b: Tensor | None) -> Tensor:  # ctx-first: no per-call signature binding
        # keep h only for a trained weight: a frozen base's input would be held to no use until backward
        ctx.save_for_backward(h if ctx.needs_input_grad[1] else None, w if ctx.needs_input_grad[0] else None)
        ctx.has_bias = b is not None
        return _linear(h, w, b)

    @staticmethod
    def backward(ctx, dout: Tensor):
        h, w = ctx.saved_tensors
        gh = torch.bmm(dout, w) if ctx.needs_input_grad[0] else None
        gw = torch.bmm(dout.transpose(1, 2), h) if ctx.needs_input_grad[1] else None
        gb = dout.sum(1) if ctx.has_bias and ctx.needs_input_grad[2] else None
        return gh, gw, gb


class _Linear(_Layer):
    def __init__(self, prefix: str, mod: nn.Linear):
        self.w = prefix + "weight"
        self.b = prefix + "bias" if mod.bias is not None else None
        self.params = (self.w,) + ((self.b,) if self.b else ())

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        w = p[self.w]  # (n, out, in)
        h = x.reshape(x.shape[0], -1, x.shape[-1])
        b = p[self.b] if self.b else None
        tracked = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (h, w, b))
        out = _LinearFn.apply(h, w, b) if tracked else _linear(h, w, b)
        return out.view(*x.shape[:-1], w.shape[1])

    def grads(self, p: Params, x: Tensor, dout: Tensor) -> Params:
        n = x.shape[0]
        h = x.reshape(n, -1, x.shape[-1])
        d = dout.reshape(n, -1, dout.shape[-1])
        g = {self.w: torch.bmm(d.transpose(1, 2), h)}  # as in _LinearFn.backward
        if self.b:
            g[self.b] = d.sum(1)
        return g


class _Conv2d(_Layer):
    def __init__(self, prefix: str, mod: nn.Conv2d, impl: str):
        self.w = prefix + "weight"
        self.b = prefix + "bias" if mod.bias is not None else None
        self.params = (self.w,) + ((self.b,) if self.b else ())
        self.mod, self.impl = mod, impl

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        w, b = p[self.w], (p[self.b] if self.b else None)
        mod, n = self.mod, x.shape[0]
        if self.impl == "loop":
            return torch.stack([F.conv2d(x[i], w[i], None if b is None else b[i], mod.stride, mod.padding,
                                         mod.dilation) for i in range(n)])
        bs, c, hh, ww = x.shape[1:]
        if self.impl == "grouped":  # clients become channel groups: (b, n*C, H, W)
            xi = x.transpose(0, 1).reshape(bs, n * c, hh, ww)
            out = F.conv2d(xi, w.reshape(-1, *w.shape[2:]), None if b is None else b.reshape(-1),
                           mod.stride, mod.padding, mod.dilation, groups=n)
            return out.view(bs, n, w.shape[1], *out.shape[2:]).transpose(0, 1)
        # unfold: im2col, then (out, C*kh*kw) @ (C*kh*kw, L) for every image of every client
        cols = F.unfold(x.reshape(n * bs, c, hh, ww), mod.kernel_size, mod.dilation, mod.padding, mod.stride)
        out = torch.matmul(w.reshape(n, 1, w.shape[1], -1), cols.view(n, bs, *cols.shape[1:]))
        if b is not None:
            out = out + b.view(n, 1, -1, 1)
        size = [(s + 2 * pad - dil * (k - 1) - 1) // st + 1
                for s, pad, dil, k, st in zip((hh, ww), mod.padding, mod.dilation, mod.kernel_size, mod.stride)]
        return out.view(n, bs, w.shape[1], *size)


class _MaxPool2d(_Layer):
    def __init__(self, mod: nn.MaxPool2d):
        self.mod = mod

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        m = self.mod
        y = F.max_pool2d(x.reshape(-1, *x.shape[2:]), m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode)
        return y.view(*x.shape[:2], *y.shape[1:])


class _Flatten(_Layer):
    def __init__(self, mod: nn.Flatten):
        self.start, self.end = _shift(mod.start_dim), _shift(mod.end_dim)

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        return x.flatten(self.start, self.end)


class _Elementwise(_Layer):
    def __init__(self, mod: nn.Module):
        self.mod = mod

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        return self.mod(x)


class _KeyedDropout(_Layer):
    def __init__(self, prefix: str, mod: KeyedDropout):
        self.key, self.mod = prefix + "key", mod

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        if keys is None or self.mod.p == 0.0:
            return x
        return self.mod.drop(x, keys[self.key])


class _Scalar(_Layer):
    """The quadratic task's model: the parameter vector itself, one copy per sample."""

    reads_values = False

    def __init__(self, prefix: str):
        self.x = prefix + "x"
        self.params = (self.x,)

    def forward(self, p: Params, inp: Tensor, keys: Params | None) -> Tensor:
        v = p[self.x]  # (n, dim)
        return v.view(v.shape[0], *[1] * (inp.dim() - 2), v.shape[1]).expand(*inp.shape[:-1], v.shape[1])

    def grads(self, p: Params, inp: Tensor, dout: Tensor) -> Params:
        return {self.x: dout.reshape(dout.shape[0], -1, dout.shape[-1]).sum(1)}


class _Chain(_Layer):
    """Layers applied one after another (a nested ``nn.Sequential`` inside a composite layer)."""

    def __init__(self, layers: list[_Layer]):
        self.layers = layers
        self.params = tuple(name for layer in layers for name in layer.params)
        self.reads = tuple(name for layer in layers for name in layer.reads)

    def forward(self, p: Params, x: Tensor, keys: Params | None) -> Tensor:
        for layer in self.layers:
            x = layer.forward(p, x, keys)
        return x

    def activations(self, p: Params, x: Tensor) -> tuple[Tensor, int]:
        total = 0
        for layer in self.layers:
            x, k = layer.activations(p, x)
            total += k
        return x, total


class Compiler:
    """What a stacked rule gets besides its module: the convolution implementation, ``layer``,
    which compiles a child module (a ``Sequential`` into a ``_Chain``) with the same rules,
    ``name_of``, a parameter's name in the model (a tied weight's owner), and ``frozen``."""

    def __init__(self, conv: str, model: nn.Module | None = None):
        self.conv = conv
        named = list(model.named_parameters()) if model is not None else []
        self._names = {id(p): name for name, p in named}
        self._frozen = {name for name, p in named if not p.requires_grad}

    def name_of(self, param: Tensor) -> str | None:
        """The name of ``param`` in the compiled model (None when it is not one of its parameters)."""
        return self._names.get(id(param))

    def frozen(self, *names: str | None) -> bool:
        """Whether the named parameters (None: absent) are all part of the frozen base: a rule
        may then compute with one copy of them (the net gives them expanded over the clients)."""
        return all(name is None or name in self._frozen for name in names)

    def layer(self, mod: nn.Module, prefix: str) -> _Layer | None:
        """The stacked form of ``mod`` (parameter names under ``prefix``), None without a rule."""
        out: list[_Layer] = []
        if not _collect(mod, prefix, self, out) or not out:
            return None
        return out[0] if len(out) == 1 else _Chain(out)


RuleFactory = Callable[[nn.Module, str, Compiler], "_Layer | None"]
_RULES: list[tuple[type, RuleFactory]] = []


def stacked_rule(module_type: type) -> Callable[[RuleFactory], RuleFactory]:
    """Decorator registering ``factory(mod, prefix, compiler) -> Layer | None`` as the stacked rule
    of modules of type ``module_type`` (``prefix``: the module's parameter-name prefix, e.g.
    ``"h0.attn."``; ``compiler.layer`` compiles its children; None: no stacked form, the model
    then trains through vmap). The rules of ``engine.sequence_layers`` (embeddings, LayerNorm,
    causal attention, the transformer block, the tied head), of ``engine.hf_layers`` (a Hugging
    Face Llama, Mistral, Qwen2 or GPT-2) and of ``engine.adapter_layers`` (LoRA) register this way; a rule must
    keep the bit contract of the module docstring."""
    def add(factory: RuleFactory) -> RuleFactory:
        _RULES.append((module_type, factory))
        return factory
    return add


def _rule(mod: nn.Module, prefix: str, compiler: Compiler) -> _Layer | None:
    if isinstance(mod, nn.Linear):
        return _Linear(prefix, mod)
    if isinstance(mod, nn.Conv2d):
        if mod.groups != 1 or mod.padding_mode != "zeros" or isinstance(mod.padding, str):
            return None
        return _Conv2d(prefix, mod, compiler.conv)
    if isinstance(mod, nn.MaxPool2d):
        return None if mod.return_indices else _MaxPool2d(mod)
    if isinstance(mod, nn.Flatten):
        return _Flatten(mod)
    if isinstance(mod, KeyedDropout):
        return _KeyedDropout(prefix, mod)
    if isinstance(mod, ScalarModel):
        return _Scalar(prefix)
    if isinstance(mod, _ELEMENTWISE) and not any(True for _ in mod.parameters()):
        return _Elementwise(mod)
    for cls, factory in _RULES:
        if isinstance(mod, cls):
            return factory(mod, prefix, compiler)
    return None


def _collect(mod: nn.Module, prefix: str, compiler: Compiler, out: list[_Layer]) -> bool:
    if isinstance(mod, nn.Sequential) and type(mod).forward is nn.Sequential.forward:
        # every child as Sequential.forward runs it (named_children would skip a repeated module)
        return all(_collect(child, f"{prefix}{name}.", compiler, out) for name, child in mod._modules.items())
    layer = _rule(mod, prefix, compiler)
    if layer is not None:
        out.append(layer)
    return layer is not None


class StackedNet:
    """A model compiled into stacked layers; see the module docstring.

    ``frozen``: the model's frozen parameters (``engine.params.frozen``), held once: ``forward``
    gives every layer each of them expanded over the n clients (a stride-0 view, never a copy),
    so a layer reads a base weight as it reads a client's own, and autograd computes no gradient
    for it."""

    def __init__(self, layers: list[_Layer], frozen: dict[str, Tensor] | None = None):
        self.layers = layers
        self.frozen = dict(frozen or {})
        *body, last = layers
        # closed-form gradients: only the last layer has parameters, and it knows its gradients
        self._head = (not any(layer.params for layer in body) and type(last).grads is not _Layer.grads
                      and not self.frozen)
        self._numel: dict[tuple, int] = {}  # activation_numel by its arguments

    @classmethod
    def compile(cls, model: nn.Module, conv: str = "loop") -> "StackedNet | None":
        """The stacked form of ``model``, or None when a module has no stacked rule (or the
        rules would not use every parameter exactly once)."""
        if conv not in CONV_IMPLS:
            raise ValueError(f"conv must be one of {CONV_IMPLS}, got {conv!r}")
        layers: list[_Layer] = []
        if not _collect(model, "", Compiler(conv, model), layers) or not layers:
            return None
        names = [name for name, _ in model.named_parameters()]
        used = [name for layer in layers for name in layer.params]
        if sorted(used) != sorted(names) or not set(r for layer in layers for r in layer.reads) <= set(names):
            return None
        return cls(layers, frozen(model))

    def forward(self, params: Params, x: Tensor, keys: Params | None = None) -> Tensor:
        """Outputs (n, b, ...) of the n clients' models ``params`` {name: (n, *shape)} on their
        inputs ``x`` (n, b, ...). ``keys``: dropout keys {'<layer>.key': (n,)} in training,
        None for evaluation (dropout off)."""
        params = self.with_base(params, x.shape[0])
        for layer in self.layers:
            x = layer.forward(params, x, keys)
        return x

    def with_base(self, params: Params, n: int) -> Params:
        """``params`` and the frozen base, each base tensor expanded (not copied) over n clients."""
        if not self.frozen:
            return params
        return {**params, **{name: v.expand(n, *v.shape) for name, v in self.frozen.items()}}

    def activation_numel(self, shapes: dict[str, torch.Size], sample: torch.Size, batch: int,
                         dtype: torch.dtype = torch.float32) -> int:
        """Elements of all layer outputs of one client's forward pass on a minibatch of ``batch``
        samples of shape ``sample`` and type ``dtype`` (token ids: int64) (counted once per argument
        set: the trainer asks every round). ``shapes``: the trainable parameters' (the frozen base
        is the net's own)."""
        args = (tuple((name, tuple(shape)) for name, shape in shapes.items()), tuple(sample), batch)
        if dtype != torch.float32:
            args += (dtype,)
        if args not in self._numel:
            self._numel[args] = self._count_activations(shapes, sample, batch, *args[3:])
        return self._numel[args]

    def _count_activations(self, shapes: dict[str, torch.Size], sample: torch.Size, batch: int,
                           dtype: torch.dtype = torch.float32) -> int:
        """One zero sample through the layers on the CPU, parameters as zero views that take no memory;
        the count grows linearly with the minibatch. (On the meta device, torch's baddbmm imports
        sympy: 0.3 s in the first round of every run.)"""
        shapes = {**shapes, **{name: v.shape for name, v in self.frozen.items()}}
        params = {name: torch.zeros(()).expand(1, *shape) for name, shape in shapes.items()}
        x, total = torch.zeros(1, 1, *sample, dtype=dtype), 0
        with torch.no_grad(), one_thread(torch.device("cpu")):
            for layer in self.layers:
                x, k = layer.activations(params, x)
                total += k
        return total * batch

    @property
    def reads_inputs(self) -> bool:
        """False when the outputs depend on the inputs' shape only (the quadratic task's model):
        the trainer then gathers no input rows."""
        return self.layers[0].reads_values

    def closed_form(self, loss) -> bool:
        """True when the gradients skip autograd: only the last layer has parameters, and the
        loss gives its output gradient in closed form."""
        return self._head and isinstance(loss, Loss) and loss.has_output_grad

    def gradients(self, loss, params: Params, x: Tensor, y: Tensor, weights: Tensor | None,
                  keys: Params | None) -> Params:
        """Every client's gradient {name: (n, *shape)} of its minibatch loss (the mean, or the
        ``weights`` (n, b) weighted sum) at ``params``; ``keys`` as in ``forward``."""
        return self.value_and_gradients(loss, params, x, y, weights, keys, value=False)[1]

    def value_and_gradients(self, loss, params: Params, x: Tensor, y: Tensor, weights: Tensor | None,
                            keys: Params | None, value: bool = True,
                            samples: bool = False) -> tuple[Tensor | Deferred | Samples | None, Params]:
        """``gradients`` and, if ``value``, each client's minibatch loss (n,) from the same forward
        pass (None otherwise); the closed form defers it (``Deferred``, which holds the per-sample
        losses too). ``samples``: also each sample's loss (``Samples``; the minibatch loss is their
        mean, the same bits as without)."""
        if self.closed_form(loss):
            with torch.no_grad():
                h = x
                for layer in self.layers[:-1]:
                    h = layer.forward(params, h, keys)
                out = self.layers[-1].forward(params, h, keys)
                if not value:
                    return None, self.layers[-1].grads(params, h, loss.output_grad(out, y, weights))
                g, raw = loss.output_grad_and_raw(out, y, weights)
                return Deferred(loss, raw, weights), self.layers[-1].grads(params, h, g)
        leaves = {name: v.detach().requires_grad_(True) for name, v in params.items()}
        with torch.enable_grad():
            out = self.forward(leaves, x, keys)
            each = per_sample(loss)(out, y) if samples or weights is not None else None
            if weights is not None:
                losses = (each * weights).sum(-1)
            else:  # a ``Loss``'s minibatch loss is (mostly) the mean of its per-sample losses: the same ops
                from_samples = each is not None and isinstance(loss, Loss) and loss.mean_of_samples
                losses = each.mean(-1) if from_samples else per_client(loss)(out, y)
            grads = torch.autograd.grad(losses.sum(), list(leaves.values()))
        if samples and value:
            return Samples(losses.detach(), each.detach()), dict(zip(leaves, grads))
        return (losses.detach() if value else None), dict(zip(leaves, grads))



class Deferred:
    """One closed-form step's minibatch losses, not finished yet: a few small ops per step cost
    more than the step's own arithmetic for small models, so ``minibatch_losses`` finishes every
    step's at once, on the host."""

    def __init__(self, loss: Loss, raw: Tensor, weights: Tensor | None):
        self.loss, self.raw, self.weights = loss, raw, weights


class Samples:
    """One step's minibatch losses (n,) with the per-sample losses (n, b) they come from
    (``engine.quantities``)."""

    def __init__(self, mean: Tensor, each: Tensor):
        self.mean, self.each = mean, each


def minibatch_losses(values: list[Tensor | Deferred | Samples]) -> np.ndarray:
    """(steps, n) float64 on the host from each step's (n,) losses, ``Samples`` or ``Deferred``
    (all of one kind)."""
    if isinstance(values[0], Samples):
        return torch.stack([v.mean for v in values]).double().cpu().numpy()
    if not isinstance(values[0], Deferred):
        return torch.stack(values).double().cpu().numpy()
    first = values[0]
    raw = torch.stack([v.raw for v in values]).double().cpu().numpy()
    weights = None if first.weights is None else torch.stack([v.weights for v in values]).double().cpu().numpy()
    return first.loss.minibatch_losses(raw, weights)


def sample_losses(values: list[Deferred | Samples]) -> np.ndarray:
    """(steps, n, b) float64 on the host: each step's per-sample losses (all of one kind)."""
    if isinstance(values[0], Samples):
        return torch.stack([v.each for v in values]).double().cpu().numpy()
    return values[0].loss.sample_losses(torch.stack([v.raw for v in values]).double().cpu().numpy())
