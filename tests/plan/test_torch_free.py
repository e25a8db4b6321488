"""rlcore-plan runs where neither torch nor Ray is installed (a laptop planning a cluster job): the planner, the
rollout engines' sizing it reads and the doctor import neither."""

import subprocess
import sys


def test_the_planner_imports_neither_torch_nor_ray():
    code = ("import sys, rlcore.plan.run_plan, rlcore.plan.heads, rlcore.rollout.sizing, rlcore.cli.plan; "
            "print(sorted(m for m in ('torch', 'ray', 'vllm', 'transformers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
