"""``whale retriever``: build a dense index and serve retrieval in Search-R1's API.

    whale retriever build --corpus wiki.jsonl --encoder ./e5-base-v2 --out wiki-e5 [--kind flat|ivf|ivfpq]
    whale retriever serve --corpus wiki.jsonl [--index wiki-e5] [--host 127.0.0.1] [--port 8000]

``build`` embeds every passage into ``--out`` as the encoder folder says (its sentence-transformers
prompts and pooling; e5's prefixes for an e5 model; ``--query-prefix`` / ``--passage-prefix`` /
``--no-prefix`` override), chunk by chunk: stop it at any point and run the same command again to
resume; the index records the prefixes and pooling, and ``serve`` embeds the queries with them.
``serve`` answers ``POST /retrieve {"queries", "topk", "return_scores"}`` with BM25 (no ``--index``) or
the dense index, batching concurrent requests; point the env at it with
``retriever="http://HOST:PORT/retrieve"``.
"""

from __future__ import annotations

import argparse
import sys

#: whale_envs.search.server.Limits' defaults, written out so that building the parser imports no env
#: (a test checks they agree).
SERVER_LIMITS = {
    "max_body": 1 << 20,
    "max_queries": 4096,
    "max_topk": 100,
    "max_hits": 16384,
    "max_reply_bytes": 16 << 20,
    "head_timeout": 10.0,
    "body_timeout": 30.0,
    "max_connections": 1024,
    "queue_wait_s": 1.0,
}


# `whale retriever serve`'s limits: (flag, key in SERVER_LIMITS, type, help with its {default}).
LIMIT_FLAGS = [
    ("--max-body", "max_body", int, "request body bytes (default {default})"),
    (
        "--max-queries",
        "max_queries",
        int,
        "queries in one request (default {default}; Search-R1 sends a rollout batch at once)",
    ),
    ("--max-topk", "max_topk", int, "passages per query (default {default})"),
    ("--max-hits", "max_hits", int, "queries x topk in one request (default {default})"),
    ("--max-reply-bytes", "max_reply_bytes", int, "bytes of one reply (default {default}, 16 MiB)"),
    (
        "--head-timeout",
        "head_timeout",
        float,
        "seconds for a request line and headers to arrive; also closes idle keep-alive connections "
        "(default {default:g})",
    ),
    (
        "--body-timeout",
        "body_timeout",
        float,
        "seconds for a request body to arrive and for a reply to be sent (default {default:g})",
    ),
    (
        "--max-connections",
        "max_connections",
        int,
        "connections served at once, one thread each (default {default})",
    ),
    (
        "--queue-wait",
        "queue_wait_s",
        float,
        "seconds a connection over --max-connections waits for a slot before a 503 (default {default:g})",
    ),
]


def add_parser(subparsers) -> None:
    p = subparsers.add_parser(
        "retriever",
        help="build a dense passage index; serve BM25 or dense retrieval in Search-R1's API",
        description=__doc__.split("\n\n")[0].replace("``", ""),
    )
    sub = p.add_subparsers(dest="retriever_command", metavar="ACTION", required=True)

    b = sub.add_parser("build", help="embed a corpus with a local encoder and build a FAISS index")
    b.add_argument(
        "--corpus", required=True, help="corpus file (jsonl of id/contents or title/text, json, tsv)"
    )
    b.add_argument(
        "--encoder", required=True, help="a local encoder folder (e.g. e5-base-v2); never downloaded"
    )
    b.add_argument("--out", required=True, help="index folder (created; an unfinished build there resumes)")
    b.add_argument(
        "--kind",
        choices=("flat", "ivf", "ivfpq"),
        default="flat",
        help="flat: exact (the paper's); ivf / ivfpq: approximate, for corpora too big for RAM",
    )
    b.add_argument("--batch-size", type=int, default=64, help="passages per encoder forward pass")
    b.add_argument(
        "--max-length",
        type=int,
        default=None,
        help="tokens per passage (default: the encoder's max_seq_length, at most 256)",
    )
    b.add_argument(
        "--query-prefix",
        default=None,
        help="prepend this to queries (default: the encoder's sentence-transformers 'query' prompt, "
        "e5's 'query: ' for an e5 model, else none); recorded in the index for serve",
    )
    b.add_argument(
        "--passage-prefix",
        default=None,
        help="prepend this to passages (default: the 'document'/'passage' prompt, e5's 'passage: ' "
        "for an e5 model, else none)",
    )
    b.add_argument("--no-prefix", action="store_true", help="no prefix on queries or passages")
    b.add_argument("--chunk", type=int, default=4096, help="passages embedded between two resume points")
    b.add_argument("--nlist", type=int, default=None, help="IVF lists (default 4 * sqrt(passages))")
    b.add_argument(
        "--pq-m", type=int, default=16, help="PQ sub-vectors of ivfpq (divides the embedding size)"
    )
    b.add_argument("--device", default="cpu", help="torch device of the encoder (cuda on a GPU machine)")
    b.set_defaults(func=cmd_build)

    s = sub.add_parser("serve", help="serve retrieval over HTTP in Search-R1's API")
    s.add_argument("--corpus", required=True, help="the corpus file the passages come from")
    s.add_argument("--index", default=None, help="a 'whale retriever build' folder (default: BM25)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 = every interface)")
    s.add_argument("--port", type=int, default=8000, help="port (0 = any free port, printed)")
    s.add_argument("--max-batch", type=int, default=64, help="queries per backend call across requests")
    s.add_argument("--nprobe", type=int, default=None, help="IVF lists visited per query (recall vs speed)")
    s.add_argument("--device", default="cpu", help="torch device of the query encoder")
    limits = s.add_argument_group(
        "limits", "what one client may cost the server; a request over a cap gets a one-line 4xx error"
    )
    for flag, key, kind, text in LIMIT_FLAGS:
        default = SERVER_LIMITS[key]
        limits.add_argument(flag, type=kind, default=default, help=text.format(default=default))
    s.add_argument(
        "--log-every",
        type=float,
        default=10.0,
        metavar="S",
        help="print a summary line (requests, queries, errors, p50/p95 latency) every S seconds that saw "
        "traffic, to stderr (default 10; 0: none)",
    )
    s.add_argument(
        "--log-requests", action="store_true", help="print one line per request instead of the summaries"
    )
    s.set_defaults(func=cmd_serve)


