"""Math task sources: GSM8K and MATH jsonl files (bundled samples or the user's files).

``tasks="gsm8k"`` loads the bundled GSM8K test split (1319 problems), ``tasks="gsm8k:PATH"`` any file
of the same format: one JSON object a line with ``question`` and ``answer``, the final answer after
``####`` on the answer's last line. Task id = ``gsm8k-<file stem>-<row index, 0-based, 4 digits>``
(``gsm8k-test-0001`` is the second row); ``meta["difficulty"]`` = the number of solution steps (lines
before ``####``), GSM8K having no level of its own.

``tasks="math"`` loads the bundled MATH-500 (OpenAI's PRM800K test subset), ``tasks="math:PATH"`` any
MATH-format file: ``problem``, and ``answer`` or else the last ``\\boxed{}`` of ``solution``; optional
``level`` (``3`` or ``"Level 3"``), ``subject`` (or ``type``), ``unique_id``. Task id = ``unique_id``
(``test/precalculus/807.json``), or ``math-<row index>`` for a row without one. ``meta["difficulty"]``
= the level (1-5), ``meta["subject"]`` the subject. Filters: ``levels`` (``"1-3"`` or ``"1,4"``),
``subjects`` (comma-separated, case-insensitive).

The paper's data (files only, nothing bundled; see docs/PAPER.md):

* ``dapo:PATH`` — DAPO-Math-17K in verl parquet: the problem is taken out of DAPO's prompt wrapper
  ("Solve the following math problem step by step. ... Remember to put your answer on its own line
  after "Answer:"."), the answer is ``reward_model.ground_truth``; task id = ``extra_info.index``
  (else ``dapo-<row>``). ``dedup=true`` (default) keeps the first row of each problem text: the
  released file repeats every problem, 17,917 remain.
* ``aime:PATH`` — AIME 2024 / 2025 as released (jsonl, json or parquet; ``Problem``/``problem``,
  ``Answer``/``answer``, ``ID``/``id``, ``year``); task id ``aime-<ID>`` or ``aime<year>-<id>``;
  ``?year=2025`` names the year of a file whose rows carry none.
* ``verl:PATH`` — any verl-format parquet (or jsonl) of math problems: the last user message of
  ``prompt`` (unwrapped when it is DAPO's wrapper), ``reward_model.ground_truth``.

Each of them, and a folder of parquet shards or a ``datasets.save_to_disk`` folder, is read with
:mod:`whale_envs.tabular`. ``meta["data_source"]`` (the row's ``data_source``, ``aime2024`` ...) is what
``whale eval`` and a run's evaluations break results down by.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from whale_envs.data import bundled_path
from whale_envs.math.problem import MathProblem
from whale_envs.math.verify import last_boxed
from whale_envs.tabular import field_ci, nested, read_rows, user_prompt
from whale_envs.tasks import ListSource, Task, TaskSourceError, existing, json_lines


def _rows(file: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, object) for every non-blank line of a jsonl file."""
    with open(file, encoding="utf-8") as fh:
        for line_no, row in json_lines(fh, str(file)):
            if not isinstance(row, dict):
                raise TaskSourceError(
                    f"{file}, line {line_no}: expected a JSON object, got {type(row).__name__}"
                )
            yield line_no, row


def _text_field(row: dict, key: str, where: str) -> str:
    value = row.get(key)
    if not isinstance(value, str) or not value.strip():
        raise TaskSourceError(f"{where}: missing or empty field {key!r}")
    return value


def gsm8k_final_answer(solution: str) -> str | None:
    """The text after the last ``####`` of a GSM8K solution, or None when there is none."""
    if "####" not in solution:
        return None
    answer = solution.rsplit("####", 1)[1].strip()
    return answer or None


