"""TMA descriptors built by the kernel itself.

A descriptor made on the host costs a Python object, its checks and a `cuTensorMapEncodeTiled`
per argument per launch; the op's forward takes four and its backward five, a large part of a
short call's host time (benchmarks/host_path.py). Built on the device, each CTA writes its own
into Triton's global scratch at the start and the launch passes plain pointers and ints.
"""
import triton
import triton.language as tl


@triton.jit
def descriptor(base, rows, cols, row_stride, BLOCK_ROWS: tl.constexpr, BLOCK_COLS: tl.constexpr):
    """`base` itself when the host passed a descriptor, else one over `[rows, cols]` with row
    stride `row_stride` (elements), read and written in `[BLOCK_ROWS, BLOCK_COLS]` boxes."""
    if isinstance(base, tl.tensor_descriptor):
        return base
    else:
        return tl.make_tensor_descriptor(base, shape=[rows, cols], strides=[row_stride, 1],
                                         block_shape=[BLOCK_ROWS, BLOCK_COLS])
