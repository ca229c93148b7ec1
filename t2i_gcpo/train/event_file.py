"""TensorBoard's event file of a run, written by t2i-gcpo itself so that no write of it follows a link
(train/tracking.start_trackers puts it in accelerate's place for report_to=tensorboard)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from accelerate.tracking import GeneralTracker

from t2i_gcpo.config import PROJECT


class EventFile(GeneralTracker):
    """TensorBoard's event file of a run, <run>/tb/t2i-gcpo/events.out.tfevents.…: one scalar event per logged
    row, in TensorBoard's record format (its own `RecordWriter` and protocol buffers). The file is opened
    once, through `outdir.open_append` (its folders checked, never through a link, kept open: a link planted
    at its name later changes nothing), and flushed after each row; a failed write is one line (WriteError).
    `purge_step`: a resumed run's first step (0: it starts over) — TensorBoard then drops the events a killed
    run logged from there on, as torch's SummaryWriter(purge_step=…) does."""

    name = "tensorboard"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, run_dir: Path, purge_step: int | None = None) -> None:
        super().__init__()
        self.run_dir, self.purge_step, self.file = Path(run_dir), purge_step, None

    @property
    def tracker(self) -> Any:
        return self.file

    def start(self) -> None:
        import secrets
        import socket
        import time

        from tensorboard.compat.proto.event_pb2 import Event, SessionLog
        from tensorboard.summary.writer.record_writer import RecordWriter

        from t2i_gcpo.outdir import open_append

        name = (
            f"events.out.tfevents.{int(time.time()):010d}.{socket.gethostname()}.{os.getpid()}."
            f"{secrets.token_hex(3)}"
        )
        self.file = open_append(self.run_dir / "tb" / PROJECT / name, within=self.run_dir, binary=True)
        self.records = RecordWriter(self.file)
        self._write(Event(wall_time=time.time(), file_version="brain.Event:2"))
        if self.purge_step is not None:
            self._write(Event(wall_time=time.time(), step=self.purge_step, file_version="brain.Event:2"))
            self._write(
                Event(
                    wall_time=time.time(),
                    step=self.purge_step,
                    session_log=SessionLog(status=SessionLog.START),
                )
            )

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        import time

        from tensorboard.compat.proto.event_pb2 import Event
        from tensorboard.compat.proto.summary_pb2 import Summary

        scalars = [Summary.Value(tag=k, simple_value=float(v)) for k, v in values.items() if _number(v)]
        if scalars and self.file is not None:
            self._write(Event(wall_time=time.time(), step=step or 0, summary=Summary(value=scalars)))

    def _write(self, event: Any) -> None:
        from t2i_gcpo.outdir import WriteError

        try:
            self.records.write(event.SerializeToString())
            self.file.flush()
        except OSError as e:
            raise WriteError(
                f"cannot write TensorBoard's event file in {self.run_dir / 'tb'}: {e.strerror or e}"
            ) from None

    def finish(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)
