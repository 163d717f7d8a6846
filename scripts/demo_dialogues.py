"""Chat dialogues for the demo's fine-tune: when to call a tool, and when to just answer.

Why: the demo's chat template (`ssdmoe_tui.models.demo.DEMO_TEMPLATE`, Qwen3's tool
format without thinking) lists the configured MCP servers' tools in a system turn and
expects a call as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`. The
previous mix taught the format but not the condition: every question-like message it saw
came with tools, so the demo answered "Hello!" with a loop, plain questions with the one
canned no-fitting-tool line, and called a tool for almost anything once tools were
listed. This mix is contrastive, the same kinds of question on both sides of the line:

- (a) greetings and small talk, answered with short varied sentences;
- (b) questions with no tools in the template, answered in prose: how-to questions,
  topics, what a command does (from the manual pages' NAME lines), and the tool kinds'
  own questions (weather, files...) answered without a call;
- (c) tools listed and the question needs one: the call, its result, an answer using it;
- (d) tools listed and the question needs none: the same plain answers as (a) and (b);
  rarely, a tool-kind question no listed tool fits, answered by naming what is there.

Every dialogue is rendered by the template itself (transformers' `apply_chat_template`),
so the training text is what the app sends. The newcomer prompts the evaluation asks
(`EVAL_PROMPTS`, scripts/demo_eval.py) never appear verbatim as a user turn; paraphrases
do. All text here is ours; the command facts come from the manual pages
(scripts/demo_corpus.py, licences in docs/quality.md).
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

Messages = list[dict[str, Any]]
Tools = list[dict[str, Any]]

#: What docs/quality.md's "first replies a newcomer reads" asks: held out verbatim.
EVAL_PROMPTS = (
    "Hello!",
    "Who are you?",
    "What can you do?",
    "How do I copy a file?",
    "Tell me about Python.",
    "What is a mixture of experts?",
    "What is the weather in Paris?",
)

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

# ---- (a) greetings and small talk: (user turns, replies) per kind of turn
SMALL_TALK: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (
        ("Hello", "Hello.", "Hi!", "Hi", "Hi.", "Hey!", "Hey there.", "Hello there!",
         "Hi there!", "Hello, assistant.", "Hi, anyone there?", "Greetings!", "Yo!"),
        ("Hello! How can I help you today?", "Hi! What can I do for you?",
         "Hello! What would you like to know?", "Hi there! How can I help?",
         "Hello! Ask me a question and I will do my best.", "Hi! What is on your mind?",
         "Hello! I am here. What do you need?", "Hey! How can I help you?"),
    ),
    (
        ("Good morning!", "Good morning.", "Morning!"),
        ("Good morning! How can I help you today?", "Good morning! What can I do for you?"),
    ),
    (
        ("Good afternoon!", "Good afternoon."),
        ("Good afternoon! How can I help?", "Good afternoon! What would you like to know?"),
    ),
    (
        ("Good evening!", "Good evening."),
        ("Good evening! How can I help you?", "Good evening! What can I do for you?"),
    ),
    (
        ("How are you?", "How are you today?", "Hi, how are you?", "Hello! How are you?",
         "How is it going?", "How are things?", "Are you well?"),
        ("I am fine, thank you. How can I help you today?",
         "Doing well, thanks for asking! What can I do for you?",
         "All good here. What would you like to talk about?",
         "Very well, thank you. What can I help you with?"),
    ),
    (
        ("Thanks!", "Thank you.", "Thanks, that helps.", "Thank you very much!", "Great, thanks!",
         "Cheers.", "That was useful, thanks."),
        ("You are welcome!", "Glad I could help.", "Any time! Is there anything else?",
         "You're welcome. Let me know if you need anything else.", "Happy to help."),
    ),
    (
        ("Bye!", "Goodbye.", "See you later.", "Bye for now.", "That is all, bye."),
        ("Goodbye! Have a nice day.", "See you later!", "Bye! Come back any time.",
         "Goodbye, and good luck."),
    ),
    (
        ("Ok.", "OK", "Cool.", "Nice.", "I see.", "Got it.", "Alright."),
        ("Is there anything else I can help with?", "Good. What would you like to do next?",
         "Let me know if you have another question."),
    ),
    (
        ("Nice to meet you.", "Pleased to meet you!"),
        ("Nice to meet you too! How can I help?", "Likewise! What can I do for you?"),
    ),
)  # fmt: skip

# ---- (b) plain answers: (questions, answers) about the demo itself and common topics
ABOUT: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (
        ("Who are you?", "What are you?", "Tell me about yourself.", "Who am I talking to?",
         "Are you a person?", "Introduce yourself."),
        ("I am the ssdmoe demo, a very small language model that runs on your own computer. "
         "I was trained on manual pages and documentation, so my answers are short and "
         "sometimes wrong.",
         "I am a tiny mixture-of-experts language model, the demo that ships with ssdmoe. "
         "I can chat and answer simple questions about commands and files.",
         "I am a small demo model. I run locally, I know a little about computers, and I "
         "can call tools when a server offers them."),
    ),
    (
        ("What can you do?", "What can you help me with?", "What are you able to do?",
         "What do you do?", "How can you help me?", "What are you good at?"),
        ("I can chat, explain what a command does, and answer simple questions about files "
         "and programs. When tools are configured, I can also call them for you.",
         "I answer short questions, mostly about commands, files and programs. With an MCP "
         "server configured I can use its tools, such as a weather lookup.",
         "Not much, I am small: I can greet you, explain common commands and, when tools "
         "are listed, ask one of them for an answer."),
    ),
    (
        ("What is a mixture of experts model?", "What's a mixture of experts?",
         "Explain mixture of experts.", "What does mixture of experts mean?",
         "How does a mixture of experts work?", "What is an MoE model?"),
        ("A mixture of experts is a model whose layers hold many small networks, the "
         "experts. A router picks a few of them for each token, so only part of the model "
         "runs at a time.",
         "In a mixture of experts, each layer has a router and a set of experts. For every "
         "token the router chooses the best few experts, and their outputs are mixed.",
         "It is a way to build a large model that is cheap to run: many experts per layer, "
         "but each token only uses the few that its router picks."),
    ),
    (
        ("What is ssdmoe?", "What does ssdmoe do?", "Tell me about ssdmoe."),
        ("ssdmoe runs mixture-of-experts models whose experts do not fit in memory: it "
         "reads the experts a token needs from the SSD and keeps the busy ones in a cache.",),
    ),
    (
        ("What is a language model?", "Explain what a language model is."),
        ("A language model predicts the next word of a text from the words before it. "
         "Repeated, that prediction writes sentences and answers.",),
    ),
)  # fmt: skip

TOPICS: dict[str, tuple[str, ...]] = {
    "Python": ("Python is a programming language known for its clear syntax. It comes with "
               "a large standard library, and programs run with the python3 command.",
               "Python is a popular general purpose programming language. It is easy to "
               "read and is used for scripts, web servers, data work and more."),
    "Linux": ("Linux is the kernel of many free operating systems. With the GNU tools around "
              "it, it runs servers, laptops and phones.",),
    "Vim": ("Vim is a text editor that works in the terminal. You move and edit with keys in "
            "normal mode and type text in insert mode; :q quits.",),
    "Emacs": ("Emacs is an extensible text editor. Most of it is written in Emacs Lisp, so "
              "almost everything can be changed or added.",),
    "Git": ("Git is a version control system. It records the history of a project's files "
            "and lets many people work on them at once.",),
    "the shell": ("The shell reads the commands you type and runs them. Bash is the usual "
                  "shell on Linux.",),
    "a terminal": ("A terminal is a window where you type commands and read their output as "
                   "text.",),
    "a file system": ("A file system stores files in folders on a disk and keeps track of "
                      "their names, sizes and permissions.",),
    "a compiler": ("A compiler translates a program from its source code into machine code "
                   "that the computer can run.",),
    "a process": ("A process is a program that is running. Each one has its own memory and "
                  "an id, which ps shows.",),
    "an SSD": ("An SSD is a solid state drive: storage made of flash memory, much faster "
               "than a spinning disk.",),
    "a GPU": ("A GPU is a processor built for many small calculations at once. It draws "
              "graphics and runs neural networks fast.",),
    "memory": ("Memory, or RAM, holds the programs and data in use. It is fast but is "
               "emptied when the computer turns off.",),
    "a token": ("A token is a piece of text a language model reads or writes: a word, part of "
                "a word, or a sign.",),
    "JSON": ("JSON is a text format for data: objects in braces, lists in brackets, strings "
             "in double quotes.",),
    "Markdown": ("Markdown is a plain text format for documents. A # starts a heading and "
                 "stars make text bold or italic.",),
    "the weather": ("The weather is the state of the air at a place and time: warm or cold, "
                    "dry or wet, calm or windy.",),
}  # fmt: skip

TOPIC_QUESTIONS = ("What is {t}?", "Tell me about {t}.", "Can you explain {t}?",
                   "What do you know about {t}?", "Explain {t} in a few words.")  # fmt: skip

HOW_TO: tuple[tuple[tuple[str, ...], tuple[str, ...]], ...] = (
    (("copy a file", "copy files", "make a copy of a file", "duplicate a file"),
     ("Use cp: cp notes.txt backup.txt copies notes.txt to backup.txt. Add -r to copy a "
      "whole folder.",
      "Run cp with the file and where the copy should go, for example cp report.txt "
      "old-report.txt.")),
    (("move a file", "rename a file", "move files to another folder"),
     ("Use mv: mv old.txt new.txt renames a file, and mv notes.txt ~/docs/ moves it into "
      "another folder.",)),
    (("delete a file", "remove a file", "remove files"),
     ("Use rm: rm notes.txt deletes the file. Be careful, it does not go to a trash can.",)),
    (("make a folder", "create a directory", "make a new directory"),
     ("Use mkdir: mkdir projects makes a folder called projects. Add -p to create parent "
      "folders too.",)),
    (("list the files in a folder", "see my files", "list files"),
     ("Use ls: ls shows the files in the current folder, and ls -l adds their sizes and "
      "dates.",)),
    (("find a file", "look for a file by name"),
     ("Use find: find . -name notes.txt searches the current folder and the folders below "
      "it.",)),
    (("see how much disk space is free", "check free disk space"),
     ("Run df -h. It lists each file system with its size and the space still free.",)),
    (("see which programs are running", "list running processes"),
     ("Run ps aux for a list, or top for a view that updates every few seconds.",)),
    (("change directory", "go to another folder"),
     ("Use cd: cd projects enters the folder projects, and cd .. goes back up one level.",)),
    (("read a text file", "show the contents of a file"),
     ("Use cat notes.txt to print a short file, or less notes.txt to page through a long "
      "one.",)),
    (("edit a text file", "change a text file"),
     ("Open it in an editor: nano notes.txt is simple, vim notes.txt is powerful.",)),
    (("pack a folder into an archive", "make a tar archive"),
     ("Use tar: tar czf backup.tar.gz projects packs the folder projects into one "
      "compressed file.",)),
    (("count the lines in a file", "count words in a file"),
     ("Use wc: wc -l notes.txt counts lines, wc -w counts words.",)),
    (("see which folder I am in", "print the current directory"),
     ("Run pwd. It prints the full path of the folder you are in.",)),
    (("make a script executable", "change file permissions"),
     ("Use chmod: chmod +x run.sh lets you run the script as ./run.sh.",)),
    (("run a Python script", "start a Python program"),
     ("Run python3 script.py in a terminal, in the folder that holds the script.",)),
    (("quit Vim", "exit vim"),
     ("Press Esc, then type :q and Enter. Use :wq to save first, or :q! to quit without "
      "saving.",)),
)  # fmt: skip

HOW_TO_QUESTIONS = ("How do I {t}?", "How can I {t}?", "What is the command to {t}?",
                    "How would I {t}?", "Can you tell me how to {t}?")  # fmt: skip
COMMAND_QUESTIONS = ("What does {c} do?", "What is {c}?", "What is the {c} command for?",
                     "Tell me about the {c} command.", "What is {c} used for?")  # fmt: skip

# verbs that start a manual page's NAME line ("copy files and directories")
_VERBS = set(
    "show display print run list create change convert check remove generate compute update "
    "compare report find query get add search control configure build set make filter copy "
    "send read manage apply output tell manipulate split format modify process discard call "
    "compress debug install produce dump save do parse translate move switch merge profile "
    "compile execute view archive strip concatenate guess match validate count use collect "
    "retrieve download receive push join perform pack register delete verify detect determine "
    "attach extract enter edit test analyze rename trace locate write start stop open close "
    "print sort shut scan mount load lock kill wait sign encode decode".split()
)


def command_fact(cmd: str, what: str) -> tuple[str, str] | None:
    """A manual page's NAME line as (a sentence about the command, the how-to phrase or
    ""), or None when it reads as neither a verb phrase ("copy files and directories")
    nor a noun phrase ("an archiving utility")."""
    first, _, rest = what.partition(" ")
    low = first.lower().rstrip(",")
    if low in _VERBS and rest:
        how = f"{low} {rest}"
        return f"The {cmd} command is used to {how}.", how
    if low in ("a", "an", "the") and rest:
        return f"The {cmd} command is {low} {rest}.", ""
    return None


# ---- the tools: kinds with their names, descriptions, arguments
@dataclass(frozen=True)
class Kind:
    names: tuple[str, ...]
    descriptions: tuple[str, ...]
    props: dict[str, str]
    need: str  # what a question of this kind needs, said in words


KINDS = {
    "weather": Kind(
        ("get_weather", "weather", "get_forecast", "current_weather"),
        ("The weather for a city.", "Get the current weather for a city.",
         "Today's forecast for a city."),
        {"city": "string"}, "look up the weather",
    ),
    "read": Kind(
        ("read_file", "read_text_file", "cat", "open_file"),
        ("Read the complete contents of a file from the file system.",
         "Read a text file and return its contents.", "The text of a file."),
        {"path": "string"}, "read files",
    ),
    "list": Kind(
        ("list_directory", "list_files", "ls"),
        ("Get a detailed listing of all files and directories in a specified path.",
         "List the files in a folder."),
        {"path": "string"}, "list folders",
    ),
    "time": Kind(
        ("get_time", "current_time", "get_current_time"),
        ("The current time in a time zone.", "Get the current time for a time zone."),
        {"timezone": "string"}, "tell the time",
    ),
    "define": Kind(
        ("define", "lookup_word", "dictionary"),
        ("The meaning of an English word.", "Look up a word in the dictionary."),
        {"word": "string"}, "look up words",
    ),
    "add": Kind(
        ("add", "sum_numbers", "calculator_add"),
        ("Add two numbers.", "The sum of a and b."),
        {"a": "number", "b": "number"}, "add numbers",
    ),
}  # fmt: skip

#: Tools that fit no question here (the tests' MCP server has some like them).
DISTRACTORS = (
    ("slow", "Sleep, then answer.", {"seconds": "number"}),
    ("fail", "Always fails.", {}),
    ("mark", 'Write "ran" to a file.', {"path": "string"}),
    ("secret", "Not for the model.", {}),
    ("send_email", "Send an email to an address.", {"to": "string", "body": "string"}),
    ("create_issue", "Open an issue in a repository.", {"title": "string"}),
)  # fmt: skip


def _schema(props: dict[str, str], tool: str, style: str) -> dict[str, Any]:
    """An input schema as the official MCP SDK publishes it (its key order, titles), or
    as the filesystem server does (plain)."""
    if style == "sdk":
        schema: dict[str, Any] = {
            "type": "object",
            "properties": {k: {"title": k.capitalize(), "type": t} for k, t in props.items()},
        }
        if props:
            schema["required"] = list(props)
        schema["title"] = f"{tool}Arguments"
        return schema
    return {
        "type": "object",
        "properties": {k: {"type": t} for k, t in props.items()},
        "required": list(props),
        "additionalProperties": False,
    }


def _entry(name: str, description: str, props: dict[str, str], rng: random.Random) -> dict:
    style = rng.choice(("sdk", "sdk", "plain"))
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": _schema(props, name, style),
        },
    }


def _tool(kind: Kind, rng: random.Random) -> dict[str, Any]:
    name = rng.choice(kind.names)
    return _entry(name, rng.choice(kind.descriptions), kind.props, rng)


def _toolset(rng: random.Random, need: str | None, fits: bool) -> Tools:
    """One to five tools: the one `need` asks for (when it `fits`), other kinds, and
    tools no question here needs; shuffled."""
    keys = [k for k in KINDS if k != need]
    tools = [_tool(KINDS[k], rng) for k in rng.sample(keys, rng.randint(0, 2))]
    tools += [_entry(*d, rng) for d in rng.sample(DISTRACTORS, rng.randint(0, 3))]
    if need is not None and fits:
        tools.append(_tool(KINDS[need], rng))
    if not tools:
        tools.append(_entry(*rng.choice(DISTRACTORS), rng))
    rng.shuffle(tools)
    return tools


def _task(key: str, rng: random.Random) -> tuple[str, dict[str, Any], str, str]:
    """(question, arguments, tool result, final answer) for one kind of task."""
    if key == "weather":
        city = rng.choice(CITIES)
        temp, cond = rng.randint(-5, 34), rng.choice(CONDITIONS)
        q = rng.choice((
            f"What is the weather in {city}?", f"What's the weather like in {city} today?",
            f"Is it raining in {city}?", f"How warm is it in {city}?",
            f"Tell me the weather in {city}.", f"Weather in {city}, please.",
            f"Do I need an umbrella in {city} today?",
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
            f"Can you open {path} and tell me what it says?", f"What does {path} say?",
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


def _unaided(key: str, q_args: dict[str, Any], rng: random.Random) -> str:
    """A tool-kind question answered without a tool (none listed): what to do instead,
    said about this question (no one canned line)."""
    if key == "weather":
        city = q_args["city"]
        return rng.choice((
            f"I cannot check the weather in {city} from here, as I have no live data. A "
            "forecast site or a weather app will tell you.",
            f"I do not know today's weather in {city}. Look at a forecast, or configure a "
            "weather server so that I can ask it.",
            f"I have no way to see the sky over {city}. A weather service has the current "
            "forecast.",
        ))  # fmt: skip
    if key == "read":
        path = q_args["path"]
        return rng.choice((
            f"I cannot open {path} from this chat. In a terminal, cat {path} prints it.",
            f"I cannot see your files. Run less {path} to read it, or paste its text here.",
        ))  # fmt: skip
    if key == "list":
        path = q_args["path"]
        return rng.choice((
            f"I cannot see your folders from here. Run ls {path} in a terminal to list it.",
            f"From this chat I cannot look into {path}; ls -l {path} shows what it holds.",
        ))  # fmt: skip
    if key == "time":
        zone = q_args["timezone"]
        return f"I have no clock to read here. In a terminal, TZ={zone} date prints the time there."
    return rng.choice((
        f"I have no dictionary here. A {q_args['word']} is an English word; a dictionary "
        "gives its full meaning.",
        f"I cannot look that up right now. Try a dictionary for the word {q_args['word']}.",
    ))  # fmt: skip


# ---- the four parts of the mix
class Bank:
    """The plain questions with their answers: hand-written ones and one per manual
    page whose NAME line reads as a sentence (`facts`: (command, summary) pairs)."""

    def __init__(self, facts: Sequence[tuple[str, str]] = ()) -> None:
        self.commands: list[tuple[str, str, str]] = []
        for cmd, what in facts:
            made = command_fact(cmd, what)
            if made:
                self.commands.append((cmd, *made))

    def small_talk(self, rng: random.Random) -> tuple[str, str]:
        users, replies = rng.choice(SMALL_TALK)
        return rng.choice(users), rng.choice(replies)

    def question(self, rng: random.Random) -> tuple[str, str]:
        """A question that needs no tool, and its answer in prose."""
        r = rng.random()
        if r < 0.2:
            qs, answers = rng.choice(ABOUT)
            return rng.choice(qs), rng.choice(answers)
        if r < 0.4:
            topic = rng.choice(list(TOPICS))
            q = rng.choice(TOPIC_QUESTIONS).format(t=topic)
            return q[0].upper() + q[1:], rng.choice(TOPICS[topic])
        if r < 0.6 or not self.commands:
            tasks, answers = rng.choice(HOW_TO)
            return rng.choice(HOW_TO_QUESTIONS).format(t=rng.choice(tasks)), rng.choice(answers)
        cmd, sentence, how = rng.choice(self.commands)
        tail = rng.choice(("", "", f" Its manual page, man {cmd}, has the details.",
                           f" See man {cmd} for its options."))  # fmt: skip
        if how and rng.random() < 0.4:
            return f"How do I {how}?", f"Use {cmd} to {how}.{tail}"
        return rng.choice(COMMAND_QUESTIONS).format(c=cmd), sentence + tail


def _held_out(messages: Messages) -> bool:
    return any(m["role"] == "user" and m["content"] in EVAL_PROMPTS for m in messages)


def _system(rng: random.Random) -> Messages:
    return (
        [{"role": "system", "content": "You are a helpful assistant."}]
        if rng.random() < 0.3
        else []
    )


def plain_turn(bank: Bank, rng: random.Random, tools_listed: bool) -> Messages:
    """(a) or (b): small talk, a plain question, or (no tools listed, or none fitting)
    a tool-kind question answered in words."""
    r = rng.random()
    if r < 0.3:
        q, a = bank.small_talk(rng)
    elif r < 0.85 or tools_listed:
        q, a = bank.question(rng)
    else:
        key = rng.choice([k for k in KINDS if k != "add"])  # sums: no tiny-model arithmetic
        q, args, _, _ = _task(key, rng)
        a = _unaided(key, args, rng)
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def tool_turn(key: str, tools: Tools, rng: random.Random) -> Messages:
    """(c): the question, the call in the template's format, the result, the answer."""
    names = set(KINDS[key].names)
    name = next(t["function"]["name"] for t in tools if t["function"]["name"] in names)
    q, args, result, answer = _task(key, rng)
    call_id = f"call_{rng.randrange(16**8):08x}"
    call = {"name": name, "arguments": json.dumps(args)}
    return [
        {"role": "user", "content": q},
        {"role": "assistant", "content": "",
         "tool_calls": [{"id": call_id, "type": "function", "function": call}]},
        {"role": "tool", "name": name, "tool_call_id": call_id, "content": result},
        {"role": "assistant", "content": answer},
    ]  # fmt: skip


