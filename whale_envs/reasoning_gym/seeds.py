"""The hold-out rule for generated datasets: the seed reasoning-gym generates from is keyed.

A reasoning-gym dataset is a pure function of ``(seed, index)``, and the package is importable wherever
WHALE runs code it does not trust (the tool sandbox, the proposer's jail). If the env handed the user's
``seed`` to reasoning-gym, anyone there could call ``create_dataset(name, seed=seed)`` and read every
held-out task with its answer. So the seed actually used is an HMAC, under the split key
(:mod:`whale_envs.splits`, a secret no sandbox can read), of the dataset spec, the user's seed and the
attempt number: the same split secret gives the same tasks in every run (a comparison still pairs), and
without the secret the tasks cannot be rebuilt (62 bits of seed: no search over seeds finds them).

``WHALE_SPLIT_SECRET=:public:`` (the unkeyed rule, to reproduce old runs) makes these seeds public too.
"""

from __future__ import annotations

import hashlib
import hmac

#: Datasets that hand ``seed + index`` to ``numpy.random.seed``, which takes 32 bits: their seeds are
#: cut to 31 bits (a composite gives each of its datasets a seed of its own, cut the same way).
NUMPY_SEEDED = frozenset({"pool_matrix"})
WIDE_BITS = 62
NARROW_BITS = 31


def generation_seed(key: bytes, label: str, user_seed: int, attempt: int) -> int:
    """The seed reasoning-gym generates attempt ``attempt`` of the dataset ``label`` from."""
    message = f"whale reasoning-gym seed v1\0{label}\0{user_seed}\0{attempt}".encode()
    return _bits(hmac.new(key, message, hashlib.sha256).digest(), WIDE_BITS)


def part_seed(seed: int, name: str) -> int:
    """The seed of dataset ``name`` inside a composite generated from ``seed`` (as secret as ``seed``)."""
    digest = hashlib.sha256(f"{seed}\0{name}".encode()).digest()
    return fit(name, _bits(digest, WIDE_BITS))


def fit(name: str, seed: int) -> int:
    """``seed`` cut to what dataset ``name`` accepts."""
    return seed % (1 << NARROW_BITS) if name in NUMPY_SEEDED else seed


def _bits(digest: bytes, bits: int) -> int:
    return int.from_bytes(digest[:8], "big") >> (64 - bits)
