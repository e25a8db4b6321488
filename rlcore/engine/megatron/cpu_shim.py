"""megatron-core on CPU: the few places where it assumes CUDA, mapped to CPU. Applied only when the device is CPU.

megatron-core 0.16 writes `torch.cuda.current_device()`, `device="cuda"`, `torch.cuda.synchronize()`, CUDA streams
and the CUDA RNG state into code paths that have nothing GPU-specific about them (grad buffers, p2p shape
exchange, grad-norm reductions, the RNG tracker), and checks `param.type() == "torch.cuda.FloatTensor"` in the
optimizer and gradient clipping. Rather than patching torch for the whole process, each megatron-core module gets
its own view of `torch` whose `cuda` namespace and tensor factories point at the CPU; every other attribute is
the real torch. The `.type()` checks see CUDA type names only for the duration of the two calls that make them.

One fix is about gloo, not CUDA: pipeline stages exchange activation shapes (variable_seq_lengths) with untagged
batched sends; with two stages the previous and the next rank are the same peer, gloo pairs messages between two
ranks in posting order, and in the interleaved schedule's steady state a gradient's shape then lands where an
activation's is expected (measured: "Received data size doesn't match expected size"). Here shapes travel with a
tag per direction.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import types

import torch

_FACTORIES = ("tensor", "zeros", "ones", "empty", "full", "arange", "randn", "rand")
_APPLIED = False


def _to_cpu_device(device):
    if device is None:
        return None
    if isinstance(device, int) or (isinstance(device, str) and device.startswith("cuda")):
        return torch.device("cpu")
    if isinstance(device, torch.device) and device.type == "cuda":
        return torch.device("cpu")
    return device


def _cpu_factory(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if "device" in kwargs:
            kwargs["device"] = _to_cpu_device(kwargs["device"])
        return fn(*args, **kwargs)

    return wrapper


class _NullStream:
    """What megatron's overlap code asks of a CUDA stream: nothing happens out of order on CPU."""

    def __init__(self, *args, **kwargs) -> None:
        pass

    def wait_stream(self, other) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, event=None):
        # The MoE alltoall dispatcher records an event on its copy stream and synchronizes on it later.
        return event if event is not None else _NullStream()

    def wait_event(self, event=None) -> None:
        pass

    def query(self) -> bool:
        return True


class _CpuCuda(types.SimpleNamespace):
    """Stands in for `torch.cuda` inside megatron-core: the current device is the CPU, the RNG is the CPU's."""

    def __getattr__(self, name):  # anything not listed behaves as it does on a CPU-only torch
        return getattr(torch.cuda, name)


def _cpu_cuda() -> _CpuCuda:
    cuda = _CpuCuda(
        current_device=lambda: torch.device("cpu"),
        set_device=lambda device: None,
        synchronize=lambda *a, **k: None,
        empty_cache=lambda: None,
        is_available=lambda: False,
        device_count=lambda: 0,
        manual_seed=lambda seed: torch.random.default_generator.manual_seed(int(seed)),
        get_rng_state=lambda *a, **k: torch.get_rng_state(),
        set_rng_state=lambda state, *a, **k: torch.set_rng_state(state),
        Stream=_NullStream,
        Event=_NullStream,
        stream=lambda s=None: contextlib.nullcontext(),
        current_stream=lambda *a, **k: _NullStream(),
        default_stream=lambda *a, **k: _NullStream(),
        memory_allocated=lambda *a, **k: 0,
        max_memory_allocated=lambda *a, **k: 0,
        nvtx=types.SimpleNamespace(range_push=lambda *a, **k: None, range_pop=lambda *a, **k: None),
    )
    cuda.random = cuda  # torch.cuda.random.get_rng_state(...)
    return cuda


class _CpuTorch(types.ModuleType):
    """`torch`, as seen from a megatron-core module on a CPU device."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _cpu_cuda()
        for name in _FACTORIES:
            setattr(self, name, _cpu_factory(getattr(torch, name)))

    def __getattr__(self, name):
        return getattr(torch, name)


@contextlib.contextmanager
def cuda_type_names():
    """`tensor.type()` reports CPU tensors under their CUDA names (`torch.cuda.FloatTensor`), for megatron's
    dtype checks in the optimizer and clipping; nothing else about the tensor changes."""
    original = torch.Tensor.type

    def type_(self, dtype=None, non_blocking=False, **kwargs):
        if dtype is None and not self.is_cuda:
            return original(self).replace("torch.", "torch.cuda.", 1)
        return original(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_
    try:
        yield
    finally:
        torch.Tensor.type = original


@contextlib.contextmanager
def tensor_cuda_is_identity():
    """`tensor.cuda()` returns the tensor itself: for megatron's tied-embedding setup, which moves the last
    stage's copy of the embedding to "the GPU" before all-reducing it from the first stage."""
    original = torch.Tensor.cuda
    torch.Tensor.cuda = lambda self, *args, **kwargs: self
    try:
        yield
    finally:
        torch.Tensor.cuda = original


