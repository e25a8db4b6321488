"""How FSDP2 lays a model over the ranks: the mesh its parameters are sharded on (`fsdp_config.fsdp_size`), which
modules become units (`fsdp_config.wrap_policy.min_num_params`), and whether each unit issues the next one's
all-gather before its own forward (`fsdp_config.forward_prefetch`)."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh


def fsdp_mesh(device_type: str, world: int, fsdp_size: int = -1) -> DeviceMesh:
    """All ranks in one shard group, or with 0 < fsdp_size < world hybrid sharding (HSDP, verl's fsdp_size): each
    group of fsdp_size consecutive ranks shards the parameters, and the world // fsdp_size groups replicate each
    other (gradients are all-reduced across them). Smaller groups keep the all-gathers inside a node at the cost of
    memory: each rank holds 1/fsdp_size of the state instead of 1/world."""
    if fsdp_size <= 0 or fsdp_size >= world:
        return init_device_mesh(device_type, (world,), mesh_dim_names=("dp",))
    if world % fsdp_size:
        raise ValueError(f"fsdp_config.fsdp_size={fsdp_size} does not divide the role's {world} ranks; use a divisor or -1")
    return init_device_mesh(device_type, (world // fsdp_size, fsdp_size), mesh_dim_names=("replicate", "shard"))


CONTAINERS = (torch.nn.ModuleList, torch.nn.ModuleDict)


def fsdp_units(model: torch.nn.Module, blocks: torch.nn.ModuleList, min_num_params: int = 0) -> list[torch.nn.Module]:
    """The modules to `fully_shard` before the root, inner units first.

    min_num_params = 0: each decoder block (what verl's FSDP2 path wraps). min_num_params > 0: FSDP1's size-based
    policy, which verl applies with that key: a module becomes a unit once the parameters under it that no inner unit
    took number min_num_params or more. Fewer, larger units mean fewer all-gathers and more memory per gather. A
    module holding a weight tied to one outside it (the embedding and the LM head) never becomes a unit: both users
    of a tied weight must gather it together, so the root keeps it."""
    if min_num_params <= 0:
        return list(blocks)
    tied = _tied_parameters(model)
    units: list[torch.nn.Module] = []

    def visit(module: torch.nn.Module) -> tuple[int, bool]:
        """(parameters under `module` no unit took, whether one of them is tied)."""
        own = list(module.parameters(recurse=False))
        free, has_tied = sum(p.numel() for p in own), any(id(p) in tied for p in own)
        for child in module.children():
            child_free, child_tied = visit(child)
            free, has_tied = free + child_free, has_tied or child_tied
        # A ModuleList / ModuleDict is never called, so its FSDP hooks would never run (FSDP1's policy skips them too).
        if module is not model and free >= min_num_params and not has_tied and not isinstance(module, CONTAINERS):
            units.append(module)
            return 0, False
        return free, has_tied

    visit(model)
    return units


def _tied_parameters(model: torch.nn.Module) -> set[int]:
    seen: dict[int, int] = {}
    for _, param in model.named_parameters(remove_duplicate=False):
        seen[id(param)] = seen.get(id(param), 0) + 1
    return {key for key, count in seen.items() if count > 1}


def chain_forward_prefetch(units: list[torch.nn.Module]) -> None:
    """Each unit's pre-forward issues the next unit's all-gather (FSDP2's explicit forward prefetch), so the gather
    overlaps the current unit's compute instead of starting when the next forward does. The chain follows the order
    fsdp_units returns, which for decoder blocks is their forward order (a size-based policy's nested units come
    children first: a wrong guess only gathers a unit early, it never changes a result)."""
    for unit, following in zip(units, units[1:]):
        unit.set_modules_to_forward_prefetch([following])