def load_gsm8k(path: str | None = None) -> ListSource[MathProblem]:
    """Load GSM8K-format jsonl (see the module docstring)."""
    file = existing(path, "gsm8k") if path else bundled_path("gsm8k", "test.jsonl")
    shown = path or "gsm8k (bundled test split)"
    stem = file.stem
    tasks = []
    for index, (line_no, row) in enumerate(_rows(file)):
        where = f"{file}, line {line_no}"
        question = _text_field(row, "question", where)
        solution = _text_field(row, "answer", where)
        answer = gsm8k_final_answer(solution)
        if answer is None:
            raise TaskSourceError(f"{where}: the 'answer' field has no final answer after '####'")
        steps = len([s for s in solution.rsplit("####", 1)[0].splitlines() if s.strip()])
        meta = {"difficulty": steps, "steps": steps, "source": shown, "row": line_no}
        tasks.append(Task(f"gsm8k-{stem}-{index:04d}", MathProblem(question.strip(), answer), meta))
    if not tasks:
        raise TaskSourceError(f"{file}: no rows")
    return ListSource(f"gsm8k:{path}" if path else "gsm8k", tasks)


def _levels(spec: Any) -> set[int] | None:
    if spec is None:
        return None
    out: set[int] = set()
    for part in str(spec).replace(" ", "").split(","):
        lo, _, hi = part.partition("-")
        try:
            out.update(range(int(lo), int(hi or lo) + 1))
        except ValueError:
            raise TaskSourceError(f"math: levels must look like '1-3' or '1,4', got {spec!r}") from None
    return out


