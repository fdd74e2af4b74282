"""The combination matrix (issue #32): every algorithm x availability kind x privacy mechanism x
local work (and, with no privacy and fixed work, x each ``CLOCK`` setting: issue #33; and, for
the model axis ``MODEL``, LoRA adapters of a tiny transformer, or of a tiny Hugging Face Llama,
over its frozen base instead of logistic regression: issue #42; and the clock crossed with
privacy, a production noise cohort ``PRODUCTION``, the local work whose durations matter ``CLOCK_WORK`` and packing:
``clock_privacy``, issue #44), on a tiny task, either refused with one line naming the keys that
conflict, or run and held to every invariant that applies (tests/test_combinations.py says which).

The axes come from the registries, so a new built-in algorithm, availability kind or mechanism
joins the matrix by itself; ``ALGORITHM``, ``KIND`` and ``PRIVACY`` hold the few parameters a
component needs to run on the tiny task, ``WORK`` the kinds of local work, ``CLOCK`` the clock's."""

from __future__ import annotations

import copy
import importlib.util
import itertools
import os
from dataclasses import dataclass

import numpy as np
import torch

from fedmpi import config, plugins
from fedmpi.algorithms.capabilities import UndeclaredRead
from fedmpi.build import build_components, check_state
from fedmpi.checkpointer import Checkpointer
from fedmpi.errors import InputError
from fedmpi.registry import ALGORITHMS, AVAILABILITY, MECHANISMS

M = 6  # clients
ROUNDS, CUT = 4, 2  # rounds of a run; the round a resumed run is cut at
BASE = {
    "seed": 7, "rounds": ROUNDS, "eval_every": ROUNDS,
    "task": {"dataset": "synthetic", "clients": M, "model": "logreg", "partition": {"kind": "iid"},
             "synthetic": {"samples": 120, "test_samples": 30, "features": 3, "classes": 2}},
    "train": {"local_steps": 2, "batch_size": 4, "lr": 0.1},
    "runtime": {"progress": False, "threads": 1},
}
#: what an algorithm needs on the tiny task (all others: their defaults)
ALGORITHM = {
    "gfedavg": {"anchor_period": 2}, "f3ast": {"select": 2}, "power_of_choice": {"select": 2, "candidates": 3},
    "fedswe": {"k": 2, "max_echo": 3}, "fedadam": {"global_lr": 0.03}, "fedyogi": {"global_lr": 0.03},
    "fedadagrad": {"global_lr": 0.03}, "fedprox": {"mu": 0.1},
    # the asynchronous servers' options of #43 on: a client may train again before the model moves
    # (once_per_version false), FedAsync's proximal term (rho); their defaults keep the older bits (test_modes)
    "fedbuff": {"concurrency": 3, "buffer": 2, "once_per_version": False},
    "fedasync": {"concurrency": 3, "rho": 0.1, "once_per_version": False},
}
SECTIONS = {"topology": {"kind": "ring"}}  # the decentralized family's own sections
_P = {"kind": "uniform", "lo": 0.3, "hi": 0.8}
#: each availability kind on 6 clients; separations of at least 2 where the kind has one (banded_mf, b = 2)
KIND = {
    "always": {}, "cohort": {"size": 3}, "stationary": {"base": {"kind": "fixed", "values": 0.5}},
    "staircase": {"period": 4, "base": _P}, "sine": {"period": 4, "base": _P},
    "interleaved_sine": {"period": 4, "cutoff": 0.4, "base": _P}, "periodic_groups": {"period": 4, "base": _P},
    "cyclic": {"groups": 2, "base": _P}, "markov": {"B": 2, "R": 1, "base": _P},
    "trace": {"schedule": [[0, 1, 2], [3, 4, 5], [0, 2], [3, 4, 5, 1]]},
}
#: each mechanism: its keys (noise_multiplier is set per check)
PRIVACY = {"none": None, "gaussian": {"clip": 0.5}, "banded_mf": {"clip": 0.5, "band": 2}}
#: declared variants of a mechanism, each a value of the privacy axis: name -> (mechanism, its keys)
VARIANTS = {"banded_opt": ("banded_mf", {"clip": 0.5, "band": 2, "factor": "optimized"}),
            "dist_banded": ("distributed_skellam", {"clip": 0.5, "band": 2}),  # the distributed matrix mechanism
            "banded_gen": ("banded_mf", {"clip": 0.5, "band": 2, "factor": "banded"})}  # the general optimum (#45)
