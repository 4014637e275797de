"""AFT-local's and AFT-conv's biases written out as dense [T, T] matrices, the form the float64
reference of the AFT equation (`aft_reference`) takes: the oracle side of the AFT tests."""

import torch


def local_bias(w, window):
    """AFT-local's w' as a dense [T, T]: w inside the window, 0 outside."""
    distance = torch.arange(w.shape[0])[:, None] - torch.arange(w.shape[0])[None, :]
    return torch.where(distance.abs() < window, w, torch.zeros_like(w))


def conv_bias(kernel, length, causal):
    """AFT-conv's kernel as dense [h, T, T] biases: w_{t, t - j + centre} = kernel[:, j], 0 elsewhere."""
    heads, window = kernel.shape
    centre = 0 if causal else (window - 1) // 2
    offset = torch.arange(length)[:, None] - torch.arange(length)[None, :] + centre  # j = t - t' + centre
    inside = (offset >= 0) & (offset < window)
    return torch.where(inside, kernel[:, offset.clamp(0, window - 1)], torch.zeros(()).to(kernel))
