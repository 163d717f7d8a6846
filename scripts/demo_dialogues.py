"""Chat dialogues for the demo's training mix: tool use in its template's format, and
plain turns where tools are offered but not needed.

Why: the demo's chat template (`ssdmoe_tui.models.demo.DEMO_TEMPLATE`, Qwen3's tool
format without thinking) lists the tools of the configured MCP servers in the system turn
and expects a call as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.
A model learns that format only from examples: these are written here from a few
hand-made patterns (a weather question, a file to read, a folder to list, a time, a
word to look up, a sum), with varied tool names, descriptions, schemas in the shapes MCP
servers publish (the official SDK's, the filesystem server's), and arguments the model
must copy from the question. Each dialogue is rendered by the template itself (with
transformers' `apply_chat_template`), so the training text is what the app sends.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

CITIES = (
    "Paris London Tokyo Berlin Madrid Rome Lisbon Dublin Oslo Vienna Prague Warsaw Athens "
    "Cairo Nairobi Lagos Mumbai Delhi Beijing Seoul Sydney Perth Auckland Toronto Chicago "
    "Boston Denver Seattle Lima Quito Santiago Havana Dakar Tunis Zurich Geneva Munich Lyon "
    "Bristol Leeds Glasgow Cork Bergen Turku Riga Tallinn Vilnius Kyiv Sofia Porto Seville"
).split()
CONDITIONS = (
    "sunny", "cloudy", "rainy", "windy", "foggy", "snowing", "clear", "showers", "stormy",
)  # fmt: skip
FILES = (
    "notes.txt todo.md README.md report.txt plan.md ideas.txt letter.txt diary.txt "
    "shopping.txt recipe.md config.toml hello.py main.py draft.md summary.txt list.txt"
).split()
DIRS = "/home/me/notes ~/notes ~/projects ./docs /tmp /home/me ~/work data src".split()
WORDS = (
    "river mountain garden lantern harbour meadow violin compass orchard thunder "
    "pebble anchor ember falcon glacier"
).split()
ZONES = "Europe/Paris Europe/London Asia/Tokyo America/New_York UTC Australia/Sydney".split()
SENTENCES = (
    "Buy milk, bread and apples.",
    "The meeting moved to Thursday at ten.",
    "Call the plumber about the kitchen sink.",
    "The first draft is due next week.",
    "Water the plants on the balcony.",
    "The train leaves at half past six.",
    "Remember to back up the photos.",
    "Finish the chapter on rivers and lakes.",
    "The garden needs new seeds in spring.",
    "Send the report to the team before noon.",
)


def _schema(props: dict[str, str], tool: str, style: str) -> dict[str, Any]:
    """An input schema as the official SDK writes it (titles), or as the filesystem
    server does (plain)."""
    if style == "sdk":
        return {
            "properties": {k: {"title": k.capitalize(), "type": t} for k, t in props.items()},
            "required": list(props),
            "title": f"{tool}Arguments",
            "type": "object",
        }
    return {
        "type": "object",
        "properties": {k: {"type": t} for k, t in props.items()},
        "required": list(props),
        "additionalProperties": False,
    }


@dataclass(frozen=True)
class Kind:
    names: tuple[str, ...]
    descriptions: tuple[str, ...]
    props: dict[str, str]


KINDS = {
    "weather": Kind(
        ("get_weather", "weather", "get_forecast", "current_weather"),
        ("The weather for a city.", "Get the current weather for a city.",
         "Today's forecast for a city."),
        {"city": "string"},
    ),
    "read": Kind(
        ("read_file", "read_text_file", "cat", "open_file"),
        ("Read the complete contents of a file from the file system.",
         "Read a text file and return its contents.", "The text of a file."),
        {"path": "string"},
    ),
    "list": Kind(
        ("list_directory", "list_files", "ls"),
        ("Get a detailed listing of all files and directories in a specified path.",
         "List the files in a folder."),
        {"path": "string"},
    ),
    "time": Kind(
        ("get_time", "current_time", "get_current_time"),
        ("The current time in a time zone.", "Get the current time for a time zone."),
        {"timezone": "string"},
    ),
    "define": Kind(
        ("define", "lookup_word", "dictionary"),
        ("The meaning of an English word.", "Look up a word in the dictionary."),
        {"word": "string"},
    ),
    "add": Kind(
        ("add", "sum_numbers", "calculator_add"),
        ("Add two numbers.", "The sum of a and b."),
        {"a": "number", "b": "number"},
    ),
}  # fmt: skip


def _tool(kind: Kind, rng: random.Random) -> dict[str, Any]:
    name = rng.choice(kind.names)
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": rng.choice(kind.descriptions),
            "parameters": _schema(kind.props, name, rng.choice(("sdk", "plain"))),
        },
    }


def _task(key: str, rng: random.Random) -> tuple[str, dict[str, Any], str, str]:
    """(question, arguments, tool result, final answer) for one kind of task."""
    if key == "weather":
        city = rng.choice(CITIES)
        temp, cond = rng.randint(-5, 34), rng.choice(CONDITIONS)
        q = rng.choice((
            f"What is the weather in {city}?", f"What's the weather like in {city} today?",
            f"Is it raining in {city}?", f"How warm is it in {city}?",
            f"Tell me the weather in {city}.",
        ))  # fmt: skip
        result = rng.choice((f"{city}: {temp} C, {cond}", f"{temp} C and {cond} in {city}"))
        answer = rng.choice((
            f"In {city} it is {temp} C and {cond}.",
            f"The weather in {city} is {cond}, at {temp} C.",
            f"It is {cond} in {city} right now, {temp} C.",
        ))  # fmt: skip
        return q, {"city": city}, result, answer
    if key == "read":
        path = rng.choice((rng.choice(FILES), f"{rng.choice(DIRS)}/{rng.choice(FILES)}"))
        text = rng.choice(SENTENCES)
        q = rng.choice((
            f"Read {path} for me.", f"What is in {path}?", f"Show me the file {path}.",
            f"Can you open {path} and tell me what it says?",
        ))  # fmt: skip
        return q, {"path": path}, text, f"The file {path} says: {text}"
    if key == "list":
        path = rng.choice(DIRS)
        names = rng.sample(FILES, rng.randint(2, 4))
        result = "\n".join(f"[FILE] {n}" for n in names)
        q = rng.choice((
            f"What files are in {path}?", f"List the files in {path}.",
            f"Which files do I have in {path}?",
        ))  # fmt: skip
        joined = ", ".join(names[:-1]) + " and " + names[-1]
        return q, {"path": path}, result, f"The folder {path} holds {joined}."
    if key == "time":
        zone = rng.choice(ZONES)
        hh, mm = rng.randint(0, 23), rng.randint(0, 59)
        q = rng.choice((f"What time is it in {zone}?", f"Tell me the time in {zone}."))
        return q, {"timezone": zone}, f"{hh:02d}:{mm:02d}", f"It is {hh:02d}:{mm:02d} in {zone}."
    if key == "define":
        word = rng.choice(WORDS)
        meaning = f"a {word} is a common English noun"
        q = rng.choice((f"What does {word} mean?", f"Define the word {word}."))
        return q, {"word": word}, meaning, f"The dictionary says {meaning}."
    a, b = rng.randint(1, 999), rng.randint(1, 999)
    q = rng.choice((f"What is {a} plus {b}?", f"Add {a} and {b}.", f"What is {a} + {b}?"))
    return q, {"a": a, "b": b}, str(a + b), f"{a} plus {b} is {a + b}."


def tool_dialogue(
    rng: random.Random, no_fit: float = 1 / 6
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(messages, tools): a question answered through one call, or (`no_fit` of them) a
    question no offered tool fits, answered without a call."""
    keys = list(KINDS)
    key = rng.choice(keys)
    others = rng.sample([k for k in keys if k != key], rng.randint(0, 3))
    tools = [_tool(KINDS[k], rng) for k in [key, *others]]
    rng.shuffle(tools)
    messages: list[dict[str, Any]] = []
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": "You are a helpful assistant."})
    unfit = [t for t in tools if t["function"]["name"] not in KINDS[key].names]
    if unfit and rng.random() < no_fit:  # tools offered, none fits: no call
        q, _, _, _ = _task(key, rng)
        messages += [
            {"role": "user", "content": q},
            {"role": "assistant", "content": "I have no tool for that, so I cannot tell."},
        ]
        return messages, unfit
    name = next(t["function"]["name"] for t in tools if t["function"]["name"] in KINDS[key].names)
    q, args, result, answer = _task(key, rng)
    call_id = f"call_{rng.randrange(16**8):08x}"
    messages += [
        {"role": "user", "content": q},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": call_id,
                    "type": "function",
                    "function": {"name": name, "arguments": json.dumps(args)},
                }
            ],
        },  # fmt: skip
        {"role": "tool", "name": name, "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": answer},
    ]
    return messages, tools


def chat_with_tools(
    rng: random.Random, question: str, answer: str
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A question no offered tool fits, answered in words: tools are offered to every
    chat in the app once a server is configured, and most questions need none."""
    tools = [_tool(KINDS[k], rng) for k in rng.sample(list(KINDS), rng.randint(1, 3))]
    messages = [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
    return messages, tools


def render(tokenizer: Any, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> str:
    """The dialogue as the template renders it (what the app sends, plus the replies)."""
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False)
