"""A local trainer on a tiny image task with dropout (cinic_cnn, or another CNN, on random 3x8x8 images)."""

from __future__ import annotations

import numpy as np
import torch

from fedmpi import config
from fedmpi.engine.local import LocalTrainer
from fedmpi.models import build_model, loss_fn
from fedmpi.task import Task

CPU = torch.device("cpu")


def image_trainer(path: str, seed: int = 0, device: torch.device = CPU, model: str = "cinic_cnn",
                  sizes: tuple[int, ...] = (10,) * 5, train: dict | None = None, **options) -> LocalTrainer:
    """``model`` (cinic_cnn: 3 dropout layers) on clients of tiny random 3x8x8 images, ``sizes[i]``
    for client i (default 5 clients of 10); ``train``: keys over batch 4, 2 local steps, lr 0.1;
    ``options``: more ``LocalTrainer`` arguments."""
    n = int(sum(sizes))
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (n, 3, 8, 8), generator=g, dtype=torch.uint8)
    y = torch.randint(0, 10, (n,), generator=g)
    x, y = x.to(device), y.to(device)
    task = Task(model=build_model(model, (3, 8, 8), 10).to(device), loss=loss_fn(model),
                train_x=x, train_y=y, test_x=x, test_y=y, order=torch.arange(n, device=device),
                offsets=np.concatenate([[0], np.cumsum(sizes)]), classes=10, label_hist=None, groups=None,
                mean=torch.full((3,), 0.5, device=device), std=torch.full((3,), 0.25, device=device), image=True)
    cfg = config.from_dict({"task": {"clients": len(sizes)},
                            "train": {"batch_size": 4, "local_steps": 2, "lr": 0.1, **(train or {})}})
    return LocalTrainer(task, cfg.train, seed, path=path, **options)
