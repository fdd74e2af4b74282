"""Data: dataset readers (``readers``), client partitions (``partition``) and on-device
augmentation (``augment``, the only torch-dependent module: import it as
``from fedmpi.data.augment import augment``, so that the numpy-only parts stay light)."""

from .partition import client_groups, label_histogram, partition
from .readers import DatasetMissing, ImageData, load, standard_root

__all__ = ["client_groups", "label_histogram", "partition", "DatasetMissing", "ImageData", "load", "standard_root"]
