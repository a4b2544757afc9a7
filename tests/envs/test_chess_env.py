"""whale/Chess-v0: the Lichess rules, EPD rules, generated puzzles, move notation, errors and seeding."""

from __future__ import annotations

import chess
import gymnasium as gym
import pytest

import whale_envs  # noqa: F401  (registers the envs)
from whale_envs.chess import ChessEnv, ChessPuzzle
from whale_envs.chess.search import mate_in_two_keys, mating_moves
from whale_envs.chess.sources import load_epd, load_lichess
from whale_envs.tasks import ListSource, Task


def solver_moves(puzzle: ChessPuzzle) -> list[str]:
    return list(puzzle.line[::2])


def play(env: ChessEnv, task_id: str, moves: list[str]):
    obs, info = env.reset(options={"task_id": task_id})
    steps = []
    for move in moves:
        obs, reward, terminated, truncated, info = env.step(move)
        steps.append((obs, reward, terminated, truncated, info))
        if terminated or truncated:
            break
    return steps


def custom_env(*puzzles: ChessPuzzle) -> ChessEnv:
    source = ListSource("custom", [Task(f"p{i}", p) for i, p in enumerate(puzzles)])
    return ChessEnv(tasks=source)


@pytest.fixture(scope="module")
def lichess_env() -> ChessEnv:
    return ChessEnv(tasks="lichess")


def test_oracle_solves_every_lichess_puzzle(lichess_env):
    solved = 0
    for task_id in lichess_env.task_ids:
        puzzle = lichess_env.source.get(task_id).payload
        steps = play(lichess_env, task_id, solver_moves(puzzle))
        _, reward, terminated, _, info = steps[-1]
        assert terminated and info["solved"], (task_id, info)
        assert len(steps) == puzzle.solver_moves  # every reply was scripted, none skipped
        solved += reward
    assert solved == len(lichess_env.task_ids) == 1000


def test_oracle_solves_every_epd_position():
    env = ChessEnv(tasks="epd")
    assert len(env.task_ids) == 896
    for task_id in env.task_ids:
        puzzle = env.source.get(task_id).payload
        board = puzzle.start_board()
        move = (
            puzzle.best[0]
            if puzzle.best
            else next(m.uci() for m in board.legal_moves if m.uci() not in puzzle.avoid)
        )
        (_, reward, terminated, _, info) = play(env, task_id, [move])[-1]
        assert terminated and reward == 1.0 and info["solved"], task_id


def test_epd_avoid_move_fails_and_other_moves_solve():
    env = ChessEnv(tasks="epd")
    puzzle = env.source.get("arasan2024.50").payload
    assert puzzle.avoid and not puzzle.best
    assert play(env, "arasan2024.50", [puzzle.avoid[0]])[-1][1] == 0.0
    other = next(m.uci() for m in puzzle.start_board().legal_moves if m.uci() not in puzzle.avoid)
    assert play(env, "arasan2024.50", [other])[-1][1] == 1.0


def test_wrong_legal_move_ends_the_episode_with_reward_zero(lichess_env):
    for task_id in lichess_env.task_ids[:50]:
        puzzle = lichess_env.source.get(task_id).payload
        board = puzzle.start_board()
        wrong = next(
            m for m in board.legal_moves if m.uci() != puzzle.line[0] and not _mates(board, m)
        )  # a legal move off the line
        obs, reward, terminated, truncated, info = play(lichess_env, task_id, [wrong.uci()])[-1]
        assert (reward, terminated, truncated, info["solved"]) == (0.0, True, False, False)
        assert "not the solution" in obs
        assert info["solution"]["line"] == list(puzzle.line)


def _mates(board: chess.Board, move: chess.Move) -> bool:
    board.push(move)
    mate = board.is_checkmate()
    board.pop()
    return mate


def test_alternative_mate_on_the_final_ply_is_rewarded(lichess_env):
    checked = 0
    for task_id in lichess_env.task_ids:
        puzzle = lichess_env.source.get(task_id).payload
        board = puzzle.start_board()
        for move in puzzle.line[:-1]:
            board.push_uci(move)
        alternatives = [m.uci() for m in mating_moves(board) if m.uci() != puzzle.line[-1]]
        if not alternatives:
            continue
        steps = play(lichess_env, task_id, solver_moves(puzzle)[:-1] + [alternatives[0]])
        _, reward, terminated, _, info = steps[-1]
        assert reward == 1.0 and terminated and info["solved"], task_id
        checked += 1
    assert checked >= 10  # the bundled sample has 20 such puzzles


