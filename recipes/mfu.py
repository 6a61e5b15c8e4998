"""Model FLOPs utilisation: the model's analytic FLOPs (:mod:`components.flops`) per second over the device's peak.

    MFU = 3 · forward FLOPs per token · tokens per second / peak FLOP/s

(a training step is a forward and a backward of twice its cost; recomputed activations are not counted,
as in PaLM's definition). The peak is the dense tensor-core figure of the device's datasheet for the run's
compute dtype — bf16/fp16, or fp32 through TF32 when torch allows it — looked up by the CUDA device name,
or given (``peak_flops``). A CPU has no entry: give its peak, or read the achieved TFLOP/s alone.
"""

import torch

# Dense (no 2:4 sparsity) peak FLOP/s from the vendors' datasheets: (16-bit, TF32, plain FP32).
PEAK_FLOPS: dict[str, tuple[float, float, float]] = {
    "H200": (989e12, 494e12, 67e12),
    "H100 PCIe": (756e12, 378e12, 51e12),
    "H100": (989e12, 494e12, 67e12),  # SXM
    "A100": (312e12, 156e12, 19.5e12),
    "L40S": (362e12, 183e12, 91.6e12),
    "L4": (121e12, 60e12, 30.3e12),
    "A10G": (70e12, 35e12, 31.2e12),
    "RTX 4090": (165e12, 82.6e12, 82.6e12),
    "V100": (125e12, 15.7e12, 15.7e12),  # no TF32: fp32 runs at its plain rate
}


def device_peak_flops(device: torch.device | str, precision: str) -> float | None:
    """The peak FLOP/s of ``device`` for a run at Lightning ``precision`` (``bf16-mixed``, ``32-true``…), or None
    where the device is not in :data:`PEAK_FLOPS` (every CPU)."""
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    name = torch.cuda.get_device_name(device)
    for key, (half, tf32, fp32) in PEAK_FLOPS.items():  # the longer names first where one contains another
        if key in name:
            if any(tag in str(precision) for tag in ("16", "bf16")):
                return half
            return tf32 if torch.backends.cuda.matmul.allow_tf32 else fp32
    return None


def training_flops(flops_per_token: float, tokens_per_second: float) -> float:
    """Achieved model FLOP/s of training: three forwards' worth per token."""
    return 3 * flops_per_token * tokens_per_second
