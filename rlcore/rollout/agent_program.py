"""Agent programs as agent loops: a function written against the `openai` client, trained through the recording
endpoint (rlcore.rollout.openai_endpoint). In agent_loop_config_path:

    - name: calculator
      _target_: rlcore.rollout.agent_program.AgentProgramLoop
      program: agent_loops/calculator_program.py:run   # "path/to/file.py:function" or "package.module:function"
      timeout_s: 60                                    # a run past it is abandoned, counted and scored failure_score
      failure_score: 0.0

The function is called once per row as `function(base_url, api_key, **row)` (row: the batch's columns for the row,
`raw_prompt` among them) in a thread of its own, or awaited if it is `async def`. It builds `OpenAI(base_url=...,
api_key=...)` and runs its own loop. It returns a float (the trajectory's reward) or None (then compute_score scores
the decoded trajectory, as for any row). Or, with `command: [python, my_agent.py]` instead of `program`, the agent
is a process per row: OPENAI_BASE_URL and OPENAI_API_KEY in its environment (which the `openai` client reads), the
row as JSON on its stdin, its reward as the last line of its stdout (a number or `null`), a non-zero exit a failure.

A program that raises (or a process that exits non-zero) or runs past `timeout_s` is counted
(`agent/metrics/program_error`, `.../program_timeout`), its row keeps what it sampled so far and scores
`failure_score`, and the step goes on (its own time: the wall time less the time its calls waited for the
engine). A process past its time is killed with its process group; an abandoned thread cannot be killed: its later
calls are refused (the key is closed), so it ends at its next request.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import importlib.util
import inspect
import json
import os
import shlex
import signal
import sys
import threading
import time
from functools import partial
from typing import Any, Callable

from rlcore.rollout.agent_api import AgentLoopBase, AgentLoopOutput
from rlcore.rollout.agent_loop import PARSERS, ToolResponseIds
from rlcore.rollout.openai_endpoint import Session, endpoint


def in_daemon_thread(fn: Callable[[], Any]) -> asyncio.Future:
    """fn() in a thread of its own, as a future of the running event loop. A daemon thread: one abandoned past its
    timeout must not hold the worker's exit (a pool's threads are joined at interpreter exit)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(ok: bool, value: Any) -> None:
        if not future.done():
            future.set_result(value) if ok else future.set_exception(value)

    def target() -> None:
        try:
            outcome = (True, fn())
        except BaseException as err:  # noqa: BLE001 -- handed to the awaiting coroutine
            outcome = (False, err)
        try:
            loop.call_soon_threadsafe(settle, *outcome)
        except RuntimeError:  # abandoned: the rollout that waited for it is over and its event loop closed
            pass

    threading.Thread(target=target, name="rlcore-agent-program", daemon=True).start()
    return future


def load_program(spec: str) -> Callable[..., Any]:
    """"file.py:function" or "module:function" -> the function."""
    where, _, name = spec.rpartition(":")
    if not where or not name:
        raise ValueError(f"program={spec!r} must be 'path/to/file.py:function' or 'package.module:function'")
    if where.endswith(".py"):
        path = os.path.abspath(os.path.expanduser(where))
        module_name = f"rlcore_agent_program_{abs(hash(path))}"
        module = sys.modules.get(module_name)
        if module is None:
            if not os.path.isfile(path):
                raise ValueError(f"program={spec!r}: {path} does not exist")
            loader = importlib.util.spec_from_file_location(module_name, path)
            module = importlib.util.module_from_spec(loader)
            loader.loader.exec_module(module)
            sys.modules[module_name] = module
    else:
        module = importlib.import_module(where)
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"program={spec!r}: {where} has no function {name}")
    return fn


def _argv(command: Any) -> list[str]:
    return shlex.split(command) if isinstance(command, str) else [str(part) for part in command]


def _plain_json(value: Any) -> Any:
    """The row's numpy values (index, arrays) as JSON."""
    return value.tolist() if hasattr(value, "tolist") else str(value)


