"""Decentralized (DSpodFL family) building blocks, one concern per module.

- ``topology``: the communication graph G = (M, E), Metropolis-Hastings mixing weights r_ij,
  and a locality relabelling so that the world's contiguous client shards cut few edges.
- ``sporadicity``: SGD probabilities d_i, link probabilities b_ij, and the per-iteration
  indicators v_i ~ Bern(d_i), v_ij ~ Bern(b_ij) drawn from counter-based streams.
- ``delay``: the emulated per-iteration delay (processing + transmission).
- ``exchange``: the cross-rank model exchange computing sum_j r_ij v_ij (x_j - x_i), plus the
  mean model and consensus error, bitwise independent of the number of ranks.
"""
