"""Running statistics one sample at a time (the streaming agent's update) against a closed form."""

from __future__ import annotations

import torch

from onlinerec.rl.normalize import ObservationNormalizer, ReturnNormalizer


def prior_and_samples(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and variance of the samples pooled with the prior (mean 0, variance 1, weight 1e-4), in closed form."""
    w, n = 1e-4, x.shape[0]
    mean = x.sum(0) / (w + n)
    var = (w * (1.0 + mean**2) + ((x - mean) ** 2).sum(0)) / (w + n)
    return mean, var


def test_one_sample_at_a_time_equals_the_closed_form_and_the_batched_update():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(300, 5, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 10.0, 0.1, 3.0, 1e3]) + 2.0
    one, batched = ObservationNormalizer((5,)), ObservationNormalizer((5,))
    for row in x:
        one.update(row[None])
    for chunk in x.split(50):
        batched.update(chunk)
    mean, var = prior_and_samples(x)
    torch.testing.assert_close(one.mean, mean, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(one.var, var, rtol=1e-10, atol=0)
    torch.testing.assert_close(one.var, batched.var, rtol=1e-10, atol=0)
    assert float(one.count) == float(batched.count)


def test_scalar_returns_one_at_a_time_equal_the_closed_form():
    gen = torch.Generator().manual_seed(1)
    returns = torch.randn(200, generator=gen, dtype=torch.float64) * 4 - 1
    norm = ReturnNormalizer()
    for r in returns:
        norm.update(r)
    mean, var = prior_and_samples(returns[:, None])
    torch.testing.assert_close(norm.mean, mean[0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(norm.var, var[0], rtol=1e-10, atol=0)


def test_the_host_paths_equal_the_tensor_updates():
    """The streaming agent's NumPy / Python-float paths: the same statistics bit for bit, the same normalised
    observations (clipped, and with features kept as they are), the same return scale to the last bit but one."""
    gen = torch.Generator().manual_seed(2)
    obs = torch.randn(500, 6, generator=gen, dtype=torch.float64) * torch.tensor([1.0, 1e-3, 1e3, 5.0, 1.0, 1.0]) + 3.0
    keep = torch.tensor([False, False, False, False, True, False])
    for clip, kept in ((0.0, None), (2.0, keep)):
        tensors, host = ObservationNormalizer((6,), clip=clip, keep=kept), ObservationNormalizer((6,), clip, keep=kept)
        for row in obs:
            x = row.float()[None]
            tensors.update(x)
            got = host.update_and_normalize_one(row.numpy())
            assert torch.equal(got, tensors(x))
            for name in ("mean", "var", "count"):
                assert torch.equal(getattr(host, name), getattr(tensors, name)), name
    tensors, host = ReturnNormalizer(), ReturnNormalizer()
    for r in (obs[:, 2] - 3.0).tolist():
        tensors.update(torch.tensor(r, dtype=torch.float64))
        std = host.update_scalar(r)
        for name in ("mean", "var", "count"):
            assert torch.equal(getattr(host, name), getattr(tensors, name)), name
        assert abs(std - float(tensors.std)) <= 2e-16 * std  # sqrt: NumPy and torch may differ in the last bit