def test_san_and_uci_give_identical_results(lichess_env):
    for task_id in lichess_env.task_ids[:200]:
        puzzle = lichess_env.source.get(task_id).payload
        board = puzzle.start_board()
        san_moves = []
        for i, uci in enumerate(puzzle.line):
            move = chess.Move.from_uci(uci)
            if i % 2 == 0:
                san_moves.append(board.san(move))  # with +/# suffixes: the env must accept both
            board.push(move)
        by_uci = play(lichess_env, task_id, solver_moves(puzzle))
        by_san = play(lichess_env, task_id, san_moves)
        strip = lambda steps: [(o, r, te, tr, {k: v for k, v in i.items()}) for o, r, te, tr, i in steps]  # noqa: E731
        assert strip(by_uci) == strip(by_san)


def test_promotion_castling_and_en_passant():
    promotion = ChessPuzzle(fen="8/4P2k/8/8/8/8/8/4K3 w - - 0 1", line=("e7e8q",))
    castle = ChessPuzzle(fen="4k3/8/8/8/8/8/8/4K2R w K - 0 1", line=("e1g1",))
    en_passant = ChessPuzzle(fen="4k3/8/8/3pP3/8/8/8/4K3 w - d6 0 1", line=("e5d6",))
    env = custom_env(promotion, castle, en_passant)
    for moves in (["e7e8q"], ["e8=Q"], ["e8=Q+"], ["E7E8Q"]):
        assert play(env, "p0", moves)[-1][1] == 1.0, moves
    assert play(env, "p0", ["e7e8n"])[-1][1] == 0.0  # under-promotion is a different move
    for moves in (["e1g1"], ["O-O"], ["0-0"], ["e1h1"]):
        assert play(env, "p1", moves)[-1][1] == 1.0, moves
    for moves in (["e5d6"], ["exd6"]):
        obs, reward, *_ = play(env, "p2", moves)[-1]
        assert reward == 1.0, moves
    env.reset(options={"task_id": "p2"})
    env.step("e5d6")
    assert env.unwrapped.board.piece_at(chess.D5) is None  # the captured pawn is gone


def test_illegal_and_malformed_moves_cost_a_turn_and_change_nothing(lichess_env):
    obs0, info0 = lichess_env.reset(options={"task_id": "tewjc"})
    for action in ["e2e5", "Qz9", "", "   ", "hello world", "0000", "--", "e1e1", "Kxx"]:
        obs, reward, terminated, truncated, info = lichess_env.step(action)
        assert reward == 0.0 and not terminated
        assert info["error"] and obs.startswith("Error: ")
        assert info["fen"] == info0["fen"]
        if truncated:
            break
    assert lichess_env.turn == lichess_env.max_turns == 2 * 3 + 2
    assert truncated and "Out of turns" in obs and info["solved"] is False


def test_illegal_move_message_is_specific(lichess_env):
    lichess_env.reset(options={"task_id": "tewjc"})
    _, _, _, _, info = lichess_env.step(
        "a7a8"
    )  # well-formed UCI, but a7 holds White's rook and Black is to move
    assert info["error"].startswith("illegal move 'a7a8' in this position")
    assert info["error_kind"] == "illegal"
    _, _, _, _, info = lichess_env.step("Nf3")
    assert "illegal move 'Nf3'" in info["error"]
    _, _, _, _, info = lichess_env.step("my move is Nf3")
    assert info["error"].startswith("malformed move") and info["error_kind"] == "malformed"


def test_no_answer_in_observation_or_info_before_the_end(lichess_env):
    for task_id in lichess_env.task_ids[:100]:
        puzzle = lichess_env.source.get(task_id).payload
        obs, info = lichess_env.reset(options={"task_id": task_id})
        assert "solution" not in info and "solved" not in info and "themes" not in info
        assert not any(s.endswith(("+", "#")) for s in info["legal_moves_san"])
        assert "#" not in obs and "+" not in obs.split("Legal moves")[1]
        if len(puzzle.line) > 1:
            obs, _, terminated, _, info = lichess_env.step(puzzle.line[0])
            assert not terminated and "solution" not in info
            assert info["last_opponent_move"] == puzzle.line[1]


