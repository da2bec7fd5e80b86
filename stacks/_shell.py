"""Shell scripts and launch lines as the commands they run, for the Megatron and launch readers.

Not a shell: enough of bash to read a training script the way it would run, offline. It joins
continuation lines, drops comments and redirections, and keeps simple variables (`VAR=value`,
`export`, `${VAR:-default}`, `$((A*B))`), arrays (`ARGS=( ... )`, `ARGS+=( ... )`,
`${ARGS[@]}`) and string variables (`ARGS="--a 1 --b 2"`, split where used unquoted), as in
Megatron-LM's example scripts. `if` / `elif` / `case` run the branch their simple tests (`[ ]`,
`[[ ]]`: -z, -n, ==, !=, -eq ...) choose; a loop body runs once per listed word; `while` bodies,
command substitutions and positional parameters are not known. A value the script leaves
unknown holds UNKNOWN. `#SBATCH` lines are kept for the launch reader.
"""

from __future__ import annotations

import ast
import fnmatch
import operator
import re
from dataclasses import dataclass, field
from typing import Any

UNKNOWN = "\x00"
"""Stands for a value the script does not say (a positional parameter, `$(cmd)`, an unset
variable)."""
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
ASSIGN = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*)(\[[^\]]*\])?(\+?)=(.*)$", re.S)
OPS = ("&&", "||", ";;", "|&", ";", "|", "&", "(", ")", "\n")
RESERVED = {"if", "then", "elif", "else", "fi", "for", "while", "until", "do", "done", "case",
            "esac", "in", "{", "}", "function", "!"}  # fmt: skip
MAX_STEPS = 20000
"""Commands run at most (loops and functions are bounded)."""


def known(text: str) -> bool:
    return UNKNOWN not in text


@dataclass(frozen=True, slots=True)
class Command:
    """One simple command as it would run: its words after expansion, the variables it sees."""

    argv: list[str]
    env: dict[str, str]
    line: int


@dataclass
class Script:
    """What a script runs: its commands in order, its variables at the end, its #SBATCH lines."""

    commands: list[Command] = field(default_factory=list)
    env: dict[str, str | list[str]] = field(default_factory=dict)
    sbatch: list[str] = field(default_factory=list)
    """The words of every `#SBATCH` line, in order."""


@dataclass(frozen=True, slots=True)
class Tok:
    kind: str  # "word" or "op"
    text: str
    line: int


# ---- lexing ------------------------------------------------------------------------------------


def _balanced(text: str, i: int, open_: str, close: str) -> int:
    """The index after the `close` matching the `open_` at text[i] (quotes respected)."""
    depth, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\":
            i += 2
            continue
        if c in "'\"" and open_ != "'":
            i = _quoted_end(text, i)
            continue
        if c == open_:
            depth += 1
        elif c == close:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return n


def _quoted_end(text: str, i: int) -> int:
    """The index after the quote closing the one at text[i]."""
    q, n = text[i], len(text)
    i += 1
    while i < n and text[i] != q:
        if q == '"' and text[i] == "\\":
            i += 1
        elif q == '"' and text.startswith("$(", i):
            i = _balanced(text, i + 1, "(", ")") - 1
        i += 1
    return min(i + 1, n)


def _word_end(text: str, i: int) -> int:
    """The index after the word starting at text[i]."""
    n = len(text)
    while i < n:
        c = text[i]
        if c in " \t\n;&|()":
            return i  # ARR=( ... ): the array's "(" is an operator of its own
        if c == "\\":
            i += 2
        elif c in "'\"":
            i = _quoted_end(text, i)
        elif c == "`":
            nxt = text.find("`", i + 1)
            i = n if nxt < 0 else nxt + 1
        elif text.startswith("$(", i):
            i = _balanced(text, i + 1, "(", ")")
        elif text.startswith("${", i):
            i = _balanced(text, i + 1, "{", "}")
        else:
            i += 1
    return n


REDIRECT = re.compile(r"\d*(<<-?|<>|>>|>&|<&|&>>|&>|>\||<|>)")


