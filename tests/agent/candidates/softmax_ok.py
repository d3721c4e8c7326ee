"""An honest candidate for the softmax task: the library's row-softmax kernel."""
import torch
import torch.nn as nn

import tegula as tg
from tegula import f32
from tegula.agent.device import launch
from tegula.kernels.softmax import softmax_config, softmax_kernel

SOFTMAX = softmax_kernel(f32)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        grid, constexprs = softmax_config(tuple(x.shape))
        launch(SOFTMAX, grid, x, y, **constexprs)
        return y
