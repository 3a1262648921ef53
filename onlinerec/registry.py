"""String aliases for configs and the command line: one :class:`Registry` per kind of component.

A registry maps short names ("elstm", "rtrl") to classes, and also resolves a class path
("my_pkg.cells.MyCell") or a class, so that a config, the CLI and a checkpoint can name *any* component, built-in
or a user's own, the same way. ``onlinerec.cells.CELLS`` and ``onlinerec.gradients.METHODS`` are the two in use.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any, Generic, TypeVar

__all__ = ["Registry"]

T = TypeVar("T")


class Registry(Mapping[str, type], Generic[T]):
    """Names to classes of one kind (all subclasses of ``base``), with errors that list the choices.

    It is a read-only mapping (``registry["elstm"]``, ``sorted(registry)``) plus :meth:`register`, :meth:`resolve`
    (a name, a class path or a class -> the class), :meth:`build` (also passes an instance through) and
    :meth:`path_of` (the string that :meth:`resolve` turns back into the class: its name if registered, else its
    class path, which is what checkpoints store).
    """

    def __init__(self, kind: str, base: type, entries: Mapping[str, type] | None = None) -> None:
        self.kind = kind
        self.base = base
        self._entries: dict[str, type] = {}
        for name, cls in (entries or {}).items():
            self.register(name, cls)

    # -- Mapping ------------------------------------------------------------------------------------------
    def __getitem__(self, name: str) -> type:
        try:
            return self._entries[name.lower()]
        except (KeyError, AttributeError):
            raise KeyError(self._unknown(name)) from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.kind!r}: {', '.join(self._entries)})"

    # -- registration and lookup --------------------------------------------------------------------------
    def register(self, name: str, cls: type | None = None) -> Any:
        """Register ``cls`` under ``name`` (lower-case); usable as a decorator: ``@CELLS.register("mine")``."""

        def add(c: type) -> type:
            if not (isinstance(c, type) and issubclass(c, self.base)):
                raise TypeError(f"only {self.base.__name__} subclasses can be registered as a {self.kind}, got {c!r}.")
            key = name.lower()
            if key in self._entries and self._entries[key] is not c:
                raise ValueError(f"{self.kind} name {key!r} is taken by {self._entries[key].__qualname__}.")
            self._entries[key] = c
            return c

        return add if cls is None else add(cls)

    def resolve(self, spec: str | type) -> type:
        """The class named by ``spec``: a registered name, a class path ``"package.module.Class"``, or a class."""
        if isinstance(spec, type):
            cls = spec
        elif isinstance(spec, str) and spec.lower() in self._entries:
            return self._entries[spec.lower()]
        elif isinstance(spec, str) and "." in spec:
            cls = _import_class_path(spec, self.kind)
        elif isinstance(spec, str):
            raise ValueError(self._unknown(spec))
        else:
            raise TypeError(
                f"a {self.kind} is given by name, class path, {self.base.__name__} subclass or instance; got {type(spec).__name__} {spec!r}."
            )
        if not issubclass(cls, self.base):
            raise TypeError(
                f"{spec!r} is not a {self.kind}: {cls.__qualname__} does not subclass {self.base.__name__}."
            )
        return cls

    def build(self, spec: Any, *args: Any, **kwargs: Any) -> T:
        """An instance: ``spec`` itself if it already is one, else ``resolve(spec)(*args, **kwargs)``."""
        if isinstance(spec, self.base):
            if args or kwargs:
                raise ValueError(
                    f"got a {self.kind} instance ({type(spec).__name__}) and arguments to build one; pass one or the other."
                )
            return spec  # type: ignore[return-value]
        return self.resolve(spec)(*args, **kwargs)

    def path_of(self, obj: Any) -> str:
        """The registered name of ``obj``'s class (or of ``obj`` if it is a class), else its class path."""
        cls = obj if isinstance(obj, type) else type(obj)
        for name, c in self._entries.items():
            if c is cls:
                return name
        return f"{cls.__module__}.{cls.__qualname__}"

    def _unknown(self, spec: Any) -> str:
        base = self.base.__name__
        article = "an" if base[:1] in "AEIOU" else "a"
        return (
            f"unknown {self.kind} {spec!r}; choose one of {sorted(self._entries)}, give a class path "
            f"('my_package.module.MyClass', {article} {base} subclass), or pass an instance."
        )


def _import_class_path(path: str, kind: str) -> type:
    module_name, _, attr = path.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except ImportError as err:
        raise ValueError(f"cannot import the {kind} class path {path!r}: {err}. Is its package installed?") from err
    cls = getattr(module, attr, None)
    if not isinstance(cls, type):
        raise ValueError(f"{path!r} names no class: {module_name} has no class {attr!r}.")
    return cls
