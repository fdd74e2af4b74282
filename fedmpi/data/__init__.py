"""Data: the dataset registry and factories (``datasets``), dataset readers (``readers``), client
partitions (``partition``) and on-device augmentation (``augment``). Import the module you need
(``from fedmpi.data.partition import partition``): the package imports none of them, so that
reading one never loads the others."""
