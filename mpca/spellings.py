"""One spelling per setting on every command line: the grammar of a setting given as an option (``--device-speed``,
``emulation.device_speed``'s one parser) and the old spellings, refused in one line that names the new one.
No torch: every command builds its parser with it."""
from __future__ import annotations

import argparse
from typing import Dict, Optional

from mpca.errors import UserError


def device_speed_problem(speeds: Dict[int, float]) -> Optional[str]:
    """What is wrong with a ``emulation.device_speed`` map, or None."""
    if any(not 0.0 < v <= 1.0 or a < 0 for a, v in speeds.items()):
        return "emulation.device_speed maps agents (>= 0) to speeds in (0, 1], e.g. {1: 0.5}"
    return None


def parse_device_speed(text: str) -> Dict[int, float]:
    """``emulation.device_speed`` as every command's ``--device-speed`` spells it: ``AGENT:SPEED[,AGENT:SPEED...]``
    (``1:0.5,3:0.8``: agent 1's device at half speed, agent 3's at 0.8); empty: none.  The one parser of it."""
    out: Dict[int, float] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        agent, sep, speed = part.partition(":")
        try:
            if not sep:
                raise ValueError
            out[int(agent)] = float(speed)
        except ValueError:
            raise UserError(f"--device-speed takes AGENT:SPEED[,AGENT:SPEED...], e.g. 1:0.5 (agent 1's device at "
                            f"half speed), got {text!r}") from None
    problem = device_speed_problem(out)
    if problem:
        raise UserError(f"--device-speed {text!r}: {problem}")
    return out


RENAMED_OPTIONS = {  # an old command-line spelling: its one spelling now, and the setting it sets
    "--step-s": ("--device-step-s", "emulation.device_step_s"),
    "--device-step": ("--device-step-s", "emulation.device_step_s"),
    "--speeds": ("--device-speed", "emulation.device_speed"),
    "--straggler": ("--device-speed", "emulation.device_speed"),
}


class _Renamed(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        new, key = RENAMED_OPTIONS[option_string]
        raise UserError(f"{parser.prog}: {option_string} is now {new} (the one spelling of {key} on every command)")


def refuse_renamed(parser: argparse.ArgumentParser, *options: str) -> None:
    """``options`` (old spellings, :data:`RENAMED_OPTIONS`) stop the command with one line naming the new one (a
    :class:`~mpca.errors.UserError` while the arguments are parsed)."""
    for option in options:
        parser.add_argument(option, action=_Renamed, nargs="?", help=argparse.SUPPRESS)
