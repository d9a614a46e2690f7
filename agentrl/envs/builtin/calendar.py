"""Calendar: one-week agenda of titled events. Events are found by day (``list_events``), which is
the lookup a plan needs before it can move or cancel an event it has not created itself."""

from __future__ import annotations

from typing import Literal, TypedDict

from agentrl.envs.builtin.base import Domain, ToolError, check_text

Day = Literal["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]
DAYS: tuple[str, ...] = Day.__args__  # type: ignore[attr-defined]


class EventId(TypedDict):
    event_id: str


class EventSummary(TypedDict):
    event_id: str
    title: str


class EventList(TypedDict):
    events: list[EventSummary]


class MovedEvent(TypedDict):
    event_id: str
    day: str


class Cancelled(TypedDict):
    cancelled: str


def _check_day(day: str) -> None:
    if day not in DAYS:
        raise ToolError(f"day must be one of {', '.join(DAYS)}; got {day!r}")


class Calendar(Domain):
    """State: ``{"seq": int, "events": {id: {"title": str, "day": str}}}``."""

    id_prefix = "E"
    records_key = "events"

    def create_event(self, title: str, day: Day) -> EventId:
        """Create an event on a day of the week and return its id.

        Args:
            title: Short title of the event.
            day: Day of the week, lowercase.
        """
        check_text(title, "title", 40)
        _check_day(day)
        event_id = self._new_id()
        self.records[event_id] = {"title": title, "day": day}
        return {"event_id": event_id}

    def list_events(self, day: Day) -> EventList:
        """List the events on a day of the week, with their ids.

        Args:
            day: Day of the week, lowercase.
        """
        _check_day(day)
        found = [{"event_id": i, "title": e["title"]} for i, e in self.records.items() if e["day"] == day]
        # Sorted so the answer is a function of the state, not of the creation history.
        return {"events": sorted(found, key=lambda e: (e["title"], e["event_id"]))}

    def move_event(self, event_id: str, day: Day) -> MovedEvent:
        """Move an event to another day.

        Args:
            event_id: Id of the event, e.g. E1234.
            day: New day of the week, lowercase.
        """
        event = self._get(event_id, "event")
        _check_day(day)
        if event["day"] == day:
            raise ToolError(f"event {event_id} is already on {day}")
        event["day"] = day
        return {"event_id": event_id, "day": day}

    def cancel_event(self, event_id: str) -> Cancelled:
        """Cancel (delete) an event.

        Args:
            event_id: Id of the event, e.g. E1234.
        """
        self._get(event_id, "event")
        del self.records[event_id]
        return {"cancelled": event_id}
