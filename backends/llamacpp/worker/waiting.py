"""The scheduler's FIFO of tickets waiting for a slot, kept as groups (the `n` choices of one prompt).

Concurrency contract: not thread-safe by itself; every method is called holding the scheduler's lock.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

from backends.llamacpp.worker.tickets import Ticket


@dataclass
class _Group:
    key: int
    tickets: list[Ticket]


class WaitingQueue:
    """Groups in arrival order; a lone request is a group of one. `len` counts tickets."""

    def __init__(self) -> None:
        self._groups: deque[_Group] = deque()
        self._n_tickets = 0
        self._keys = 0

    def __len__(self) -> int:
        return self._n_tickets

    def push(self, tickets: list[Ticket]) -> None:
        self._keys += 1
        self._groups.append(_Group(self._keys, list(tickets)))
        self._n_tickets += len(tickets)

    def take(self, n: int) -> list[tuple[int, Ticket]]:
        """Up to `n` tickets from the front, each with its group's key; a group at the front gives as many
        members as fit and keeps the rest at the front (FIFO: nothing behind it overtakes them)."""
        taken: list[tuple[int, Ticket]] = []
        while self._groups and len(taken) < n:
            group = self._groups[0]
            k = min(n - len(taken), len(group.tickets))
            taken += [(group.key, ticket) for ticket in group.tickets[:k]]
            del group.tickets[:k]
            if not group.tickets:
                self._groups.popleft()
        self._n_tickets -= len(taken)
        return taken

    def drop_cancelled(self) -> list[Ticket]:
        """Remove and return every cancelled ticket."""
        dropped = [t for group in self._groups for t in group.tickets if t.cancelled]
        if dropped:
            for group in self._groups:
                group.tickets = [t for t in group.tickets if not t.cancelled]
            self._groups = deque(group for group in self._groups if group.tickets)
            self._n_tickets -= len(dropped)
        return dropped

    def drain(self) -> list[Ticket]:
        """Remove and return every ticket."""
        tickets = [t for group in self._groups for t in group.tickets]
        self._groups.clear()
        self._n_tickets = 0
        return tickets
