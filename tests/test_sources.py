"""Every Python file of the project compiles without a warning.

Python 3.11 (CI) keeps an invalid escape sequence in a string ("\\(") silent, as a DeprecationWarning; 3.12 (the GPU
machine's, and what most CUDA images ship) prints a SyntaxWarning from every process that imports the module, each
Ray worker included, and a later Python makes it an error. The GPU run found one in rlcore/engine/fsdp2.py.
"""

import pathlib
import warnings

ROOT = pathlib.Path(__file__).resolve().parent.parent


def test_every_source_file_compiles_without_a_warning():
    problems = []
    for folder in ("rlcore", "bench", "tools", "tests", "agent_loops", "interactions"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                try:
                    compile(path.read_text(), str(path), "exec")
                except (SyntaxError, SyntaxWarning, DeprecationWarning) as err:
                    problems.append(f"{path.relative_to(ROOT)}: {err}")
    assert not problems, "\n".join(problems)