#: privacy with the noise of a production cohort (``privacy.noise_cohort_size``), crossed with the clock
PRODUCTION = {"gaussian_n12": ("gaussian", {"clip": 0.5, "noise_cohort_size": 12})}
SIGMA = 0.7
#: the kinds of local work (``train.*``); ``file`` names a steps file written by ``steps_file``
WORK = {
    "fixed": {}, "file": {"local_steps_file": "steps.txt"},
    "uniform": {"local_steps_draw": "uniform", "local_steps": 3},
    "geometric": {"local_steps_draw": "geometric", "local_steps": 3},
    "lognormal": {"local_steps_draw": "lognormal", "local_steps": 3},
    "epochs": {"local_epochs": 0.5}, "momentum": {"momentum": 0.5},  # epochs: 3 steps of 20 samples, 2 of 10
}
#: the client whose data the neighbouring-run check changes on the clock: at seed 7 its lognormal speed
#: puts its 3-step task (local epochs on 20 samples) just over ``CLOCK["deadline"]`` and 2 steps (10
#: samples) under it, so a deadline on sample counts would change who is kept
CHANGED = 3
#: the local work crossed with the clock under privacy: durations from fixed steps, a file, keyed
#: draws, or sample counts (``epochs``, which reads the clients' data)
CLOCK_WORK = ("fixed", "file", "uniform", "epochs")
STEPS = "1 3 2 4 1 2\n"  # the steps file's counts, one per client
#: the virtual clock (``clock.*``): none (the four axes above), device speeds, and what a synchronous
#: round does with time (a deadline with dropout; over-selection, which needs a cohort)
CLOCK = {
    "none": None, "lognormal": {"kind": "lognormal", "step_time": 1.0, "comm_time": 0.5, "sigma": 0.8},
    "deadline": {"kind": "lognormal", "step_time": 1.0, "sigma": 0.8, "deadline": 3.0, "dropout": 0.2},
    "overselect": {"kind": "constant", "step_time": 1.0, "over_select": 0.5},
    "slots": {"kind": "lognormal", "step_time": 1.0, "sigma": 0.8, "slot": 2.0},  # availability in time
}


#: the model axis: the task block of each model (logreg: ``BASE``'s own); lora trains the LoRA
#: adapters of a tiny transformer (every Linear of its block, with keyed dropout) over its frozen
#: base, on the synthetic token dataset's 6 writers
MODEL = {
    "logreg": None,
    "lora": {"dataset": "synthetic_text", "clients": M, "model": "transformer", "partition": {"kind": "natural"},
             "synthetic_text": {"samples": 72, "test_samples": 18, "vocab": 12, "length": 8, "users": M},
             "width": 8, "heads": 2, "layers": 1,
             "adapter": {"kind": "lora", "r": 2, "alpha": 4.0, "dropout": 0.1,
                         "target_modules": ["q_proj", "k_proj", "v_proj", "o_proj", "up_proj", "down_proj"]}},
    # LoRA on q_proj and v_proj (keyed dropout) of a tiny random Hugging Face Llama (helpers.hf: 2 layers,
    # width 16, grouped-query heads; its folder made under the matrix's folder, ``Combo.data``), trained
    # through the Llama's stacked rules. It assumes the [llm] extra: its combinations join the matrix only
    # where transformers is installed (``HF``)
    "hf": {"dataset": "synthetic_text", "clients": M, "model": "hf", "partition": {"kind": "natural"},
           "synthetic_text": {"samples": 72, "test_samples": 18, "vocab": 12, "length": 8, "users": M},
           "adapter": {"kind": "lora", "r": 2, "alpha": 4.0, "dropout": 0.1, "target_modules": ["q_proj", "v_proj"]}},
}
HF = importlib.util.find_spec("transformers") is not None and importlib.util.find_spec("safetensors") is not None


