"""What the session-long side checks share (the soak, the DRA resync): a copy of the thing under test on a node of
its own, started once and always removed, even when its start is interrupted."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TypeVar

__all__ = ["Watch"]

_W = TypeVar("_W", bound="Watch")


class Watch(ABC):
    """``with SomeWatch(...) as watch:`` starts the copy and removes it on the way out."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def close(self) -> None: ...

    def __enter__(self: _W) -> _W:
        try:
            self.start()
        except BaseException:  # an interrupt mid-start: remove what it deployed
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
