"""builtin:game2048, the sliding-tile game played through one `move` tool.

The board is 4x4; each move slides every tile one way, equal neighbours merge
once, and a new tile (2, or 4 one time in ten) appears on an empty cell. The
spawns come from a random generator seeded by the scenario, so the rollouts of
one group play the same game and differ only by their moves. The game ends at
the target tile, when no move is possible, or at the turn limit.

Reward: 0.6 * log2(largest tile) / log2(target) + 0.4 * min(1, merged / target)
(merged: the sum of the tiles created by merging), +1 for reaching the target,
-0.1 for each move that changes nothing and each malformed or refused call.

`worked_examples: N` (an environment option, default 0) shows the first N moves
of an example game (its own seed, outside both splits) before the board, as
context, never trained.
"""

from __future__ import annotations

import json
import math
import random
from dataclasses import dataclass, field

from appliance.agents.environment import AgentEnvironmentError, Episode, Scenario, Split, ToolEnvironment, ToolResult
from appliance.agents.toolcalls import format_call, function_tool
from appliance.agents.trajectory import AssistantMessage, FunctionCall, Message, ToolCall, ToolMessage, UserMessage

Board = list[list[int]]
DIRECTIONS = ("left", "right", "up", "down")
HELD_OUT_SEED_BASE = 1_000_000  # held-out games use seeds from here up, training games below
EXAMPLE_SEED = 3_000_000  # the worked example's game: in neither split
EXAMPLE_MOVES = ("left", "up", "right", "down")  # move k of the example tries them from the k-th on


def slide_row_left(row: list[int]) -> tuple[list[int], int]:
    """The row after sliding left, and the sum of the tiles merging created."""
    tiles = [value for value in row if value]
    out, merged, index = [], 0, 0
    while index < len(tiles):
        if index + 1 < len(tiles) and tiles[index] == tiles[index + 1]:
            out.append(tiles[index] * 2)
            merged += tiles[index] * 2
            index += 2
        else:
            out.append(tiles[index])
            index += 1
    return out + [0] * (len(row) - len(out)), merged


def _transpose(board: Board) -> Board:
    return [list(column) for column in zip(*board)]


def slide(board: Board, direction: str) -> tuple[Board, int]:
    """The board after sliding `direction` (no new tile), and the merged sum."""
    # Every direction is a left slide of the right rows: columns are transposed into rows, and right and down
    # slide the reversed row.
    rows = _transpose(board) if direction in ("up", "down") else [list(row) for row in board]
    reverse = direction in ("right", "down")
    merged, out = 0, []
    for row in rows:
        new, gained = slide_row_left(row[::-1] if reverse else row)
        out.append(new[::-1] if reverse else new)
        merged += gained
    return (_transpose(out) if direction in ("up", "down") else out), merged


def spawn(board: Board, rng: random.Random) -> None:
    empty = [(r, c) for r, row in enumerate(board) for c, value in enumerate(row) if not value]
    if empty:
        r, c = rng.choice(empty)
        board[r][c] = 4 if rng.random() < 0.1 else 2  # the original game's odds


def can_move(board: Board) -> bool:
    return any(slide(board, direction)[0] != board for direction in DIRECTIONS)


def render(board: Board) -> str:
    width = max(len(str(value)) for row in board for value in row)
    return "\n".join(" ".join(str(value or ".").rjust(width) for value in row) for row in board)


@dataclass
class GameState:
    rng: random.Random
    board: Board = field(default_factory=lambda: [[0] * 4 for _ in range(4)])
    merged: int = 0
    moves: int = 0
    useless_moves: int = 0

    def largest(self) -> int:
        return max(max(row) for row in self.board)