#: how the server sums (issue #45): plain, or secure aggregation on a ring of 2 neighbours, threshold 1;
#: without privacy with a range and dropouts at both stages (under privacy the range is the clip's and
#: dropouts are refused). It assumes cohorts of at least 2 after a client is toggled (one client aborts a
#: round, an event the accountant does not cover): it crosses the kinds ``SECURE_KINDS``
AGGREGATION = {"plain": None, "secagg": {"kind": "secagg", "neighbours": 2, "threshold": 1}}
SECURE_ALONE = {"clip_range": 1.0, "dropout": 0.2, "unmask_dropout": 0.1}
SECURE_KINDS = ("always", "cohort", "cyclic")


@dataclass(frozen=True)
class Combo:
    algorithm: str
    kind: str
    privacy: str
    work: str
    clock: str = "none"
    model: str = "logreg"
    aggregation: str = "plain"

    @property
    def name(self) -> str:
        tail = (f"-{self.clock}-{self.model}-{self.aggregation}" if self.aggregation != "plain" else
                f"-{self.clock}-{self.model}" if self.model != "logreg" else
                f"-{self.clock}" if self.clock != "none" else "")
        return f"{self.algorithm}-{self.kind}-{self.privacy}-{self.work}{tail}"

    def data(self, folder: str, sigma: float = SIGMA) -> dict:
        """The config of this combination (``folder`` holds the steps file)."""
        cfg = copy.deepcopy(BASE)
        if MODEL[self.model] is not None:
            cfg["task"] = copy.deepcopy(MODEL[self.model])
        if self.model == "hf":
            cfg["task"]["path"] = llama_folder(folder)
        cfg["algorithm"] = {"name": self.algorithm, **ALGORITHM.get(self.algorithm, {})}
        cfg.update(copy.deepcopy(SECTIONS))
        cfg["availability"] = {"kind": self.kind, **copy.deepcopy(KIND.get(self.kind, {}))}
        cfg["train"].update({k: os.path.join(folder, v) if k == "local_steps_file" else v
                             for k, v in WORK[self.work].items()})
        if CLOCK[self.clock] is not None:
            cfg["clock"] = dict(CLOCK[self.clock])
        mechanism, keys = {**VARIANTS, **PRODUCTION}.get(self.privacy,
                                                         (self.privacy, PRIVACY.get(self.privacy, {"clip": 0.5})))
        if keys is not None:
            cfg["privacy"] = {"mechanism": mechanism, **keys, "noise_multiplier": sigma}
        if AGGREGATION[self.aggregation] is not None:
            cfg["aggregation"] = {**AGGREGATION[self.aggregation], **(SECURE_ALONE if keys is None else {})}
        return cfg


def llama_folder(folder: str) -> str:
    """The tiny Llama of the ``hf`` model axis under ``folder`` (made on first use)."""
    path = os.path.join(folder, "llama")
    if not os.path.isdir(path):
        from helpers.hf import tiny_folder

        tiny_folder(folder, "llama")
    return path


def steps_file(folder: str) -> None:
    with open(os.path.join(folder, "steps.txt"), "w") as fh:
        fh.write(STEPS)


def axes() -> tuple[list[str], list[str], list[str], list[str]]:
    """The built-in algorithms, availability kinds, privacy mechanisms (and their ``VARIANTS``) and
    kinds of local work."""
    plugins.load()
    return (ALGORITHMS.names(builtin_only=True), AVAILABILITY.names(builtin_only=True),
            MECHANISMS.names(builtin_only=True) + list(VARIANTS), list(WORK))


#: the availability kinds the LoRA model runs with in the whole matrix (with every algorithm and
#: mechanism; cyclic separates participations, as banded_mf needs): the model axis is about what
#: trains, not who is available
LORA_KINDS = ("always", "cohort", "cyclic")


