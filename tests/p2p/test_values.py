"""The cores' frozen values with a written `__init__` (p2p.swarm.events says why) take
their fields in order with the dataclass's defaults, set each field to its own
argument, and stay frozen, comparable and hashable."""

from __future__ import annotations

import dataclasses
import inspect
from types import ModuleType

import pytest

from p2p.swarm import events, links, node
from tracker import machine, registry

MODULES = (events, node, links, registry, machine)
# The values a simulation makes by the million: they must keep their written __init__.
HOT = {events.PeerHas, events.PeerPending, events.ChunkArrived, events.PeerJoined,
       events.Request, events.Advertise, events.Cancel, node.SwarmActions, links.JoinHeard,
       registry.Member, machine.ContentAnnounce}


def _written(module: ModuleType) -> list[type]:
    return [cls for _, cls in inspect.getmembers(module, inspect.isclass)
            if cls.__module__ == module.__name__ and dataclasses.is_dataclass(cls)
            and not cls.__dataclass_params__.init  # type: ignore[attr-defined]
            and dataclasses.fields(cls)]  # (one without fields has object's __init__)


VALUES = [cls for module in MODULES for cls in _written(module)]


def test_the_hot_values_have_a_written_init() -> None:
    assert set(VALUES) >= HOT


@pytest.mark.parametrize("cls", VALUES, ids=lambda cls: cls.__qualname__)
def test_a_written_init_takes_the_fields_in_order(cls: type) -> None:
    fields = dataclasses.fields(cls)
    params = list(inspect.signature(cls).parameters.values())
    assert [p.name for p in params] == [f.name for f in fields]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)
    assert [p.default for p in params] == [
        inspect.Parameter.empty if f.default is dataclasses.MISSING else f.default
        for f in fields]
    # Each field gets its own argument (by position and by name), and stays frozen.
    args = [f"arg-{f.name}" for f in fields]
    value = cls(*args)
    assert [getattr(value, f.name) for f in fields] == args
    assert value == cls(**{f.name: a for f, a in zip(fields, args, strict=True)})
    assert hash(value) == hash(cls(*args))
    with pytest.raises(dataclasses.FrozenInstanceError):
        setattr(value, fields[0].name, "changed")
