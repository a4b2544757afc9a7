"""Search question answering: ``whale/SearchQA-v0``, its BM25 retriever and its task sources
(``generated``, ``hotpotqa``, ``musique``, ``nq``)."""

from whale_envs.search.corpus import Corpus, Passage, SearchQuestion
from whale_envs.search.env import SearchQAEnv, parse_action
from whale_envs.search.generator import SearchGenConfig, SearchSample, generate_sample
from whale_envs.search.judge import JudgeError, LLMJudge
from whale_envs.search.retriever import Retriever, clear_memory_cache, get_retriever
from whale_envs.search.scoring import exact_match, f1_score, normalize_answer
from whale_envs.search.sources import load_corpus

__all__ = [
    "Corpus",
    "JudgeError",
    "LLMJudge",
    "Passage",
    "Retriever",
    "SearchGenConfig",
    "SearchQAEnv",
    "SearchQuestion",
    "SearchSample",
    "clear_memory_cache",
    "exact_match",
    "f1_score",
    "generate_sample",
    "get_retriever",
    "load_corpus",
    "normalize_answer",
    "parse_action",
]
