"""Rules for profiling (`global_profiler.*`, `<role>.profiler.*`): what cannot profile anything is refused before
Ray starts, naming the key and what to use. `c` is validate's checker (get / error / choice). Whether `nsys` is
installed is a fact of the machine that runs the job: rlcore.cli.preflight checks it."""

from __future__ import annotations

from rlcore.config.profiler_schema import TOOLS, TORCH_CONTENTS

GP = "global_profiler"
ROLE_SECTIONS = {"actor_rollout_ref.actor": "actor", "actor_rollout_ref.ref": "ref", "actor_rollout_ref.rollout": "rollout",
                 "critic": "critic", "reward_model": "reward_model"}
HYBRID = ("actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout")  # one process in rlcore


def check_profiler(c) -> None:
    tool = c.get(f"{GP}.tool")
    if tool is not None:
        c.choice(f"{GP}.tool", TOOLS)
    enabled = [s for s in ROLE_SECTIONS if c.get(f"{s}.profiler.enable")]
    if tool is None:
        if enabled:
            c.error(f"{enabled[0]}.profiler.enable=True but global_profiler.tool is null: nothing would be profiled; set "
                    f"{GP}.tool=torch (and {GP}.steps=[...])")
        return
    if tool == "npu":
        c.error(f"{GP}.tool=npu profiles Ascend NPUs, which rlcore does not run on; use {GP}.tool=torch")
    if tool in ("torch_memory", "nsys") and c.get("trainer.device") != "cuda":
        c.error(f"{GP}.tool={tool} records the CUDA {'caching allocator' if tool == 'torch_memory' else 'kernels'}, and "
                f"trainer.device={c.get('trainer.device')} has none; use {GP}.tool=torch (its tool_config.torch.contents="
                "[memory] records allocations on any device)")
    if not enabled:
        return  # a tool and no role asking for it profiles nothing, as in verl (whose scripts set the tool so)
    steps = c.get(f"{GP}.steps")
    if not steps:
        c.error(f"{enabled[0]}.profiler.enable=True profiles the steps in {GP}.steps, which is empty; set e.g. "
                f"{GP}.steps=[2,3]")
    elif any(not isinstance(s, int) or s < 1 for s in steps):
        c.error(f"{GP}.steps={list(steps)} must list global steps, counted from 1")
    for section in enabled:
        _check_role(c, section)
    # The actor, reference and rollout share a process: one profiler runs there, with one tool and one folder.
    shared = [s for s in HYBRID if s in enabled]
    for key in ("tool", "save_path"):
        values = {s: c.get(f"{s}.profiler.{key}") for s in shared}
        if len(set(map(str, values.values()))) > 1:
            c.error(f"{', '.join(f'{s}.profiler.{key}={v}' for s, v in values.items())}: the actor, reference and rollout "
                    f"run in one process, which one profiler with one {key} serves; set the same {key} (or leave them to "
                    f"{GP}.{key})")


def _check_role(c, section: str) -> None:
    contents = c.get(f"{section}.profiler.tool_config.torch.contents") or []
    unknown = [x for x in contents if x not in TORCH_CONTENTS]
    if unknown:
        c.error(f"{section}.profiler.tool_config.torch.contents={list(contents)}: {unknown} not among {', '.join(TORCH_CONTENTS)}")
    if c.get(f"{section}.profiler.tool") not in TOOLS:
        c.error(f"{section}.profiler.tool={c.get(f'{section}.profiler.tool')} is not one of {', '.join(TOOLS)}")
    ranks = c.get(f"{section}.profiler.ranks") or []
    if any(not isinstance(r, int) or r < 0 for r in ranks):
        c.error(f"{section}.profiler.ranks={list(ranks)} must list ranks of the role's worker group, from 0")