def _skip_blank(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t":
        i += 1
    return i


def tokens(text: str) -> list[Tok]:
    """Words and operators, with line numbers; comments, continuations, redirections (and
    here-documents) dropped."""
    out: list[Tok] = []
    i, n, line = 0, len(text), 1
    heredocs: list[str] = []
    while i < n:
        c = text[i]
        if text.startswith("\\\n", i):
            i, line = i + 2, line + 1
        elif c in " \t\r":
            i += 1
        elif c == "#":
            while i < n and text[i] != "\n":
                i += 1
        elif c == "\n":
            out.append(Tok("op", "\n", line))
            i, line = i + 1, line + 1
            for delimiter in heredocs:
                i, line = _skip_heredoc(text, i, line, delimiter)
            heredocs = []
        elif (m := REDIRECT.match(text, i)) and not text.startswith("&&", i):
            i = _skip_blank(text, m.end())
            end = _word_end(text, i)
            if m.group(1).startswith("<<"):
                heredocs.append(text[i:end].strip("'\"").lstrip("-"))
            i = end
        elif op := next((o for o in OPS if text.startswith(o, i)), None):
            out.append(Tok("op", op, line))
            i += len(op)
        else:
            end = _word_end(text, i)
            out.append(Tok("word", text[i:end], line))
            line += text.count("\n", i, end)
            i = end
    return out


def _skip_heredoc(text: str, i: int, line: int, delimiter: str) -> tuple[int, int]:
    while i < len(text):
        end = text.find("\n", i)
        end = len(text) if end < 0 else end
        current = text[i:end].strip()
        i, line = end + 1, line + 1
        if current == delimiter:
            break
    return i, line


# ---- expansion ---------------------------------------------------------------------------------

Env = dict[str, str | list[str]]


class _Fields:
    """Words being built by an expansion: literal text joins, unquoted expansions split."""

    def __init__(self, split: bool) -> None:
        self.split, self.cur, self.has = split, "", False
        self.out: list[str] = []

    def literal(self, text: str) -> None:
        self.cur += text
        self.has = True

    def splittable(self, text: str) -> None:
        if not self.split:
            self.cur += text
            self.has = self.has or bool(text)
            return
        for k, piece in enumerate(re.split(r"[ \t\n]+", text)):
            if k > 0:
                self.push()
            if piece:
                self.cur += piece
                self.has = True

    def elements(self, items: list[str], quoted: bool) -> None:
        if not quoted:
            self.splittable(" ".join(items))
            return
        for k, item in enumerate(items):
            if k > 0:
                self.push()
            self.literal(item)

    def push(self) -> None:
        if self.has:
            self.out.append(self.cur)
        self.cur, self.has = "", False

    def words(self) -> list[str]:
        self.push()
        return self.out


def expand(raw: str, env: Env, *, split: bool = True) -> list[str]:
    """The words one raw word becomes (quotes removed, variables expanded; unquoted expansions
    split on blanks when `split`)."""
    f = _Fields(split)
    i, n = 0, len(raw)
    while i < n:
        c = raw[i]
        if c == "'":
            end = raw.find("'", i + 1)
            end = n if end < 0 else end
            f.literal(raw[i + 1 : end])
            i = end + 1
        elif c == '"':
            end = _quoted_end(raw, i)
            _double_quoted(raw[i + 1 : end - 1], env, f)
            f.has = True
            i = end
        elif c == "\\":
            f.literal(raw[i + 1 : i + 2])
            i += 2
        elif c == "$" or c == "`":
            kind, value, i = _dollar(raw, i, env)
            if kind == "array":
                f.elements(value, quoted=False)
            else:
                f.splittable(value)
        else:
            f.literal(c)
            i += 1
    return f.words()


def expand_one(raw: str, env: Env) -> str:
    """A raw word as one string (an assignment's value: no splitting)."""
    return " ".join(expand(raw, env, split=False))


def _double_quoted(inner: str, env: Env, f: _Fields) -> None:
    i, n = 0, len(inner)
    while i < n:
        c = inner[i]
        if c == "\\" and i + 1 < n and inner[i + 1] in '$`"\\\n':
            f.literal(inner[i + 1] if inner[i + 1] != "\n" else "")
            i += 2
        elif c in "$`":
            kind, value, i = _dollar(inner, i, env)
            if kind == "array":
                f.elements(value, quoted=True)
            else:
                f.cur += value
        else:
            f.cur += c
            i += 1


def _dollar(raw: str, i: int, env: Env) -> tuple[str, Any, int]:
    """("text", value, end) or ("array", elements, end) of the expansion at raw[i]."""
    if raw[i] == "`":
        end = raw.find("`", i + 1)
        return "text", UNKNOWN, len(raw) if end < 0 else end + 1
    if raw.startswith("$((", i):
        end = _balanced(raw, i + 1, "(", ")")
        return "text", arithmetic(raw[i + 3 : end - 2], env), end
    if raw.startswith("$(", i):
        return "text", UNKNOWN, _balanced(raw, i + 1, "(", ")")
    if raw.startswith("${", i):
        end = _balanced(raw, i + 1, "{", "}")
        kind, value = _parameter(raw[i + 2 : end - 1], env)
        return kind, value, end
    m = NAME.match(raw, i + 1)
    if m:
        value = env.get(m.group(0))
        if value is None:
            return "text", UNKNOWN, m.end()
        return "text", value[0] if isinstance(value, list) and value else value or "", m.end()
    if i + 1 < len(raw) and raw[i + 1] in "@*":
        return "array", [], i + 2  # the script's own arguments: none known
    if i + 1 < len(raw) and raw[i + 1] in "0123456789#?$!-":
        return "text", UNKNOWN, i + 2
    return "text", "$", i + 1


PARAM = re.compile(r"([A-Za-z_][A-Za-z0-9_]*|\d+|[@*])(?:\[([^\]]*)\])?(.*)$", re.S)


def _parameter(body: str, env: Env) -> tuple[str, Any]:
    """${body}: NAME, NAME[@], NAME[N], #NAME and the :- - := = :+ + :? ? operators."""
    if body.startswith("#") and NAME.fullmatch(body[1:]):
        value = env.get(body[1:])
        return "text", UNKNOWN if value is None else str(len(value))
    m = PARAM.match(body)
    if not m:
        return "text", UNKNOWN
    name, index, rest = m.groups()
    value = env.get(name) if NAME.fullmatch(name) else None
    if index in ("@", "*"):
        items = value if isinstance(value, list) else ([] if value is None else [value])
        return ("array", items) if not rest else ("text", UNKNOWN)
    if index is not None:
        items = value if isinstance(value, list) else ([] if value is None else [value])
        k = int(index) if index.isdigit() else -1
        value = items[k] if 0 <= k < len(items) else None
    elif isinstance(value, list):
        value = value[0] if value else ""
    return "text", _operator(name, value, rest, env)


def _operator(name: str, value: str | None, rest: str, env: Env) -> str:
    if not rest:
        return UNKNOWN if value is None else value
    m = re.match(r"(:?)([-=+?])(.*)$", rest, re.S)
    if not m:
        return UNKNOWN
    colon, op, word = m.groups()
    unset = value is None or (colon == ":" and value == "")
    if op == "+":
        return "" if unset else expand_one(word, env)
    if not unset:
        return value or ""
    if op == "?":
        return UNKNOWN
    default = expand_one(word, env)
    if op == "=" and NAME.fullmatch(name):
        env[name] = default
    return default


ARITH_OPS = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
    ast.FloorDiv: operator.floordiv, ast.Div: operator.floordiv, ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}  # fmt: skip


