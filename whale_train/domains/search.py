"""Search question answering (``whale/SearchQA-v0``): the shipped ``search_qa/`` harnesses, the search
mechanism library, the search warm-start formats."""

from __future__ import annotations

from whale_envs import SEARCH_QA_ID
from whale_train.domains.registry import builtin_domain, register_domain

SEARCH = builtin_domain(
    "search",
    SEARCH_QA_ID,
    harness_dir="search_qa",
    harnesses=("h0", "question_query", "multi_hop", "follow_up"),
    info_fields=("question", "passages (id, title, text)", "searches_used", "max_searches"),
    actions="'search: <query>' returns passages; 'answer: <text>' ends the episode.",
)

register_domain(SEARCH)
