"""``onlinerec.registry.Registry``: short names, class paths and classes all name a component; a name is taken once;
errors list the choices and say what is wrong with a class path; ``path_of`` gives the string that resolves back."""

from __future__ import annotations

import re

import pytest

from onlinerec.cells import CELLS, ELSTMCell
from onlinerec.gradients import METHODS, RTRL
from onlinerec.registry import Registry


class Part:
    """The base class of the registry under test."""


class Gear(Part):
    pass


class Wheel(Part):
    def __init__(self, size: int = 1) -> None:
        self.size = size


class Axle(Part):
    """A Part that no registry names: reachable by its class path."""


class Stranger:
    """Not a Part."""


def parts() -> Registry:
    return Registry("part", Part, {"Gear": Gear, "wheel": Wheel})


def test_names_are_lower_case_and_the_registry_is_a_read_only_mapping():
    registry = parts()
    assert registry["gear"] is Gear and registry["GEAR"] is Gear and registry["Wheel"] is Wheel
    assert sorted(registry) == ["gear", "wheel"] and len(registry) == 2
    assert "gear" in registry and "axle" not in registry
    assert repr(registry) == "Registry('part': gear, wheel)"
    with pytest.raises(TypeError):
        registry["axle"] = Axle  # type: ignore[index]


def test_register_works_as_a_decorator_and_refuses_a_taken_name_or_a_foreign_class():
    registry = parts()

    @registry.register("Spoke")
    class Spoke(Part):
        pass

    assert registry["spoke"] is Spoke and Spoke.__name__ == "Spoke"  # the decorator returns the class
    registry.register("gear", Gear)  # the same class again: nothing changes
    assert len(registry) == 3
    with pytest.raises(ValueError, match=r"part name 'gear' is taken by Gear\."):
        registry.register("GEAR", Wheel)
    with pytest.raises(TypeError, match=r"only Part subclasses can be registered as a part"):
        registry.register("stranger", Stranger)
    assert registry["gear"] is Gear and "stranger" not in registry


def test_resolve_takes_a_name_a_class_path_or_a_class():
    registry = parts()
    assert registry.resolve("Wheel") is Wheel
    assert registry.resolve(f"{__name__}.Gear") is Gear
    assert registry.resolve(f"{__name__}.Axle") is Axle  # no registration needed
    assert registry.resolve(Axle) is Axle


def test_an_unknown_name_lists_the_choices_and_the_other_ways_to_name_a_part():
    registry = parts()
    message = (
        "unknown part 'gearbox'; choose one of ['gear', 'wheel'], give a class path "
        "('my_package.module.MyClass', a Part subclass), or pass an instance."
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        registry.resolve("gearbox")
    with pytest.raises(KeyError, match=re.escape(message)):
        registry["gearbox"]


def test_the_unknown_name_message_says_an_before_a_vowel():
    with pytest.raises(ValueError, match=re.escape("('my_package.module.MyClass', an ElementwiseCell subclass)")):
        CELLS.resolve("rtuu")


def test_a_class_path_that_names_no_part_says_what_is_wrong():
    registry = parts()
    with pytest.raises(ValueError, match=r"cannot import the part class path 'no_such_package\.Gear'.*installed\?"):
        registry.resolve("no_such_package.Gear")
    with pytest.raises(ValueError, match=rf"names no class: {__name__} has no class 'Pulley'"):
        registry.resolve(f"{__name__}.Pulley")
    with pytest.raises(TypeError, match=r"is not a part: Stranger does not subclass Part"):
        registry.resolve(f"{__name__}.Stranger")
    with pytest.raises(TypeError, match=r"is not a part: Stranger does not subclass Part"):
        registry.resolve(Stranger)
    with pytest.raises(TypeError, match=r"a part is given by name, class path, Part subclass or instance; got int 42"):
        registry.resolve(42)


def test_build_makes_an_instance_or_passes_one_through():
    registry = parts()
    wheel = registry.build("wheel", size=3)
    assert type(wheel) is Wheel and wheel.size == 3
    assert registry.build(wheel) is wheel
    assert type(registry.build(f"{__name__}.Axle")) is Axle
    with pytest.raises(ValueError, match=r"got a part instance \(Wheel\) and arguments to build one"):
        registry.build(wheel, size=2)


def test_path_of_is_the_name_or_the_class_path_and_resolves_back():
    registry = parts()
    assert registry.path_of(Gear) == "gear" and registry.path_of(Wheel()) == "wheel"
    assert registry.path_of(Axle()) == f"{__name__}.Axle"
    for obj in (Gear, Wheel(2), Axle, Axle()):
        cls = obj if isinstance(obj, type) else type(obj)
        assert registry.resolve(registry.path_of(obj)) is cls


def test_the_cells_and_the_gradient_methods_are_registries():
    assert isinstance(CELLS, Registry) and isinstance(METHODS, Registry)
    assert CELLS["elstm"] is ELSTMCell and CELLS.path_of(ELSTMCell) == "elstm"
    assert METHODS.resolve("RTRL") is RTRL and type(METHODS.build("rtrl")) is RTRL
