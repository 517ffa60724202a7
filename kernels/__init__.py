"""TLX Jagged Flash Attention kernels (import as jfa_prof.kernels)."""
import os

# fbtriton's C launch cache on the kernels the op launches: a repeat launch is keyed in C instead
# of binding its arguments in Python, which is most of a short call's host time
# (benchmarks/host_path.py). JFA_PROF_C_CACHE=0 turns it off, to compare.
C_CACHE_ENV = "JFA_PROF_C_CACHE"
C_CACHE = os.environ.get(C_CACHE_ENV, "1") != "0"
