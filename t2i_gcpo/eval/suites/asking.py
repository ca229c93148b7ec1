"""Asking a scorer many questions, resumably: the loop every question-based evaluation runs (GenEval 2's
VQA questions, the judge suites' one request per image).

A question is a `Question`: an id stable across runs (``00012/0000#3``: the item's key and the question's
number), a fingerprint of everything that decides its answer (the text asked, the image's bytes, the
scorer and its settings) and whatever the scorer needs to ask it. Its answer is a dict of JSON values (the
judge's text, a probability, the score it gave) appended to ``answers.jsonl`` the moment it is known, so
that an interrupted evaluation loses at most the questions in flight. `answer_all` reads that file first
and re-asks nothing it holds with the same fingerprint (a regenerated image, an edited template or another
scorer asks again).

Questions go to the scorer `batch_size` at a time (a local VLM's forward pass), at most `concurrency`
batches in flight (a judge's requests, on threads). A batch that fails — an exception the scorer raises
for a transport error, a timeout or an answer it cannot use (`BadAnswer`: unparseable, out of range) — is
tried again up to `retries` times, `backoff` seconds apart, doubling; a question still unanswered then
stops the evaluation with one line naming the scorer, the question and the last failure (a `UserError`,
after the answers already given were written). A `UserError` from the scorer (a server that gives no
log-probabilities where they are needed) is not retried.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from t2i_gcpo.errors import UserError, shorten

ANSWERS_NAME = "answers.jsonl"


class BadAnswer(ValueError):
    """A scorer's answer that cannot be used (unparseable, out of range): asked again, up to the retries."""


@dataclass(frozen=True)
class Question:
    """One question: `id` stable across runs, `fingerprint` of what decides its answer, `payload` what the
    scorer reads (an image, the text, the answers whose probability is wanted)."""

    id: str
    fingerprint: str
    payload: Any = field(compare=False, repr=False)


def fingerprint(*parts: Any) -> str:
    """A short SHA-256 of JSON-serialisable `parts` (bytes hashed as they are)."""
    digest = hashlib.sha256()
    for part in parts:
        digest.update(
            part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode()
        )
        digest.update(b"\0")
    return digest.hexdigest()[:32]