class AgentProgramLoop(AgentLoopBase):
    """Runs one agent program per row against the recording endpoint and returns what it recorded."""

    def __init__(self, *args: Any, program: str | None = None, command: Any = None, timeout_s: float = 300.0,
                 failure_score: float = 0.0, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.program = load_program(program) if program else None
        self.command = _argv(command) if command else None
        self.timeout_s, self.failure_score = float(timeout_s), float(failure_score)
        rollout = self.config.actor_rollout_ref.rollout
        self.budget = rollout.response_length
        self.render = ToolResponseIds(self.tokenizer, self.apply_chat_template_kwargs)
        self.parse = PARSERS[rollout.multi_turn.format]

    async def _within_timeout(self, task: asyncio.Future, session: Session) -> Any:
        """The program's result, or TimeoutError once its own time (wall time less the time its calls waited for
        the engine, which a busy step stretches) passes timeout_s."""
        start = time.monotonic()
        while True:
            left = self.timeout_s - (time.monotonic() - start - session.engine_wait_s)
            if left <= 0:
                task.cancel()  # a process is killed here; a thread is abandoned
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
                raise asyncio.TimeoutError
            done, _ = await asyncio.wait({task}, timeout=left)
            if done:
                return task.result()

    async def _process(self, base_url: str, key: str, row: dict[str, Any], session: Session) -> Any:
        """The command as a process of its own group (killed whole if cancelled); its stdout's last line."""
        env = {**os.environ, "OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": key}
        proc = await asyncio.create_subprocess_exec(*self.command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE, env=env, start_new_session=True)
        try:
            out, err = await proc.communicate(json.dumps(row, default=_plain_json).encode())
        except asyncio.CancelledError:  # past its time: the process and anything it started go
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
            raise
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or ["(no stderr)"]
            raise RuntimeError(f"exited with {proc.returncode}: {tail[0]}")
        last = (out.decode(errors="replace").strip().splitlines() or ["null"])[-1]
        try:
            return json.loads(last)
        except json.JSONDecodeError:
            return None  # a last line that is not a number: compute_score scores the trajectory

    @staticmethod
    def check_config(kwargs: dict[str, Any]) -> list[str]:
        """What is wrong with an agent_loop_config_path entry's arguments (checked before Ray starts)."""
        problems = []
        if bool(kwargs.get("program")) == bool(kwargs.get("command")):
            problems.append("give one of program (file.py:function or module:function) and command (the argv of a process per row)")
        elif kwargs.get("program"):
            try:
                load_program(str(kwargs["program"]))
            except (ValueError, ImportError, OSError, SyntaxError) as err:
                problems.append(f"program: {err}")
        elif not _argv(kwargs["command"]):
            problems.append(f"command={kwargs['command']!r} is empty; give the argv, e.g. [python, my_agent.py]")
        if not float(kwargs.get("timeout_s", 300.0)) > 0:
            problems.append(f"timeout_s={kwargs.get('timeout_s')} must be > 0 (seconds a program may run)")
        unknown = set(kwargs) - {"program", "command", "timeout_s", "failure_score"}
        if unknown:
            problems.append(f"unknown arguments {sorted(unknown)} (AgentProgramLoop takes program or command, timeout_s, failure_score)")
        return problems

    async def run(self, sampling_params: dict[str, Any], **row: Any) -> AgentLoopOutput:
        session = Session(self.server_manager, asyncio.get_running_loop(), self.tokenizer, self.render, self.parse, self.budget,
                          sampling_params)
        server = endpoint()
        key = server.open(session)
        status, reward = "ok", None
        try:
            if self.command is not None:
                call = self._process(server.base_url, key, row, session)
            elif inspect.iscoroutinefunction(self.program):
                call = self.program(server.base_url, key, **row)
            else:
                call = in_daemon_thread(partial(self.program, server.base_url, key, **row))
            reward = await self._within_timeout(asyncio.ensure_future(call), session)
        except asyncio.TimeoutError:
            status = "timeout"
        except Exception as err:  # noqa: BLE001 -- the user's program; counted, scored failure_score, the step goes on
            status = "error"
            name = " ".join(self.command) if self.command else getattr(self.program, "__qualname__", self.program)
            print(f"WARNING: agent program {name} failed: {type(err).__name__}: {err}", flush=True)
        finally:
            server.close(key)
        if status != "ok":
            reward = self.failure_score
        elif reward is not None and not isinstance(reward, (int, float)):
            reward = None  # anything but a number (the final messages, say): compute_score scores the trajectory
        prompt = session.prompt or await self.apply_chat_template(list(row.get("raw_prompt") or []))
        return AgentLoopOutput(
            prompt_ids=prompt, response_ids=session.response, response_mask=session.sampled, response_logprobs=session.log_probs,
            reward_score=None if reward is None else float(reward), num_turns=session.calls,
            metrics={"program_error": float(status == "error"), "program_timeout": float(status == "timeout"),
                     "calls": float(session.calls), "history_rewrites": float(session.rewrites)})
