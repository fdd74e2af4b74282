"""Run under ``mpiexec -n N``: every collective of ``World`` on both transports, against what
they must give (sums and maxima of known per-rank values, rank 0's broadcast, the gathered
parts in rank order), for float32, float64 and int64 tensors, contiguous or not. Prints OK."""

from __future__ import annotations

import sys

import torch

from fedmpi.runtime.world import World


def check(transport: str) -> None:
    w = World.create(device="cpu", collectives=transport, timeout_s=60)
    assert w.mpi_collectives == (transport != "torch"), (transport, w.mpi_collectives)
    n, r = w.size, w.rank
    for dtype in (torch.float32, torch.float64, torch.int64):
        base = torch.arange(12, dtype=dtype).view(3, 4)
        for strided in (False, True):
            want_sum = sum((base + k) for k in range(n))
            want_max = base + (n - 1)
            t = (base + r).t().contiguous().t() if strided else (base + r).clone()  # .t() twice: not contiguous
            assert t.is_contiguous() != strided
            got = w.allreduce_sum_(t)
            assert got is t and torch.equal(t, want_sum), (transport, dtype, strided, t)
            t = (base + r).clone()
            assert torch.equal(w.allreduce_max_(t), want_max)
            t = (base + r).clone()
            w.sum_to_server_(t)
            if r == 0:
                assert torch.equal(t, want_sum)
            t = (base + r).clone()
            w.broadcast_(t)
            assert torch.equal(t, base), (transport, dtype, t)
            parts = w.gather_to_server((base + r).t())
            if r == 0:
                assert [p.tolist() for p in parts] == [(base + k).t().tolist() for k in range(n)]
            else:
                assert parts is None
    assert w.max_float(float(r)) == n - 1
    w.close(finished=True)


if __name__ == "__main__":
    check(sys.argv[1])
    print("OK")
