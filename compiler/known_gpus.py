"""What each known hardware class can do, for planning without the device (`orchestrate plan` on a
laptop, `sweep` before a job reaches its GPU). A job still measures its own device at run time
(`compiler.capabilities.from_device`); this table only lets the planner rule cells out early.

Keys are class names as Ray names the GPU (`compiler.hardware.accelerator_type`: "NVIDIA A100-SXM4-80GB"
-> "A100"). Where one class covers several boards (A100 40/80 GB, H100 SXM5/PCIe), the SM count and
memory are the smallest board's, so a rule that needs more never passes by mistake.

Sources: compute capabilities from NVIDIA's CUDA GPU list (https://developer.nvidia.com/cuda-gpus);
SM counts and memory from NVIDIA's architecture whitepapers and data sheets, cited per row.
bf16 and TF32 tensor cores start at sm80 (Ampere), fp8 at sm89 (Ada) and sm90 (Hopper).

Change a row, or add one, and bump `TABLE_VERSION`: plans and `unsupported` rows name the version
that ruled them out.
"""

from __future__ import annotations

TABLE_VERSION = 1
TABLE_DATE = "2026-11-25"

# name: (compute capability, SM count, memory GB (decimal, as NVIDIA quotes it))
GPUS: dict[str, tuple[tuple[int, int], int, float]] = {
    # Volta GV100, Tesla V100 SXM2/PCIe: 80 SMs, 16 or 32 GB HBM2 (NVIDIA Tesla V100 GPU
    # Architecture whitepaper, 2017).
    "V100": ((7, 0), 80, 16.0),
    # Turing TU104, Tesla T4: 40 SMs, 16 GB GDDR6 (NVIDIA T4 data sheet; Turing architecture
    # whitepaper).
    "T4": ((7, 5), 40, 16.0),
    # Ampere GA100, A100 SXM4/PCIe: 108 SMs, 40 or 80 GB (NVIDIA A100 Tensor Core GPU
    # Architecture whitepaper, 2020).
    "A100": ((8, 0), 108, 40.0),
    # Ampere GA102, A10: 72 SMs, 24 GB GDDR6 (NVIDIA A10 data sheet).
    "A10": ((8, 6), 72, 24.0),
    # Ampere GA102, A10G (AWS G5 instances): 80 SMs, 24 GB GDDR6 (AWS EC2 G5 documentation).
    "A10G": ((8, 6), 80, 24.0),
    # Ada AD104, L4: 58 SMs, 24 GB GDDR6 (NVIDIA L4 data sheet; Ada Lovelace architecture
    # whitepaper).
    "L4": ((8, 9), 58, 24.0),
    # Ada AD102, L40S: 142 SMs, 48 GB GDDR6 (NVIDIA L40S data sheet).
    "L40S": ((8, 9), 142, 48.0),
    # Hopper GH100, H100 SXM5 132 SMs / PCIe 114 SMs, 80 GB HBM (NVIDIA H100 Tensor Core GPU
    # Architecture whitepaper, 2022).
    "H100": ((9, 0), 114, 80.0),
    # Hopper GH100, H200 SXM: 132 SMs, 141 GB HBM3e (NVIDIA H200 data sheet).
    "H200": ((9, 0), 132, 141.0),
}
