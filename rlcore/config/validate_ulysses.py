"""Rules for Ulysses sequence parallelism (`<role>.ulysses_sequence_parallel_size`, FSDP2 engine): a role's size,
read from either of verl's two places, and what it needs. `c` is validate's checker (get / error)."""

from __future__ import annotations

ARR = "actor_rollout_ref"

# role -> (the role's own key, its fsdp_config's key: verl's newer engine config reads the size there, its older
# workers from the role's section; either sets it), the model section whose use_remove_padding it needs, strategy key
SP_KEYS = {
    "actor": (f"{ARR}.actor.ulysses_sequence_parallel_size", f"{ARR}.actor.fsdp_config.ulysses_sequence_parallel_size",
              f"{ARR}.model", f"{ARR}.actor.strategy"),
    "ref": (f"{ARR}.ref.ulysses_sequence_parallel_size", f"{ARR}.ref.fsdp_config.ulysses_sequence_parallel_size",
            f"{ARR}.model", f"{ARR}.ref.strategy"),
    "critic": ("critic.ulysses_sequence_parallel_size", "critic.model.fsdp_config.ulysses_sequence_parallel_size",
               "critic.model", "critic.strategy"),
    "reward_model": ("reward_model.ulysses_sequence_parallel_size", None, "reward_model.model", "reward_model.strategy"),
}


def sequence_parallel_size(*values) -> int:
    """The size from a role's keys (None: a key the section does not have): the one that is not 1 (validation
    refuses two different sizes)."""
    return max((int(v) for v in values if v is not None and v > 1), default=1)


def role_sp(get, role: str) -> int:
    """A role's size (`get`: a config getter by dotted key); the reference's is the actor's unless set (it shares
    the actor's processes and batches)."""
    role_key, fsdp_key, _, _ = SP_KEYS[role]
    own = sequence_parallel_size(get(role_key), get(fsdp_key) if fsdp_key else None)
    return role_sp(get, "actor") if role == "ref" and own == 1 else own


def sp_key(get, role: str) -> str:
    """The key that sets a role's size, for messages (the role's own key when neither does)."""
    sp = role_sp(get, role)
    return next((k for k in SP_KEYS[role][:2] if k and get(k) == sp), SP_KEYS[role][0])


def check_ulysses(c, role: str) -> None:
    """A role's sequence parallelism: one size, FSDP2 only, on packed sequences (verl's rule: sp > 1 needs
    use_remove_padding, since the slices are cut from the packed row)."""
    role_key, fsdp_key, model, strategy_key = SP_KEYS[role]
    values = {key: c.get(key) for key in (role_key, fsdp_key) if key}
    if role == "ref" and values[role_key] == c.get(SP_KEYS["actor"][0]):
        values.pop(role_key)  # the actor's value, interpolated (verl's default): the actor's checks cover it
    for key, value in values.items():
        if value is None or value < 1:
            c.error(f"{key}={value} must be >= 1; use {key}=1")
            return
    if len({v for v in values.values() if v != 1}) > 1 and fsdp_key in values and role_key in values:
        c.error(f"{role_key}={values[role_key]} and {fsdp_key}={values[fsdp_key]} disagree (verl reads either place); "
                f"set one of them, e.g. {role_key}={values[role_key]} {fsdp_key}=1")
        return
    sp = sequence_parallel_size(*values.values())
    if sp == 1:  # (a reference left at 1 follows the actor, whose checks cover it)
        return
    key = next(k for k, v in values.items() if v == sp)
    if c.get(strategy_key) == "megatron":
        c.error(f"{key}={sp} (Ulysses) runs on the FSDP2 engine; with {strategy_key}=megatron split sequences with "
                f"megatron.context_parallel_size (refused by rlcore's megatron engine) or use {strategy_key}=fsdp2")
    elif not c.get(f"{model}.use_remove_padding"):
        c.error(f"{key}={sp} slices the packed sequence, which needs {model}.use_remove_padding=True (verl's rule too); "
                f"use {model}.use_remove_padding=True or {key}=1")
    if role == "ref" and sp != role_sp(c.get, "actor"):
        actor = SP_KEYS["actor"][0]
        c.error(f"{key}={sp} differs from the actor's {actor}={role_sp(c.get, 'actor')}: the reference runs in the actor's "
                f"processes on the actor's data layout; use {key}={role_sp(c.get, 'actor')}")
