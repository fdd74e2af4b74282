"""On-device augmentation of stacked client minibatches: random crop and horizontal flip.

Randomness comes from the caller as uniforms ``u`` (counter-based, rank-independent), so the
same ``u`` always gives the same images. One gather per axis does crop and flip together
for all clients and images at once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import InputError

OPS = ("crop", "flip")
MODES = ("per_image", "per_batch")


def require_images(ops: list[str], image: bool, sample_shape: tuple[int, ...]) -> None:
    """``train.augment`` on data that are not images is an error, not a silent no-op."""
    if ops and not image:
        raise InputError(f"train.augment: {', '.join(ops)} need image data; this task's samples are "
                         f"{'x'.join(map(str, sample_shape)) or 'scalars'} features (leave train.augment empty)")


def augment(x: torch.Tensor, ops: list[str], mode: str, u: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """Augment ``x`` (n_clients, b, C, H, W) with ``ops`` (subset of crop, flip).

    ``u`` (n_clients, b, 3) uniforms in [0, 1): u[..., 0] / u[..., 1] pick the vertical /
    horizontal crop offset in 0..2*pad of the zero-padded image (offset pad = no shift),
    u[..., 2] < 0.5 flips horizontally. ``mode`` per_batch uses u[:, 0] for the whole
    client minibatch (authors' code); per_image gives every image its own draw.
    """
    bad = [o for o in ops if o not in OPS]
    if bad:
        raise InputError(f"train.augment: unknown augmentation {bad[0]!r} (allowed: {', '.join(OPS)})")
    if mode not in MODES:
        raise InputError(f"train.augment_mode: must be one of {', '.join(MODES)}, got {mode!r}")
    if not ops:
        return x
    n, b, c, h, w = x.shape
    u = torch.as_tensor(u, device=x.device)
    if u.shape != (n, b, 3):
        raise ValueError(f"augment: u must have shape {(n, b, 3)}, got {tuple(u.shape)}")
    if mode == "per_batch":
        u = u[:, :1].expand(n, b, 3)
    p = pad if "crop" in ops else 0
    offset = (u[..., :2] * (2 * p + 1)).long().clamp_(0, 2 * p)  # (n, b, 2): row, column offsets
    rows = offset[..., 0, None] + torch.arange(h, device=x.device)  # (n, b, H) in padded coordinates
    cols = offset[..., 1, None] + torch.arange(w, device=x.device)  # (n, b, W)
    if "flip" in ops:
        cols = torch.where((u[..., 2] < 0.5)[..., None], cols.flip(-1), cols)
    xp = F.pad(x, (p, p, p, p)) if p else x
    xp = xp.gather(3, rows[:, :, None, :, None].expand(n, b, c, h, w + 2 * p))
    return xp.gather(4, cols[:, :, None, None, :].expand(n, b, c, h, w))
