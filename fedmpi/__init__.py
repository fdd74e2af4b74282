"""fedmpi: emulate federated-learning clusters with real MPI ranks and torch.distributed."""

__version__ = "0.1.0"
