"""YAML job file -> JobSpec, or every error at once as `FILE:LINE:KEY: message`.

The YAML is composed into nodes first so that each key path knows its line;
pydantic then validates the plain data and its errors are mapped back to
those lines. Unknown keys get a did-you-mean suggestion. `read_job` keeps the
plain data and the line index so that `appliance/job_checks.py` can report the problems it
finds (model store, files, reward registry) at the same keys and lines.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from appliance.errors import ApplianceError
from appliance.suggest import did_you_mean
from appliance.config.limits import MAX_INTEGER, MAX_JOB_FILE_BYTES, MAX_NUMBER_CHARS
from appliance.config.schema import JobSpec
from appliance.text_rules import escaped, first_bad, text_problem

_NOT_IN_TEXT_RAW = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\ud800-\udfff]")

# libyaml's parser where it is installed: a large job file costs milliseconds, not seconds of pure Python.
SafeLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class JobLoader(SafeLoader):  # type: ignore[valid-type, misc]
    """The safe loader with every number bounded as it is built: a 20,000-digit hex or base-60 integer costs
    seconds to build and cannot even be printed in an error, so it is refused at its line first."""


def _bounded(build):
    def construct(loader, node):
        if len(node.value) > MAX_NUMBER_CHARS:
            raise yaml.constructor.ConstructorError(
                None,
                None,
                f"a number of {len(node.value)} characters; write at most {MAX_NUMBER_CHARS}",
                node.start_mark,
            )
        value = build(loader, node)
        if isinstance(value, int) and abs(value) > MAX_INTEGER:
            raise yaml.constructor.ConstructorError(
                None, None, f"an integer of {value.bit_length()} bits; no key takes one past 2**63 - 1", node.start_mark
            )
        return value

    return construct


JobLoader.add_constructor("tag:yaml.org,2002:int", _bounded(yaml.constructor.SafeConstructor.construct_yaml_int))
JobLoader.add_constructor("tag:yaml.org,2002:float", _bounded(yaml.constructor.SafeConstructor.construct_yaml_float))

# A key path (("rewards", 0, "name")) -> its 1-based line in the file.
LineIndex = dict[tuple, int]

# A job file is a few sections a few levels deep: deeper nesting is a mistake or an attack.
MAX_DEPTH = 32
# A file with more problems than this lists these and counts the rest (the answer stays small).
MAX_REPORTED = 100
# How much of a wrong value an error message repeats.
MAX_SHOWN_VALUE = 80


@dataclass(frozen=True)
class ConfigError:
    file: str
    key: str
    message: str
    line: int | None = None

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else self.file
        return f"{where}:{self.key or '(top)'}: {self.message}"

    def as_dict(self) -> dict:
        return {"file": self.file, "line": self.line, "key": self.key, "message": self.message}


class JobFileError(ApplianceError):
    """One or more problems in a job file; str() lists them one per line."""

    def __init__(self, errors: list[ConfigError]):
        self.errors = errors
        super().__init__("\n".join(str(e) for e in errors))


@dataclass(frozen=True)
class ParsedJob:
    """One job file after YAML parsing and schema validation.

    `data` is the plain YAML value (None when the file could not be read or
    parsed); `spec` is set only when the schema accepted it.
    """

    file: str
    data: Any
    lines: LineIndex
    spec: JobSpec | None
    errors: list[ConfigError] = field(default_factory=list)

    def error_at(self, path: tuple, message: str) -> ConfigError:
        """An error for the key at `path`, located at its line (or its nearest parent's)."""
        return ConfigError(self.file, dotted(path), message, nearest_line(self.lines, path))


def dotted(path: tuple) -> str:
    """("rewards", 0, "name") -> "rewards[0].name"."""
    text = ""
    for part in path:
        # A key is the caller's text: shown with control characters escaped, and cut when long.
        part = part if isinstance(part, int) else escaped(str(part)[:MAX_SHOWN_VALUE], multiline=False)
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def nearest_line(lines: LineIndex, path: tuple) -> int | None:
    path = tuple(path)
    while path:
        if path in lines:
            return lines[path]
        path = path[:-1]
    return lines.get(())


def _index_lines(node: yaml.Node, file: str, path: tuple, lines: LineIndex, errors: list[ConfigError]) -> None:
    """Fill `lines` for every key path under `node`; a key given twice in one mapping is an error."""
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[Any, int] = {}
        for key_node, value_node in node.value:
            line = key_node.start_mark.line + 1
            key = key_node.value
            if key in seen:
                # PyYAML silently keeps the last value; a user almost never means that.
                errors.append(
                    ConfigError(
                        file, dotted(path + (key,)), f"key given twice (also on line {seen[key]}); keep one", line
                    )
                )
                continue
            seen[key] = line
            lines[path + (key,)] = line
            _index_lines(value_node, file, path + (key,), lines, errors)
    elif isinstance(node, yaml.SequenceNode):
        for position, item in enumerate(node.value):
            lines[path + (position,)] = item.start_mark.line + 1
            _index_lines(item, file, path + (position,), lines, errors)


def _model_at(path: tuple) -> type[BaseModel] | None:
    """The pydantic model class that holds the keys at `path`, if any."""
    model: Any = JobSpec
    for part in path:
        if isinstance(part, int):
            continue
        field_info = model.model_fields.get(part) if isinstance(model, type) and issubclass(model, BaseModel) else None
        if field_info is None:
            return None
        model = _unwrap_model(field_info.annotation)
        if model is None:
            return None
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def _unwrap_model(annotation: Any) -> type[BaseModel] | None:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for argument in getattr(annotation, "__args__", ()) or ():
        found = _unwrap_model(argument)
        if found is not None:
            return found
    return None


def _data_path(location: tuple, data: Any, kind: str) -> tuple:
    """pydantic's error location -> the key path in the YAML data.

    pydantic inserts union branch names ('str', 'int', 'JudgeSpec') and
    validator names into locations; only the parts that walk the data are
    keys the user wrote. A missing key is not in the data, so it is kept last.
    """
    path: list = []
    node = data
    for position, part in enumerate(location):
        if isinstance(node, dict) and part in node:
            path.append(part)
            node = node[part]
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            path.append(part)
            node = node[part]
        elif kind == "missing" and position == len(location) - 1:
            path.append(part)
    return tuple(path)


def _describe(error: dict, path: tuple) -> str:
    kind = error["type"]
    if kind == "extra_forbidden":
        model = _model_at(path[:-1])
        known = list(model.model_fields) if model else []
        hint = did_you_mean(str(path[-1]), known) or (f"; known keys: {', '.join(known)}" if known else "")
        return f"unknown key{hint}"
    if kind == "missing":
        return "required key is missing"
    if kind == "model_type":  # pydantic says "a valid dictionary or instance of GrpoSpec"
        return "should be a mapping of keys (key: value on indented lines, or {key: value})"
    message = error["msg"]
    if message.startswith("Value error, "):
        message = message[len("Value error, ") :]
    return message


def _schema_errors(exc: ValidationError, data: dict, file: str, lines: LineIndex) -> list[ConfigError]:
    """One error per key; the branches of a union ('a valid string', 'a valid integer') become one message."""
    by_key: dict[tuple, list[dict]] = {}
    for error in exc.errors():
        by_key.setdefault(_data_path(tuple(error["loc"]), data, error["type"]), []).append(error)
    errors = []
    for path, found in by_key.items():
        messages = [_describe(error, path) for error in found]
        message = messages[0] + "".join(
            " or " + m.removeprefix("Input should be ") for m in messages[1:] if m != messages[0]
        )
        first = found[0]
        if first["type"] not in ("value_error", "assertion_error", "missing", "extra_forbidden") and not isinstance(
            first.get("input"), dict
        ):
            shown = repr(first["input"])
            message += f" (got {shown[:MAX_SHOWN_VALUE] + '...' if len(shown) > MAX_SHOWN_VALUE else shown})"
        errors.append(ConfigError(file, dotted(path), message, nearest_line(lines, path)))
    return errors


def _shape_problem(text: str, file: str) -> ConfigError | None:
    """Anchors, aliases or nesting past MAX_DEPTH, found from the event stream before any node is built.

    A job file has no use for anchors; refusing them is what keeps an alias
    bomb (a few hundred bytes expanding to gigabytes) from ever being expanded.
    """
    depth = 0
    for event in yaml.parse(text, Loader=SafeLoader):
        line = event.start_mark.line + 1
        if isinstance(event, yaml.AliasEvent) or getattr(event, "anchor", None) is not None:
            return ConfigError(
                file,
                "",
                "YAML anchors and aliases (&name, *name) are not allowed in a job file; write values out",
                line,
            )
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                return ConfigError(file, "", f"nested more than {MAX_DEPTH} levels deep; a job file needs a few", line)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1
    return None


def _text_problem(text: str, file: str) -> ConfigError | None:
    """The file as a whole: at most MAX_JOB_FILE_BYTES, and no character the string rule refuses."""
    size = len(text.encode("utf-8", errors="surrogatepass"))
    if size > MAX_JOB_FILE_BYTES:
        return ConfigError(
            file,
            "",
            f"the job file is {size} bytes, over the limit of {MAX_JOB_FILE_BYTES}; a job file needs a few KiB",
        )
    plain = text.replace("\r", "\n")  # a carriage return is a YAML line break, not a control character here
    position = first_bad(plain, multiline=True)
    if position is not None:
        line = plain.count("\n", 0, position) + 1
        problem = text_problem(plain[position], multiline=True).split(" at character")[0]
        return ConfigError(
            file, _key_on_line(text, line), f"{problem}; remove it (write the value as plain text)", line
        )
    return None


def _key_on_line(text: str, line: int) -> str:
    """The deepest key written on `line` of a file whose bad characters are replaced (for the error's key)."""
    clean = parse_job(_NOT_IN_TEXT_RAW.sub("\ufffd", text), "")
    on_line = [path for path, number in clean.lines.items() if number == line]
    marked = [path for path in on_line if "\ufffd" in str(path[-1:]) or "\ufffd" in str(_value_at(clean.data, path))]
    found = marked or on_line
    return dotted(max(found, key=len)) if found else ""


def _value_at(data: Any, path: tuple) -> Any:
    for part in path:
        try:
            data = data[part]
        except (KeyError, IndexError, TypeError):
            return None
    return data if isinstance(data, str) else None


def _path_of(node: yaml.Node, mark: yaml.Mark, path: tuple = ()) -> tuple | None:
    """The key path of the value that starts at `mark` in a composed document (no value built), if any."""
    if node.start_mark.index == mark.index and not isinstance(node, (yaml.MappingNode, yaml.SequenceNode)):
        return path
    if isinstance(node, yaml.MappingNode):
        children = [(key.value, value) for key, value in node.value]
    elif isinstance(node, yaml.SequenceNode):
        children = list(enumerate(node.value))
    else:
        return None
    for part, child in children:
        if child.start_mark.index <= mark.index <= child.end_mark.index:
            found = _path_of(child, mark, path + (part,))
            if found is not None:
                return found
    return None


def parse_job(text: str, file: str = "<job>") -> ParsedJob:
    """Parse and validate YAML text; every problem found is in the result's `errors`."""
    problem = _text_problem(text, file)
    if problem is not None:
        return ParsedJob(file, None, {}, None, [problem])
    loader = JobLoader(text)
    root = None
    try:
        problem = _shape_problem(text, file)
        if problem is not None:
            return ParsedJob(file, None, {}, None, [problem])
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = mark.line + 1 if mark else None
        column = f", column {mark.column + 1}" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        kind = "a value cannot be read" if isinstance(exc, yaml.constructor.ConstructorError) else "YAML syntax error"
        key = dotted(_path_of(root, mark) or ()) if root is not None and mark is not None else ""
        return ParsedJob(file, None, {}, None, [ConfigError(file, key, f"{kind}{column}: {problem}", line)])
    except (ValueError, OverflowError, RecursionError) as exc:  # a value the loader cannot build (a 5000-digit int)
        message = f"a value cannot be read ({str(exc).split(';')[0][:MAX_SHOWN_VALUE]}); write it out plainly"
        return ParsedJob(file, None, {}, None, [ConfigError(file, "", message)])
    finally:
        loader.dispose()
    if data is None:
        return ParsedJob(
            file,
            None,
            {},
            None,
            [ConfigError(file, "", "the job file is empty; it needs at least name, student and rewards", 1)],
        )
    if not isinstance(data, dict):
        kind = "a list" if isinstance(data, list) else f"a {type(data).__name__}"
        return ParsedJob(
            file,
            data,
            {},
            None,
            [
                ConfigError(
                    file,
                    "",
                    f"a job file must be a YAML mapping of sections (name, student, rewards, ...), not {kind}",
                    1,
                )
            ],
        )
    lines: LineIndex = {}
    errors: list[ConfigError] = []
    _index_lines(root, file, (), lines, errors)
    try:
        spec = JobSpec.model_validate(data)
    except ValidationError as exc:
        return ParsedJob(file, data, lines, None, _at_most(errors + _schema_errors(exc, data, file, lines)))
    return ParsedJob(file, data, lines, None if errors else spec, _at_most(errors))


def _at_most(errors: list[ConfigError]) -> list[ConfigError]:
    """The first MAX_REPORTED errors, and one line counting the rest."""
    if len(errors) <= MAX_REPORTED:
        return errors
    rest = ConfigError(errors[0].file, "", f"... and {len(errors) - MAX_REPORTED} more errors; fix these first")
    return errors[:MAX_REPORTED] + [rest]


def read_job(path: str | Path) -> ParsedJob:
    """Read a job file and validate it against the schema (no outside-world checks)."""
    path = Path(path)
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_JOB_FILE_BYTES + 1)  # never more than the cap, whatever the file's size
        if len(data) > MAX_JOB_FILE_BYTES:
            message = f"the job file is over the limit of {MAX_JOB_FILE_BYTES} bytes; a job file needs a few KiB"
            return ParsedJob(str(path), None, {}, None, [ConfigError(str(path), "", message)])
        text = data.decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "it is not UTF-8 text"
        return ParsedJob(str(path), None, {}, None, [ConfigError(str(path), "", f"cannot read the job file: {reason}")])
    return parse_job(text, str(path))


def parse_job_text(text: str, file: str = "<job>") -> JobSpec:
    """Validate YAML text; raise JobFileError with every problem found."""
    parsed = parse_job(text, file)
    if parsed.spec is None:
        raise JobFileError(parsed.errors)
    return parsed.spec


def load_job(path: str | Path) -> JobSpec:
    """Read and validate a job file against the schema; raise JobFileError with every problem.

    This does not look at the model store or other files: use
    `appliance.job_checks.load_checked_job` before training.
    """
    parsed = read_job(path)
    if parsed.spec is None:
        raise JobFileError(parsed.errors)
    return parsed.spec
