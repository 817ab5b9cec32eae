"""Turning a pydantic validation error into one plain line per problem, with did-you-mean:
`job.toml: train.batch_size: must be greater than 0 (got 0)`. Shared by jobspec, config, the
sweep file, the mirror's manifest and the notifier tables (pydantic only)."""

from __future__ import annotations

import difflib
import json
import re
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError


def _show(value: Any) -> str:
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (dict, list)):
        text = repr(value)
        return text if len(text) <= 60 else text[:57] + "..."
    return str(value)


_BARE_KEY = re.compile(r"[A-Za-z0-9_-]+")


def quote_key(key: str) -> str:
    """A key as TOML writes it in a dotted path: bare when it can be, else quoted, so one key with
    a dot (a sweep's 'train.lr') never reads as two tables: sweep.params.'train.lr'."""
    if _BARE_KEY.fullmatch(key):
        return key
    return f"'{key}'" if "'" not in key and "\n" not in key else json.dumps(key)


def _dotted(loc: tuple[Any, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        else:
            parts.append(quote_key(str(item)))
    return ".".join(parts)


def _model_at(model: type[BaseModel], loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The pydantic model class that owns the field at loc (for did-you-mean suggestions)."""
    current: Any = model
    for item in loc:
        if isinstance(item, int):  # an entry of a list of tables ([[recovery.zones]]): its model
            continue
        if not (isinstance(current, type) and issubclass(current, BaseModel)):
            return None
        field = current.model_fields.get(str(item))
        if field is None:
            return None
        current = _unwrap(field.annotation)
    return current if isinstance(current, type) and issubclass(current, BaseModel) else None


def _unwrap(annotation: Any) -> Any:
    for arg in getattr(annotation, "__args__", ()) or ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return annotation


def _bound(value: Any) -> Any:
    # pydantic reports a float field's bound as 0.0; users wrote (and read) 0.
    return int(value) if isinstance(value, float) and value.is_integer() else value


# pydantic's error type -> what it means for a TOML value ({bound}: the limit in the error's ctx).
_WORDS = {
    "greater_than": ("must be greater than {bound}", "gt"),
    "greater_than_equal": ("must be at least {bound}", "ge"),
    "less_than": ("must be less than {bound}", "lt"),
    "less_than_equal": ("must be at most {bound}", "le"),
    **dict.fromkeys(("int_type", "int_parsing", "int_from_float"), ("must be a whole number", None)),
    **dict.fromkeys(("float_type", "float_parsing"), ("must be a number", None)),
    **dict.fromkeys(("bool_type", "bool_parsing"), ("must be true or false", None)),
    "number_in_quotes": ("must be a number, written without quotes", None),
    "string_type": ("must be a string", None),
    "list_type": ("must be a list", None),
    **dict.fromkeys(("dict_type", "model_type", "model_attributes_type"), ("must be a table", None)),
    **dict.fromkeys(("too_short", "string_too_short"), ("must not be empty", None)),
}


def _message(err: Any) -> str:
    kind, ctx, value = err["type"], err.get("ctx") or {}, err.get("input")
    got = f" (got {_show(value)})"
    if kind == "missing":
        return "is required"
    if kind == "value_error":
        return str(ctx.get("error", err["msg"]))
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected')}{got}"
    if kind in _WORDS:
        words, limit = _WORDS[kind]
        return words.format(bound=_bound(ctx[limit]) if limit else "") + got
    return f"{err['msg'][0].lower()}{err['msg'][1:]}{got}"


def problems_from(exc: ValidationError, model: type[BaseModel], label: str) -> list[str]:
    lines: list[str] = []
    for err in exc.errors():
        loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        # pydantic puts union branch names in loc ("list[str]", "float"); drop them.
        loc = tuple(x for x in loc if not (isinstance(x, str) and ("[" in x or x in {"float", "int", "str", "bool"})))
        if err["type"] == "extra_forbidden":
            # The unknown key is the last item of the raw loc, whatever it looks like ("[x", "int").
            key, parent = str(err["loc"][-1]), loc[:-1] if loc and loc[-1] == err["loc"][-1] else loc
            owner = _model_at(model, parent)
            # not a field set by orch itself (Config.path), which the file cannot hold
            choices = [k for k, f in owner.model_fields.items() if not f.exclude] if owner else []
            near = difflib.get_close_matches(key, choices, n=1, cutoff=0.6)
            prefix = _dotted(parent) + "." if parent else ""
            hint = f" (did you mean '{prefix}{near[0]}'?)" if near else ""
            if not hint and choices:
                hint = f" (known keys: {', '.join(choices)})"
            lines.append(f"{label}: unknown key '{prefix}{key}'{hint}")  # quoted whole: the key as written
        elif loc:
            lines.append(f"{label}: {_dotted(loc)}: {_message(err)}")
        else:
            lines.append(f"{label}: {_message(err)}")
    # Keep order, drop repeats (unions can report one problem twice).
    return list(dict.fromkeys(lines))


def _number_only(args: tuple[Any, ...]) -> tuple[bool, bool]:
    """(takes a number, takes nothing else a TOML scalar could mean: no bool, str or Literal)."""
    numeric = int in args or float in args
    other = bool in args or str in args or any(typing.get_origin(a) is typing.Literal for a in args)
    return numeric, numeric and not other


class TomlTable(BaseModel):
    """A table of a file people write (job.toml, config.toml, a sweep file): unknown keys are
    errors, a number field takes only a TOML number and a true/false field only a TOML boolean. pydantic would read `true` as 1
    (num_labels = true became a one-label regression head) and "32" as 32 (a quoted number
    usually means a template or a copy-paste went wrong, and "inf" passed every bound)."""

    model_config = ConfigDict(extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_numbers(cls, value: Any, info: ValidationInfo) -> Any:
        if not isinstance(value, (bool, str, int, float)) or info.field_name not in cls.model_fields:
            return value
        annotation = cls.model_fields[info.field_name].annotation
        args = getattr(annotation, "__args__", None) or (annotation,)
        if not isinstance(value, bool) and bool in args and _bool_only(args):
            # pydantic would read "yes", "off", 1 and 0 as booleans: cpu_offload = 1 turned it on
            raise PydanticCustomError("bool_type", "true or false")
        if not isinstance(value, (bool, str)):
            return value
        numeric, only = _number_only(args)
        if isinstance(value, bool) and numeric and bool not in args:
            raise PydanticCustomError("int_type" if int in args and float not in args else "float_type", "a number")
        if isinstance(value, str) and only and _reads_as_number(value):
            raise PydanticCustomError("number_in_quotes", "a number, written without quotes")
        return value  # any other text: pydantic's own "must be a whole number (got 'two')"


def _bool_only(args: tuple[Any, ...]) -> bool:
    """A field that takes true or false and nothing else (None aside)."""
    return all(a is bool or a is type(None) for a in args)


def _reads_as_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