def _level_of(value: Any, where: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip().lower().removeprefix("level").strip()
    if text in ("?", ""):
        return None
    try:
        return int(text)
    except ValueError:
        raise TaskSourceError(f"{where}: 'level' must be an integer or 'Level N', got {value!r}") from None


def load_math(
    path: str | None = None, *, levels: str | int | None = None, subjects: str | None = None
) -> ListSource[MathProblem]:
    """Load MATH-format jsonl (see the module docstring)."""
    file = existing(path, "math") if path else bundled_path("math500", "test.jsonl")
    shown = path or "math (bundled MATH-500)"
    want_levels = _levels(levels)
    want_subjects = {s.strip().lower() for s in subjects.split(",")} if subjects else None
    tasks = []
    for index, (line_no, row) in enumerate(_rows(file)):
        where = f"{file}, line {line_no}"
        problem = _text_field(row, "problem", where)
        answer = row.get("answer")
        if not isinstance(answer, str) or not answer.strip():
            solution = row.get("solution")
            answer = last_boxed(solution) if isinstance(solution, str) else None
            if not answer:
                raise TaskSourceError(f"{where}: no 'answer' field and no \\boxed{{}} answer in 'solution'")
        level = _level_of(row.get("level"), where)
        subject = row.get("subject") or row.get("type")
        if want_levels is not None and level not in want_levels:
            continue
        if want_subjects is not None and str(subject).lower() not in want_subjects:
            continue
        task_id = str(row.get("unique_id") or f"math-{index}")
        meta = {"difficulty": level, "level": level, "subject": subject, "source": shown, "row": line_no}
        tasks.append(Task(task_id, MathProblem(problem.strip(), answer.strip()), meta))
    name = f"math:{path}" if path else "math"
    if not tasks:
        raise TaskSourceError(f"{name}: no problem passes the filters")
    return ListSource(name, tasks)


# ------------------------------------------------------------------------------ the paper's data

_DAPO_HEAD = "Solve the following math problem step by step."
_DAPO_TAIL = "Remember to put your answer on its own line after"


def unwrap_dapo_prompt(text: str) -> str:
    """The problem inside DAPO's prompt wrapper (the text itself when it is not wrapped)."""
    body = text.strip()
    if body.startswith(_DAPO_HEAD) and "\n\n" in body:
        body = body.split("\n\n", 1)[1]
    if _DAPO_TAIL in body:
        body = body.rsplit(_DAPO_TAIL, 1)[0]
    return body.strip()


def _ground_truth(record: dict, where: str) -> str:
    truth = nested(record, "reward_model.ground_truth")
    if isinstance(truth, dict):  # {"target": [...]} as in Search-R1's files
        truth = truth.get("target")
    if isinstance(truth, (list, tuple)) and truth:
        truth = truth[0]
    if isinstance(truth, (int, float)) and not isinstance(truth, bool):
        truth = str(truth)
    if not isinstance(truth, str) or not truth.strip():
        raise TaskSourceError(f"{where}: missing or empty reward_model.ground_truth")
    return truth.strip()


def _load_verl_math(kind: str, path: str, *, dedup: bool) -> ListSource[MathProblem]:
    tasks: list[Task[MathProblem]] = []
    seen: set[str] = set()
    ids: set[str] = set()
    for row, where, record in read_rows(path, kind):
        prompt = user_prompt(record) or record.get("problem") or record.get("question")
        if not isinstance(prompt, str) or not prompt.strip():
            raise TaskSourceError(f"{where}: no problem text (a 'prompt' chat list with a user message)")
        problem = unwrap_dapo_prompt(prompt)
        if dedup:
            if problem in seen:
                continue
            seen.add(problem)
        answer = _ground_truth(record, where)
        index = nested(record, "extra_info.index")
        task_id = str(index) if index is not None and str(index) not in ids else f"{kind}-{row}"
        ids.add(task_id)
        source = record.get("data_source") or kind
        meta = {"difficulty": source, "data_source": source, "source": f"{kind}:{path}", "row": row}
        tasks.append(Task(task_id, MathProblem(problem, answer), meta))
    if not tasks:
        raise TaskSourceError(f"{kind}:{path}: no rows")
    return ListSource(f"{kind}:{path}", tasks)


def load_dapo(path: str, *, dedup: bool = True) -> ListSource[MathProblem]:
    """DAPO-Math-17K (verl parquet; see the module docstring)."""
    return _load_verl_math("dapo", path, dedup=dedup)


def load_verl_math(path: str, *, dedup: bool = False) -> ListSource[MathProblem]:
    """Any verl-format math file (see the module docstring)."""
    return _load_verl_math("verl", path, dedup=dedup)


def load_aime(path: str, *, year: int | None = None) -> ListSource[MathProblem]:
    """AIME 2024 / 2025 releases (see the module docstring); ``year`` for a release whose rows carry none."""
    tasks, year_option = [], year
    for row, where, record in read_rows(path, "aime"):
        problem = field_ci(record, "problem", "question")
        answer = field_ci(record, "answer")
        if not isinstance(problem, str) or not problem.strip():
            raise TaskSourceError(f"{where}: missing or empty field 'problem' (or 'Problem')")
        if isinstance(answer, (int, float)) and not isinstance(answer, bool):
            answer = str(int(answer)) if float(answer).is_integer() else str(answer)
        if not isinstance(answer, str) or not answer.strip():
            raise TaskSourceError(f"{where}: missing or empty field 'answer' (or 'Answer')")
        raw_id = field_ci(record, "id", "unique_id")
        year = field_ci(record, "year") if year_option is None else year_option
        text_id = str(raw_id) if raw_id is not None else str(row)
        if year is None and text_id[:4].isdigit():  # "2024-I-1"
            year = text_id[:4]
        task_id = (
            f"aime{year}-{text_id}"
            if year is not None and not text_id.startswith(str(year))
            else f"aime-{text_id}"
        )
        source = f"aime{year}" if year is not None else "aime"
        meta = {"difficulty": source, "data_source": source, "source": f"aime:{path}", "row": row}
        tasks.append(Task(task_id, MathProblem(problem.strip(), answer.strip()), meta))
    if not tasks:
        raise TaskSourceError(f"aime:{path}: no rows")
    return ListSource(f"aime:{path}", tasks)


def _register() -> None:
    from whale_envs.math.generators import make_generated
    from whale_envs.tasks import register_generator, register_source

    register_generator(
        "math",
        make_generated,
        "arithmetic, word problems, linear equations, fractions; difficulty 1-5 (no files)",
    )
    register_source("math", "gsm8k", load_gsm8k, doc="GSM8K jsonl (bundled: the 1319-problem test split)")
    register_source("math", "math", load_math, doc="MATH jsonl (bundled: MATH-500)")
    register_source(
        "math", "dapo", load_dapo, path_required=True, doc="DAPO-Math-17K verl parquet (dedup=true)"
    )
    register_source("math", "aime", load_aime, path_required=True, doc="AIME 2024/2025 jsonl or parquet")
    register_source("math", "verl", load_verl_math, path_required=True, doc="any verl-format math parquet")


_register()
