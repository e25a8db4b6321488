"""Host values kept real inside the rehearsal's fake tensors (rlcore.cli.rehearsal).

A vision-language model's forward reads values on the host: the image grids (`image_grid_thw.tolist()` sizes the
tower's windows and rotary tables), the token ids (the multimodal RoPE index, the image-token masks that place the
features). Fake tensors have no values, so under FakeTensorMode alone HF's Qwen-VL code stops at its first such read.
Those values are small integer bookkeeping, not the model's compute: this mode computes them for real and leaves
every tensor that comes from the model's parameters or activations fake, so the memory the rehearsal counts is
still the fake compute's.

    an op whose tensor inputs are all real        runs for real (ids, grids, masks, positions; also .item())
    a factory (arange, full, tensor) of an integer or bool dtype, up to SMALL elements
                                                  real; a float factory (or a larger one) stays fake
    indexing fake data with a real bool mask      the mask's indices are taken for real, so the fake result has
                                                  a known shape (x[mask] == x[mask.nonzero()])

Entered after (inside) a FakeTensorMode with allow_non_fake_inputs=True, which turns the real inputs of a mixed op
into fake ones.
"""

from __future__ import annotations

import torch
from torch._subclasses.fake_tensor import FakeTensor, unset_fake_temporarily
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

SMALL = 1 << 22  # elements: an index or mask of a micro-batch (tokens x 3 RoPE rows), not an FSDP2 byte buffer
_INDEXING = {torch.ops.aten.index.Tensor, torch.ops.aten.index_put.default, torch.ops.aten.index_put_.default,
             torch.ops.aten._index_put_impl_.default}


def _real(t: torch.Tensor) -> bool:
    return not isinstance(t, FakeTensor)


class HostValues(TorchDispatchMode):
    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        tensors = [t for t in pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
        if tensors and all(_real(t) for t in tensors):
            with unset_fake_temporarily():
                return func(*args, **kwargs)
        if not tensors:  # a factory: its output's dtype and size decide (asking the fake mode costs no memory)
            out = func(*args, **kwargs)
            if isinstance(out, torch.Tensor) and not (out.dtype.is_floating_point or out.dtype.is_complex) and out.numel() <= SMALL:
                with unset_fake_temporarily():
                    return func(*args, **kwargs)
            return out
        if func in _INDEXING and any(i is not None and _real(i) and i.dtype == torch.bool for i in args[1]):
            indices = []
            for index in args[1]:
                if index is not None and _real(index) and index.dtype == torch.bool:
                    with unset_fake_temporarily():
                        indices.extend(index.nonzero(as_tuple=True))
                else:
                    indices.append(index)
            args = (args[0], indices, *args[2:])
        return func(*args, **kwargs)
