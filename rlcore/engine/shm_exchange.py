"""Weight-sync buckets through one shared-memory segment, for CPU ranks on the same host.

Over gloo, an all-gather of the model's bytes costs ~6x a memcpy of them (TCP over loopback), and each bucket's
receive buffer is fresh memory that the kernel must fault in. Ranks of one host can instead map one segment in
/dev/shm: each writes its shards into place, a barrier, and every rank reads the full tensors in place, ~1.5
memcpy in all (the CUDA analogue is verl's IPC handles between colocated trainer and vLLM). The segment is kept
and reused from sync to sync, so a tensor handed out is only valid until the next one is drawn: the weight sync
copies each into the rollout model at once (`TrainEngine.rollout_weights(transient=True)`).

Used only when every rank of the group runs on this host and /dev/shm has room (containers often give it 64 MB);
otherwise the buckets go through the plain all-gather.
"""

from __future__ import annotations

import logging
import os
import socket
import uuid

import torch
import torch.distributed as dist

from rlcore.engine.gather import Exchange

log = logging.getLogger(__name__)
SHM_DIR = "/dev/shm"


def _host_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f"{socket.gethostname()}/{f.read().strip()}"
    except OSError:
        return socket.gethostname()


def _agree(group, value):
    """Rank 0's `value` on every rank of `group`."""
    box = [value]
    dist.broadcast_object_list(box, group_src=0, group=group)
    return box[0]


class SharedMemoryExchange(Exchange):
    """A bucket in one mapped file; falls back to the all-gather for a bucket /dev/shm cannot hold."""

    def __init__(self, group) -> None:
        self.group = group
        self.world, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.buffer: torch.Tensor | None = None  # uint8 view of the mapped segment
        self.warned = False  # the no-room warning is said once, not per bucket

    @classmethod
    def for_group(cls, group) -> "SharedMemoryExchange | None":
        """An exchange if every rank of `group` is on this host (collective), else None."""
        hosts = [None] * dist.get_world_size(group)
        dist.all_gather_object(hosts, _host_id(), group=group)
        return cls(group) if len(set(hosts)) == 1 and len(hosts) > 1 else None

    def gather_bucket(self, group, shards: list[torch.Tensor], widths: list[int]) -> list[torch.Tensor]:
        """Tensor-major layout: tensor i's shares sit side by side, so its full tensor is one contiguous view
        (the all-gather's rank-major layout needs a copy per tensor to put the rows back together)."""
        dtype, size = shards[0].dtype, shards[0].element_size()
        if group is not self.group or shards[0].device.type != "cpu" or not self._ensure(self.world * sum(widths) * size):
            return super().gather_bucket(group, shards, widths)  # the segment is this group's, and host memory
        segment = self.buffer[: self.world * sum(widths) * size].view(dtype)
        dist.barrier(group=self.group)  # every rank has consumed the previous bucket before it is overwritten
        views, offset = [], 0
        for shard, width in zip(shards, widths):
            block = segment[offset : offset + self.world * width].view(self.world, width)
            block[self.rank, : shard.numel()] = shard
            views.append(block)
            offset += self.world * width
        dist.barrier(group=self.group)  # every rank's shares are written
        return views

    def _ensure(self, nbytes: int) -> bool:
        """Maps a segment of at least `nbytes` (collective when it grows); False if /dev/shm has no room."""
        if self.buffer is not None and self.buffer.numel() >= nbytes:
            return True
        path = None
        if self.rank == 0:
            stat = os.statvfs(SHM_DIR) if os.path.isdir(SHM_DIR) else None
            free = stat.f_bavail * stat.f_frsize if stat else 0
            if free >= 2 * nbytes:  # keep headroom: Ray's object store lives in /dev/shm too
                path = os.path.join(SHM_DIR, f"rlcore-weights-{uuid.uuid4().hex}")
                with open(path, "wb") as f:
                    f.truncate(nbytes)
            elif not self.warned:
                self.warned = True
                log.warning("weight sync: /dev/shm has %.0f MiB free, a %.0f MiB bucket needs twice that; using the all-gather",
                            free / 2**20, nbytes / 2**20)
        path = _agree(self.group, path)
        if path is None:
            return False
        self.buffer = torch.from_file(path, shared=True, size=nbytes, dtype=torch.uint8)
        dist.barrier(group=self.group)
        if self.rank == 0:
            os.unlink(path)  # the mappings stay valid; nothing is left behind when the processes end
        return True
