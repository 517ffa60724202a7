"""TLX Jagged Flash Attention kernels (import as jfa_prof.kernels)."""
