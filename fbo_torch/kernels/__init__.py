from fbo_torch.kernels.rff_kernel import RFFKernel

__all__ = ["RFFKernel"]
