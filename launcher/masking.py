"""Secrets: which names and which text mark one, and how each is masked wherever tflaunch shows or writes it.

A variable whose name marks a secret (:func:`is_secret_name`) keeps its value out of run.json,
``--dry-run``, messages and logs; so does the password of a URL (``scheme://user:PASSWORD@host``)
in any value, argument or shell line, and the value of a secret-named assignment (``HF_TOKEN=...``)
or option (``--api-key ...``) in a command or a ``setup`` line (:func:`masked_text`,
:func:`masked_argv`). Masking is for what is shown: the tasks still get every value as it was given.
"""

from __future__ import annotations

import functools
import re
from typing import Sequence

# A name containing one of these, in any case, marks a secret (WANDB_API_KEY, HF_TOKEN, DB_PASSWORD).
SECRET_NAME_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "API_KEY", "APIKEY", "ACCESS_KEY", "PRIVATE_KEY",
                     "CREDENTIAL")
# A name ending with one of these (or one of them alone, without the underscore) marks a secret too:
# a data source name holds its password (SENTRY_DSN, DATABASE_DSN), a personal access token
# (GITHUB_PAT), a key (KAGGLE_KEY, OPENAI_KEY).
SECRET_NAME_ENDINGS = ("_DSN", "_PAT", "_KEY")
# Keys of connection strings (``Key=VALUE;...``, Azure's and ODBC's) and URL queries whose value is a
# secret, in any case: matched in any text, since their names follow no variable's rule.
SECRET_FORM_KEYS = ("AccountKey", "SharedAccessKey", "SharedAccessSignature", "Password", "Pwd", "sig")
MASK = "<hidden>"  # what is written and shown instead of a hidden value
ENV_OPTIONS = ("--env", "-e")  # tflaunch's options that set a variable in every task

# The password of a URL's user information: scheme://user:PASSWORD@host. The authority ends at the
# first blank, /, ? or #, as URL parsers read it; the password runs to its last @, so one that
# holds @ or quotes is masked whole.
_URL_PASSWORD = re.compile(r"(?P<head>\b[A-Za-z][A-Za-z0-9+.\-]*://[^\s:/?#@'\"]*:)[^\s/?#]+(?=@)")
# Key=VALUE of a connection string or a URL query, VALUE up to the next ; & blank or quote.
_SECRET_FORM = re.compile(r"(?<![A-Za-z0-9_])(?P<key>" + "|".join(SECRET_FORM_KEYS) + r")=[^;&\s'\"]*",
                          re.IGNORECASE)
# NAME=VALUE in a shell line or a command's word: VALUE quoted, or up to a blank, quote or operator.
_ASSIGNMENT = re.compile(r"(?<![\w$-])(?P<name>[A-Za-z_][A-Za-z0-9_]*)=(?P<value>'[^']*'|\"(?:[^\"\\]|\\.)*\"|"
                         r"[^\s;&|)'\"]*)")
# --NAME=VALUE, or --NAME alone (its value the next word), in a command.
_OPTION = re.compile(r"--?(?P<name>[A-Za-z][A-Za-z0-9_-]*)(?P<eq>=?)")


@functools.lru_cache(maxsize=4096)  # asked for every variable of every task of a large cluster, again and again
def is_secret_name(name: str) -> bool:
    """Whether ``name`` marks its value as a secret (see SECRET_NAME_PARTS and SECRET_NAME_ENDINGS);
    an option's name (``api-key``) as the variable it would be (``API_KEY``)."""
    upper = name.upper().replace("-", "_")
    return any(part in upper for part in SECRET_NAME_PARTS) or upper.endswith(SECRET_NAME_ENDINGS) or \
        f"_{upper}" in SECRET_NAME_ENDINGS


def masked_url_passwords(text: str) -> str:
    """``text`` with the password of every URL in it (``scheme://user:PASSWORD@host``), and the value
    of every secret key of a connection string or URL query (``AccountKey=...``, ``sig=...``), replaced by MASK."""
    if "://" in text:
        text = _URL_PASSWORD.sub(lambda m: m["head"] + MASK, text)
    if "=" in text:
        text = _SECRET_FORM.sub(lambda m: f"{m['key']}={MASK}", text)
    return text


def masked_text(text: str) -> str:
    """A shell line (a ``setup``), a value or a message as it may be shown: URL passwords and the
    values of secret-named assignments (``export HF_TOKEN=...``) replaced by MASK."""
    text = masked_url_passwords(text)
    if "=" not in text:
        return text
    return _ASSIGNMENT.sub(lambda m: f"{m['name']}={MASK}" if is_secret_name(m["name"]) else m[0], text)


def masked_argv(argv: Sequence[str]) -> list[str]:
    """A command line as it may be written or shown (tflaunch's own, a task's, or the program that
    called the Python API): URL passwords masked in every word, and the value of every
    secret-named ``NAME=VALUE`` (also after ``--env``, ``-e`` or as ``-eNAME=VALUE``), ``--NAME=VALUE``
    and ``--NAME VALUE`` (``--api-key KEY``, ``--hf-token=...``) is MASK."""
    out: list[str] = []
    hide_next = False
    for word in argv:
        if hide_next:
            hide_next = False
            if not word.startswith("-"):
                out.append(MASK)
                continue
        option = _OPTION.match(word) if word.startswith("-") and word not in ENV_OPTIONS else None
        if option is not None and option.end() == len(word) and not option["eq"]:
            hide_next = is_secret_name(option["name"])  # --api-key KEY: the next word is its value
            out.append(word)
        elif option is not None and option["eq"]:  # --hf-token=..., or --env=NAME=VALUE
            rest = word[option.end():]
            out.append(word[:option.end()] + (MASK if is_secret_name(option["name"]) else _masked_word(rest)))
        elif word.startswith("-e") and not word.startswith("--") and "=" in word:
            out.append("-e" + _masked_word(word[2:]))
        else:
            out.append(_masked_word(word))
    return out


def _masked_word(word: str) -> str:
    """One word of a command: NAME=VALUE with a secret NAME, or a URL's password, masked."""
    name, sep, _ = word.partition("=")
    if sep and is_secret_name(name) and name.replace("_", "a").isalnum():
        return f"{name}={MASK}"
    return masked_url_passwords(word)


@functools.lru_cache(maxsize=1024)  # every task of a run shows the same few commands, at every record
def masked_command(argv: tuple[str, ...]) -> tuple[str, ...]:
    """:func:`masked_argv` of a task's command, kept for the next task that runs it."""
    return tuple(masked_argv(argv))
