"""The live progress bar of a run: time against --duration, and sent / done / errors so far."""

from __future__ import annotations

from types import TracebackType

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

from fleetgate.bench.stats import RequestRecord


class ProgressBar:
    """A `RunObserver` (see runner) drawing on a rich console; use it as a context manager."""

    def __init__(self, duration_s: float, console: Console | None = None) -> None:
        self._duration_s = duration_s
        self._progress = Progress(
            TextColumn("[bold]bench"),
            BarColumn(),
            TimeElapsedColumn(),
            TextColumn(
                "sent {task.fields[sent]}  done {task.fields[done]}"
                "  [red]errors {task.fields[errors]}[/]  in flight {task.fields[in_flight]}"
            ),
            console=console,
            refresh_per_second=4,
            transient=False,
        )
        self._task: TaskID | None = None
        self.sent = 0
        self.done = 0
        self.errors = 0

    def __enter__(self) -> ProgressBar:
        self._progress.start()
        self._task = self._progress.add_task(
            "bench", total=self._duration_s, sent=0, done=0, errors=0, in_flight=0
        )
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._update(None)
        self._progress.stop()

    def request_sent(self, now_s: float) -> None:
        self.sent += 1
        self._update(now_s)

    def request_done(self, record: RequestRecord, now_s: float) -> None:
        self.done += 1
        if record.error is not None:
            self.errors += 1
        self._update(now_s)

    def _update(self, now_s: float | None) -> None:
        if self._task is None:
            return
        self._progress.update(
            self._task,
            completed=min(now_s, self._duration_s) if now_s is not None else None,
            sent=self.sent,
            done=self.done,
            errors=self.errors,
            in_flight=self.sent - self.done,
        )
