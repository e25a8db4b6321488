"""The base class of every worker process: rank bookkeeping and the torch process group."""

from __future__ import annotations

import faulthandler
import os
import socket
import time

import torch
import torch.distributed as dist

from rlcore.controller.decorator import DataLayout, Dispatch, register
from rlcore.utils.dist import set_collective_timeout
from rlcore.utils.profiler import ProfileSpec, WorkerProfiler


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]


def node_ip() -> str:
    """This node's address as other nodes reach it (127.0.0.1 is fine for a single node)."""
    try:
        import ray

        return ray.util.get_node_ip_address()
    except Exception:
        return "127.0.0.1"


class Worker:
    """One process per device. Subclasses add `@register`-ed methods that the controller calls as a group."""

    def __init__(self, rank: int = 0, world_size: int = 1, device: str = "cpu") -> None:
        # A native crash (segfault in a collective or allocator) then still shows every Python thread's stack
        # in the worker's log, which is what tells a library bug from ours.
        faulthandler.enable(all_threads=True)
        self.rank = rank
        self.world_size = world_size
        self.device_type = device
        self.layouts: dict[str, DataLayout] = {}  # data-parallel layouts other than "every rank on its own"
        self.profiler = WorkerProfiler(rank, device)  # idle until the controller starts it (global_profiler.steps)

    @property
    def device(self) -> torch.device:
        # Under Ray each actor sees only its own GPU (CUDA_VISIBLE_DEVICES), so it is always cuda:0.
        return torch.device("cuda", torch.cuda.current_device()) if self.device_type == "cuda" else torch.device("cpu")

    def data_layout(self, mesh: str | None) -> DataLayout:
        """This rank's place in the layout a `@register(mesh=...)` method splits its data over."""
        return self.layouts.get(mesh, DataLayout(self.rank, self.world_size))

    def get_master_addr_port(self) -> tuple[str, int]:
        return node_ip(), free_port()

    def process_info(self) -> tuple[str, int, str]:
        """(node IP, pid, Ray node id): the placement map, and where the driver looks when this rank stops answering."""
        import ray

        return node_ip(), os.getpid(), ray.get_runtime_context().get_node_id()

    def timed_call(self, method: str, *args, **kwargs):
        """A registered method's result, when it started on this rank (wall clock) and the seconds it took: the group
        compares its ranks (who started late, who waited for the slowest) and its own round trip with them."""
        started, start = time.time(), time.perf_counter()
        with self.profiler.call(method):
            result = getattr(self, method)(*args, **kwargs)
        return result, started, time.perf_counter() - start

    @register(Dispatch.ONE_TO_ALL)
    def start_profile(self, spec: ProfileSpec) -> None:
        """Profiles this rank's calls from now on, if `spec` names it (rlcore.utils.profiler)."""
        self.profiler.start(spec)

    @register(Dispatch.ONE_TO_ALL)
    def stop_profile(self) -> list[str]:
        """Ends the profile; the trace and snapshot files this rank wrote."""
        return self.profiler.stop()

    def peak_flops(self) -> tuple[float, str]:
        """This rank's peak matmul FLOP/s and where the figure comes from. CUDA: the nominal dense bf16 peak of a
        known device (rlcore.utils.device.NOMINAL_BF16_TFLOPS), else a measured bf16 GEMM; CPU: a measured fp32
        GEMM with this rank's threads (what the CPU recipes train in)."""
        from rlcore.utils.device import measure_gemm_flops, nominal_peak_flops

        if self.device_type == "cuda":
            name = torch.cuda.get_device_name()
            nominal = nominal_peak_flops(name)
            if nominal:
                return nominal, f"nominal dense bf16 peak of {name}"
            return measure_gemm_flops(self.device, torch.bfloat16, 8192), f"measured bf16 GEMM on {name}"
        threads = torch.get_num_threads()
        return measure_gemm_flops(self.device, torch.float32, 1024), f"measured fp32 GEMM on rank {self.rank} ({threads} thread{'s' if threads > 1 else ''})"

    def read_marker(self, path: str) -> str | None:
        """The text of `path` as this rank's node sees it (None if it cannot): is a directory shared?"""
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            return None

    def init_process_group(self, master_addr: str, master_port: int, timeout_s: float = 600) -> None:
        """Joins the group of all ranks: gloo on CPU, nccl on CUDA, same code otherwise. `timeout_s`
        (actor_rollout_ref.nccl_timeout) bounds every collective of every group this rank creates."""
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port), RANK=str(self.rank), WORLD_SIZE=str(self.world_size), LOCAL_RANK="0")
        backend = "nccl" if self.device_type == "cuda" else "gloo"
        if self.device_type == "cuda":
            torch.cuda.set_device(0)
        if not dist.is_initialized():
            dist.init_process_group(backend=backend, rank=self.rank, world_size=self.world_size, timeout=set_collective_timeout(timeout_s))

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.barrier()  # all ranks get here together (ONE_TO_ALL); none closes a pair a peer still uses
            dist.destroy_process_group()
