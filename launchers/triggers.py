"""One extra profiler window, asked for while the job runs (issue 30): the rank's side.

When the live monitor of ``rankscope run`` notices the job slow down, it writes
``RUN/trigger.json`` = ``{"id", "start_step", "steps", "reason"}``: record ``steps`` steps from
profiler step ``start_step`` (``ProfilerStep#start_step``, i.e. once ``start_step`` steps are
done), on every rank. No collective is added to the user's job: every rank's probe thread looks
for the file (every :data:`~rankscope.launchers.hang_probe.REQUEST_POLL_S`) and hands it to
:meth:`RankTriggers.take_trigger`; the monitor chose ``start_step`` far enough ahead that every
rank sees the file before it gets there, and a rank that saw it too late (or where the window
would overlap a scheduled one) refuses it and says so in ``meta.json`` (``triggers``) rather
than record another step than the others.

The profiler's schedule is :meth:`RankTriggers._schedule`: torch's own schedule from the settings,
except in the steps of an accepted trigger (its warm-up steps, its recorded steps). The window is
exported, written and numbered like the scheduled ones (the next index of the rank's counter);
its record in ``meta.json`` ``windows[]`` carries ``"trigger": {"id", "reason"}``.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rankscope.launchers.spec import ProfilerSettings

#: Key of meta.json listing the trigger requests the rank saw, accepted or not.
TRIGGERS_KEY = "triggers"


@dataclass(frozen=True)
class Trigger:
    """An accepted request for an extra window."""

    id: int
    start_step: int
    """First recorded profiler step."""
    steps: int
    """Recorded steps."""
    warmup: int
    """Warm-up steps before ``start_step``."""
    reason: str

    @property
    def last_step(self) -> int:
        return self.start_step + self.steps - 1


def parse_trigger(doc: Any) -> tuple[int, int, int, str] | None:
    """(id, start_step, steps, reason) of a ``trigger.json`` document, None when malformed."""
    if not isinstance(doc, dict):
        return None
    try:
        ident, start, steps = (int(doc[k]) for k in ("id", "start_step", "steps"))
    except (KeyError, TypeError, ValueError):
        return None
    if start < 0 or steps < 1:
        return None
    return ident, start, steps, str(doc.get("reason", ""))


class RankTriggers:
    """Triggered windows of one rank (mixed into
    :class:`~rankscope.launchers.runtime.RankRuntime`, which sets these attributes)."""

    settings: ProfilerSettings
    meta: dict[str, Any]
    lock: threading.RLock
    _triggers: list[Trigger]
    _base_schedule: Any
    _actions: dict[str, Any]

    if TYPE_CHECKING:

        def write_meta(self) -> None: ...

    def _schedule(self, step: int) -> Any:
        """The profiler's action for ``ProfilerStep#step``: an accepted trigger's, else the
        scheduled one's."""
        for t in self._triggers:
            if t.start_step - t.warmup <= step <= t.last_step:
                if step < t.start_step:
                    return self._actions["warmup"]
                return self._actions["save" if step == t.last_step else "record"]
        return self._base_schedule(step)

    def take_trigger(self, doc: Any) -> None:
        """In the probe's thread: a new ``trigger.json``; accepted when the rank is still
        before its first warm-up step (one step to spare: the training thread may be ending a
        step right now) and the window fits the schedule; recorded in ``meta.json`` either way."""
        parsed = parse_trigger(doc)
        if parsed is None:
            return
        ident, start, steps, reason = parsed
        with self.lock:
            seen = self.meta.setdefault(TRIGGERS_KEY, [])
            if any(t.get("id") == ident for t in seen):
                return
            done = int(self.meta["steps"])
            warmup = self.settings.warmup
            why = None
            if done + 1 >= start - warmup:
                why = f"seen at step {done}, too late for step {start - warmup}"
            elif not self.settings.window_fits(start, steps) or any(
                start - warmup <= t.last_step + 1 and t.start_step - t.warmup <= start + steps
                for t in self._triggers
            ):
                why = "overlaps another window"
            seen.append(
                {
                    "id": ident,
                    "start_step": start,
                    "steps": steps,
                    "reason": reason,
                    "seen_at_step": done,
                    "accepted": why is None,
                    "why": why,
                }
            )
            if why is None:
                self._triggers.append(Trigger(ident, start, steps, warmup, reason))
        self.write_meta()  # what the rank made of it, readable at once

    def _trigger_of(self, last_step: int) -> Trigger | None:
        """The accepted trigger whose window ends at ``last_step``."""
        return next((t for t in self._triggers if t.last_step == last_step), None)
