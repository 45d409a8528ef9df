"""The one command-line layer of every entry point: Hydra set-up, argument parsing and error-to-exit-code handling.

- Hydra commands (`launch`, `diagnose`, `intervene`, `eval.linear`, `eval.dense`) are built with `hydra_command`:
  the repository's configs, short aliases (`n_images=` for `diagnostics.n_images=`), `check_config` right after
  composition, then the command's function.
- Plain commands (`leaderboard`, `synthetic`, `bench`) parse `key=value` arguments against a typed schema with
  `parse_args` (misspelt keys and wrong types name themselves) and run under `run_command`.
- `compose` turns a configuration that does not compose into a `ConfigError`; `guarded` turns a `UserError` into
  `error: <message>` on one line with its exit code (1; a failed built-in check `CheckFailed`: 3); any other
  exception is a bug and keeps its traceback. `VITSINKS_TRACEBACK=1` shows the traceback of user errors too.
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException
from omegaconf.nodes import StringNode

from vitsinks.utils.errors import CheckFailed, ConfigError, UserError


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


def data_overrides() -> list[str] | None:
    """The `data` / `data.*` keys this Hydra command line set; None outside a Hydra command (called from Python)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    keys = [o.split("=")[0].lstrip("+~") for o in HydraConfig.get().overrides.task]
    return [k for k in keys if k.split(".")[0] == "data"]


def pick_data(cfg_data: DictConfig, ckpt_data: DictConfig, overridden: Sequence[str] | None) -> DictConfig:
    """The data a command reading a checkpoint uses: the command line's when it chose a dataset (`data=`,
    `data.name=`, `data.root=`) or when called from Python (`overridden` None); else the checkpoint's own training
    data with the command line's other `data.*` settings (e.g. `data.on_bad_image=error`)."""
    if overridden is None or any(k in ("data", "data.name", "data.root") for k in overridden):
        return cfg_data
    return OmegaConf.merge(ckpt_data, {k[len("data."):]: OmegaConf.select(cfg_data, k[len("data."):])
                                       for k in overridden})  # type: ignore[return-value]


def compose(overrides: Sequence[str]) -> DictConfig:
    """The checked config of these overrides, composed as the command line would (see `config.load_config`); a
    composition error (unknown group or option, misspelt key, wrong type, value outside a closed set) becomes a
    `ConfigError` with Hydra's message on one line. Errors of vitsinks' own code keep their type and traceback."""
    from hydra.errors import HydraException

    from vitsinks.configs.schema import load_config

    try:
        return load_config(list(overrides))
    except (HydraException, OmegaConfBaseException) as err:
        raise ConfigError(composition_message(err)) from None


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


def hydra_command(fn: Callable[[DictConfig], Any], aliases: dict[str, str] | None = None,
                  lists: Sequence[str] = ()) -> Callable[[Sequence[str] | None], None]:
    """The `main(argv)` of a Hydra command running `fn(cfg)`: aliases rewritten, the config checked, errors handled."""
    import hydra

    from vitsinks.configs.schema import check_config, config_dir, register_configs

    def task(cfg: DictConfig) -> None:
        guarded(check_config, cfg)
        guarded(fn, cfg)

    register_configs()
    hydra_main = hydra.main(config_path=str(config_dir()), config_name="config", version_base="1.3")(task)

    def main(argv: Sequence[str] | None = None) -> None:
        args = rewrite_aliases(sys.argv[1:] if argv is None else list(argv), aliases or {}, lists)
        if not any(a.startswith("-") or a.startswith("hydra") for a in args):
            guarded(compose, args)  # composition mistakes on one line (Hydra's own message spans several)
        sys.argv = [sys.argv[0], *args]
        hydra_main()

    return main


def parse_args(argv: Sequence[str], schema: Any, usage: str, positional: str | None = None) -> DictConfig:
    """`key=value` arguments merged onto a structured schema (dataclass); `positional` names one leading bare word.

    Unknown keys, wrong types and stray words are a `ConfigError` naming them, with `usage`.
    """
    args = list(argv)
    base = OmegaConf.structured(schema)
    extra: dict[str, Any] = {}
    if positional and args and "=" not in args[0]:
        extra[positional] = args.pop(0)
    stray = [a for a in args if "=" not in a]
    if stray:
        raise ConfigError(f"unexpected argument(s) {' '.join(stray)}; usage: {usage}")
    # a string field takes its value as written (`title=a: b` is a title, not the YAML mapping {a: b})
    literal = {k: v for k, _, v in (a.partition("=") for a in args)
               if k in base and isinstance(base._get_node(k), StringNode) and v != "null"}
    typed = [a for a in args if a.partition("=")[0] not in literal]
    try:
        return OmegaConf.merge(base, OmegaConf.from_dotlist(typed), literal, extra)  # type: ignore[return-value]
    except OmegaConfBaseException as err:
        raise ConfigError(f"{' '.join(str(err).split())}; usage: {usage}") from None


def run_command(fn: Callable[[Sequence[str]], int | None]) -> Callable[[Sequence[str] | None], NoReturn]:
    """The `main(argv)` of a plain command: `fn(argv)` returns its exit code (None: 0); errors handled."""

    def main(argv: Sequence[str] | None = None) -> NoReturn:
        sys.exit(guarded(fn, sys.argv[1:] if argv is None else list(argv)) or 0)

    return main