def _corpus(path: str):
    from whale_envs.search.sources import load_corpus

    return load_corpus(path)


def cmd_build(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from whale_envs.search.dense import DenseIndexError, Encoder, build_index
    from whale_train.cli_common import CLIError, console

    if args.no_prefix and (args.query_prefix is not None or args.passage_prefix is not None):
        raise CLIError("--no-prefix and --query-prefix/--passage-prefix contradict each other")
    prefixes = {"query_prefix": args.query_prefix, "passage_prefix": args.passage_prefix}
    if args.no_prefix:
        prefixes = {"query_prefix": "", "passage_prefix": ""}
    corpus = _corpus(args.corpus)
    try:
        encoder = Encoder(
            args.encoder,
            batch_size=args.batch_size,
            max_length=args.max_length,
            device=args.device,
            **prefixes,
        )
        console.print(f"encoder {args.encoder}: {encoder.describe()}", markup=False, highlight=False)
        with Progress(
            "[bold]embedding", BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(), console=console
        ) as bar:
            job = bar.add_task("embed", total=len(corpus))
            folder = build_index(
                corpus,
                encoder,
                args.out,
                kind=args.kind,
                chunk=args.chunk,
                nlist=args.nlist,
                pq_m=args.pq_m,
                progress=lambda done, _n: bar.update(job, completed=done),
            )
    except DenseIndexError as exc:
        raise CLIError(str(exc)) from None
    console.print(f"built a {args.kind} index of {len(corpus)} passages in {folder}")
    return 0


def make_backend(corpus_path: str, index: str | None, *, nprobe: int | None = None, device: str = "cpu"):
    """BM25 over the corpus, or the dense index folder ``index`` over it."""
    corpus = _corpus(corpus_path)
    if index is None:
        from whale_envs.search.server import BM25Backend

        return BM25Backend(corpus)
    from whale_envs.search.dense import DenseIndex, Encoder

    meta = DenseIndex.read_meta(index)
    encoder = Encoder(
        meta["encoder"],
        query_prefix=meta["query_prefix"],
        passage_prefix=meta["passage_prefix"],
        max_length=meta["max_length"],
        device=device,
    )
    return DenseIndex(index, corpus, encoder, nprobe=nprobe)


def cmd_serve(args: argparse.Namespace) -> int:
    from whale_envs.search.dense import DenseIndexError
    from whale_envs.search.server import Limits, RequestLog, RetrievalServer
    from whale_train.cli_common import CLIError, console

    try:
        limits = Limits(
            max_body=args.max_body,
            max_queries=args.max_queries,
            max_topk=args.max_topk,
            max_hits=args.max_hits,
            max_reply_bytes=args.max_reply_bytes,
            head_timeout=args.head_timeout,
            body_timeout=args.body_timeout,
            max_connections=args.max_connections,
            queue_wait_s=args.queue_wait,
        )
    except ValueError as exc:
        raise CLIError(str(exc)) from None
    try:
        backend = make_backend(args.corpus, args.index, nprobe=args.nprobe, device=args.device)
    except DenseIndexError as exc:
        raise CLIError(str(exc)) from None
    try:
        log = RequestLog(every_s=args.log_every, per_request=args.log_requests)
        server = RetrievalServer(
            backend, args.host, args.port, limits=limits, max_batch=args.max_batch, request_log=log
        )
    except OSError as exc:
        raise CLIError(f"cannot listen on {args.host}:{args.port}: {exc}") from None
    console.print(f"serving {backend.name} retrieval over {len(backend)} passages at {server.url}")
    sys.stdout.flush()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
        server.batcher.close()
        log.close()
    return 0
