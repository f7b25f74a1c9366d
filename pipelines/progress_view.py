"""The terminal view of a local run's progress (components/reporting/progress.py writes the events).

`ProgressPrinter` tails the progress file in a thread and prints, for every stage:
- a line when it starts, finishes (with its seconds) or fails;
- its phases as they come (the exporter's restore, conversion, parity, compression and gate);
- its counts (ExampleGen's rows and byte ranges, preprocessing's counting and transform passes)
  with rate, share of the total and ETA where the total is known;
- the Trainer's steps (step/total, loss, examples/s, ETA) and each evaluation, the final one named
  as the kept model's (its step and how it was chosen, report.kept_model).
On a terminal, counts and steps are tqdm bars redrawn in place; otherwise (a file, a CI log)
plain lines, at most one per stage every `every` seconds, so a long run's log stays readable.
"""
from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, TextIO

from components.reporting import progress
from components.reporting.report import kept_model


def _clock(t: float) -> str:
    return time.strftime("%H:%M:%S", time.localtime(t))


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    m, s = divmod(seconds, 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m"


def _rate(n: float) -> str:
    return f"{n / 1e6:.2f}M" if n >= 1e6 else f"{n / 1e3:.1f}k" if n >= 1e3 else f"{n:.0f}"


@dataclass
class _Count:
    done: int = 0
    total: Optional[int] = None
    unit: str = "rows"
    first_t: Optional[float] = None
    first_done: int = 0  # units reported by the first event: finished before first_t, not in the rate
    last_t: float = 0.0
    bar: Any = None


@dataclass
class _Stage:
    started: float
    totals: Dict[str, int] = field(default_factory=dict)  # phase -> total announced at the start
    counts: Dict[str, _Count] = field(default_factory=dict)
    printed_t: float = 0.0
    step_bar: Any = None
    step_t0: Optional[float] = None  # (time, step) of the first step event: the ETA's base
    step_s0: int = 0


def count_text(name: str, c: _Count, now: float) -> str:
    """Formats a count as one line of the view.

    Args:
      name: the count's phase name.
      c: the count so far (done, total, unit, times of its first and last events).
      now: the current time (unused: the rate runs to the last event).

    Returns:
      E.g. `counting values: 1,234,567 / 3,000,000 rows (41%, 52.1k rows/s, ETA 34s)`.
    """
    parts = []
    elapsed = (c.last_t - c.first_t) if c.first_t is not None else 0.0
    rate = (c.done - c.first_done) / elapsed if elapsed > 0 else None
    if c.total:
        parts.append(f"{c.done / c.total:.0%}")
    if rate:
        if c.unit != "ranges":  # a handful of byte ranges a minute: their rate says nothing
            parts.append(f"{_rate(rate)} {c.unit}/s")
        if c.total and c.done < c.total:
            parts.append(f"ETA {_duration((c.total - c.done) / rate)}")
    of = f" / {c.total:,}" if c.total else ""
    return f"{name}: {c.done:,}{of} {c.unit}" + (f" ({', '.join(parts)})" if parts else "")


def step_text(e: Dict[str, Any], st: _Stage) -> str:
    """Formats a training step event as one line of the view.

    Args:
      e: the `step` event (`t`, `step`, `total`, `loss`, `examples_per_second`).
      st: the stage's state (its first step event is the ETA's base).

    Returns:
      E.g. `step 1,000/5,000, loss 0.4512, 52.1k examples/s, ETA 2m05s`.
    """
    parts = [f"step {e['step']:,}/{e['total']:,}"]
    if e.get("loss") is not None:
        parts.append(f"loss {e['loss']:.4f}")
    if e.get("examples_per_second"):
        parts.append(f"{_rate(e['examples_per_second'])} examples/s")
    if st.step_t0 is not None and e["step"] > st.step_s0 and e["step"] < e["total"]:
        per_step = (e["t"] - st.step_t0) / (e["step"] - st.step_s0)
        parts.append(f"ETA {_duration(per_step * (e['total'] - e['step']))}")
    return ", ".join(parts)


class ProgressPrinter:
    """Tails a progress file and prints its events to a stream, from `start()` until `stop()`.

    Args:
      path: the progress file (JSON lines, components/reporting/progress.py).
      stream: where to print.
      tty: draw tqdm bars in place; None asks `stream.isatty()`. Off without tqdm.
      every: without bars, print a stage's counts and steps at most once per this many seconds.
      poll: seconds between reads of the file.
    """

    def __init__(self, path: str, stream: TextIO, tty: Optional[bool] = None, every: float = 10.0, poll: float = 0.25):
        self.path, self.stream, self.every, self.poll = path, stream, every, poll
        self.tty = stream.isatty() if tty is None else tty
        if self.tty:
            try:
                # lazy: tqdm is optional (bars on a terminal; plain lines without it)
                import tqdm  # noqa: F401
            except ImportError:
                self.tty = False
        self._stages: Dict[str, _Stage] = {}
        self._offset = 0
        self._partial = b""
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self.current: Optional[str] = None  # the stage that started last and has not finished
        self.seen: List[str] = []  # stages that reported a start, in order

    # -- lifecycle --------------------------------------------------------------------------------
    def start(self) -> "ProgressPrinter":
        """Starts the tailing thread.

        Returns:
          This printer, to chain calls.
        """
        self._thread = threading.Thread(target=self._loop, name="progress", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stops the thread after a last read; never raises (the view is best effort)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self.drain_quietly()
        try:
            for st in self._stages.values():
                self._close_bars(st)
        except Exception:  # noqa: BLE001
            pass

    def drain_quietly(self) -> None:
        """Like `drain`, but never raises: the view is best effort and the run goes on."""
        try:
            self.drain()
        except Exception:  # noqa: BLE001 - a closed terminal, an unreadable file: the run goes on
            pass

    def _loop(self) -> None:
        while not self._stop.wait(self.poll):
            self.drain_quietly()

    # -- reading ----------------------------------------------------------------------------------
    def drain(self) -> None:
        """Reads the events appended since the last read and prints them.

        An unfinished last line waits for the next read; torn lines and events this view does not
        understand are skipped.

        Raises:
          OSError: the file cannot be read (a missing file is no error).
        """
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self._offset)
                data = fh.read()
        except FileNotFoundError:
            return
        if not data:
            return
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()  # an unfinished last line waits for its end
        for line in lines:
            try:
                event = json.loads(line)
            except ValueError:
                continue  # a torn line (another writer's crash): skip it, the view is best effort
            try:
                self.handle(event)
            except (KeyError, TypeError, ValueError):
                continue  # an event this view does not understand

    # -- printing ---------------------------------------------------------------------------------
    def _print(self, text: str) -> None:
        if self.tty:
            # lazy: tqdm is optional (the view prints plain lines without it)
            from tqdm import tqdm

            tqdm.write(text, file=self.stream)
        else:
            print(text, file=self.stream, flush=True)

    def _line(self, t: float, stage: str, text: str) -> None:
        self._print(f"[{_clock(t)}] {stage} {text}")

    def _detail(self, t: float, stage: str, text: str) -> None:
        self._print(f"[{_clock(t)}]   {stage}: {text}")

    def _close_bars(self, st: _Stage) -> None:
        for c in st.counts.values():
            if c.bar is not None:
                c.bar.close()
                c.bar = None
        if st.step_bar is not None:
            st.step_bar.close()
            st.step_bar = None

    def handle(self, e: Dict[str, Any]) -> None:
        """Updates the view with one event and prints what it changes.

        Args:
          e: the event (`t`, `stage`, `event` and the kind's fields).

        Raises:
          KeyError, TypeError, ValueError: an event this view does not understand.
        """
        name, kind, t = e.get("stage", "?"), e.get("event"), float(e.get("t", time.time()))
        if kind == progress.START:
            self._stages[name] = _Stage(started=t, totals=dict(e.get("totals") or {}))
            self.current = name
            self.seen.append(name)
            self._line(t, name, "running")
            return
        st = self._stages.setdefault(name, _Stage(started=t))
        if kind in (progress.DONE, progress.FAILED):
            self._flush_counts(name, st, t, final=True)
            self._close_bars(st)
            secs = e.get("seconds", t - st.started)
            self._line(t, name, f"finished in {_duration(secs)}" if kind == progress.DONE
                       else f"failed after {_duration(secs)} ({e.get('error', 'error')})")
            if self.current == name and kind == progress.DONE:
                self.current = None
        elif kind == progress.PHASE:
            self._detail(t, name, e.get("text", ""))
        elif kind == progress.COUNT:
            phase = e.get("phase", "")
            c = st.counts.setdefault(phase, _Count(unit=e.get("unit", "rows")))
            c.done += int(e.get("done", 0))
            c.total = e.get("total") or st.totals.get(phase) or c.total
            if c.first_t is None:
                c.first_t, c.first_done = t, c.done
            c.last_t = t
            self._show_count(name, st, phase, c, t)
        elif kind == progress.STEP:
            if st.step_t0 is None:
                st.step_t0, st.step_s0 = t, int(e["step"])
            self._show_step(name, st, e, t)
        elif kind == progress.EVAL:
            metrics = ", ".join(f"{k} {v:,.0f}" if float(v).is_integer() else f"{k} {v:.4f}"
                                for k, v in sorted((e.get("metrics") or {}).items()))
            # the kept model's evaluation names that model (its step, how it was chosen), never the last step
            what = (f"eval of {kept_model(e.get('step', 0), e['kept'])}" if e.get("kept")
                    else f"eval at step {e.get('step', 0):,}")
            self._detail(t, name, f"{what}: {metrics}")

    def _show_count(self, name: str, st: _Stage, phase: str, c: _Count, t: float) -> None:
        if self.tty:
            # lazy: tqdm is optional (the view prints plain lines without it)
            from tqdm import tqdm

            if c.bar is None:
                c.bar = tqdm(total=c.total, desc=f"  {name}: {phase}", unit=f" {c.unit}", unit_scale=True,
                             file=self.stream, leave=False, dynamic_ncols=True)
            if c.total and c.bar.total != c.total:
                c.bar.total = c.total
            c.bar.update(c.done - c.bar.n)
            return
        if t - st.printed_t >= self.every:
            self._flush_counts(name, st, t)

    def _flush_counts(self, name: str, st: _Stage, t: float, final: bool = False) -> None:
        if self.tty and not final:
            return
        if st.counts:
            self._detail(t, name, "; ".join(count_text(p, c, t) for p, c in st.counts.items()))
        st.printed_t = t

    def _show_step(self, name: str, st: _Stage, e: Dict[str, Any], t: float) -> None:
        if self.tty:
            # lazy: tqdm is optional (the view prints plain lines without it)
            from tqdm import tqdm

            if st.step_bar is None:
                st.step_bar = tqdm(total=e["total"], initial=e["step"], desc=f"  {name}: training", unit=" steps",
                                   file=self.stream, leave=False, dynamic_ncols=True)
            st.step_bar.update(e["step"] - st.step_bar.n)
            post = {}
            if e.get("loss") is not None:
                post["loss"] = f"{e['loss']:.4f}"
            if e.get("examples_per_second"):
                post["examples/s"] = _rate(e["examples_per_second"])
            st.step_bar.set_postfix(post, refresh=False)
            if e["step"] >= e["total"]:
                self._detail(t, name, step_text(e, st))
            return
        if t - st.printed_t >= self.every or e["step"] >= e["total"]:
            self._detail(t, name, step_text(e, st))
            st.printed_t = t


def progress_path(output_dir: str) -> str:
    """Gives the progress file of a local run.

    Args:
      output_dir: the run's output folder.

    Returns:
      `<output_dir>/progress.jsonl`.
    """
    return os.path.join(output_dir, "progress.jsonl")