def every() -> list[Combo]:
    algorithms, kinds, mechanisms, _ = axes()
    clocks = [c for c in CLOCK if c != "none"]
    lora = [Combo(a, k, p, "fixed", "none", "lora")
            for a, k, p in itertools.product(algorithms, LORA_KINDS, mechanisms)]
    lora += [Combo(a, "cohort", "none", "momentum", "none", "lora") for a in algorithms]
    lora += [Combo(a, "always", "none", "fixed", "lognormal", "lora") for a in algorithms]
    # the Hugging Face Llama: every algorithm on a cohort, without and with central DP (the model axis is
    # about what trains; the transformer's LoRA crosses the rest)
    lora += [Combo(a, "cohort", p, "fixed", "none", "hf") for a in algorithms for p in ("none", "gaussian") if HF]
    secure = [Combo(a, k, p, "fixed", "none", "logreg", "secagg")
              for a, k, p in itertools.product(algorithms, SECURE_KINDS, mechanisms)]
    return secure + [Combo(*c) for c in itertools.product(*axes())] + [
        Combo(a, k, "none", "fixed", c) for a, k, c in itertools.product(algorithms, kinds, clocks)] + lora + [
        Combo(a, k, p, "fixed", c) for a, k, p, c in itertools.product(asynchronous(), kinds, mechanisms, clocks)
        if p != "none"] + clock_privacy()  # DP for asynchronous FL: an asynchronous server runs only on the clock


#: the availability kinds the clock crosses privacy with, in turn: fixed-size and Poisson sampling
CLOCK_KINDS = ("cohort", "stationary")


def clock_privacy() -> list[Combo]:
    """The clock crossed with privacy (issue #44): every synchronous algorithm x mechanism (and the
    production noise cohort) x ``CLOCK_WORK`` x clock setting, on a fixed-size or a Poisson kind
    in turn (the asynchronous servers cross privacy in ``every``)."""
    algorithms, _, _, _ = axes()
    private = [p for p in MECHANISMS.names(builtin_only=True) if p != "none"] + list(PRODUCTION)
    clocks = [c for c in CLOCK if c != "none"]
    sync = [a for a in algorithms if a not in asynchronous()]
    return [Combo(a, CLOCK_KINDS[(i + j + k) % len(CLOCK_KINDS)], p, w, c)
            for i, a in enumerate(sync) for j, p in enumerate(private) for k, w in enumerate(CLOCK_WORK)
            for c in clocks]


def asynchronous() -> list[str]:
    """The built-in asynchronous servers (they run on the clock only, so privacy crosses them there)."""
    from fedmpi.algorithms.asynchronous import AsyncAlgorithm

    return [a for a in axes()[0] if issubclass(ALGORITHMS.get(a).obj, AsyncAlgorithm)]


