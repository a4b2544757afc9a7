"""``whale retriever``: build a dense index, serve retrieval in Search-R1's API, measure recall.

    whale retriever build --corpus wiki.jsonl --encoder ./e5-base-v2 --out wiki-e5 [--kind flat|ivf|ivfpq]
    whale retriever serve --corpus wiki.jsonl [--index wiki-e5] [--host 127.0.0.1] [--port 8000]
    whale retriever recall [SOURCE...] [--k 1 3 5] [--encoder ./e5-base-v2]

``build`` embeds every passage into ``--out`` as the encoder folder says (its sentence-transformers
prompts and pooling; e5's prefixes for an e5 model; ``--query-prefix`` / ``--passage-prefix`` /
``--no-prefix`` override), chunk by chunk: stop it at any point and run the same command again to
resume; the index records the prefixes and pooling, and ``serve`` embeds the queries with them.
``serve`` answers ``POST /retrieve {"queries", "topk", "return_scores"}`` with BM25 (no ``--index``) or
the dense index, batching concurrent requests; point the env at it with
``retriever="http://HOST:PORT/retrieve"``. ``recall`` prints recall@k of the supporting passages, the
question as the query, for BM25 and (``--encoder``) a dense index beside it
(:mod:`whale_envs.search.evaluate`), a markdown table row by row as each is measured.
"""

from __future__ import annotations

import argparse
import os
import sys

from whale_train.cli.common import console
from whale_train.cli.registry import command
from whale_train.errors import CLIError

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


@command(
    "retriever",
    help="build a dense passage index; serve BM25 or dense retrieval in Search-R1's API; measure recall",
    description=__doc__.split("\n\n")[0].replace("``", ""),
)
def arguments(p: argparse.ArgumentParser) -> None:
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
    r = sub.add_parser(
        "recall",
        help="recall@k of the supporting passages: BM25, and a dense encoder beside it",
        description="Recall@k of the supporting passages, the question as the query: BM25, and a dense "
        "encoder beside it (--encoder), on the same questions; a markdown table, printed row by row.",
    )
    add_recall_arguments(r)


def _corpus(path: str):
    from whale_envs.search.sources import load_corpus

    return load_corpus(path)


def cmd_build(args: argparse.Namespace) -> int:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    from whale_envs.search.dense import DenseIndexError, Encoder, build_index

    prefixes = _prefixes(args)
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


def add_recall_arguments(r: argparse.ArgumentParser) -> None:
    from whale_envs.search.evaluate import DEFAULT_SOURCES

    r.add_argument("sources", nargs="*", default=list(DEFAULT_SOURCES), help="task source specs")
    r.add_argument("--k", nargs="+", type=int, default=[1, 3, 5], help="cut-offs (default 1 3 5)")
    r.add_argument("--cache-dir", default=None, help="BM25 index cache folder (default: the usual one)")
    r.add_argument(
        "--encoder",
        default=None,
        metavar="PATH",
        help="a local encoder folder (Hugging Face or sentence-transformers; its prompts and pooling, e5's "
        "prefixes for an e5 model): also report dense recall over a flat index of each corpus, on the same "
        "questions",
    )
    r.add_argument(
        "--query-prefix", default=None, help="prepend this to queries (default: the encoder's own)"
    )
    r.add_argument(
        "--passage-prefix", default=None, help="prepend this to passages (default: the encoder's own)"
    )
    r.add_argument("--no-prefix", action="store_true", help="embed without any prefix")
    r.add_argument(
        "--index-dir", default=None, help="keep the dense indexes here (default: a temporary folder)"
    )
    r.add_argument("--device", default="cpu", help="the encoder's torch device (default cpu)")
    r.set_defaults(func=cmd_recall)


def cmd_recall(args: argparse.Namespace) -> int:
    """The table on stdout, a row as soon as it is measured (a run stopped part way has printed the rows
    it finished); the encoder and each source's timing on stderr."""
    import tempfile
    from pathlib import Path

    from whale_envs.search.evaluate import dense_ranker, markdown_header, markdown_row, retrieval_recall

    # A generated world is drawn under the split key (whale_envs.splits): the recall of a generated source
    # is measured on the worlds of the published demo secret unless WHALE_SPLIT_SECRET says otherwise, so
    # the docs' numbers come out the same on every machine.
    os.environ.setdefault("WHALE_SPLIT_SECRET", "whale-demo")
    if any(k < 1 for k in args.k):
        raise CLIError(f"--k: cut-offs must be positive, got {args.k}")
    encoder = None
    if args.encoder is not None:
        from whale_envs.search.dense import DenseIndexError, Encoder

        try:
            encoder = Encoder(args.encoder, device=args.device, **_prefixes(args))
        except DenseIndexError as exc:
            raise CLIError(f"--encoder: {exc}") from None
        print(f"encoder {args.encoder}: {encoder.describe()}", file=sys.stderr, flush=True)
    print(markdown_header(args.k, encoder is not None), flush=True)
    with tempfile.TemporaryDirectory(prefix="whale-dense-") as scratch:
        dense = dense_ranker(encoder, args.index_dir or scratch) if encoder is not None else None
        name = f"dense ({Path(args.encoder).name})" if encoder is not None else ""
        for spec in args.sources:
            reports = []
            try:
                reports.append(retrieval_recall(spec, args.k, cache_dir=args.cache_dir))
                print(markdown_row(reports[-1], dense is not None), flush=True)
                if dense is not None:
                    reports.append(retrieval_recall(spec, args.k, ranker=dense, retriever=name))
                    print(markdown_row(reports[-1], True), flush=True)
            except ValueError as exc:  # TaskSourceError and DenseIndexError are ValueErrors
                raise CLIError(f"{spec}: {exc}") from None
            done = ", ".join(f"{r.retriever} {r.seconds:.1f}s" for r in reports)
            print(f"{spec}: {reports[-1].questions} questions ({done})", file=sys.stderr, flush=True)
    return 0


def _prefixes(args: argparse.Namespace) -> dict[str, str | None]:
    """The encoder's query and passage prefixes of --query-prefix, --passage-prefix and --no-prefix."""
    if args.no_prefix and (args.query_prefix is not None or args.passage_prefix is not None):
        raise CLIError("--no-prefix and --query-prefix/--passage-prefix contradict each other")
    if args.no_prefix:
        return {"query_prefix": "", "passage_prefix": ""}
    return {"query_prefix": args.query_prefix, "passage_prefix": args.passage_prefix}
