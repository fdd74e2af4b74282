"""On-device augmentation: crop/flip from caller-supplied uniforms."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from fedmpi.data.augment import augment
from fedmpi.errors import InputError

N, B, C, H, W, PAD = 3, 5, 2, 8, 6, 2


@pytest.fixture
def x():
    return torch.rand(N, B, C, H, W, generator=torch.Generator().manual_seed(0))


def uniforms(seed=1, n=N, b=B):
    return torch.rand(n, b, 3, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def reference(x, ops, u, pad):
    """Image-by-image loop: crop of the zero-padded image at (oy, ox), then flip."""
    out = torch.empty_like(x)
    p = pad if "crop" in ops else 0
    for i in range(x.shape[0]):
        for j in range(x.shape[1]):
            oy, ox = (min(int(v * (2 * p + 1)), 2 * p) for v in u[i, j, :2].tolist())
            img = F.pad(x[i, j], (p, p, p, p))[:, oy:oy + x.shape[3], ox:ox + x.shape[4]]
            out[i, j] = img.flip(-1) if "flip" in ops and u[i, j, 2] < 0.5 else img
    return out


@pytest.mark.parametrize("ops", [["crop"], ["flip"], ["crop", "flip"]])
def test_matches_reference_and_deterministic(x, ops):
    u = uniforms()
    out = augment(x, ops, "per_image", u, pad=PAD)
    assert out.shape == x.shape and out.dtype == x.dtype
    torch.testing.assert_close(out, reference(x, ops, u, PAD), rtol=0, atol=0)
    assert torch.equal(out, augment(x, ops, "per_image", u.clone(), pad=PAD))
    assert not torch.equal(out, augment(x, ops, "per_image", uniforms(seed=2), pad=PAD))


def test_per_batch_one_transform_per_client(x):
    u = uniforms()
    out = augment(x, ["crop", "flip"], "per_batch", u, pad=PAD)
    shared = u[:, :1].expand(N, B, 3)
    torch.testing.assert_close(out, reference(x, ["crop", "flip"], shared, PAD), rtol=0, atol=0)
    same = x[:, :1].expand(N, B, C, H, W)  # identical images stay identical within a client
    res = augment(same, ["crop", "flip"], "per_batch", u, pad=PAD)
    assert torch.equal(res, res[:, :1].expand_as(res))


def test_identity_and_shift(x):
    centre = (PAD + 0.5) / (2 * PAD + 1)
    u = torch.full((N, B, 3), centre)
    u[..., 2] = 0.75  # no flip
    assert torch.equal(augment(x, ["crop", "flip"], "per_image", u, pad=PAD), x)
    assert torch.equal(augment(x, [], "per_image", u, pad=PAD), x)
    u[..., :2] = 0.0  # offset 0: image moves down-right by pad, zeros enter
    out = augment(x, ["crop"], "per_image", u, pad=PAD)
    assert torch.equal(out[..., PAD:, PAD:], x[..., :H - PAD, :W - PAD])
    assert (out[..., :PAD, :] == 0).all() and (out[..., :PAD] == 0).all()
    u[..., 2] = 0.25
    assert torch.equal(augment(x, ["flip"], "per_image", u), x.flip(-1))


def test_bad_arguments(x):
    with pytest.raises(InputError, match=r"^train\.augment:"):
        augment(x, ["rotate"], "per_image", uniforms())
    with pytest.raises(InputError, match=r"^train\.augment_mode:"):
        augment(x, ["crop"], "sometimes", uniforms())
    with pytest.raises(ValueError):
        augment(x, ["crop"], "per_image", uniforms(b=B - 1))
