"""Start-or-join logic of the controller's Ray cluster (the real start is covered by the e2e tests)."""

import ray

from rlcore.controller.ray_group import init_ray


def test_joins_ray_address_from_env_and_does_not_own_it(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert init_ray(address=None, num_cpus=None) is False  # joined, so we must not shut it down
    assert calls[0]["address"] == "10.0.0.1:6379"


def test_config_address_wins_and_local_start_is_owned(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert init_ray(address="auto", num_cpus=None) is False and calls[-1]["address"] == "auto"
    assert init_ray(address=None, num_cpus=2) is True and calls[-1]["num_cpus"] == 2 and "address" not in calls[-1]


def test_the_runtime_env_goes_to_ray_init_whether_it_starts_or_joins(monkeypatch):
    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kw: calls.append(kw))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    env = {"py_executable": "uv run --frozen", "env_vars": {"A": "1"}}
    init_ray(address=None, num_cpus=2, runtime_env=env)
    init_ray(address="auto", num_cpus=None, runtime_env=env)
    init_ray(address=None, num_cpus=2)
    assert [c.get("runtime_env") for c in calls] == [env, env, None]
