"""The one command-line layer of every entry point: Hydra set-up, argument parsing and error-to-exit-code handling.

- Hydra commands (`hydra_command`): short aliases rewritten, the config composed once (`compose`, as every run of
  a sweep is) and checked, then given to the command's function; `--cfg job|hydra|all` (`--resolve`) and `--help`.
- Plain commands parse `key=value` arguments against a typed schema (`parse_args`) and run under `run_command`.
- `guarded` prints a `UserError` (and a write the file system refused) as `error: <message>` on one line and exits
  with its code; any other exception is a bug and keeps its traceback (`VITSINKS_TRACEBACK=1`: user errors too).
"""

from __future__ import annotations

import copy
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn, Protocol

import torch
from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import configure_log
from hydra.errors import HydraException, OverrideParseException
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException
from omegaconf.nodes import StringNode

from vitsinks.configs.checks import check_config
from vitsinks.configs.schema import compose_config
from vitsinks.configs.usage import FLAGS_USAGE, command_help, help_text, wants_help
from vitsinks.configs.user_inputs import unicode_fix
from vitsinks.utils.cpus import cpu_threads, runs_on_cpu
from vitsinks.utils.errors import CheckFailed, ConfigError, UserError
from vitsinks.utils.files import fault


class HydraMain(Protocol):
    """A Hydra command's `main(argv=None)` (`hydra_command`): None reads `sys.argv`."""

    def __call__(self, argv: Sequence[str] | None = None) -> None: ...


class PlainMain(Protocol):
    """A plain command's `main(argv=None)` (`run_command`): None reads `sys.argv`; it exits with the code."""

    def __call__(self, argv: Sequence[str] | None = None) -> NoReturn: ...


def fail(err: BaseException, code: int = 1) -> NoReturn:
    """Print `error: <message>` (one line) and exit with `code`."""
    if os.environ.get("VITSINKS_TRACEBACK"):
        raise err
    message = " ".join(str(err).split())  # one line, whatever the library's layout
    prefix = "error: built-in check failed: " if isinstance(err, CheckFailed) else "error: "
    print(prefix + message, file=sys.stderr)
    sys.exit(code)


