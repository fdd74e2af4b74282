"""The ``runtime`` keys of a run's outputs, declared for readers that sit above the config.

Their readers -- the checkpointer (``fedmpi.checkpointer``), the runner's result-file writer
(``fedmpi.results.hdf5``) and its sidecars (``fedmpi.results.sidecars``) -- need the built config
and the claimed result file, so they sit in the run layer, above ``fedmpi.config``, which
assembles the ``runtime`` section from these classes. Each class names its reader; the key is
read nowhere else. This module imports only ``fedmpi.schema`` (docs/DESIGN.md, "Layers").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .schema import opt


@dataclass
class CheckpointParams:
    """Read by ``fedmpi.checkpointer.Checkpointer`` (when to save, what to keep)."""

    checkpoint_every: int = opt(0, "rounds between checkpoints; 0 = off", ge=0)
    keep_final: bool = opt(True, "a completed run keeps its final state as its checkpoint (RUN.h5.ckpt), so that "
                                 "a larger rounds extends it; false deletes it")


@dataclass
class ResultFileParams:
    """Read by the runner for its ``fedmpi.results.hdf5`` writer; ``label`` by the readers of the
    file it stores (``fedmpi.results.reader``: plot legends, table rows, export)."""

    log_availability: bool = opt(False, "store the per-round participation mask")
    flush_s: float = opt(5.0, "write buffered result rows to the HDF5 file at most every N seconds "
                              "(and at checkpoints and the end)", ge=0)
    label: Optional[str] = opt(None, "the run's name in fedmpi plot legends, table rows and export's variant "
                                     "column (a sweep gives each cell its variant's label); null = none")


@dataclass
class SidecarParams:
    """Read by ``fedmpi.results.sidecars.sidecars`` (files written next to the result file)."""

    csv: bool = opt(False, "also write the metric rows to a CSV file next to the result file (RUN.csv)")
    tensorboard: Optional[str] = opt(None, "also log the metrics as TensorBoard scalars under this folder "
                                           "(needs the tensorboard package: fedmpi[tensorboard])")
    wandb: Optional[str] = opt(None, "also log the config and the metrics to Weights & Biases, in this project: one "
                                     "W&B run per result file, continued on resume (WANDB_MODE=offline: locally, "
                                     "no account; needs fedmpi[wandb])")
    mlflow: Optional[str] = opt(None, "also log the config (as parameters) and the metrics to MLflow: a tracking URI, "
                                      "or a path: a .db file (a local SQLite store) or a folder (a file store); one "
                                      "MLflow run per result file, continued on resume (needs fedmpi[mlflow])")