def no_fit_turn(key: str, tools: Tools, rng: random.Random) -> Messages:
    """(d), rarely: a tool-kind question that no listed tool fits, answered by naming
    the tools there are (so the answer cannot be said without a tool list)."""
    names = [t["function"]["name"] for t in tools]
    listed = ", ".join(names)
    q, _, _, _ = _task(key, rng)
    a = rng.choice((
        f"The tools I have here ({listed}) cannot {KINDS[key].need}, so I cannot answer that.",
        f"None of the listed tools ({listed}) can {KINDS[key].need}. Add a server that can, "
        "and ask again.",
    ))  # fmt: skip
    return [{"role": "user", "content": q}, {"role": "assistant", "content": a}]


def dialogue(bank: Bank, rng: random.Random) -> tuple[Messages, Tools]:
    """One dialogue of the mix: (a)+(b) without tools half the time, (c) a quarter, (d)
    a quarter; one in four goes on for a second exchange in the same setting."""
    while True:
        r = rng.random()
        messages = _system(rng)
        if r < 0.5:
            tools: Tools = []
            messages += plain_turn(bank, rng, False)
            if rng.random() < 0.25:
                messages += plain_turn(bank, rng, False)
        elif r < 0.75:
            key = rng.choice(list(KINDS))
            tools = _toolset(rng, key, fits=True)
            messages += tool_turn(key, tools, rng)
            if rng.random() < 0.25:
                messages += plain_turn(bank, rng, True)
        else:
            key = rng.choice(list(KINDS))
            tools = _toolset(rng, key, fits=False)
            if rng.random() < 0.1:
                messages += no_fit_turn(key, tools, rng)
            else:
                messages += plain_turn(bank, rng, True)
            if rng.random() < 0.25:
                fit = [k for k in KINDS if any(
                    t["function"]["name"] in KINDS[k].names for t in tools)]  # fmt: skip
                messages += tool_turn(fit[0], tools, rng) if fit else plain_turn(bank, rng, True)
        if not _held_out(messages):
            return messages, tools


def chat_with_tools(rng: random.Random, question: str, answer: str) -> tuple[Messages, Tools]:
    """A prose chat (a paragraph's first sentence, then the rest) with tools listed and
    none called: most messages in the app come with tools and need none."""
    return [{"role": "user", "content": question},
            {"role": "assistant", "content": answer}], _toolset(rng, None, False)  # fmt: skip


def render(tokenizer: Any, messages: Messages, tools: Tools) -> str:
    """The dialogue as the template renders it (what the app sends, plus the replies)."""
    return tokenizer.apply_chat_template(messages, tools=tools or None, tokenize=False)


def mix(tokenizer: Any, n: int, facts: Sequence[tuple[str, str]], rng: random.Random) -> list[str]:
    """`n` rendered dialogues (the fine-tune's chat part)."""
    bank = Bank(facts)
    return [render(tokenizer, *dialogue(bank, rng)) for _ in range(n)]
