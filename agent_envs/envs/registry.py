"""The one registry of environments: env ids, ``gym.register`` calls and CLI choices derive from it.

Environments are plug-ins, found in two places (docs/api.md#adding-an-environment):

- **a folder of this package**: any sub-package of ``agent_envs.envs`` whose ``__init__`` defines
  ``environments()``; adding one is adding its folder, nothing else;
- **another installed package**: an entry point in the group :data:`ENTRY_POINT_GROUP`
  (``[project.entry-points."agent_envs.environments"]``) naming an object of that package.

Either way the object is an :class:`EnvSpec`, a sequence of them, or a callable returning one of
those.  Folders come first, ordered by their ``ORDER`` (the first environment is eval's default),
then the entry points by name.  Layers above (rollout callers, the report, the CLI, the engine
pools) look a spec up here by id and pass it down; nothing below the environments names one.
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points
from typing import Any, Iterable

from agent_envs.core.spec import EnvSpec

#: the entry-point group a third-party package declares its environments in
ENTRY_POINT_GROUP = "agent_envs.environments"
#: a folder without ``ORDER`` sorts after those with one (by folder name)
LAST = 1_000


def specs_of(found: Any, source: str) -> tuple[EnvSpec, ...]:
    """The specs a plug-in object stands for (a spec, a sequence of specs, or a callable giving
    either); anything else is a TypeError naming ``source``."""
    if callable(found) and not isinstance(found, EnvSpec):
        found = found()
    specs = (found,) if isinstance(found, EnvSpec) else tuple(found) if isinstance(found, (list, tuple)) else None
    if not specs or not all(isinstance(s, EnvSpec) for s in specs):
        raise TypeError(f"environment plug-in {source} gave {found!r}, not an EnvSpec or a sequence of them")
    return specs


def folder_specs() -> list[tuple[str, tuple[EnvSpec, ...]]]:
    """``(folder module, its specs)`` for every folder of ``agent_envs.envs`` that defines
    ``environments()``, in ``ORDER`` then name order."""
    package = importlib.import_module("agent_envs.envs")
    found = []
    for info in pkgutil.iter_modules(package.__path__, "agent_envs.envs."):
        if not info.ispkg:
            continue
        module = importlib.import_module(info.name)
        if hasattr(module, "environments"):
            found.append((getattr(module, "ORDER", LAST), info.name, specs_of(module.environments, info.name)))
    return [(name, specs) for _, name, specs in sorted(found, key=lambda t: (t[0], t[1]))]


def entry_point_specs(group: str = ENTRY_POINT_GROUP) -> list[tuple[str, tuple[EnvSpec, ...]]]:
    """``(entry point, its specs)`` for every installed package's entry point in ``group``, by name.
    A plug-in that fails to load is an error naming it (a broken plug-in is not silently left out)."""
    found = []
    for ep in sorted(entry_points(group=group), key=lambda e: (e.name, e.value)):
        source = f"entry point {ep.name} = {ep.value} ({group})"
        try:
            loaded = ep.load()
        except Exception as exc:
            raise ImportError(f"{source} failed to load: {exc!r}") from exc
        found.append((source, specs_of(loaded, source)))
    return found


def collect(sources: Iterable[tuple[str, tuple[EnvSpec, ...]]]) -> dict[str, EnvSpec]:
    """One table by id; two sources declaring the same id is an error naming both."""
    table: dict[str, EnvSpec] = {}
    origin: dict[str, str] = {}
    for source, specs in sources:
        for s in specs:
            if s.id in table:
                raise ValueError(f"environment {s.id!r} is declared twice: by {origin[s.id]} and by {source}")
            table[s.id], origin[s.id] = s, source
    return table


#: every environment: this package's folders, then the installed plug-ins
SPECS: dict[str, EnvSpec] = collect([*folder_specs(), *entry_point_specs()])

ENV_IDS: tuple[str, ...] = tuple(SPECS)


def spec(env_id: str) -> EnvSpec:
    """The spec of a registered environment; an unknown id is an error naming the known ones."""
    found = SPECS.get(env_id)
    if found is None:
        raise KeyError(f"unknown environment {env_id!r}; registered: {', '.join(ENV_IDS)}")
    return found


def spec_of(rows: Iterable[dict[str, Any]]) -> EnvSpec | None:
    """The spec of the environment that wrote ``rows`` (their first ``env_id``), None when they name
    no registered one (records of another version, or rows built by hand)."""
    env_id = next((r.get("env_id") for r in rows if r.get("env_id")), None)
    return SPECS.get(str(env_id)) if env_id is not None else None


def register_all() -> None:
    """``gym.register`` every environment (idempotent)."""
    import gymnasium as gym

    from gymnasium.envs.registration import WrapperSpec

    # applied outside a TimeLimit, so that its cut ends the episode with a record (envs/time_limit.py)
    record_truncation = WrapperSpec("RecordTruncation", "agent_envs.envs.time_limit:RecordTruncation", {})
    for env_id, env_spec in SPECS.items():
        if env_id not in gym.registry:
            # max_episode_steps is left unset: the environment enforces its own turn limit and
            # reports it as termination_reason="max_turns"; a TimeLimit of the caller's ends it
            # with "time_limit"
            gym.register(
                id=env_id,
                entry_point=env_spec.entry_point,
                nondeterministic=False,
                additional_wrappers=(record_truncation,),
            )