def guarded(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)`, with user errors (configurations that do not compose included, see `compose`) on one line."""
    try:
        return fn(*args)
    except (UserError, CheckFailed) as err:
        fail(err, err.exit_code)
    except OSError as err:  # a write the file system refused outside vitsinks' own writers (a folder, a lock file)
        named = fault(err, doing="access")
        if named is None:
            raise
        fail(named, named.exit_code)


def composition_message(err: BaseException) -> str:
    """Hydra's message and the first line of each cause (OmegaConf appends its node metadata on further lines)."""
    parts = [str(err).split("Config search path")[0].strip()]
    cause = err.__cause__
    while cause is not None:
        first = str(cause).strip().splitlines()[0] if str(cause).strip() else ""
        if first and first not in parts[-1]:
            parts.append(first)
        cause = cause.__cause__
    return ": ".join(parts) + " (--help lists the config groups and their options)"


def cli_keys() -> list[str] | None:
    """The keys the running command's command line set; None outside a command (called from Python)."""
    if not HydraConfig.initialized():
        return None
    return [o.split("=")[0].lstrip("+~") for o in HydraConfig.get().overrides.task]


def data_overrides() -> list[str] | None:
    """The `data` / `data.*` keys the running command's command line set; None outside a command."""
    keys = cli_keys()
    return None if keys is None else [k for k in keys if k.split(".")[0] == "data"]


def pick_seed(cfg_seed: int, ckpt_seed: int, overridden: Sequence[str] | None) -> int:
    """The seed of a command reading a checkpoint: the command line's `seed=` when it gave one, or `cfg_seed` when
    called from Python (`overridden` None); else the checkpoint's own training seed, so that a checkpoint is probed
    alike after training, by a later command and as the source of a post-hoc edit."""
    return int(cfg_seed) if overridden is None or "seed" in overridden else int(ckpt_seed)


def pick_data(cfg_data: DictConfig, ckpt_data: DictConfig, overridden: Sequence[str] | None) -> DictConfig:
    """The data a command reading a checkpoint uses: the command line's when it chose a dataset (`data=`,
    `data.name=`, `data.root=`) or from Python (`overridden` None); else the checkpoint's own with the command
    line's other `data.*` settings."""
    if overridden is None or any(k in ("data", "data.name", "data.root") for k in overridden):
        return cfg_data
    return OmegaConf.merge(ckpt_data, {k[len("data."):]: OmegaConf.select(cfg_data, k[len("data."):])
                                       for k in overridden})  # type: ignore[return-value]


def compose(overrides: Sequence[str], check: bool = True, hydra: bool = False) -> DictConfig:
    """The config of these overrides, composed as the command line does and checked (`check_config`) unless not
    `check`; `hydra` keeps Hydra's own node. A composition error (unknown group or option, misspelt key, wrong type,
    value outside a closed set) becomes a `ConfigError` with Hydra's message on one line."""
    try:
        cfg = compose_config(list(overrides), hydra=hydra)
    except (HydraException, OmegaConfBaseException) as err:  # a non-ASCII value Hydra's grammar refused: the fix
        raise ConfigError((isinstance(err, OverrideParseException) and unicode_fix(overrides))
                          or composition_message(err)) from None
    if check:
        check_config(cfg)
    return cfg


def rewrite_aliases(argv: Sequence[str], aliases: dict[str, str], lists: Sequence[str] = ()) -> list[str]:
    """`short=value` -> `full.key=value` for each alias; for the `lists` aliases a single value needs no brackets."""
    out = []
    for a in argv:
        m = re.match(r"^([A-Za-z_]\w*)=(.*)$", a)
        if m and m.group(1) in aliases:
            key, value = m.groups()
            if key in lists and not value.startswith("["):
                value = f"[{value}]"
            a = f"{aliases[key]}={value}"
        out.append(a)
    return out


CFG_PARTS = ("job", "hydra", "all")


def split_flags(args: Sequence[str]) -> tuple[dict[str, Any], list[str]]:
    """(`{"help": bool, "cfg": None | job | hydra | all, "resolve": bool}`, the overrides) of a command line."""
    flags: dict[str, Any] = {"help": False, "cfg": None, "resolve": False}
    overrides: list[str] = []
    rest = list(args)
    while rest:
        a = rest.pop(0)
        if wants_help([a]):
            flags["help"] = True
        elif a == "--resolve":
            flags["resolve"] = True
        elif a in ("-c", "--cfg") or a.startswith("--cfg="):
            part = a.partition("=")[2] if "=" in a else (rest.pop(0) if rest else "")
            if part not in CFG_PARTS:
                raise ConfigError(f"--cfg takes one of {', '.join(CFG_PARTS)}, got {part!r}")
            flags["cfg"] = part
        elif a.startswith("-"):
            raise ConfigError(f"unknown option {a}; the options are {FLAGS_USAGE}")
        else:
            overrides.append(a)
    return flags, overrides


def task_config(cfg: DictConfig) -> DictConfig:
    """The run's config without Hydra's node (what a command's function gets)."""
    task = copy.deepcopy(cfg)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


@contextmanager
def hydra_context(cfg: DictConfig) -> Iterator[None]:
    """What Hydra sets up around a job (`HydraConfig`, cleared afterwards, and logging) for `cfg` with its node."""
    HydraConfig.instance().set_config(cfg)
    configure_log(cfg.hydra.job_logging, cfg.hydra.verbose)
    try:
        yield
    finally:
        HydraConfig.instance().cfg = None


def hydra_command(fn: Callable[[DictConfig], Any], aliases: dict[str, str] | None = None,
                  lists: Sequence[str] = ()) -> HydraMain:
    """The `main(argv)` of a Hydra command running `fn(cfg)` (see the module docstring)."""

    def main(argv: Sequence[str] | None = None) -> None:
        args = rewrite_aliases(sys.argv[1:] if argv is None else list(argv), aliases or {}, lists)
        flags, overrides = guarded(split_flags, args)
        if flags["help"]:
            module = sys.modules.get(getattr(fn, "__module__", None) or "")
            print(help_text(module.__doc__ if module else None, aliases or {}))
            return
        cfg = guarded(compose, overrides, flags["cfg"] is None, True)
        if flags["cfg"] is not None:
            part = {"job": task_config(cfg), "hydra": OmegaConf.masked_copy(cfg, "hydra"), "all": cfg}[flags["cfg"]]
            print(OmegaConf.to_yaml(part, resolve=flags["resolve"]), end="")
            return
        with hydra_context(cfg):
            guarded(_with_cpu_threads, fn, task_config(cfg))

    return main


def _with_cpu_threads(fn: Callable[[DictConfig], Any], cfg: DictConfig) -> Any:
    """`fn(cfg)` with CPU work on `train.cpu_threads` threads (`cpus.compute_threads`)."""
    with cpu_threads(cfg, torch.device("cpu" if runs_on_cpu(cfg) else "meta")):  # meta: left alone
        return fn(cfg)


def parse_args(argv: Sequence[str], schema: type | dict[str, Any], usage: str,
               positional: str | None = None) -> DictConfig:
    """`key=value` arguments merged onto a structured schema (a dataclass, or a dict of the defaults); `positional`
    names one leading bare word. Unknown keys, wrong types and stray words are a `ConfigError` naming them."""
    args = list(argv)
    base = OmegaConf.structured(schema)
    extra: dict[str, Any] = {}
    if positional and args and "=" not in args[0]:
        extra[positional] = args.pop(0)
    if stray := [a for a in args if "=" not in a]:
        raise ConfigError(f"unexpected argument(s) {' '.join(stray)}; usage: {usage}")
    # a string field takes its value as written (`title=a: b` is a title, not the YAML mapping {a: b})
    literal = {k: v for k, _, v in (a.partition("=") for a in args)
               if k in base and isinstance(base._get_node(k), StringNode) and v != "null"}
    typed = [a for a in args if a.partition("=")[0] not in literal]
    try:
        return OmegaConf.merge(base, OmegaConf.from_dotlist(typed), literal, extra)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        raise ConfigError(f"{' '.join(str(err).split())}; usage: {usage}") from None


def module_help(fn: Callable[..., Any], argv: Sequence[str]) -> str:
    """The `--help` of the command whose module defines `fn` (`usage.command_help`; else the module's docstring)."""
    module = sys.modules.get(getattr(fn, "__module__", None) or "")
    spec = getattr(module, "__spec__", None)  # `python -m` runs a module as __main__ with its real name in its spec
    try:
        return command_help(spec.name if spec else getattr(fn, "__module__", ""), argv)
    except LookupError:
        return ((module.__doc__ if module else None) or "").strip()


def run_command(fn: Callable[[Sequence[str]], int | None]) -> PlainMain:
    """The `main(argv)` of a plain command: `fn(argv)` returns its exit code (None: 0); `-h` prints its help."""

    def main(argv: Sequence[str] | None = None) -> NoReturn:
        args = sys.argv[1:] if argv is None else list(argv)
        if wants_help(args):
            print(module_help(fn, args))
            sys.exit(0)
        sys.exit(guarded(fn, args) or 0)

    return main