def arithmetic(expr: str, env: Env) -> str:
    """$((expr)) over known integers (+ - * / % **), else UNKNOWN."""
    text = expand_one(expr, env)

    def name(m: re.Match[str]) -> str:
        value = env.get(m.group(0))
        value = value[0] if isinstance(value, list) and value else value
        return str(value) if isinstance(value, str) and value.strip().lstrip("-").isdigit() else "x"

    text = NAME.sub(name, text)
    if not known(text) or "x" in text:
        return UNKNOWN
    try:
        return str(_arith(ast.parse(text.strip(), mode="eval").body))
    except (SyntaxError, ValueError, ZeroDivisionError, OverflowError):
        return UNKNOWN


def _arith(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and isinstance(node.value, int):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = _arith(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in ARITH_OPS:
        left, right = _arith(node.left), _arith(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > 64:
            raise ValueError("exponent")
        return int(ARITH_OPS[type(node.op)](left, right))
    raise ValueError("not arithmetic")


# ---- running -----------------------------------------------------------------------------------

STOP = ("then", "elif", "else", "fi", "do", "done", "esac", "}")
"""Words that end a command list."""
BUILTINS = {"set", "shift", "cd", "pushd", "popd", "echo", "printf", "mkdir", "rm", "cp", "mv",
            "ln", "touch", "wait", "sleep", "trap", "ulimit", "umask", "unset", "source", ".",
            "module", "conda", "ls", "cat", "nvidia-smi", "hostname", "date", "pip", "git",
            "return", "read", "chmod", "tee", "wget", "curl", "nproc", "exec", "time"}  # fmt: skip
"""Commands whose running changes nothing a reader needs (recorded as nothing)."""
DECLARE = ("export", "local", "declare", "readonly", "typeset")


class _Run:
    """Runs the token list of a script (`go` False: parses a branch not taken)."""

    def __init__(self, toks: list[Tok], env: Env, script: Script) -> None:
        self.toks, self.pos, self.env, self.script = toks, 0, env, script
        self.functions: dict[str, list[Tok]] = {}
        self.steps, self.stopped = 0, False
        self.outer: list[str] = []

    def peek(self, offset: int = 0) -> Tok | None:
        k = self.pos + offset
        return self.toks[k] if k < len(self.toks) else None

    def at(self, kind: str, *texts: str) -> bool:
        tok = self.peek()
        return tok is not None and tok.kind == kind and (not texts or tok.text in texts)

    def newlines(self) -> None:
        while self.at("op", "\n", ";"):
            self.pos += 1

    def expect_word(self, text: str) -> None:
        self.newlines()
        if self.at("word", text):
            self.pos += 1

    def command_list(self, go: bool, ends: tuple[str, ...] = STOP) -> bool | None:
        """Runs and-or lists until a word of `ends` (or `)`, `;;`); the last status."""
        status: bool | None = True
        while True:
            self.newlines()
            tok = self.peek()
            if tok is None or (tok.kind == "word" and tok.text in ends):
                return status
            if tok.kind == "op" and tok.text in (")", ";;"):
                return status
            status = self.and_or(go)
            if self.at("op", "&"):
                self.pos += 1

    def and_or(self, go: bool) -> bool | None:
        status = self.pipeline(go)
        while self.at("op", "&&", "||"):
            op = self.toks[self.pos].text
            self.pos += 1
            while self.at("op", "\n"):
                self.pos += 1
            run = go and (status is not False if op == "&&" else status is False)
            right = self.pipeline(run)
            if run:
                status = right
        return status

    def pipeline(self, go: bool) -> bool | None:
        negate = self.at("word", "!")
        if negate:
            self.pos += 1
        status = self.command(go)
        while self.at("op", "|", "|&"):
            self.pos += 1
            self.newlines()
            status = self.command(go)
        if negate and status is not None:
            return not status
        return status

    def command(self, go: bool) -> bool | None:
        self.steps += 1
        if self.steps > MAX_STEPS or self.stopped:
            go = False
        tok = self.peek()
        if tok is None:
            return True
        if tok.kind == "op" and tok.text == "(":
            self.pos += 1
            status = self.command_list(go)
            self.pos += 1  # ")"
            return status
        compound = {
            "if": self.if_,
            "for": self.for_,
            "while": self.while_,
            "until": self.while_,
            "case": self.case_,
            "{": self.group,
            "function": self.function,
        }
        if tok.kind == "word" and tok.text in compound:
            return compound[tok.text](go)
        nxt, after = self.peek(1), self.peek(2)
        if (
            tok.kind == "word"
            and NAME.fullmatch(tok.text)
            and nxt is not None
            and nxt.text == "("
            and after is not None
            and after.text == ")"
        ):
            self.pos += 3
            return self.define(tok.text)
        return self.simple(go)

    def if_(self, go: bool) -> bool | None:
        self.pos += 1  # if / elif
        test = self.command_list(go, ("then",))
        self.expect_word("then")
        taken = go and test is True
        status = self.command_list(taken, ("elif", "else", "fi"))
        if self.at("word", "elif"):
            other = self.if_(go and not taken)
            return status if taken else other
        if self.at("word", "else"):
            self.pos += 1
            other = self.command_list(go and not taken, ("fi",))
            status = status if taken else other
        self.expect_word("fi")
        return status

    def for_(self, go: bool) -> bool | None:
        self.pos += 1
        var = self.toks[self.pos].text if self.peek() else ""
        self.pos += 1
        words: list[str] = []
        if self.at("word", "in"):
            self.pos += 1
            while self.at("word"):
                words += expand(self.toks[self.pos].text, self.env)
                self.pos += 1
        self.expect_word("do")
        start, status = self.pos, None
        for word in (words[:64] or [UNKNOWN]) if go else [UNKNOWN]:
            self.pos = start
            self.env[var] = word
            status = self.command_list(go and known(word), ("done",))
        self.expect_word("done")
        return status

    def while_(self, go: bool) -> bool | None:
        self.pos += 1
        self.command_list(False, ("do",))
        self.expect_word("do")
        self.command_list(False, ("done",))
        self.expect_word("done")
        return True

    def case_(self, go: bool) -> bool | None:
        self.pos += 1
        subject = expand_one(self.toks[self.pos].text, self.env) if self.peek() else UNKNOWN
        self.pos += 1
        self.expect_word("in")
        done: bool = not go
        status: bool | None = True
        while True:
            self.newlines()
            if self.peek() is None or self.at("word", "esac"):
                break
            patterns = self.case_patterns()
            hit = (
                not done
                and known(subject)
                and any(fnmatch.fnmatchcase(subject, p) for p in patterns)
            )
            status = self.command_list(hit, ("esac",)) if hit else self.command_list(False)
            done = done or hit
            if self.at("op", ";;"):
                self.pos += 1
        self.expect_word("esac")
        return status

    def case_patterns(self) -> list[str]:
        if self.at("op", "("):
            self.pos += 1
        patterns = []
        while self.peek() is not None and not self.at("op", ")"):
            if self.at("word"):
                patterns += expand(self.toks[self.pos].text, self.env, split=False)
            self.pos += 1
        self.pos += 1
        return patterns

    def group(self, go: bool) -> bool | None:
        self.pos += 1
        status = self.command_list(go, ("}",))
        self.expect_word("}")
        return status

    def function(self, go: bool) -> bool | None:
        self.pos += 1
        name = self.toks[self.pos].text if self.peek() else ""
        self.pos += 1
        if self.at("op", "("):
            self.pos += 2
        return self.define(name)

    def define(self, name: str) -> bool:
        """Records a function's body (the compound command after its name)."""
        self.newlines()
        start = self.pos
        self.command(False)
        self.functions[name] = self.toks[start : self.pos]
        return True

    def simple(self, go: bool) -> bool | None:
        raw, line = self.raw_words()
        if not go or not raw:
            return True
        prefix: dict[str, str] = {}
        k = 0
        while k < len(raw) and isinstance(raw[k], str) and ASSIGN.match(raw[k]):
            k = self.assign(raw, k, prefix)
        argv: list[str] = []
        for word in raw[k:]:
            argv += expand(word, self.env) if isinstance(word, str) else word
        if not argv:
            self.env.update(prefix)  # plain assignments
            return True
        return self.execute(argv, raw[k + 1 :], prefix, line)

    def raw_words(self) -> tuple[list[Any], int]:
        """The raw words of one simple command (an array assignment's `( ... )` as a tuple of
        raw words after its `NAME=` word); `[[ ... ]]` keeps its && and ||."""
        out: list[Any] = []
        line = self.peek().line if self.peek() else 0  # type: ignore[union-attr]
        test = self.at("word", "[[")
        while (tok := self.peek()) is not None:
            if tok.kind == "op":
                if test and tok.text in ("&&", "||", "(", ")"):
                    out.append(tok.text)
                    self.pos += 1
                    continue
                if tok.text == "(" and out and isinstance(out[-1], str) and out[-1].endswith("="):
                    self.pos += 1
                    out.append(tuple(self.array_words()))
                    continue
                break
            if tok.text in STOP and not out:
                break
            out.append(tok.text)
            test = test and tok.text != "]]"
            self.pos += 1
        return out, line

    def array_words(self) -> list[str]:
        words = []
        while (tok := self.peek()) is not None and not (tok.kind == "op" and tok.text == ")"):
            if tok.kind == "word":
                words.append(tok.text)
            self.pos += 1
        self.pos += 1
        return words

    def assign(self, raw: list[Any], k: int, into: dict[str, str] | None) -> int:
        """Runs the assignment raw[k] (with its array at raw[k+1]); the next index."""
        m = ASSIGN.match(raw[k])
        assert m is not None
        name, index, append, value = m.groups()
        if k + 1 < len(raw) and isinstance(raw[k + 1], tuple) and value == "":
            items = [w for r in raw[k + 1] for w in expand(r, self.env)]
            old = self.env.get(name) if append else None
            old_items = old if isinstance(old, list) else ([old] if old else [])
            self.env[name] = old_items + items
            return k + 2
        text = expand_one(value, self.env)
        if append:
            old = self.env.get(name)
            if isinstance(old, list):
                self.env[name] = [*old, text]
                return k + 1
            text = (old or "") + text
        if index is not None:
            return k + 1  # ARR[N]=x: not followed
        if into is not None:
            into[name] = text
        else:
            self.env[name] = text
        return k + 1

    def execute(
        self, argv: list[str], raw: list[Any], prefix: dict[str, str], line: int
    ) -> bool | None:
        name = argv[0]
        if name in DECLARE:
            for k, word in enumerate(raw):
                if isinstance(word, str) and ASSIGN.match(word):
                    self.assign(raw, k, None)
            return True
        if name in ("[", "[[", "test"):
            return condition(argv[1:], self.env)
        if name in ("true", ":"):
            return True
        if name == "false":
            return False
        if name == "exit":
            self.stopped = True
            return True
        if name in self.functions and self.steps < MAX_STEPS:
            return self.call(name)
        if name == "eval":
            return self.nested(" ".join(argv[1:]), [])
        inner = _shell_c(argv)
        if inner is not None:
            return self.nested(argv[inner], argv[: max(inner - 2, 0)])
        if name in BUILTINS:
            return True
        strings = {k: v if isinstance(v, str) else " ".join(v) for k, v in self.env.items()}
        command = Command([*self.outer, *argv], {**strings, **prefix}, line)
        self.script.commands.append(command)
        return True

    def call(self, name: str) -> bool | None:
        saved = self.toks, self.pos
        self.toks, self.pos = self.functions[name], 0
        status = self.command(True)
        self.toks, self.pos = saved
        return status

    def nested(self, text: str, outer: list[str]) -> bool | None:
        """A command line inside a string (`sh -c "..."`, `eval`), run in this environment;
        `outer` (the launcher around it, e.g. srun's words) prefixes its commands."""
        if self.steps > MAX_STEPS:
            return True
        saved = self.toks, self.pos, self.outer
        self.toks, self.pos, self.outer = tokens(text), 0, [*self.outer, *outer]
        status = self.command_list(True, ())
        self.toks, self.pos, self.outer = saved
        return status


def _shell_c(argv: list[str]) -> int | None:
    """The index of the command string of `... sh -c STRING` / `bash -c STRING`, else None."""
    for k, word in enumerate(argv[:-2]):
        if word.rsplit("/", 1)[-1] in ("sh", "bash") and argv[k + 1] == "-c":
            return k + 2
    return None


def condition(args: list[str], env: Env) -> bool | None:
    """A `[ ... ]` / `[[ ... ]]` test: True, False, or None (not known)."""
    if args and args[-1] in ("]", "]]"):
        args = args[:-1]
    for op, combine in (("||", any), ("&&", all), ("-o", any), ("-a", all)):
        if op in args:
            k = args.index(op)
            parts = [condition(args[:k], env), condition(args[k + 1 :], env)]
            if combine is any:
                return True if True in parts else (None if None in parts else False)
            return False if False in parts else (None if None in parts else True)
    if args and args[0] == "!":
        result = condition(args[1:], env)
        return None if result is None else not result
    return _test(args)


NUMERIC = {"-eq": operator.eq, "-ne": operator.ne, "-lt": operator.lt, "-le": operator.le,
           "-gt": operator.gt, "-ge": operator.ge}  # fmt: skip


def _test(args: list[str]) -> bool | None:
    if any(not known(a) for a in args):
        return None
    if len(args) == 1:
        return args[0] != ""
    if len(args) == 2 and args[0] in ("-z", "-n"):
        return (args[1] == "") == (args[0] == "-z")
    if len(args) == 3 and args[1] in ("=", "==", "!="):
        same = fnmatch.fnmatchcase(args[0], args[2])
        return same if args[1] != "!=" else not same
    if len(args) == 3 and args[1] in NUMERIC:
        try:
            return bool(NUMERIC[args[1]](int(args[0]), int(args[2])))
        except ValueError:
            return None
    return None


def parse_script(text: str, env: Env | None = None) -> Script:
    """The commands `text` runs (in order, expanded), its variables and its #SBATCH words."""
    script = Script()
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#SBATCH"):
            script.sbatch += [w for w in stripped[len("#SBATCH") :].split() if w]
    start: Env = {**slurm_env(sbatch_options(script.sbatch)), **(env or {})}
    run = _Run(tokens(text), start, script)
    while run.peek() is not None and run.steps <= MAX_STEPS:
        before = run.pos
        run.command_list(True, ())
        if run.pos == before:
            run.pos += 1  # a stray closing word or operator
    script.env = run.env
    return script


SBATCH_SHORT = {"-N": "nodes", "-n": "ntasks", "-G": "gpus", "-c": "cpus-per-task",
                "-p": "partition", "-C": "constraint"}  # fmt: skip


def sbatch_options(words: list[str]) -> dict[str, str]:
    """`--opt=value` / `--opt value` / `-N value` of sbatch or srun words, by long name."""
    out: dict[str, str] = {}
    k = 0
    while k < len(words):
        word = words[k]
        k += 1
        if word.startswith("--"):
            name, eq, value = word[2:].partition("=")
            if not eq and k < len(words) and not words[k].startswith("-"):
                value, k = words[k], k + 1
            out[name] = value
        elif word[:2] in SBATCH_SHORT:
            value = word[2:].lstrip("=")
            if not value and k < len(words):
                value, k = words[k], k + 1
            out[SBATCH_SHORT[word[:2]]] = value
    return out


def slurm_env(options: dict[str, str]) -> dict[str, str | list[str]]:
    """The SLURM_* variables a job of these sbatch options starts with."""
    env: dict[str, str | list[str]] = {}
    nodes = options.get("nodes", "").split("-")[0]
    if nodes.isdigit():
        env["SLURM_NNODES"] = env["SLURM_JOB_NUM_NODES"] = nodes
    if options.get("ntasks-per-node", "").isdigit():
        env["SLURM_NTASKS_PER_NODE"] = options["ntasks-per-node"]
    gpus = options.get("gpus-per-node", "").rsplit(":", 1)[-1]
    if gpus.isdigit():
        env["SLURM_GPUS_PER_NODE"] = env["SLURM_GPUS_ON_NODE"] = gpus
    if options.get("ntasks", "").isdigit():
        env["SLURM_NTASKS"] = options["ntasks"]
    return env
