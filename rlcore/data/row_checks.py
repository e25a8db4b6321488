"""Every prompt row checked once at dataset load, before Ray starts: a bad row is reported with its file and row
number (or, with data.skip_bad_rows=True, dropped and counted) instead of failing mid-run, or silently scoring 0."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable, Iterable

RowCheck = Callable[[dict[str, Any]], "str | None"]  # a row -> what is wrong with it, or None
SHOWN = 3  # locations listed per problem


def prompt_problem(row: dict[str, Any], prompt_key: str) -> str | None:
    messages = row.get(prompt_key)
    if not isinstance(messages, list):
        return f"column {prompt_key!r} (data.prompt_key) is not a list of chat messages"
    if not messages:
        return f"column {prompt_key!r} (data.prompt_key) is an empty conversation"
    if not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in messages):
        return f"a message in {prompt_key!r} (data.prompt_key) lacks a string 'role' or 'content'"
    return None


def rule_score_problem(row: dict[str, Any], source_key: str, scored_sources: Iterable[str]) -> str | None:
    """What the rule scorers need: a scorer for the row's data source, and a ground truth to compare with."""
    source = row.get(source_key)
    if source not in scored_sources:
        return (f"{source_key}={source!r} has no rule scorer (registered: {', '.join(sorted(scored_sources))}; register one, or set "
                "reward.custom_reward_function.path)")
    if (row.get("reward_model") or {}).get("ground_truth") is None:
        return "reward_model.ground_truth is missing (the rule scorer compares the response with it)"
    return None


def find_bad_rows(rows: list[dict[str, Any]], checks: list[RowCheck]) -> dict[int, str]:
    """Row index -> its first problem, for the rows some check rejects."""
    bad = {}
    for i, row in enumerate(rows):
        for check in checks:
            problem = check(row)
            if problem is not None:
                bad[i] = problem
                break
    return bad


def bad_rows_report(bad: dict[int, str], origins: list[tuple[str, int]], total: int) -> str:
    """"N of M rows are unusable:" then each problem's count and its first few file:row locations."""
    by_problem: dict[str, list[int]] = defaultdict(list)
    for i, problem in bad.items():
        by_problem[problem].append(i)
    lines = [f"{len(bad)} of {total} rows are unusable:"]
    for problem, rows in sorted(by_problem.items(), key=lambda item: -len(item[1])):
        where = ", ".join(f"{origins[i][0]}:{origins[i][1]}" for i in rows[:SHOWN]) + (", ..." if len(rows) > SHOWN else "")
        lines.append(f"  {len(rows)} x {problem} (at {where})")
    return "\n".join(lines)
