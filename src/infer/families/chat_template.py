"""Chat templates per model family: turn a conversation into the exact prompt text the model was tuned on."""

from __future__ import annotations

import json
from datetime import datetime
from functools import cache
from pathlib import Path
from typing import Any, NoReturn, Protocol

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from infer.families.catalog import family

TEMPLATE_DIR = Path(__file__).parent / "templates"
ROLES = ("system", "user", "assistant", "tool")  # every bundled template handles exactly these


class ChatTemplateError(ValueError):
    """A template name or conversation that cannot be rendered; the message names the template or message index."""


def available_templates() -> list[str]:
    """Names of the bundled templates (the `.jinja` files in TEMPLATE_DIR), sorted, for errors and CLI choices."""
    return sorted(path.stem for path in TEMPLATE_DIR.glob("*.jinja"))


def _tojson(value: Any, indent: int | None = None) -> str:
    """JSON as transformers' chat templates write it (no HTML escaping, non-ASCII kept, `, ` and `: `)."""
    return json.dumps(value, ensure_ascii=False, indent=indent)


def _hf_tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    """transformers' `tojson` filter, with its keyword arguments (templates written for Hugging Face pass them)."""
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    """transformers' `strftime_now`: the current local time formatted (Llama 3.x templates date their prompts)."""
    return datetime.now().strftime(fmt)


def _raise_exception(message: str) -> NoReturn:
    """Let a template reject a conversation it cannot format; the name follows Hugging Face templates."""
    raise ChatTemplateError(message)


@cache
def _environment() -> ImmutableSandboxedEnvironment:
    """The one sandboxed environment: templates are data and get no reach into Python; strict so typos fail loudly."""
    env = ImmutableSandboxedEnvironment(
        loader=jinja2.FileSystemLoader(TEMPLATE_DIR),
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    env.globals["raise_exception"] = _raise_exception
    env.filters["tojson"] = _tojson
    return env


@cache
def load_template(name: str) -> jinja2.Template:
    """The compiled template `name` (file `<name>.jinja` in TEMPLATE_DIR), compiled once per process."""
    available = available_templates()
    if name not in available:
        raise ChatTemplateError(
            f"unknown chat template {name!r}: no {name}.jinja in {TEMPLATE_DIR} (available: {', '.join(available)})"
        )
    return _environment().get_template(f"{name}.jinja")


@cache
def _file_environment() -> ImmutableSandboxedEnvironment:
    """The sandbox for a template file of the user's (`--chat-template`): as transformers renders chat templates
    (an undefined name is empty, loop controls, its filters and globals), since such files are written for it."""
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, autoescape=False,
                                        extensions=[jinja2.ext.loopcontrols])
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    env.filters["tojson"] = _hf_tojson
    return env


@cache
def load_template_file(path: str) -> jinja2.Template:
    """The chat template in the Jinja2 file at `path`, compiled once per process; ChatTemplateError names the file
    and the line of a syntax error."""
    file = Path(path).expanduser()
    try:
        return _file_environment().from_string(file.read_text())
    except OSError as exc:
        raise ChatTemplateError(f"cannot read the chat template {file}: {exc.strerror}") from None
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"{file}, line {exc.lineno}: {exc.message}") from None


def template_source(name: str) -> str:
    """The Jinja text of template `name`, as clients that render prompts themselves read it (lm-eval)."""
    load_template(name)  # the same error for an unknown name
    return (TEMPLATE_DIR / f"{name}.jinja").read_text()


def _validate(messages: list[dict[str, Any]]) -> None:
    """Accept only a non-empty list of dicts with a supported `role` and a str `content`; an assistant turn may
    carry `tool_calls` ({"function": {"name": str, "arguments": dict}}); name the bad index."""
    if not isinstance(messages, list) or not messages:
        raise ChatTemplateError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise ChatTemplateError(f"message {index} is a {type(message).__name__}, not a dict")
        role = message.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"message {index} has role {role!r}; supported roles: {', '.join(ROLES)}")
        content = message.get("content")
        if not isinstance(content, str):
            raise ChatTemplateError(f"message {index} ({role}) needs str content, got {type(content).__name__}")
        calls = message.get("tool_calls")
        if calls is not None and (role != "assistant" or not all(_is_call(c) for c in calls)):
            raise ChatTemplateError(f"message {index} ({role}): tool_calls belong to assistant messages, each "
                                    "{'function': {'name': str, 'arguments': dict}}")


def _is_call(call: object) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and isinstance(function.get("name"), str) and isinstance(function.get("arguments"), dict)


def render_chat(
    name: str,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> str:
    """Render `messages` into template `name`'s prompt text; `tools` are OpenAI tool definitions
    ({"type": "function", "function": {...}}); `extra` reaches the template (date_string, enable_thinking, ...)."""
    return render_template(load_template(name), messages, add_generation_prompt, bos_token, tools, **extra)


def render_template(
    template: jinja2.Template,
    messages: list[dict[str, Any]],
    add_generation_prompt: bool = True,
    bos_token: str = "",
    tools: list[dict[str, Any]] | None = None,
    **extra: Any,
) -> str:
    """`render_chat` with a compiled template: a bundled one, or a file's (`load_template_file`)."""
    _validate(messages)
    if tools:
        extra["tools"] = tools
    return template.render(
        messages=messages, add_generation_prompt=add_generation_prompt, bos_token=bos_token, **extra
    )


CUSTOM_TEMPLATE = "custom"  # chat_template_name of a template file on a family with no bundled template


class _Vocabulary(Protocol):
    def has_token(self, token: str) -> bool: ...


def chat_template_name(model_type: str, tokenizer: _Vocabulary) -> str:
    """The bundled chat template for a model family whose tokenizer has the template's marker token."""
    for name, marker in family(model_type).chat_templates:
        if tokenizer.has_token(marker):
            return name
    raise ChatTemplateError(
        f"no chat template for this {model_type} tokenizer; "
        f"add one to {TEMPLATE_DIR} and declare it in infer/families/catalog.py"
    )
