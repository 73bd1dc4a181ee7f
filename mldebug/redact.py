"""Secrets never copied into reports: one rule for environment values, command lines and
free text.

A value is a secret when its name says so (token, secret, password, key, credential, auth,
cookie, session), when it is the value of such a ``--flag=value`` / ``--flag value``, when it
is a URL's password or a ``password=``/``token=``/``api_key=`` pair inside a value, or when it has a well-known token shape (``hf_``, ``ghp_``, ``sk-``,
``AKIA``, ``xoxb-``, ``glpat-``, JWTs, long base64/hex runs). Every report and saved file
passes command lines and env values through here unless the user gives ``--show-secrets``.

Stdlib only.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

REDACTED = "<redacted>"
SECRET_NAME = re.compile(
    r"TOKEN|SECRET|PASSW|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY|AUTH|COOKIE|"
    r"SESSION|SIGNATURE|(^|[_-])KEY$|(^|[_-])PWD$", re.I)
# names that match the rule above but are never secret values
NOT_SECRET_NAME = re.compile(r"^(SSH_AUTH_SOCK|XDG_SESSION_\w+|DBUS_SESSION_BUS_ADDRESS|"
                             r"SESSION_MANAGER|KRB5CCNAME|.*_KEY_?(FILE|PATH)|.*_TOKEN_?(FILE|PATH)|"
                             r"TOKENIZERS_PARALLELISM|.*TOKENIZER.*)$", re.I)
TOKEN_SHAPE = re.compile(  # not inside a longer word ("task-runner-..." is no "sk-" token)
    r"(?<![A-Za-z0-9_-])(?:hf_[A-Za-z0-9]{20,}|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,}|"
    r"sk-[A-Za-z0-9_-]{16,}|sk_live_[A-Za-z0-9]{16,}|xox[abprs]-[A-Za-z0-9-]{10,}|"
    r"AKIA[0-9A-Z]{16}|glpat-[A-Za-z0-9_-]{16,}|"
    r"eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]{10,})")
TOKEN_PREFIX = re.compile(r"^(?:hf_|ghp_|gho_|ghs_|ghu_|github_pat_|sk-|sk_live_|xox[abprs]-|AKIA|"
                          r"glpat-)")
LONG_OPAQUE = re.compile(r"^[A-Za-z0-9+/_=-]{32,}$")
URL_PASSWORD = re.compile(r"(//[^/:@\s]{1,200}:)[^@/\s]{1,200}@")
# a secret key=value inside a value or a line: a URL query (?password=X&...), space-, comma- or
# semicolon-separated settings; the key may carry a prefix (access_token=, DB_PASSWORD=), not a
# suffix: "tokenizer=bert" and "password_file=/path" stay
KEY_VALUE = re.compile(r"(?<![A-Za-z0-9])((?:[A-Za-z0-9]{1,40}[_-]){0,4}"
                       r"(?:password|passwd|pwd|secret|token|api[_-]?key)=[\"']?)[^&\s,;'\"]+", re.I)
_FLAG = re.compile(r"^(--?[A-Za-z0-9][\w.-]*)(=)(.*)$", re.S)


def is_secret_name(name: str) -> bool:
    return bool(SECRET_NAME.search(name)) and not NOT_SECRET_NAME.match(name)


# what every token shape and URL password needs somewhere in the text: one C-speed search
# lets the common string (a frame name, a file path) through without the two substitutions
_MAYBE_SECRET = re.compile(r"@|hf_|gh[pousr]_|github_pat_|sk[-_]|xox|AKIA|glpat-|eyJ"
                           r"|(?i:passw(?:or)?d=|pwd=|secret=|token=|api[_-]?key=)")


def redact_text(text: str) -> str:
    """Free text (a log line, a finding title) with URL passwords, secret ``key=value`` pairs
    (``password=``, ``token=``, ``api_key=``...) and token shapes replaced."""
    if _MAYBE_SECRET.search(text) is None:
        return text
    text = URL_PASSWORD.sub(r"\1" + REDACTED + "@", text)
    text = KEY_VALUE.sub(r"\1" + REDACTED, text)
    return TOKEN_SHAPE.sub(REDACTED, text)


def redact_value(name: str, value: str) -> str:
    """An environment variable's value, or ``<redacted>`` when the name or the value looks
    like a secret; a URL keeps everything but its password."""
    if is_secret_name(name) or TOKEN_PREFIX.match(value) or LONG_OPAQUE.match(value):
        return REDACTED if value else value
    return redact_text(value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: redact_value(k, v) for k, v in env.items()}


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with the values of secret-named flags (``--api-key=X``, ``--token X``,
    ``HF_TOKEN=X`` assignments) and token-shaped words replaced."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            out.append(REDACTED)
            hide_next = False
            continue
        m = _FLAG.match(arg)
        if m and is_secret_name(m.group(1).lstrip("-")):
            out.append(f"{m.group(1)}={REDACTED}")
            continue
        if arg.startswith("-") and "=" not in arg and is_secret_name(arg.lstrip("-")):
            out.append(arg)
            hide_next = True
            continue
        name, eq, value = arg.partition("=")
        if eq and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name) and is_secret_name(name):
            out.append(f"{name}={REDACTED}")
            continue
        out.append(redact_text(arg))
    return out


ARGV_KEYS = frozenset({"cmdline", "argv", "command_line", "args"})
ENV_KEYS = frozenset({"env", "environ", "environment"})


def redact_doc(doc: object) -> object:
    """A JSON-like report with every command line (a list under ``cmdline``/``argv``) and
    every environment (a str->str mapping under ``env``/``environ``) redacted, and in every
    other string URL passwords and token shapes (``redact_text``), at any depth; a new document, the input is left as it is."""
    if isinstance(doc, dict):
        out: dict[object, object] = {}
        for k, v in doc.items():
            if k in ARGV_KEYS and isinstance(v, list) and all(isinstance(a, str) for a in v):
                out[k] = redact_argv(v)
            elif k in ARGV_KEYS and isinstance(v, str):
                out[k] = " ".join(redact_argv(v.split(" ")))
            elif k in ENV_KEYS and isinstance(v, dict):
                out[k] = {n: redact_value(str(n), x) if isinstance(x, str) else redact_doc(x)
                          for n, x in v.items()}
            else:
                out[k] = redact_doc(v)
        return out
    if isinstance(doc, list):
        return [redact_doc(x) for x in doc]
    if isinstance(doc, str):
        return redact_text(doc)  # any other field: URL passwords, token shapes
    return doc
