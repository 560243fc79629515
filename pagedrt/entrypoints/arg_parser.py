"""The parser every `pagedrt` command line uses: argparse's, with a short usage error.

argparse answers a bad option with the command's whole usage block (30 lines for `pagedrt
generate`, whose engine options are many) and then the error; a user reads the error, so
here it is the one line, with where the options are listed:

    pagedrt generate: error: argument --block-size: invalid choice: 12 (choose from 8, 16, 32)
    (pagedrt generate --help lists the options)

Exit status 2, as argparse's.
"""

from __future__ import annotations

import argparse
import difflib
from typing import NoReturn


class ArgumentParser(argparse.ArgumentParser):
    """argparse.ArgumentParser whose `error` prints the error line and a pointer to --help,
    not the usage block (subparsers made with `add_subparsers` are of this class too)."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}\n({self.prog} --help lists the options)\n")

    def unrecognized(self, rest: list[str]) -> NoReturn:
        """The error for arguments this parser does not know (what `parse_known_args` left),
        with the closest known option for a misspelt one: `--temprature` -> `--temperature`."""
        known = [o for action in self._actions for o in action.option_strings]
        hints = []
        for arg in rest:
            name = arg.split("=", 1)[0]
            if name.startswith("--"):
                close = difflib.get_close_matches(name, known, n=1)
                if close:
                    hints.append(f"{name}: did you mean {close[0]}?")
        self.error(f"unrecognized arguments: {' '.join(rest)}"
                   + ("" if not hints else f" ({'; '.join(hints)})"))
