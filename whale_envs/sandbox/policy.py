"""Whether untrusted code may run, and how: the isolation available here (checked by a probe that runs
the configuration that will be used), the user's explicit opt-in to run without it, and how a run is
labelled. The sandbox fails closed: without namespaces nothing runs unless the user opted in.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings

from whale_envs.sandbox import bundle, execute
from whale_envs.sandbox.config import boot_python, site_dirs
from whale_envs.sandbox.process import Limits

#: The explicit opt-in to run untrusted code without namespaces (the CLI's ``--allow-unisolated`` sets it).
OPT_IN_ENV = "WHALE_ALLOW_UNISOLATED"
OPT_IN_FLAG = "--allow-unisolated"


class IsolationUnavailable(RuntimeError):
    """Untrusted code was about to run, namespaces are unavailable and the opt-in is not given."""


def unisolated_opt_in() -> bool:
    """Whether the user explicitly allowed untrusted code to run without namespaces."""
    return os.environ.get(OPT_IN_ENV, "").strip().lower() in ("1", "true", "yes")


def allow_unisolated(allowed: bool = True) -> None:
    """Set the opt-in for this process and its children (what ``--allow-unisolated`` does)."""
    if allowed:
        os.environ[OPT_IN_ENV] = "1"
    else:
        os.environ.pop(OPT_IN_ENV, None)


_PROBES: dict[tuple, str | None] = {}
_PROBE_LOCK = threading.Lock()


def isolation_problem(site_packages: bool = True) -> str | None:
    """Why untrusted code cannot run in namespaces here, or None when it can.

    The probe runs the configuration that will actually be used (this interpreter, the same bind
    mounts with or without the installed packages, the same uid switch) and checks that the code ran
    jailed and not as uid 0. Cached per configuration.
    """
    if not sys.platform.startswith("linux"):
        return f"Linux namespaces are not available on {sys.platform}"
    key = (boot_python(), site_packages, tuple(site_dirs()) if site_packages else (), os.geteuid())
    with _PROBE_LOCK:  # one probe per configuration, however many threads ask at once
        if key not in _PROBES:
            problem, lasting = _probe(site_packages)
            if not lasting:  # a probe stopped by its time limit (a busy machine) is asked again later
                return problem
            _PROBES[key] = problem
        return _PROBES[key]


#: The probe of a configuration, run in its jail as a call's code would run; the harness worker's.
PROBE = f"{bundle.PROGRAMS}.probe"
EPISODE_PROBE = f"{bundle.PROGRAMS}.episode_probe"


def _probe(site_packages: bool) -> tuple[str | None, bool]:
    """(why isolation is unavailable or None, whether the answer lasts). Without the installed packages
    (the harness worker's configuration) the probe also checks that each episode can run alone."""
    program = bundle.program(PROBE if site_packages else EPISODE_PROBE)
    limits = Limits(wall_s=30, cpu_s=10, isolation="namespaces", site_packages=site_packages)
    result = execute.run(program, limits, isolation="namespaces", probing=True)
    if result.limit in ("wall", "cpu"):
        return f"the sandboxed probe hit its {result.limit} limit (a busy machine?)", False
    if result.limit == "setup":
        return f"the sandbox cannot be built here: {result.error}", True
    if result.exit_code != 0 or not result.stdout.startswith("ok "):
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or [f"exit {result.exit_code}"]
        return f"the sandboxed probe did not run: {detail[0][:300]}", True
    _, uid, etc, *episodes = result.stdout.split(maxsplit=3)
    if os.geteuid() == 0 and uid == "0":
        return "the sandboxed probe ran as uid 0", True
    if etc != "0":
        return "the sandboxed probe could see the host's /etc", True
    if not site_packages and episodes != ["episodes-alone"]:
        why = episodes[0].removeprefix("episodes: ") if episodes else "no answer"
        return f"the harness worker's episodes cannot run alone (namespaces of their own): {why}", True
    return None, True


def isolation_available(site_packages: bool = True) -> bool:
    """Whether untrusted code runs in namespaces here (see :func:`isolation_problem` for why not)."""
    return isolation_problem(site_packages) is None


def refusal(problem: str, what: str = "untrusted code") -> str:
    """The one-line error for a refused unisolated run: the cause and the opt-in."""
    return (
        f"refusing to run {what} without isolation: {problem}. To run it anyway with resource limits "
        f"only (no network or file-system isolation), pass {OPT_IN_FLAG} or set {OPT_IN_ENV}=1"
    )


def require_isolation(what: str = "untrusted code", *, site_packages: bool = True) -> str:
    """The isolation ``what`` will run under: ``"namespaces"``, or ``"none (opt-in)"`` when the user
    opted in; raises :class:`IsolationUnavailable` (cause + opt-in) otherwise."""
    problem = isolation_problem(site_packages)
    if problem is None:
        return "namespaces"
    if unisolated_opt_in():
        return UNISOLATED_LABEL
    raise IsolationUnavailable(refusal(problem, what))


#: How a run under the opt-in is labelled in results.json, the ledger and the report.
UNISOLATED_LABEL = f"none (unisolated by opt-in {OPT_IN_ENV})"


def isolation_label(site_packages: bool | None = None) -> str:
    """``"namespaces"``, :data:`UNISOLATED_LABEL` (a run under the opt-in), or ``"unavailable"``.

    ``site_packages=None``: both configurations (the tool's and the harness worker's) must be isolated.
    """
    configs = (True, False) if site_packages is None else (site_packages,)
    if all(isolation_problem(c) is None for c in configs):
        return "namespaces"
    return UNISOLATED_LABEL if unisolated_opt_in() else "unavailable"


_WARNED = False


def choose_isolation(limits: Limits) -> tuple[str, str | None]:
    """(isolation to use, None) or ("unavailable", why): fails closed unless the user opted in."""
    global _WARNED
    if limits.isolation == "none":
        if unisolated_opt_in():
            return "none", None
        return "unavailable", refusal("isolation='none' was asked for")
    problem = isolation_problem(limits.site_packages)
    if problem is None:
        return "namespaces", None
    if limits.isolation == "namespaces" or not unisolated_opt_in():
        return "unavailable", refusal(problem)
    if not _WARNED:
        _WARNED = True
        warnings.warn(
            f"whale_envs.sandbox: {problem}; untrusted code runs with resource limits only (no network or "
            f"file-system isolation) because {OPT_IN_ENV} is set",
            RuntimeWarning,
            stacklevel=3,
        )
    return "none", None
