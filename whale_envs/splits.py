"""Which split a task belongs to, decided by a secret that only the trusted side holds.

The rule (docs/HARNESSES.md, "What is measured stays unseen"): nothing a harness or a proposer can
observe may tell a scored (test) task from an unscored one. A split that is a public function of a
task's id or content breaks that rule: a harness could behave on the train and harness splits (all that
``whale check`` and the search's check ever draw) and cheat only on the test split. So a task's split is
an HMAC of its id under a **split secret**:

* ``WHALE_SPLIT_SECRET`` (any text) when set, so a team or a paper can share one split; else
* the user's secret file, ``$XDG_CONFIG_HOME/whale/split-secret`` (default ``~/.config/whale``), made
  once with 32 random bytes (mode 0600) on first use.

The secret never enters a sandbox: harness episodes, the tool sandbox, the verifier helper and the
proposer's jail start with a clean environment and see no home folder, so in there the split cannot be
computed (a jail that asks gets a fresh random secret of its own: its "splits" are noise). What a run
records is the secret's **fingerprint** (an HMAC of a fixed text; it cannot be inverted), so ``--resume``
can refuse a run folder whose splits were drawn under another secret, and the test ids are written out
for the user after the run.

The same secret gives the same splits in every run and every method of a comparison (paired comparisons
still pair); tests and ``make demo`` pin ``WHALE_SPLIT_SECRET`` so their numbers reproduce anywhere.
``WHALE_SPLIT_SECRET=:public:`` brings back the old unkeyed rule, to reproduce a run made before splits
were keyed (it makes the split visible: never for a new score).

``public_split_of`` is the old unkeyed rule (a SHA-256 of the text). It decides no run's split; it is
kept for building a corpus before any run exists (the shipped tiny model's pretraining data).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import secrets
from pathlib import Path

#: Split names, and the share of task ids each one gets.
SPLITS: dict[str, float] = {"train": 0.70, "harness": 0.15, "test": 0.15}
SPLIT_NAMES = (*SPLITS, "all")

#: The environment variable that pins the split secret (any non-empty text).
SECRET_ENV = "WHALE_SPLIT_SECRET"
#: The value of ``WHALE_SPLIT_SECRET`` that brings back the unkeyed rule of runs made before splits were
#: keyed (a SHA-256 of the id), to reproduce them. It makes every split visible: never for a new score.
PUBLIC = ":public:"


class SplitSecretError(RuntimeError):
    """The split secret cannot be read or made (an unreadable file, a folder that cannot be written)."""


def secret_file() -> Path:
    """Where the user's split secret lives when ``WHALE_SPLIT_SECRET`` is not set."""
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "whale" / "split-secret"


def _file_secret(path: Path) -> bytes:
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        data = b""
    except OSError as exc:
        raise SplitSecretError(f"cannot read the split secret {path}: {exc.strerror}") from None
    if data.strip():
        return data.strip()
    try:
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:  # another process made it first: read theirs
        return path.read_bytes().strip()
    except OSError as exc:
        raise SplitSecretError(
            f"cannot create the split secret {path}: {exc.strerror} (set {SECRET_ENV} instead)"
        ) from None
    with os.fdopen(fd, "wb") as f:
        f.write(secrets.token_hex(32).encode())
    return path.read_bytes().strip()


def secret_for_children() -> dict[str, str]:
    """The environment a trusted child on another machine needs to draw the same splits (a Ray task of a
    comparison): ``{WHALE_SPLIT_SECRET: ...}``. Never give it to a sandbox."""
    pinned = os.environ.get(SECRET_ENV, "").strip()
    return {SECRET_ENV: pinned or _file_secret(secret_file()).decode("utf-8")}


@functools.lru_cache(maxsize=8)
def _key(pinned: str, path: str) -> bytes:
    if pinned == PUBLIC:
        return b""  # the unkeyed rule (see _keyed_split)
    secret = pinned.encode("utf-8") if pinned else _file_secret(Path(path))
    return hmac.new(secret, b"whale split key v1", hashlib.sha256).digest()


def split_key() -> bytes:
    """The HMAC key every split decision of this process uses (derived from the secret; read once)."""
    pinned = os.environ.get(SECRET_ENV, "").strip()
    return _key(pinned, "" if pinned else str(secret_file()))


def fingerprint(key: bytes | None = None) -> str:
    """A short public name of the split key (12 hex digits): equal fingerprints, equal splits. A run
    records it; it tells nothing about which task is in which split."""
    key = split_key() if key is None else key
    return hmac.new(key, b"fingerprint", hashlib.sha256).hexdigest()[:12]


def _bucket(digest: bytes) -> str:
    h = int.from_bytes(digest[:8], "big") / 2**64
    acc = 0.0
    name = "train"
    for name, share in SPLITS.items():
        acc += share
        if h < acc:
            return name
    return name  # float rounding at the top end


@functools.lru_cache(maxsize=1 << 20)
def _keyed_split(key: bytes, text: str) -> str:
    if not key:  # WHALE_SPLIT_SECRET=:public:
        return public_split_of(text)
    return _bucket(hmac.new(key, text.encode("utf-8"), hashlib.sha256).digest())


def split_of(task_id: str, key: bytes | None = None) -> str:
    """The split of a task id (or of a generated task's content) under the split key: an HMAC, so it
    cannot be computed without the secret. Memoized (a rollout filters a source's ids per env)."""
    return _keyed_split(split_key() if key is None else key, task_id)


@functools.lru_cache(maxsize=1 << 16)
def _opaque(key: bytes, task_id: str) -> str:
    return "t" + hmac.new(key, b"id:" + task_id.encode("utf-8"), hashlib.sha256).hexdigest()[:15]


def opaque_id(task_id: str, key: bytes | None = None) -> str:
    """The name a harness sees for a task: stable within a split key, unrelated to the task's own id."""
    return _opaque(split_key() if key is None else key, task_id)


@functools.lru_cache(maxsize=1 << 20)
def public_split_of(text: str) -> str:
    """The unkeyed rule (SHA-256 of the text): decides no run's split. Only for a corpus built before any
    run, such as the shipped model's pretraining data."""
    return _bucket(hashlib.sha256(text.encode("utf-8")).digest())
