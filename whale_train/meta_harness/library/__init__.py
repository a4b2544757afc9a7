"""The offline proposer's mechanism library: per domain, the mechanisms a harness can be built from.

``core.py`` holds what every library is made of (genomes, ``Choice``, ``Constant``, ``DomainLibrary``
and the rendering helpers); ``chess.py``, ``math.py`` and ``search.py`` are the built-in domains'
libraries (each named by its ``Domain`` in ``whale_train.domains``); ``generic.py`` holds the
domain-agnostic mechanisms an env without a library of its own gets, written on top of its seed
harness. ``library_for(domain, seed_source)`` picks the right one. ``mechanisms/`` holds the code the
mechanisms put in a candidate, one module per library.
"""

from __future__ import annotations

from whale_train.domains import Domain, registered
from whale_train.meta_harness.library.core import DomainLibrary, Genome, key
from whale_train.meta_harness.library.generic import SeedLibrary, seed_library


def library_for(domain: Domain, seed_source: str) -> DomainLibrary:
    """The domain's own library, or the generic mechanisms on top of ``seed_source``."""
    return domain.load_library() or seed_library(seed_source, domain.name, domain.options_field)


def libraries() -> dict[str, DomainLibrary]:
    """The registered domains' own libraries, by domain name."""
    return {d.name: d.load_library() for d in registered() if d.library}


__all__ = ["DomainLibrary", "Genome", "SeedLibrary", "key", "libraries", "library_for", "seed_library"]
