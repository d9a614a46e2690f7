"""A notes database in in-memory SQLite, as an agentrl environment plugin (docs/own_tools.md).

Tools: ``add_note``, ``search_notes``, ``delete_note``, ``count_notes``. Every episode gets its own
in-memory database, filled from ``task.initial_state["notes"]`` (ids 1, 2, ... in that order).
The reward compares the database the episode left with ``task.metadata["notes"]``, the exact set
of notes (title, body, tags) that should exist at the end. It reads that database in one of two
ways (docs/own_tools.md, "The reward function"), both registered here:

* ``notes_goal_live`` (the backend's default): the episode's own database, before agentrl closes
  it (``live_session=True``). Each call runs once; what to copy for a database server or any
  service whose answers carry ids or timestamps;
* ``notes_goal``: a fresh database with the episode's calls replayed (``final_backend``). Fine
  here, since an in-memory database from the same notes gives the same answers to the same calls,
  but every call runs twice; a task picks it with ``"reward": "notes_goal"``.
"""

from __future__ import annotations

import sqlite3
from collections import Counter
from contextlib import closing

from agentrl.envs.registry import register_backend
from agentrl.rewards.registry import Score, final_backend, register_reward


class NotesDB:
    TOOLS = ("add_note", "search_notes", "delete_note", "count_notes")

    def __init__(self, task):
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.executescript(
            "CREATE TABLE notes (id INTEGER PRIMARY KEY AUTOINCREMENT, title TEXT NOT NULL, body TEXT NOT NULL);"
            "CREATE TABLE tags (note_id INTEGER NOT NULL REFERENCES notes(id) ON DELETE CASCADE, tag TEXT NOT NULL,"
            " PRIMARY KEY (note_id, tag));"
        )
        self.db.execute("PRAGMA foreign_keys = ON")
        for note in (task.initial_state or {}).get("notes", []):
            self._insert(note["title"], note.get("body", ""), note.get("tags", []))

    def _insert(self, title: str, body: str, tags: list[str]) -> int:
        with self.db:
            note_id = self.db.execute("INSERT INTO notes (title, body) VALUES (?, ?)", (title, body)).lastrowid
            self.db.executemany("INSERT OR IGNORE INTO tags VALUES (?, ?)",
                                [(note_id, t.strip().lower()) for t in tags if t.strip()])
        return note_id

    def _tags(self, note_id: int) -> list[str]:
        return [r[0] for r in self.db.execute("SELECT tag FROM tags WHERE note_id = ? ORDER BY tag", (note_id,))]

    # ------------------------------------------------------------------ the tools

    def add_note(self, title: str, body: str, tags: list[str]) -> dict:
        """Create a new note.

        Args:
            title: The note's title.
            body: The note's text.
            tags: Labels for the note, e.g. ["work", "urgent"]; may be empty.
        """
        if not title.strip():
            raise ValueError("title must not be empty")
        return {"note_id": self._insert(title.strip(), body, tags)}

    def search_notes(self, tag: str) -> dict:
        """List the notes that carry a tag.

        Args:
            tag: The tag to look for.
        """
        rows = self.db.execute(
            "SELECT n.id, n.title FROM notes n JOIN tags t ON t.note_id = n.id WHERE t.tag = ? ORDER BY n.id",
            (tag.strip().lower(),)).fetchall()
        return {"notes": [{"note_id": i, "title": title, "tags": self._tags(i)} for i, title in rows]}

    def delete_note(self, note_id: int) -> dict:
        """Delete a note by its id.

        Args:
            note_id: The id of the note to delete.
        """
        with self.db:
            if self.db.execute("DELETE FROM notes WHERE id = ?", (note_id,)).rowcount == 0:
                raise LookupError(f"no note with id {note_id}")
        return {"deleted": note_id}

    def count_notes(self) -> dict:
        """Count the notes in the database."""
        return {"count": self.db.execute("SELECT COUNT(*) FROM notes").fetchone()[0]}

    def call(self, name: str, arguments: dict):
        return getattr(self, name)(**arguments)

    def close(self) -> None:
        """Called by agentrl when the episode ends, after a live-session reward read it (and by
        ``notes_goal`` on its replay)."""
        self.db.close()

    # ------------------------------------------------------------------ for the reward

    def snapshot(self) -> list[dict]:
        """Every note as {title, body, tags}, in id order."""
        rows = self.db.execute("SELECT id, title, body FROM notes ORDER BY id").fetchall()
        return [{"title": t, "body": b, "tags": self._tags(i)} for i, t, b in rows]


def _key(note: dict) -> tuple:
    return note["title"], note.get("body", ""), tuple(sorted(t.lower() for t in note.get("tags", [])))


def goal_checks(initial: list[dict], final: list[dict], goal: dict) -> list[bool]:
    """The checks of one episode's end state, all true exactly when it is the goal state.

    One per change the task asks for (a note to add is there, a note to delete is gone), so doing
    nothing earns no credit, and one for "exactly the goal's notes, nothing else".
    """
    start, have, want = Counter(map(_key, initial)), Counter(map(_key, final)), Counter(map(_key, goal["notes"]))
    added = [have[k] >= want[k] for k in want - start]
    removed = [have[k] <= want[k] for k in start - want]
    return [*added, *removed, have == want]


def goal_score(episode, task, notes: NotesDB) -> Score:
    """Outcome 1 when the database ``notes`` holds the goal's notes and every turn was answered;
    the process score is the fraction of checks that hold."""
    checks = goal_checks((task.initial_state or {}).get("notes", []), notes.snapshot(), task.metadata)
    checks.append(episode.termination == "done")
    return Score(outcome=float(all(checks)), process=sum(checks) / len(checks))


def notes_goal_live(episode, task, notes: NotesDB) -> Score:
    """The database the episode's calls ran against, still open (agentrl closes it afterwards)."""
    return goal_score(episode, task, notes)


def notes_goal(episode, task) -> Score:
    """A fresh database with the episode's calls replayed (checked to give the same answers)."""
    with closing(final_backend(episode, task)) as notes:  # the replayed copy is ours to close
        return goal_score(episode, task, notes)


register_backend("sqlite_notes", NotesDB, tools=[getattr(NotesDB, n) for n in NotesDB.TOOLS],
                 reward="notes_goal_live")
register_reward("notes_goal_live", notes_goal_live, live_session=True)
register_reward("notes_goal", notes_goal)
