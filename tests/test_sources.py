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


def test_no_two_test_modules_share_a_file_name():
    """The test folders are no packages: pytest imports each test module by its file name, and a second
    tests/<a>/test_x.py beside tests/<b>/test_x.py stops the whole run at collection ("import file mismatch")."""
    names: dict[str, list[str]] = {}
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        names.setdefault(path.name, []).append(str(path.relative_to(ROOT)))
    assert not {name: paths for name, paths in names.items() if len(paths) > 1}
