"""Process world: MPI ranks, torch.distributed, devices, client sharding."""

from .launcher import launched_rank, launched_size  # noqa: F401  (torch-free)


def __getattr__(name: str):  # ``World`` imports torch: only when it is asked for
    if name == "World":
        from .world import World

        return World
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
