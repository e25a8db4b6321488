"""Custom agent loops in verl's YAML shape (`actor_rollout_ref.rollout.agent.agent_loop_config_path`):

    - name: calculator_agent                      # what a row's `agent_name` (or agent.default_agent_loop) picks
      _target_: agent_loops.retry_agent.RetryAgentLoop     # package.module.ClassName: an async `run(sampling_params, **row)`
      max_turns: 4                                # any other key: a keyword argument of the constructor (verl's)

`load_agent_loop_config` checks every entry before Ray starts, all problems at once, as the tool config does. The
loops themselves run in the rollout workers (rlcore.rollout.agent_runner).
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any

import yaml

from rlcore.config.tool_config import check_class

BUILTIN_AGENT_LOOPS = ("single_turn_agent", "tool_agent")  # rlcore's own: one engine call, the hermes tool agent


@dataclass(frozen=True)
class AgentLoopSpec:
    """One loop of the config: its name, its class and the constructor's extra keyword arguments."""

    name: str
    target: str  # "package.module.ClassName", imported in each rollout worker
    kwargs: dict  # the entry's other keys, name included (verl instantiates the entry with hydra: every key but _target_)


def load_agent_loop_config(path: str) -> list[AgentLoopSpec]:
    """The loops of a verl agent-loop YAML (a list of entries). Raises ValueError listing every problem."""
    try:
        with open(path) as f:
            entries = yaml.safe_load(f)
    except OSError:
        raise ValueError(f"agent loop config {path} does not exist; point agent_loop_config_path at a YAML list of "
                         "{name, _target_} entries such as agent_loops/retry.yaml") from None
    except yaml.YAMLError as err:
        raise ValueError(f"agent loop config {path} is not valid YAML ({' '.join(str(err).split())}); fix the syntax") from None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"agent loop config {path} must be a non-empty YAML list of entries, each with name and _target_ "
                         "(see agent_loops/retry.yaml)")
    errors: list[str] = []
    specs: list[AgentLoopSpec] = []
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"[{i}]"
        if not isinstance(entry, dict):
            errors.append(f"{where} is {type(entry).__name__}, not a mapping with name and _target_")
            continue
        before = len(errors)
        name = entry.get("name")
        if not isinstance(name, str) or not name:
            errors.append(f"{where}.name={name!r} must be a non-empty string (what rows' agent_name picks)")
        elif name in BUILTIN_AGENT_LOOPS:
            errors.append(f"{where}.name={name!r} is one of rlcore's built-in loops ({', '.join(BUILTIN_AGENT_LOOPS)}); give yours another name")
        elif name in seen:
            errors.append(f"{where}.name={name!r} repeats [{seen[name]}]'s; give each loop its own name")
        target = entry.get("_target_")
        check_class(target, f"{where}._target_", errors, ("run",), "rlcore.rollout.agent_api.AgentLoopBase",
                    "agent_loops.retry_agent.RetryAgentLoop")
        if len(errors) == before and not inspect.iscoroutinefunction(_class(target).run):
            errors.append(f"{where}._target_={target}.run is not `async def`; an agent loop awaits the server "
                          "(`await self.server_manager.generate(...)`), as verl's do")
        check = getattr(_class(target), "check_config", None) if len(errors) == before else None
        if check is not None:  # a loop that can check its own keyword arguments (the agent-program loop does)
            errors += [f"{where}: {problem}" for problem in check({k: v for k, v in entry.items() if k not in ("_target_", "name")})]
        if len(errors) == before:
            seen[name] = i
            specs.append(AgentLoopSpec(name, target, {k: v for k, v in entry.items() if k != "_target_"}))
    if errors:
        raise ValueError(f"agent loop config {path} has {len(errors)} problem(s):\n" + "\n".join(f"  - {e}" for e in errors))
    return specs


def _class(target: str) -> Any:
    module, _, attr = target.rpartition(".")
    return getattr(importlib.import_module(module), attr)


def agent_name_problem(row: dict[str, Any], names: set[str]) -> str | None:
    """A prompt row's check (rlcore.data.row_checks): its `agent_name`, if it has one, names a loop there is."""
    name = row.get("agent_name")
    if name is None or name in names:
        return None
    return f"agent_name={name!r} is not a loop of agent_loop_config_path nor built in ({', '.join(sorted(names))})"