def sample(n: int | None = None) -> list[Combo]:
    """A fixed spread of the matrix: every algorithm, kind, mechanism and kind of local work, each
    paired with a rotating choice of the others, plus the combinations issue #32 found wrong and a
    few of each clock setting (issue #33), of the LoRA models (issue #42: the transformer's and a
    Hugging Face Llama's, where transformers is installed) and of the clock under privacy (issue #44)."""
    algorithms, kinds, mechanisms, works = axes()
    picked = [Combo(a, kinds[(3 * i) % len(kinds)], mechanisms[i % len(mechanisms)], works[(5 * i) % len(works)])
              for i, a in enumerate(algorithms)]
    picked += [Combo("fedavgm", "stationary", "gaussian", "fixed"), Combo("fedadam", "cyclic", "gaussian", "uniform"),
               Combo("debiased_fedavg", "stationary", "gaussian", "fixed"),
               Combo("debiased_fedavg", "markov", "banded_mf", "momentum"),
               Combo("scaffold", "always", "none", "file"), Combo("scaffold", "sine", "none", "momentum"),
               Combo("fedswe", "trace", "banded_mf", "geometric"),
               Combo("fedavg_active", "trace", "gaussian", "epochs"),
               Combo("dspodfl", "always", "none", "uniform"), Combo("fedprox", "cohort", "gaussian", "lognormal"),
               Combo("fedavg_active", "cyclic", "banded_opt", "fixed"),
               Combo("fedprox", "cyclic", "banded_gen", "momentum"),
               Combo("fedadam", "cyclic", "banded_mf", "fixed"),
               Combo("fedbuff", "always", "none", "fixed", "lognormal"),
               Combo("fedasync", "always", "none", "fixed", "deadline"),
               Combo("fedavg_active", "cohort", "gaussian", "fixed", "overselect"),
               Combo("fedavg_active", "stationary", "gaussian", "fixed", "deadline"),
               Combo("mifa", "stationary", "none", "fixed", "deadline"),
               Combo("fedknown", "stationary", "none", "fixed", "deadline"),
               Combo("scaffold", "always", "none", "fixed", "overselect"),
               Combo("fedbuff", "stationary", "none", "fixed", "slots"),
               Combo("fedavg_active", "markov", "none", "momentum", "slots"),
               Combo("fedbuff", "always", "gaussian", "fixed", "lognormal"),  # DP-FedBuff (#43)
               Combo("fedbuff", "always", "local_gaussian", "fixed", "lognormal"),
               Combo("fedasync", "always", "gaussian", "fixed", "lognormal"),
               Combo("fedavg_active", "stationary", "local_gaussian", "uniform"),  # local DP (#43)
               Combo("fedswe", "trace", "local_gaussian", "fixed"),
               # distributed DP (#45): the lattice sum on a Poisson kind with a deadline, a fixed cohort,
               # the Markov sampler; its refusals (FedSWE's own rows, an asynchronous server)
               Combo("fedavg_active", "stationary", "distributed_dgauss", "fixed", "deadline"),
               Combo("fedprox", "cohort", "distributed_skellam", "fixed"),
               Combo("debiased_fedavg", "markov", "distributed_dgauss", "momentum"),
               Combo("fedswe", "trace", "distributed_skellam", "fixed"),
               Combo("fedbuff", "always", "distributed_skellam", "fixed", "lognormal"),
               Combo("fedavg_active", "cyclic", "dist_banded", "fixed"),
               Combo("fedadam", "markov", "dist_banded", "uniform"),
               Combo("fedavg_active", "stationary", "dist_banded", "fixed"),
               # the clock under privacy (#44): a deadline on sample counts (refused), on keyed draws, a
               # file and fixed steps; epochs without a deadline; the production noise cohort; packed
               Combo("fedswe", "stationary", "gaussian", "epochs", "deadline"),
               Combo("fedavg_active", "cohort", "gaussian_n12", "uniform", "deadline"),
               Combo("fedprox", "stationary", "local_gaussian", "file", "deadline"),
               Combo("fedadam", "cohort", "banded_mf", "epochs", "lognormal"),
               Combo("fedswe", "stationary", "gaussian_n12", "fixed", "deadline"),
               Combo("mifa", "cohort", "gaussian", "epochs", "lognormal")]
    # the LoRA model axis (issue #42): centralized algorithms with and without DP, the asynchronous
    # server, a per-client table and the decentralized family on adapters
    picked += [Combo("fedavg_active", "cohort", "gaussian", "fixed", "none", "lora"),
               Combo("fedadam", "cyclic", "banded_mf", "momentum", "none", "lora"),
               Combo("scaffold", "cohort", "none", "fixed", "none", "lora"),
               Combo("fedprox", "stationary", "gaussian", "fixed", "none", "lora"),
               Combo("mifa", "stationary", "none", "fixed", "none", "lora"),
               Combo("fedbuff", "always", "none", "fixed", "lognormal", "lora"),
               Combo("dspodfl", "always", "none", "fixed", "none", "lora")]
    if HF:  # the Hugging Face Llama (issue #42): plain, a per-client table, DP on its adapters
        picked += [Combo("fedavg_active", "cohort", "none", "fixed", "none", "hf"),
                   Combo("scaffold", "cohort", "none", "fixed", "none", "hf"),
                   Combo("fedadam", "cohort", "gaussian", "fixed", "none", "hf")]
    # secure aggregation (issue #45): alone, under central DP, and what it refuses
    picked += [Combo("fedavg_active", "cohort", "none", "fixed", "none", "logreg", "secagg"),
               Combo("fedavg_active", "always", "gaussian", "fixed", "none", "logreg", "secagg"),
               Combo("fedadam", "cyclic", "banded_mf", "fixed", "none", "logreg", "secagg"),
               Combo("fedprox", "cohort", "distributed_dgauss", "fixed", "none", "logreg", "secagg"),
               Combo("debiased_fedavg", "always", "none", "fixed", "none", "logreg", "secagg"),
               Combo("scaffold", "always", "none", "fixed", "none", "logreg", "secagg"),
               Combo("fedavg_active", "cohort", "local_gaussian", "fixed", "none", "logreg", "secagg"),
               Combo("dgd", "always", "none", "fixed", "none", "logreg", "secagg")]
    return list(dict.fromkeys(picked))[:n]  # n None: all


