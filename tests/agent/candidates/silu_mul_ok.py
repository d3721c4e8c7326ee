"""An honest candidate for the silu_mul task: the library's fused SiLU(x) * y kernel."""
import torch
import torch.nn as nn

from tegula import f32
from tegula.agent.device import launch
from tegula.kernels.elementwise import silu_mul_config, silu_mul_kernel

SILU_MUL = silu_mul_kernel(f32)


class ModelNew(nn.Module):
    def forward(self, x, y):
        out = torch.empty_like(x)
        grid, constexprs = silu_mul_config(tuple(x.shape))
        launch(SILU_MUL, grid, x, y, out, **constexprs)
        return out
