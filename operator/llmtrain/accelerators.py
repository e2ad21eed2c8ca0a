"""The accelerator node labels llmtrain knows: the values labellers write, and each device's memory.

One home for two readers. `llmtrain validate` and `render` warn when `resources.acceleratorType` is
not a value the labeller of `resources.acceleratorLabelKey` writes: the rendered node selector would
match no node and the job would wait forever (`H100` for `NVIDIA-H100-80GB-HBM3`). The memory-fit
check (memory.py) reads the device's memory here. A value missing from these tables is only
warned about, never refused: a new GPU model is labelled before this list learns its name.

Imports nothing, like constants.py.
"""

# NVIDIA GPU feature discovery (GFD; part of the NVIDIA device plugin and the GPU operator) writes
# the NVML device name with its spaces turned into '-'.
GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"
# GKE labels its GPU nodes with the accelerator type the node pool was created with.
GKE_ACCELERATOR_LABEL = "cloud.google.com/gke-accelerator"

# label key -> who writes it, for messages.
LABELLERS: dict[str, str] = {
    GPU_PRODUCT_LABEL: "NVIDIA GPU feature discovery",
    GKE_ACCELERATOR_LABEL: "GKE",
}

# label key -> {label value: device memory in GiB}, the values grouped by product.
KNOWN_ACCELERATORS: dict[str, dict[str, int]] = {
    GPU_PRODUCT_LABEL: {
        "NVIDIA-B200": 180,
        "NVIDIA-GH200-480GB": 96,  # 480 GB counts the Grace CPU's memory; the GPU has 96 GB HBM3
        "NVIDIA-H200": 141,
        "NVIDIA-H200-NVL": 141,
        "NVIDIA-H100-80GB-HBM3": 80,
        "NVIDIA-H100-PCIe": 80,
        "NVIDIA-H100-NVL": 94,
        "NVIDIA-A100-SXM4-80GB": 80,
        "NVIDIA-A100-SXM4-40GB": 40,
        "NVIDIA-A100-80GB-PCIe": 80,
        "NVIDIA-A100-PCIE-40GB": 40,
        "NVIDIA-L40S": 48,
        "NVIDIA-L4": 24,
        "NVIDIA-A10G": 24,
        "NVIDIA-A10": 24,
        "Tesla-V100-SXM2-32GB": 32,
        "Tesla-V100-SXM2-16GB": 16,
        "Tesla-T4": 16,
    },
    GKE_ACCELERATOR_LABEL: {
        "nvidia-b200": 180,
        "nvidia-h200-141gb": 141,
        "nvidia-h100-mega-80gb": 80,
        "nvidia-h100-80gb": 80,
        "nvidia-a100-80gb": 80,
        "nvidia-tesla-a100": 40,
        "nvidia-l4": 24,
        "nvidia-tesla-t4": 16,
    },
}

# Device memory by product name, for label values not in the tables above whose name carries no
# size (a labeller of its own naming `H200`); see memory.device_memory_bytes.
DEVICE_GIB_BY_PRODUCT: dict[str, int] = {
    "H200": 141,
    "B200": 180,
    "GH200": 96,
    "L4": 24,
    "A10G": 24,
    "A10": 24,
    "L40S": 48,
    "T4": 16,
}