def test_info_fields(lichess_env):
    obs, info = lichess_env.reset(options={"task_id": "tewjc"})
    board = chess.Board("r5k1/pp3p1p/2b2qp1/3pr3/8/4P2P/R1PN1PP1/Q3K2R w K - 0 19")
    board.push_uci("a2a7")
    assert info["fen"] == board.fen()
    assert info["side_to_move"] == info["solver_color"] == "black"
    assert info["last_opponent_move"] == "a2a7" and info["last_opponent_move_san"] == "Rxa7"
    assert info["solver_move_number"] == 1
    assert sorted(info["legal_moves_uci"]) == sorted(m.uci() for m in board.legal_moves)
    assert len(info["legal_moves_san"]) == len(info["legal_moves_uci"])
    assert "Opponent's last move: a2a7 (Rxa7)" in obs


def test_same_seed_same_tasks_and_observations():
    def run(seed):
        env = gym.make("whale/Chess-v0", tasks="lichess", split="train")
        out = [env.reset(seed=seed)[0]]
        out += [env.reset()[0] for _ in range(5)]
        return out

    assert run(7) == run(7)
    assert run(7) != run(8)


@pytest.mark.parametrize("level", [1, 2, 3])
def test_generated_puzzles_are_solved_by_the_oracle_and_strict(level):
    env = ChessEnv(tasks=f"generated?difficulty={level}&seed=3&size=60")
    for task_id in env.task_ids[:12]:
        _check_generated(env, task_id, level)


@pytest.mark.slow
def test_generated_level4_puzzles_are_solved_by_the_oracle_and_strict():
    env = ChessEnv(tasks="generated?difficulty=4&seed=3&size=20")
    for task_id in env.task_ids[:4]:
        _check_generated(env, task_id, 4)


def _check_generated(env: ChessEnv, task_id: str, level: int) -> None:
    task = env.source.get(task_id)
    puzzle = task.payload
    assert task.meta["difficulty"] == level
    assert len(puzzle.line) == (1 if level in (1, 2) else 3)
    board = puzzle.start_board()
    if level >= 3:  # the key move is the only one that works, and there is no shortcut mate
        assert mating_moves(board) == []
        assert [m.uci() for m in mate_in_two_keys(board)] == [puzzle.line[0]]
    steps = play(env, task_id, solver_moves(puzzle))
    assert steps[-1][1] == 1.0 and steps[-1][4]["solved"]


def test_generated_source_is_seeded_and_split_by_content():
    from whale_envs.tasks import make_source, split_of

    a = make_source("chess", "generated?seed=5&size=40")
    b = make_source("chess", "generated", seed=5, size=40)
    c = make_source("chess", "generated?seed=6&size=40")
    ids = a.ids()[:10]
    assert [a.get(i).payload for i in ids] == [b.get(i).payload for i in ids]
    assert [a.get(i).payload for i in ids] != [c.get(i).payload for i in c.ids()[:10]]
    for i in ids:
        assert split_of(a.get(i).payload.fen) == split_of(i)
    # a task does not depend on the source's size
    big = make_source("chess", "generated?seed=5&size=400")
    assert big.get(ids[3]).payload == a.get(ids[3]).payload


def test_lichess_filters():
    low = load_lichess(max_rating=1000)
    assert 0 < len(low) < 1000 and all(t.meta["rating"] <= 1000 for t in low)
    band = load_lichess(min_rating=1200, max_rating=1400)
    assert all(1200 <= t.meta["rating"] <= 1400 for t in band)
    mates = load_lichess(themes="mateIn1,mateIn2")
    assert all({"mateIn1", "mateIn2"} & set(t.meta["themes"]) for t in mates)
    no_mates = load_lichess(exclude_themes=["mate"])
    assert not any("mate" in t.meta["themes"] for t in no_mates)
    assert len(mates) + len(no_mates) <= 1000
    env = gym.make("whale/Chess-v0", tasks="lichess?min_rating=1800")
    assert all(env.unwrapped.source.get(i).meta["rating"] >= 1800 for i in env.unwrapped.task_ids)


def test_epd_source_from_a_file_of_the_user(tmp_path):
    path = tmp_path / "mine.epd"
    path.write_text(
        '6k1/5ppp/8/8/8/8/5PPP/R5K1 w - - bm Ra8; id "backrank";\n7k/8/8/8/8/8/8/K5R1 w - - am Rg8;\n'
    )
    source = load_epd(str(path))
    assert source.ids() == ["backrank", "mine.epd:2"]
    assert source.get("backrank").payload.best == ("a1a8",)
