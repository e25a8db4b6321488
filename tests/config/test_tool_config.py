"""verl tool configs: the shipped ones load; every malformed entry is reported with the file, the entry and the fix."""

import pytest

from rlcore.config.tool_config import ToolSpec, load_tool_config

GOOD = """
tools:
  - class_name: rlcore.tools.builtin.AddTool
    tool_schema:
      type: function
      function: {name: add, description: adds, parameters: {type: object, properties: {a: {type: integer}}, required: [a]}}
"""


def write(tmp_path, text: str) -> str:
    path = tmp_path / "tools.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("path, name, cls", [("tool_configs/tiny_add.yaml", "add", "AddTool"),
                                             ("tool_configs/gsm8k_calculator.yaml", "calculator", "CalculatorTool")])
def test_shipped_tool_configs_load_with_the_tools_own_schema(path, name, cls):
    import rlcore.tools.builtin as builtin

    [spec] = load_tool_config(path)
    assert (spec.name, spec.class_name, spec.config) == (name, f"rlcore.tools.builtin.{cls}", {})
    assert spec.tool_schema == getattr(builtin, cls).TOOL_SCHEMA


def test_a_missing_config_is_an_empty_dict(tmp_path):
    assert load_tool_config(write(tmp_path, GOOD)) == [ToolSpec("rlcore.tools.builtin.AddTool", {}, {
        "type": "function", "function": {"name": "add", "description": "adds",
                                         "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}})]


def test_file_level_problems(tmp_path):
    with pytest.raises(ValueError, match=r"tool config nowhere.yaml does not exist; point the key at a YAML file such as tool_configs"):
        load_tool_config("nowhere.yaml")
    with pytest.raises(ValueError, match=r"tools.yaml is not valid YAML .*; fix the syntax"):
        load_tool_config(write(tmp_path, "tools: [\n"))
    for text in ("", "tools: []\n", "tools: {a: 1}\n", "- a\n"):
        with pytest.raises(ValueError, match=r"tools.yaml needs a non-empty list under `tools:`"):
            load_tool_config(write(tmp_path, text))


ENTRY = GOOD.split("\n", 2)[2]  # the add entry, indented under tools:


@pytest.mark.parametrize("old, new, message", [
    ("rlcore.tools.builtin.AddTool", "AddTool", "tools[0].class_name='AddTool' must be 'package.module.ClassName'"),
    ("rlcore.tools.builtin.AddTool", "no_such_module.AddTool", "tools[0].class_name=no_such_module.AddTool: module no_such_module "
                                                               "cannot be imported (ModuleNotFoundError"),
    ("rlcore.tools.builtin.AddTool", "rlcore.tools.builtin.MulTool", "rlcore.tools.builtin has no class MulTool; fix the name"),
    ("rlcore.tools.builtin.AddTool", "rlcore.tools.parser.ParsedCall", "ParsedCall lacks create, execute, release; subclass "
                                                                       "rlcore.tools.base.BaseTool"),
    ("    tool_schema:", "    config: [1]\n    tool_schema:", "tools[0].config is list; it must be a mapping"),
    ("type: function", "type: retrieval", "tools[0].tool_schema.type='retrieval': only OpenAI function tools are supported"),
    ("name: add, ", "", "tools[0].tool_schema.function.name is missing; give the name the model calls the tool by"),
    ("type: object", "type: string", "tools[0].tool_schema.function.parameters must be a JSON object schema"),
    ("required: [a]", "required: [b]", "tools[0].tool_schema.function.parameters.required=['b'] must list names from properties (a)"),
])
def test_each_bad_entry_names_itself_and_the_fix(tmp_path, old, new, message):
    path = write(tmp_path, GOOD + ENTRY.replace(old, new))  # the bad entry is tools[1]... renamed below
    with pytest.raises(ValueError) as err:
        load_tool_config(path)
    text = str(err.value)
    assert text.startswith(f"tool config {path} has ")
    assert message.replace("tools[0]", "tools[1]") in text, text


def test_duplicate_names_and_all_problems_at_once(tmp_path):
    path = write(tmp_path, GOOD + ENTRY + ENTRY.replace("AddTool", "Nope"))
    with pytest.raises(ValueError) as err:
        load_tool_config(path)
    text = str(err.value)
    assert f"tool config {path} has 2 problem(s)" in text
    assert "tools[1].tool_schema.function.name='add' repeats tools[0]'s; give each tool its own name" in text
    assert "tools[2].class_name=rlcore.tools.builtin.Nope" in text