def _within(context, fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with context():
            return fn(*args, **kwargs)

    return wrapper


def _with_cuda_type_names(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with cuda_type_names():
            return fn(*args, **kwargs)

    return wrapper


def _communicate_shapes_tagged(self, tensor_send_next, tensor_send_prev, recv_prev: bool, recv_next: bool):
    """megatron's P2PCommunicator._communicate_shapes with a tag per direction: 1 towards the next stage, 2
    towards the previous one (so with two stages the same peer's two messages cannot be confused)."""
    import torch.distributed as dist

    def shape_of(t):
        return torch.tensor(t.size(), dtype=torch.int64)

    recv_prev_shape = torch.empty(3, dtype=torch.int64) if recv_prev else None
    recv_next_shape = torch.empty(3, dtype=torch.int64) if recv_next else None
    reqs = []
    if tensor_send_next is not None:
        reqs.append(dist.isend(shape_of(tensor_send_next), self.next_rank, group=self.pp_group, tag=1))
    if tensor_send_prev is not None:
        reqs.append(dist.isend(shape_of(tensor_send_prev), self.prev_rank, group=self.pp_group, tag=2))
    if recv_prev_shape is not None:
        reqs.append(dist.irecv(recv_prev_shape, self.prev_rank, group=self.pp_group, tag=1))
    if recv_next_shape is not None:
        reqs.append(dist.irecv(recv_next_shape, self.next_rank, group=self.pp_group, tag=2))
    for req in reqs:
        req.wait()
    as_list = lambda t: t.tolist() if t is not None else [0, 0, 0]  # noqa: E731
    return as_list(recv_prev_shape), as_list(recv_next_shape)


def _move_to_cpu_as_on_cuda(tensor, as_numpy: bool = False, record_stream: bool = False):
    """megatron's moe_utils.maybe_move_tensor_to_cpu, for tensors already on the CPU: on CUDA it hands the alltoall
    dispatcher its split sizes as numpy arrays, which all_to_all_single takes; it left CPU tensors as tensors, which
    all_to_all_single refuses (TypeError on gloo at expert_model_parallel_size > 1)."""
    if as_numpy and torch.is_tensor(tensor):
        return tensor.numpy()
    return tensor


def _import_megatron_modules() -> None:
    """Every megatron-core module the engine runs, imported before they are given the CPU view of torch."""
    import megatron.core.distributed  # noqa: F401
    import megatron.core.distributed.finalize_model_grads  # noqa: F401
    import megatron.core.models.gpt.gpt_model  # noqa: F401
    import megatron.core.optimizer  # noqa: F401
    import megatron.core.optimizer.clip_grads  # noqa: F401
    import megatron.core.optimizer.distrib_optimizer  # noqa: F401
    import megatron.core.pipeline_parallel.p2p_communication  # noqa: F401
    import megatron.core.pipeline_parallel.schedules  # noqa: F401
    import megatron.core.tensor_parallel.random  # noqa: F401
    import megatron.core.transformer.moe.moe_layer  # noqa: F401
    import megatron.core.transformer.moe.moe_utils  # noqa: F401
    import megatron.core.transformer.moe.router  # noqa: F401
    import megatron.core.transformer.moe.token_dispatcher  # noqa: F401


def apply_cpu_shim() -> None:
    """Idempotent. Call before building megatron-core models on a CPU device (never on CUDA)."""
    global _APPLIED
    if _APPLIED:
        return
    _import_megatron_modules()
    cpu_torch = _CpuTorch()
    for name, module in list(sys.modules.items()):
        if name.startswith("megatron.core") and getattr(module, "torch", None) is torch:
            module.torch = cpu_torch

    from megatron.core.models.common.language_module.language_module import LanguageModule
    from megatron.core.optimizer import clip_grads, distrib_optimizer, optimizer
    from megatron.core.pipeline_parallel import p2p_communication
    from megatron.core.tensor_parallel import random

    p2p_communication.P2PCommunicator._communicate_shapes = _communicate_shapes_tagged
    from megatron.core.transformer.moe import token_dispatcher

    token_dispatcher.maybe_move_tensor_to_cpu = _move_to_cpu_as_on_cuda

    # The RNG tracker keeps and swaps "CUDA" generator states; on CPU they are the CPU generator's.
    random._get_cuda_rng_state = lambda device=None, clone=False, graph_safe=False: torch.get_rng_state()
    random._set_cuda_rng_state = lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)
    # The dtype checks by CUDA type name.
    clipped = _with_cuda_type_names(clip_grads.clip_grad_by_total_norm_fp32)
    clip_grads.clip_grad_by_total_norm_fp32 = clipped
    optimizer.clip_grad_by_total_norm_fp32 = clipped
    build = distrib_optimizer.DistributedOptimizer._build_model_and_main_param_groups
    distrib_optimizer.DistributedOptimizer._build_model_and_main_param_groups = staticmethod(_with_cuda_type_names(build))
    optimizer.Float16OptimizerWithFloat16Params.__init__ = _with_cuda_type_names(optimizer.Float16OptimizerWithFloat16Params.__init__)
    LanguageModule.setup_embeddings_and_output_layer = _within(tensor_cuda_is_identity, LanguageModule.setup_embeddings_and_output_layer)
    _APPLIED = True
