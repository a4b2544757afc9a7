"""Search question answering (``whale/SearchQA-v0``): the shipped ``search_qa/`` harnesses, the search
mechanism library, the search warm-start formats."""

from __future__ import annotations

from whale_envs import SEARCH_QA_ID
from whale_train.domains.registry import Domain, register_domain

SEARCH = Domain(
    name="search",
    env_id=SEARCH_QA_ID,
    base_harness="search_qa/h0",
    harness_dir="search_qa",
    harnesses=("search_qa/h0", "search_qa/question_query", "search_qa/multi_hop", "search_qa/follow_up"),
    info_fields=(
        "question",
        "passages (id, title, text)",
        "searches_used",
        "max_searches",
        "error",
        "error_kind",
    ),
    actions="'search: <query>' returns passages; 'answer: <text>' ends the episode.",
    library="whale_train.meta_harness.library.search:LIBRARY",
    pretrain_formats="whale_train.pretrain.formats:SEARCH",
    prompt_edits="whale_train.meta_harness.prompt_only:SEARCH_EDITS",
)

register_domain(SEARCH)