KEYS = {"algorithm": "algorithm", "kind": "availability", "privacy": "privacy", "work": "train.", "clock": "clock.",
        "model": "task.", "aggregation": "aggregation."}


def verdict(combo: Combo, folder: str, world) -> tuple[str, object]:
    """("refused", the one-line message) or ("runs", the config). Refusals come from the config
    checks or, for what needs the built run (the availability model's sampling), from the build."""
    try:
        cfg = config.from_dict(combo.data(folder), world.size)
        build_components(cfg, world)
    except UndeclaredRead:  # an algorithm's bug, never a refusal of the combination
        raise
    except InputError as e:
        return "refused", str(e)
    return "runs", cfg


def named(message: str, combo: Combo) -> list[str]:
    """The axes of ``combo`` whose key ``message`` names (an algorithm also by its name)."""
    words = set(message.replace("'", " ").replace(",", " ").split())
    return [axis for axis, key in KEYS.items() if key in message or (axis == "algorithm" and combo.algorithm in words)]


# ----------------------------------------------------------------------------- running

def run(cfg, world, start: int = 0, stop: int = ROUNDS, folder: str | None = None) -> np.ndarray | None:
    """Rounds start..stop-1 of ``cfg``: from the checkpoint in ``folder`` when ``start`` > 0, saved
    there after ``stop`` < ROUNDS (then None); else the final model. The undeclared-state check
    runs after the first round, as the runner does it."""
    components = build_components(cfg, world)
    keeper = None
    if folder is not None:
        keeper = Checkpointer(components, os.path.join(folder, "r.h5"), required=start > 0)
        assert keeper.rounds_done == start
    for t in range(start, stop):
        components.algorithm.round(t)
        if t == start:
            check_state(components)
    if stop < ROUNDS:
        keeper.save(stop, 0.0)
        return None
    return components.algorithm.final_params().detach().cpu().numpy().copy()


def packed(cfgs: dict, folder: str, world) -> dict[str, np.ndarray]:
    """The final models of the runs ``cfgs`` ({name: config}) that pack, trained in packed groups of
    equal ``pack_key`` (``fedmpi sweep --pack``), each into its result file in ``folder``."""
    import h5py

    from fedmpi.packed import pack_key, plan, run_group

    names = [n for n, cfg in cfgs.items() if pack_key(cfg)[0] is not None]
    got = {}
    for group in plan([pack_key(cfgs[n]) for n in names], len(names)):
        paths = [os.path.join(folder, f"packed-{names[i]}.h5") for i in group]
        ended = run_group([cfgs[names[i]] for i in group], world, paths, [names[i] for i in group],
                          [()] * len(group), quiet=True)
        assert all(o.code == 0 for o in ended), [(names[i], o) for i, o in zip(group, ended)]
        for i, path in zip(group, paths):
            with h5py.File(path, "r") as f:
                got[names[i]] = f["final/params"][:]
    return got


class Emptied:
    """``inner``'s availability with round ``at`` empty; anything else is ``inner``'s."""

    derived = ("inner",)
    configuration = ("at",)

    def __init__(self, inner, at: int):
        self.inner, self.at = inner, at

    def available(self, t: int) -> np.ndarray:
        ids = self.inner.available(t)
        return ids[:0] if t == self.at else ids

    def __getattr__(self, name: str):
        return getattr(self.inner, name)


def released_every_round(cfg, world, empty: int = 1) -> None:
    """With noise, every round moves the model, an empty one (round ``empty``) too: the release does
    not show whether anybody took part (what amplification by sampling needs)."""
    probe = build_components(cfg, world)
    components = build_components(cfg, world, participation=Emptied(probe.participation, empty), task=probe.task)
    algo = components.algorithm
    for t in range(ROUNDS):
        before = algo.x.clone()
        n = algo.round(t)
        assert not torch.equal(before, algo.x), f"round {t} ({n} clients) released no step"
