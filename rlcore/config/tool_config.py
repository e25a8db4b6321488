"""Tool configs in verl's YAML shape (`actor_rollout_ref.rollout.multi_turn.tool_config_path`):

    tools:
      - class_name: rlcore.tools.builtin.CalculatorTool   # package.module.ClassName
        config: {}                                        # the tool constructor's `config`
        tool_schema:                                      # OpenAI function schema, shown to the model
          type: function
          function: {name: calculator, description: ..., parameters: {type: object, properties: {...}, required: [...]}}

`load_tool_config` checks every entry before Ray starts and reports all problems at once, each naming the file, the
entry and how to fix it. Tool classes are checked by duck typing (create / execute / release), so this config layer
does not import rlcore.tools.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from typing import Any

import yaml

from rlcore.config.typed import dotted

_METHODS = ("create", "execute", "release")


@dataclass(frozen=True)
class ToolSpec:
    """One tool of a tool config: the class to build in each tool process and the schema the model sees."""

    class_name: str  # "package.module.ClassName", importable in the tool processes
    config: dict  # passed to the tool's constructor as `config`
    tool_schema: dict  # OpenAI function schema {"type": "function", "function": {"name", "description", "parameters"}}

    @property
    def name(self) -> str:
        """The name the model calls the tool by (tool_schema.function.name)."""
        return self.tool_schema["function"]["name"]


def load_tool_config(path: str) -> list[ToolSpec]:
    """The tools of a verl tool-config YAML. Raises ValueError listing every problem, each with the file, the entry
    (e.g. `tools[1].tool_schema.function.name`) and the fix."""
    tools = yaml_entries(path, "tools", "tool config", "class_name, config and tool_schema", "tool_configs/tiny_add.yaml")
    errors: list[str] = []
    specs = [_spec(entry, f"tools[{i}]", errors) for i, entry in enumerate(tools)]
    seen: dict[str, int] = {}
    for i, spec in enumerate(specs):
        if spec is None:
            continue
        if spec.name in seen:
            errors.append(f"tools[{i}].tool_schema.function.name={spec.name!r} repeats tools[{seen[spec.name]}]'s; give each tool its own name")
        seen.setdefault(spec.name, i)
    if errors:
        raise ValueError(f"tool config {path} has {len(errors)} problem(s):\n" + "\n".join(f"  - {e}" for e in errors))
    return specs  # type: ignore[return-value]  # no None left without an error


def yaml_entries(path: str, key: str, what: str, fields: str, example: str) -> list:
    """The non-empty list under `key:` in the YAML file `path` (a verl tool or interaction config); ValueError
    naming the file and the fix when it is missing, not YAML, or has no such list."""
    if not os.path.isfile(path):
        raise ValueError(f"{what} {path} does not exist; point the key at a YAML file such as {example}")
    try:
        with open(path) as f:
            doc = yaml.safe_load(f)
    except yaml.YAMLError as err:
        raise ValueError(f"{what} {path} is not valid YAML ({' '.join(str(err).split())}); fix the syntax") from None
    entries = doc.get(key) if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ValueError(f"{what} {path} needs a non-empty list under `{key}:`, each entry with {fields} (see {example})")
    return entries


def _spec(entry: Any, where: str, errors: list[str]) -> ToolSpec | None:
    """entry's ToolSpec, or None with its problems appended to `errors`."""
    if not isinstance(entry, dict):
        errors.append(f"{where} is {type(entry).__name__}, not a mapping with class_name, config and tool_schema")
        return None
    before = len(errors)
    class_name = entry.get("class_name")
    check_class(class_name, f"{where}.class_name", errors, _METHODS, "rlcore.tools.base.BaseTool", "rlcore.tools.builtin.AddTool")
    config = entry.get("config")
    if config is None:
        config = {}  # verl's tools without options leave it out
    elif not isinstance(config, dict):
        errors.append(f"{where}.config is {type(config).__name__}; it must be a mapping (the tool constructor's options), or {{}}")
    schema = entry.get("tool_schema")
    if not isinstance(schema, dict):
        errors.append(f"{where}.tool_schema is missing; give the OpenAI function schema: {{type: function, function: {{name, description, parameters}}}}")
    else:
        _check_schema(schema, f"{where}.tool_schema", errors)
    return ToolSpec(class_name, config, schema) if len(errors) == before else None


def check_class(class_name: Any, where: str, errors: list[str], methods: tuple[str, ...], base: str, example: str) -> None:
    """Appends to `errors` why `class_name` cannot serve: not a 'package.module.ClassName' string (`example` is one),
    its module does not import, it is not a class there, or it lacks one of `methods` (checked by duck typing;
    `base` is the class to subclass, named in the fix)."""
    if not isinstance(class_name, str) or "." not in class_name:
        errors.append(f"{where}={class_name!r} must be 'package.module.ClassName', e.g. {example}")
        return
    module_name, _, attr = class_name.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:  # noqa: BLE001 -- any import failure is the user's to fix
        errors.append(f"{where}={class_name}: module {module_name} cannot be imported ({type(err).__name__}: {err}); "
                      f"put it on PYTHONPATH or fix the name")
        return
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        errors.append(f"{where}={class_name}: {module_name} has no class {attr}; fix the name")
        return
    missing = [m for m in methods if not callable(getattr(cls, m, None))]
    if missing:
        errors.append(f"{where}={class_name} lacks {', '.join(missing)}; subclass {base}")


def _check_schema(schema: dict, where: str, errors: list[str]) -> None:
    if schema.get("type") != "function":
        errors.append(f"{where}.type={schema.get('type')!r}: only OpenAI function tools are supported; use type: function")
    function = schema.get("function")
    if not isinstance(function, dict):
        errors.append(f"{where}.function is missing; give {{name, description, parameters}}")
        return
    name = function.get("name")
    if not isinstance(name, str) or not name:
        errors.append(f"{where}.function.name is missing; give the name the model calls the tool by, e.g. name: calculator")
    params = function.get("parameters")
    if not isinstance(params, dict) or params.get("type") != "object":
        errors.append(f"{where}.function.parameters must be a JSON object schema: {{type: object, properties: {{...}}, required: [...]}}")
        return
    properties = params.get("properties", {})
    if not isinstance(properties, dict):
        errors.append(f"{where}.function.parameters.properties must map each argument name to its schema")
        return
    required = params.get("required", [])
    if not isinstance(required, list) or any(r not in properties for r in required):
        errors.append(f"{where}.function.parameters.required={required!r} must list names from properties ({', '.join(properties) or 'none'})")


MT = "actor_rollout_ref.rollout.multi_turn"
AGENT = "actor_rollout_ref.rollout.agent"


def tools_enabled(cfg) -> bool:
    """Multi-turn rollouts with tools are on with either of verl's switches: multi_turn.enable or the tool_agent loop."""
    return bool(dotted(cfg)(f"{MT}.enable")) or dotted(cfg)(f"{AGENT}.default_agent_loop") == "tool_agent"


def tool_config_key_of(cfg) -> str | None:
    """The key that names the tool config: multi_turn.tool_config_path, else data.tool_config_path, else None."""
    return next((key for key in (f"{MT}.tool_config_path", "data.tool_config_path") if dotted(cfg)(key)), None)


def tool_schemas(cfg) -> list[dict] | None:
    """The OpenAI schemas of the configured tools when multi-turn is on (what chat templates render into the
    prompt, so the model knows its tools), else None."""
    key = tool_config_key_of(cfg) if tools_enabled(cfg) else None
    return [spec.tool_schema for spec in load_tool_config(dotted(cfg)(key))] if key else None
