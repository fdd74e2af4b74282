"""Process world: MPI ranks, torch.distributed, devices, client sharding."""

from .world import World, launched_size  # noqa: F401
