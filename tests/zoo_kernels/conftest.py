import os

import torch

# Without a GPU, Triton kernels run in Triton's numpy interpreter (fp32 only, slow: tiny shapes).
# It must be chosen before triton compiles anything; the kernel modules import triton lazily.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