def image_digest(path: str | os.PathLike) -> str:
    """The SHA-256 of an image file's bytes (a regenerated image is a new question)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_answers(path: str | os.PathLike, repair: bool = False) -> dict[str, dict]:
    """The answers already in `path` (``answers.jsonl``) by question id, the last of each id kept. A last line
    cut short by a crash is dropped — and, with `repair`, cut from the file, so that answers appended next
    start on a line of their own."""
    from t2i_gcpo.outdir import parse_json, read_side_text, write_file

    path = Path(path)
    if not path.exists() and not path.is_symlink():
        return {}
    text = read_side_text(path, limit=1 << 30)
    lines = text.splitlines(keepends=True)
    torn = bool(lines) and not lines[-1].endswith("\n")
    out = {}
    for i, line in enumerate(lines[:-1] if torn else lines):
        if not line.strip():
            continue
        row = parse_json(line, f"{path}:{i + 1}")
        if (
            not isinstance(row, dict)
            or not isinstance(row.get("id"), str)
            or not isinstance(row.get("fingerprint"), str)
        ):
            raise UserError(
                f"{path}:{i + 1}: not an answer record t2i-gcpo wrote (no 'id' and 'fingerprint'); "
                "use another --out"
            )
        out[row["id"]] = row
    if torn and repair:
        write_file(path, "".join(lines[:-1]))
    return out


def answer_all(
    questions: Sequence[Question],
    ask: Callable[[list[Any]], list[dict]],
    log: str | os.PathLike | None,
    *,
    scorer: str,
    batch_size: int = 1,
    concurrency: int = 1,
    retries: int = 0,
    backoff: float = 1.0,
    within: str | os.PathLike | None = None,
    desc: str = "ask",
    progress: bool = True,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, dict]:
    """Every question's answer by id (module docstring): those in `log` with the same fingerprint, the rest
    asked — ``ask(payloads)`` returns one answer dict per payload, in order — and appended to `log` as they
    come (`within`: the output folder the log is in; None: no log, every question asked — an evaluation
    during training, whose images live in memory). `scorer` names the scorer in the message that stops
    the evaluation. Returns {id: answer record (the answer's fields, ``id`` and ``fingerprint``)}."""
    from tqdm.auto import tqdm

    from t2i_gcpo.outdir import append_text

    if batch_size < 1 or concurrency < 1 or retries < 0:
        raise ValueError(
            f"batch_size and concurrency must be >= 1, retries >= 0 ({batch_size}, {concurrency}, {retries})"
        )
    ids = [q.id for q in questions]
    if len(set(ids)) != len(ids):
        raise ValueError("question ids must be unique")
    log = Path(log) if log is not None else None
    kept = read_answers(log, repair=True) if log is not None else {}
    done = {
        q.id: kept[q.id] for q in questions if q.id in kept and kept[q.id]["fingerprint"] == q.fingerprint
    }
    todo = [q for q in questions if q.id not in done]
    batches = [todo[i : i + batch_size] for i in range(0, len(todo), batch_size)]
    bar = tqdm(total=len(questions), initial=len(done), desc=desc, unit="q", disable=not progress)

    kept_in = f"; the answers given so far are kept in {log} (the same command continues)" if log else ""

    def run(batch: list[Question]) -> list[dict]:
        wait_s, last = backoff, ""
        for attempt in range(retries + 1):
            if attempt:
                sleep(wait_s)
                wait_s *= 2
            try:
                answers = ask([q.payload for q in batch])
                if len(answers) != len(batch):
                    raise BadAnswer(f"{len(answers)} answers to {len(batch)} questions")
                return answers
            except UserError:
                raise
            except Exception as e:  # a transport error, a timeout, an answer it cannot use: asked again
                last = f"{type(e).__name__}: {e}"
        first = batch[0].id + (f" (and {len(batch) - 1} more)" if len(batch) > 1 else "")
        raise UserError(
            f"{scorer}: question {first} has no usable answer after {retries + 1} tries: "
            f"{shorten(' '.join(last.split()), 200)}{kept_in}"
        )

    def record(batch: list[Question], answers: list[dict]) -> None:
        lines = []
        for q, a in zip(batch, answers):
            row = {**a, "id": q.id, "fingerprint": q.fingerprint}
            done[q.id] = row
            lines.append(json.dumps(row, ensure_ascii=False) + "\n")
        if log is not None:
            append_text(log, "".join(lines), within=Path(within) if within is not None else None)
        bar.update(len(batch))

    try:
        if concurrency == 1:
            for batch in batches:
                record(batch, run(batch))
        else:
            _in_pool(batches, run, record, concurrency)
    finally:
        bar.close()
    return {q.id: done[q.id] for q in questions}


def _in_pool(batches: Iterable[list[Question]], run: Callable, record: Callable, concurrency: int) -> None:
    """`run` each batch on `concurrency` threads, `record` each result in this thread as it comes; the first
    failure cancels what has not started and is raised once the running ones are done (their answers kept)."""
    pending = iter(batches)
    pool = ThreadPoolExecutor(max_workers=concurrency)
    running: dict[Future, list[Question]] = {}
    failure: BaseException | None = None
    try:
        for batch in pending:
            running[pool.submit(run, batch)] = batch
            if len(running) >= concurrency:
                break
        while running:
            finished, _ = wait(running, return_when=FIRST_COMPLETED)
            for future in finished:
                batch = running.pop(future)
                try:
                    record(batch, future.result())
                except BaseException as e:
                    failure = failure or e
                if failure is None:
                    nxt = next(pending, None)
                    if nxt is not None:
                        running[pool.submit(run, nxt)] = nxt
        if failure is not None:
            raise failure
    finally:
        pool.shutdown(wait=failure is None, cancel_futures=True)