class Game2048Environment(ToolEnvironment):
    name = "game2048"
    # environment_options each takes, and its bounds (checked at admission, before the class builds anything).
    option_bounds = {"target": (8, 2**17), "max_turns": (1, 1000), "worked_examples": (0, 8)}

    def __init__(self, target: int = 64, max_turns: int = 40, worked_examples: int = 0):
        if target < 8 or target & (target - 1):  # a power of two has a single bit set
            raise AgentEnvironmentError(f"2048 target must be a power of two of at least 8, not {target}")
        if not 0 <= worked_examples <= 8:
            raise AgentEnvironmentError(
                f"2048 worked_examples (moves of the example game) must be 0 to 8, not {worked_examples}"
            )
        self.target, self.max_turns, self.worked_examples = target, max_turns, worked_examples

    def examples(self, scenario: Scenario) -> list[Message]:
        if not self.worked_examples:
            return []
        state, _, user = self.start(Scenario(id="2048-example", data={"seed": EXAMPLE_SEED}))
        messages: list[Message] = [UserMessage(content=user)]
        for number in range(self.worked_examples):
            order = EXAMPLE_MOVES[number % 4 :] + EXAMPLE_MOVES[: number % 4]  # vary the shown directions
            direction = next((d for d in order if slide(state.board, d)[0] != state.board), None)
            if direction is None:  # the example game is stuck: fewer moves are shown
                break
            call = ToolCall(
                id=f"example_move_{number}",
                function=FunctionCall(name="move", arguments=json.dumps({"direction": direction})),
            )
            result = self.call(state, "move", {"direction": direction})
            messages += [
                AssistantMessage(content=format_call(call)),
                ToolMessage(tool_call_id=call.id, content=result.content),
            ]
            if result.done:
                break
        return messages

    def tools(self) -> list[dict]:
        return [
            function_tool(
                "move",
                "Slide all tiles in one direction; equal tiles that touch merge.",
                {"direction": {"type": "string", "enum": list(DIRECTIONS)}},
            )
        ]

    def scenarios(self, split: Split, count: int, seed: int) -> list[Scenario]:
        base = HELD_OUT_SEED_BASE if split == "held_out" else 0
        # Offsets below the base, drawn without repeats: the two splits' games never share a seed.
        seeds = random.Random(seed).sample(range(HELD_OUT_SEED_BASE), count)
        return [Scenario(id=f"2048-{base + s}", data={"seed": base + s}) for s in seeds]

    def start(self, scenario: Scenario) -> tuple[GameState, str, str]:
        state = GameState(rng=random.Random(scenario.data["seed"]))
        spawn(state.board, state.rng)
        spawn(state.board, state.rng)
        system = (
            f"You play 2048 on a 4x4 board. Merge equal tiles to reach {self.target}. "
            "Make one move per turn with the move tool; empty cells are shown as '.'."
        )
        return state, system, f"The board:\n{render(state.board)}\nYour move."

    def call(self, state: GameState, name: str, arguments: dict) -> ToolResult:
        board, merged = slide(state.board, arguments["direction"])
        if board == state.board:  # no tile moved: no new tile either, and the move is refused as an error
            state.useless_moves += 1
            return ToolResult(
                f"moving {arguments['direction']} changes nothing; try another direction.\n{render(state.board)}",
                error=True,
            )
        state.board, state.merged, state.moves = board, state.merged + merged, state.moves + 1
        spawn(state.board, state.rng)
        if state.largest() >= self.target:
            return ToolResult(f"{render(state.board)}\nYou reached {self.target}!", done=True)
        if not can_move(state.board):
            return ToolResult(f"{render(state.board)}\nNo moves left: game over.", done=True)
        return ToolResult(f"{render(state.board)}\nMerged {merged} this move. Your move.")

    def score(self, state: GameState, episode: Episode) -> tuple[float, dict[str, float]]:
        largest = state.largest()
        won = largest >= self.target
        reward = (
            0.6 * math.log2(largest) / math.log2(self.target)
            + 0.4 * min(1.0, state.merged / self.target)
            + float(won)
            - 0.1 * (episode.invalid_calls + episode.malformed_calls)
        )
        return reward, {
            "largest_tile": float(largest),
            "merged": float(state.merged),
            "won": float(won),
            "success": float(won),
            "moves": float(state.moves),
        }
