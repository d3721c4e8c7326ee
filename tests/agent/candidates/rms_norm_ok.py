"""An honest candidate for the rms_norm task: the library's RMSNorm kernel; the (N,)
weight is viewed as the (1, N) row the kernel broadcasts."""
import torch
import torch.nn as nn

from tegula import f32
from tegula.agent.device import launch
from tegula.kernels.norm import rms_norm_config, rms_norm_kernel

RMS_NORM = rms_norm_kernel(f32)


class ModelNew(nn.Module):
    def forward(self, x, w):
        y = torch.empty_like(x)
        grid, constexprs = rms_norm_config(tuple(x.shape), eps=1e-6)
        launch(RMS_NORM, grid, x, w.view(1, -1), y, **constexprs)
        return y
